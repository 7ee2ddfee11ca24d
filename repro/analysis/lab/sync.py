"""Staleness lab, ``sync_vs_async`` (``python -m repro.run +exp=sync_vs_async``): what a barrier
costs, measured beside theory. Owns the throughput theory (expected order statistics of the
clients' segment times; a max-plus recurrence for SSP's clock rule), the tidy frame and the
drawing. The timing model and each protocol's prediction: docs/lab.md, "sync_vs_async"."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from repro.analysis.render import printed_table, register_figure
from repro.analysis.frames import PREDICTED, cost_of, measured_rows
from repro.analysis.lab import legend_key, message_bytes, tidy
from repro.analysis.load import Runs, finite
from repro.sim.cost import CostModel, step_time
from repro.analysis.tables import resolve_target, times_to_target
from repro.analysis.configs import one_run_each

PROFILE_ORDER = ("jitter_lognormal", "jitter_exponential", "straggler")
PROTOCOL_ORDER = ("async", "sync", "sync + 1 backup", "ssp (s=3)")
QUANTITIES = {"throughput_ratio": "applied samples/s\nrelative to async (same N)",
              "updates_per_s": "server updates per second\n(versions / virtual s)",
              "time_to_target_s": "time to target\n(virtual s)"}
SOURCES = {"async": "async: 1/(c f_i E[S] + o) per client",
           "sync": "barrier: E[S] / E[max_i S_i] (order statistics)",
           "backup": "backup workers: (N-b)-th order statistic (Chen et al. 2016)",
           "ssp": "ssp: clock-bound max-plus recurrence (Ho et al. 2013), Monte Carlo"}
MC_SEED, MC_REPLICAS = 20131226, 256   # the recurrence's Monte Carlo: fixed, so frames repeat


def _lognormal_cdf(x: np.ndarray, sigma: float) -> np.ndarray:
    z = (np.log(np.maximum(x, 1e-300)) + sigma * sigma / 2) / (sigma * math.sqrt(2))
    return np.where(x > 0, 0.5 * (1 + np.vectorize(math.erf)(z)), 0.0)


def _gamma_cdf(y: np.ndarray, n: int) -> np.ndarray:
    """P(Gamma(n, 1) <= y) = 1 - exp(-y) sum_{j<n} y^j / j!, in log space (n up to ~100s)."""
    y = np.maximum(np.asarray(y, float), 0.0)
    logy = np.log(np.maximum(y, 1e-300))
    tail = sum(np.exp(j * logy - y - math.lgamma(j + 1)) for j in range(n))
    return np.where(y > 0, 1.0 - tail, 0.0)


@lru_cache(maxsize=64)
def segment_cdf(jitter: str, sigma: float, nsync: int, points: int = 2**15):
    """(grid t, P(S <= t)) for S = the sum of ``nsync`` step factors, t in step units (docs/lab.md)."""
    if jitter == "none" or sigma == 0:
        t = np.linspace(0.0, 2.0 * nsync, points)
        return t, (t >= nsync).astype(float)
    q = math.exp(7.1 * sigma - sigma * sigma / 2) if jitter == "lognormal" else (1 - sigma) + sigma * 28.0
    t = np.linspace(0.0, nsync * q + 2.0, points)   # beyond: a segment is vanishingly unlikely (P < 1e-12 per step)
    if jitter == "exponential":
        return t, _gamma_cdf((t - nsync * (1 - sigma)) / sigma, nsync)
    if nsync == 1:
        return t, _lognormal_cdf(t, sigma)
    dt = t[1] - t[0]
    edges = np.concatenate([[0.0], t[:-1] + dt / 2, [np.inf]])
    pmf = np.diff(np.concatenate([[0.0], _lognormal_cdf(edges[1:-1], sigma), [1.0]]))
    size = 1 << int(math.ceil(math.log2(points * nsync)))
    total = np.fft.irfft(np.fft.rfft(pmf, size) ** nsync, size)[:points]
    return t, np.clip(np.cumsum(np.maximum(total, 0.0)), 0.0, 1.0)


def harmonic(n: int) -> float:
    """H_n = E[max of n Exp(1)], the exact barrier cost of exponential steps at nsync 1."""
    return sum(1.0 / i for i in range(1, n + 1))


@dataclass(frozen=True)
class Timing:
    """One grid point's timing model (what a run's config.json says about time)."""
    compute_s: float
    jitter: str
    sigma: float
    nsync: int
    num_clients: int
    slowdowns: tuple[float, ...] = ()   # f_i of clients 1..N (repro.sim.cost.step_time); (): all 1
    overhead_s: float = 0.0           # 2 * transfer + server apply, per exchange

    def factors(self) -> list[float]:
        return list(self.slowdowns) or [1.0] * self.num_clients


def segment_order_time(tm: Timing, m: int) -> float:
    """E[m-th earliest of the N clients' segment times] in seconds (m = N: the barrier; docs/lab.md)."""
    base, cdf = segment_cdf(tm.jitter, float(tm.sigma), int(tm.nsync))
    t = base * max(tm.factors())   # the slowest client's segments must fit on the grid too
    count = np.zeros((len(tm.factors()) + 1, len(t)))
    count[0] = 1.0
    for f in tm.factors():
        p = np.interp(t / f, base, cdf, right=1.0)   # C_i = c f_i S_i
        count[1:] = count[1:] * (1 - p) + count[:-1] * p
        count[0] *= 1 - p
    return tm.compute_s * float(np.trapezoid(count[:m].sum(0), t))


def async_segments_per_s(tm: Timing) -> float:
    """Each client cycles through compute and one exchange; E[S] = nsync (mean-1 steps)."""
    return sum(1.0 / (tm.compute_s * f * tm.nsync + tm.overhead_s) for f in tm.factors())


def sync_round_s(tm: Timing, backups: int = 0) -> float:
    """A round lasts until the (N - b)-th push, then one exchange (Chen et al. 2016, Sec. 3)."""
    return segment_order_time(tm, tm.num_clients - backups) + tm.overhead_s


def _segments(rng, tm: Timing, shape) -> np.ndarray:
    n, s = tm.nsync, tm.sigma
    if tm.jitter == "none" or s == 0:
        return np.full(shape, float(n))
    if tm.jitter == "lognormal":
        return np.exp(s * rng.standard_normal((*shape, n)) - s * s / 2).sum(-1)
    return n * (1 - s) + s * rng.gamma(n, 1.0, shape)


def ssp_clock(tm: Timing, bound: int, pushes: int) -> tuple[float, float]:
    """(mean time until ``pushes`` pushes are applied under SSP with bound s, their mean staleness): docs/lab.md."""
    rng = np.random.default_rng(MC_SEED)
    n_cl, per_client = tm.num_clients, pushes   # no client can push more than all pushes
    f = np.asarray(tm.factors())[None, :]
    applied, released = np.zeros((MC_REPLICAS, n_cl, per_client)), np.zeros((MC_REPLICAS, n_cl))
    for j in range(per_client):
        seg = tm.compute_s * f * _segments(rng, tm, (MC_REPLICAS, n_cl))
        applied[:, :, j] = released + seg + tm.overhead_s / 2 + (tm.overhead_s / 2 if j else 0.0)
        gate = applied[:, :, j - bound].max(1, keepdims=True) if j - bound >= 0 else 0.0
        released = np.maximum(applied[:, :, j], gate)
    flat = applied.reshape(MC_REPLICAS, -1)
    return float(np.partition(flat, pushes - 1, axis=1)[:, pushes - 1].mean()), _staleness(applied, bound, pushes)


def _staleness(applied: np.ndarray, bound: int, pushes: int) -> float:
    """Mean staleness of the first ``pushes`` pushes of :func:`ssp_clock`'s recurrence, applied one
    at a time, ties by client; a client fetches at rank max(r_k(j-1), max_l r_l(j-1-s)), -1 at first."""
    reps, n_cl, per_client = applied.shape
    order = np.lexsort((np.broadcast_to(np.arange(n_cl)[None, :, None], applied.shape).reshape(reps, -1),
                        applied.reshape(reps, -1)))
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    rank = rank.reshape(applied.shape)
    fetch = np.full(applied.shape, -1)
    fetch[:, :, 1:] = rank[:, :, :-1]
    if per_client > bound + 1:   # the wait for round j - 1 - s's latest push
        latest = rank[:, :, :per_client - bound - 1].max(1, keepdims=True)
        fetch[:, :, bound + 1:] = np.maximum(fetch[:, :, bound + 1:], latest)
    first = rank < pushes
    return float((rank - fetch - 1)[first].mean())


def predict(tm: Timing, protocol: str, backups: int, bound: int, pushes: int) -> dict:
    """Predicted applied segments/s, server updates/s and (sync) round time of one protocol."""
    if protocol == "sync":
        round_s = sync_round_s(tm, backups)
        return {"segments_per_s": (tm.num_clients - backups) / round_s,
                "updates_per_s": 1.0 / round_s, "mean_round_s": round_s}
    if protocol == "ssp":
        time_s, staleness = ssp_clock(tm, bound, pushes)
        return {"segments_per_s": pushes / time_s, "updates_per_s": pushes / time_s, "mean_staleness": staleness}
    rate = async_segments_per_s(tm)
    return {"segments_per_s": rate, "updates_per_s": rate}   # every push a server update


def timing(cost, nsync: int, num_clients: int, param_bytes: int) -> Timing:
    """The timing model of ``num_clients`` clients at ``nsync`` under ``cost``, messages of ``param_bytes``."""
    transfer = CostModel(cost, 0, param_bytes, cost.compute_s).transfer_s
    return Timing(cost.compute_s, cost.jitter, cost.jitter_sigma, nsync, num_clients,
                  tuple(step_time(cost, k, 1.0) for k in range(1, num_clients + 1)),
                  2 * transfer + cost.server_apply_s)


def timing_of(run: pd.Series) -> Timing:
    """The timing model of a run, from its config columns."""
    cost = cost_of(run)
    return timing(cost, int(run["nsync"]), int(run["num_clients"]), message_bytes(run, cost))


def protocol_label(run: pd.Series) -> str:
    name, b = str(run["protocol.name"]), int(run.get("protocol.backup_workers", 0) or 0)
    if name == "sync" and b:
        return f"sync + {b} backup"
    if name == "ssp":
        return f"ssp (s={int(run['protocol.staleness_bound'])})"
    return name


KEYS = ["cost.profile", "protocol", "num_clients", "nsync"]
COLUMNS = [*KEYS, "seed", "run_dir", "status", "diverged", "quantity", "value", "kind", "source",
           "clock", "target"]


def sync_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Per run: applied samples/s, updates/s, the ratio to async (same profile, N, nsync, seed),
    sync's round time, time to ``target``; per grid point their predictions (none for the last)."""
    target = resolve_target(runs.runs, target)
    r = runs.runs.copy()
    r["protocol"] = [protocol_label(row) for _, row in r.iterrows()]
    one_run_each(r, [*KEYS, "seed"], "cost profile, protocol, client count, nsync and seed")
    r["samples_per_s"] = r["final_samples_seen"] / r["final_time_s"]
    r["updates_per_s"] = r["final_version"] / r["final_time_s"]
    r["mean_round_s"] = np.where(r["protocol.name"] == "sync", r["final_time_s"] / r["final_version"], np.nan)
    r["time_to_target_s"] = times_to_target(runs, target)
    same = ["cost.profile", "num_clients", "nsync", "seed"]
    base = r[r["protocol"] == "async"].set_index(same)["samples_per_s"]
    key = list(zip(r["cost.profile"], r["num_clients"], r["nsync"], r["seed"]))
    r["throughput_ratio"] = r["samples_per_s"].to_numpy() / base.reindex(key).to_numpy()
    r["target"] = target
    measured = measured_rows(r, COLUMNS, ["samples_per_s", "updates_per_s", "throughput_ratio", "mean_round_s",
                                          "time_to_target_s"])
    rows = []
    for (profile, label, n, k), group in r.groupby(KEYS, sort=False):
        run = group.iloc[0]
        tm, name = timing_of(run), str(run["protocol.name"])
        pushes = max(int(round(run["final_samples_seen"] / (run["algo.batch_size"] * k))), 1)
        pred = predict(tm, name, int(run["protocol.backup_workers"]), int(run["protocol.staleness_bound"]), pushes)
        source = SOURCES["backup" if name == "sync" and run["protocol.backup_workers"] else
                         name if name in SOURCES else "async"]
        values = {"samples_per_s": pred["segments_per_s"] * k * run["algo.batch_size"],
                  "updates_per_s": pred["updates_per_s"],
                  "throughput_ratio": pred["segments_per_s"] / async_segments_per_s(tm),
                  "mean_round_s": pred.get("mean_round_s", np.nan)}
        for q, v in values.items():
            rows.append({"cost.profile": profile, "protocol": label, "num_clients": n, "nsync": k, **PREDICTED,
                         "quantity": q, "value": v, "source": source, "clock": run["clock"], "target": target})
    out = pd.concat([measured, pd.DataFrame(rows)], ignore_index=True)
    out = out[out["value"].notna() | (out["quantity"] == "time_to_target_s")]
    return tidy(out, COLUMNS, ["cost.profile", "quantity", "protocol", "num_clients", "kind", "seed"])


PROFILE_TITLES = {"jitter_lognormal": "lognormal steps (sigma 0.5), free comm.",
                  "jitter_exponential": "exponential steps, free comm.",
                  "straggler": "client 1 is 4x slower (lan: comm. + sigma 0.1)"}


def draw_sync(frame: pd.DataFrame):
    """3 rows (throughput ratio, updates/s, time to target) x one column per cost profile;
    measured: markers (mean over seeds, bars min-max); predicted: dashed lines."""
    from matplotlib.legend_handler import HandlerTuple
    from repro.analysis.figures import (_PALETTE, DIVERGED_MARKER, _new_figure, _require, _seeds, mean_minmax,
                                        ordered, plain_log_ticks)
    _require(frame, "sync_vs_async")
    profiles = ordered(frame["cost.profile"], PROFILE_ORDER)
    protocols = ordered(frame["protocol"], PROTOCOL_ORDER)
    colors = {p: _PALETTE[i] for i, p in enumerate(protocols)}
    shift = {p: 2 ** (0.06 * (i - (len(protocols) - 1) / 2)) for i, p in enumerate(protocols)}
    fig, axes = _new_figure(len(QUANTITIES), len(profiles), panel=(3.9, 2.9), sharex=True)
    counts = sorted(int(n) for n in frame["num_clients"].unique())
    budget_note = False
    for col, profile in enumerate(profiles):
        for row, q in enumerate(QUANTITIES):
            ax = axes[row, col]
            panel = frame[(frame["cost.profile"] == profile) & (frame["quantity"] == q)]
            top = panel.loc[panel["kind"] == "measured", "value"].max()
            for p in protocols:
                mine = panel[panel["protocol"] == p]
                pred = mine[mine["kind"] == "predicted"].sort_values("num_clients")
                if len(pred):
                    ax.plot(pred["num_clients"], pred["value"], color=colors[p], linestyle="--", lw=1.3)
                mean_minmax(ax, mine[(mine["kind"] == "measured") & ~mine["diverged"].astype(bool)],
                            shift=shift[p], color=colors[p], marker="o", capsize=2, ms=4.5, lw=0.8,
                            linestyle="-" if q == "time_to_target_s" else "none")
                if q == "time_to_target_s":
                    miss = mine[(mine["kind"] == "measured") & mine["value"].isna()]
                    for diverged, marker in ((False, "v"), (True, "x")):
                        m = miss[miss["diverged"].astype(bool) == diverged]
                        if len(m):
                            budget_note = True
                            y = top * 1.6 if finite(top) else 1.0
                            ax.plot(m["num_clients"] * shift[p], [y] * len(m), linestyle="none",
                                    color=colors[p], **{**DIVERGED_MARKER, "marker": marker})
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(c) for c in counts])
            ax.minorticks_off()
            if q == "throughput_ratio":
                ax.set_ylim(0, 1.15)
            else:
                ax.set_yscale("log")
                plain_log_ticks(ax.yaxis, subs=(1.0, 2.0, 3.0, 5.0))
            ax.set(title=f"{profile}:\n{PROFILE_TITLES.get(profile, 'cost profile')}" if row == 0 else "",
                   ylabel=QUANTITIES[q] if col == 0 else "",
                   xlabel="clients N" if row == len(QUANTITIES) - 1 else "")
    handles, labels = [], []
    for p in protocols:
        src = frame.loc[(frame["protocol"] == p) & (frame["kind"] == "predicted"), "source"]
        handles.append((legend_key(colors[p], marker="o", linestyle="none"), legend_key(colors[p], linestyle="--")))
        labels.append(f"{p}   (dashed: {src.iloc[0] if len(src) else 'no prediction'})")
    handles += [legend_key(marker="o", linestyle="none"), legend_key(linestyle="--")]
    labels += ["measured: mean over seeds, bars min-max (time to target: joined by a line)",
               "predicted (none for time to target: no closed form)"]
    if budget_note:
        handles += [legend_key(linestyle="none", **{**DIVERGED_MARKER, "marker": "v"}),
                    legend_key(linestyle="none", **DIVERGED_MARKER)]
        labels += ["target not reached in the budget", "diverged"]
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small",
               handler_map={tuple: HandlerTuple(ndivide=None)})
    nsync = "/".join(str(int(k)) for k in sorted(frame["nsync"].unique()))
    target = float(frame["target"].iloc[0])
    fig.suptitle("Sync vs async: what a barrier costs in throughput, and what it buys in time to "
                 f"{100 * target:g}% training error\n(nsync = {nsync}; {_seeds(frame)}; virtual time)"
                 "\nc: compute time of a step, f_i: client i's "
                 "slowdown, S: a segment of nsync steps (mean-1 factors), o: 2 x transfer + server apply")
    return fig


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured (mean over seeds) beside predicted throughput ratio, updates/s, sync round."""
    f = frame[frame["quantity"].isin(["throughput_ratio", "updates_per_s", "mean_round_s"])]
    f = f[~f["diverged"].astype(bool)]
    out = f.pivot_table(index=["cost.profile", "protocol", "num_clients"], columns=["quantity", "kind"],
                        values="value", aggfunc="mean")
    out.columns = [f"{q}_{k}" for q, k in out.columns]
    return out.reset_index()


register_figure("sync_vs_async", sync_frame, draw_sync, exps=("sync_vs_async",), extra=printed_table(table),
                axes=("num_clients", "protocol.name", "protocol.backup_workers", "cost."))
