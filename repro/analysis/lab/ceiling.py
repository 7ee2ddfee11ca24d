"""Staleness lab, ``ceiling`` (``python -m repro.run +exp=ceiling``): what limits speedup, measured
beside the bound :func:`repro.sim.ceiling.ceiling` predicts from each run's cost profile. Owns the
figure's tidy frame (steady-state throughput and speedup over one client; runs without jitter a
``lockstep`` series of their own), drawing and table. The theory: TEACHING.md, step 6."""
from __future__ import annotations

import numpy as np
import pandas as pd

from repro.analysis.frames import PREDICTED, cost_of, measured_rows
from repro.analysis.render import printed_table, register_figure
from repro.analysis.lab import legend_key, message_bytes, tidy
from repro.analysis.load import Runs, finite
from repro.sim.ceiling import ceiling

KEYS = ["cost.profile", "cost.bandwidth_Bps", "nsync", "num_clients"]
COLUMNS = [*KEYS, "cost.jitter", "seed", "run_dir", "status", "diverged", "quantity", "value", "kind", "binding",
           "clock"]
# kind of a measured row: clients out of step (the profile's jitter), or in lockstep (none)
MEASURED, LOCKSTEP = "measured", "lockstep"
QUANTITIES = {"samples_per_s": "applied samples per second\n(steady state, virtual time)",
              "speedup": "speedup in throughput\n(N clients / 1 client)"}


def predict(run: pd.Series, counts) -> list:
    """The :class:`~repro.sim.ceiling.Ceiling` of the run's profile at each client count of ``counts``."""
    cost = cost_of(run)
    return [ceiling(cost, n, int(run["nsync"]), message_bytes(run, cost)) for n in counts]


def steady_samples_per_s(updates: pd.DataFrame) -> pd.Series:
    """Per run_dir: applied samples per virtual second over the second half of its pushes."""
    def steady(up: pd.DataFrame) -> float:
        mid, last = up.iloc[len(up) // 2], up.iloc[-1]
        if len(up) < 4 or last["time_s"] <= mid["time_s"]:
            return last["samples_seen"] / last["time_s"] if last["time_s"] > 0 else np.nan
        return (last["samples_seen"] - mid["samples_seen"]) / (last["time_s"] - mid["time_s"])
    return pd.Series({run_dir: steady(up.sort_values("version"))
                      for run_dir, up in updates.groupby("run_dir", sort=False)}, dtype=float)


def ceiling_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Per run: steady-state samples/s and speedup over 1 client (same profile, bandwidth, nsync,
    jitter, seed), kind ``measured`` or ``lockstep``; per grid point the bound on both and what sets it."""
    r = runs.runs.copy()
    if "cost.jitter" not in r:
        r["cost.jitter"] = "none"
    r["cost.bandwidth_Bps"] = r["cost.bandwidth_Bps"].astype(float)
    r["samples_per_s"] = r["run_dir"].map(steady_samples_per_s(runs.updates))
    same = ["cost.profile", "cost.bandwidth_Bps", "nsync", "cost.jitter", "seed"]
    one = r[r["num_clients"] == 1].set_index(same)["samples_per_s"]
    key = list(zip(*(r[c] for c in same)))
    r["speedup"] = r["samples_per_s"].to_numpy() / one.reindex(key).to_numpy()
    sigma = r["cost.jitter_sigma"].astype(float) if "cost.jitter_sigma" in r else 1.0
    lockstep = (r["cost.jitter"] == "none") | (sigma == 0)   # clients in step: no jitter, or of size 0
    r["kind"], r["binding"] = np.where(lockstep, LOCKSTEP, MEASURED), None
    measured = measured_rows(r, COLUMNS, QUANTITIES)
    rows = []   # the bound at every client count up to the largest run, so the knee shows
    for (profile, bw, k), group in r.groupby(KEYS[:3], sort=False, dropna=False):
        run = group.iloc[0]
        bounds = predict(run, range(1, int(group["num_clients"].max()) + 1))
        per_push = int(k) * int(run["algo.batch_size"])
        for bound in bounds:
            for q, v in (("samples_per_s", bound.pushes_per_s * per_push),
                         ("speedup", bound.pushes_per_s / bounds[0].pushes_per_s)):
                rows.append({"cost.profile": profile, "cost.bandwidth_Bps": bw, "nsync": k,
                             "num_clients": bound.num_clients, "cost.jitter": None, **PREDICTED,
                             "quantity": q, "value": v, "binding": bound.binding,
                             "clock": run["clock"]})
    return tidy(pd.concat([measured, pd.DataFrame(rows)], ignore_index=True), COLUMNS,
                ["cost.profile", "cost.bandwidth_Bps", "quantity", "nsync", "num_clients", "kind", "seed"])


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured (mean over seeds) beside predicted, per bandwidth, nsync and client count run."""
    index = ["cost.bandwidth_Bps", "nsync", "num_clients"]
    f = frame[~frame["diverged"].astype(bool)]
    out = f.pivot_table(index=index, columns=["quantity", "kind"], values="value", aggfunc="mean")
    out.columns = [f"{q}_{k}" for q, k in out.columns]
    binding = frame[frame["kind"] == "predicted"].drop_duplicates(index).set_index(index)["binding"]
    ran = [c for c in out.columns if c.endswith((f"_{MEASURED}", f"_{LOCKSTEP}"))]
    return out.join(binding).dropna(subset=ran, how="all").reset_index()


MARKERS = {MEASURED: dict(marker="o", ms=4.5), LOCKSTEP: dict(marker="s", ms=4.0, markerfacecolor="none")}


def draw_ceiling(frame: pd.DataFrame):
    """2 rows (samples/s, speedup) x one column per link bandwidth, one colour per nsync: measured
    out of step, filled circles; in lockstep, hollow squares; the bound, dashed."""
    from repro.analysis.figures import _PALETTE, _new_figure, _require, mean_minmax, plain_log_ticks
    _require(frame, "ceiling")
    bws = sorted(frame["cost.bandwidth_Bps"].unique(), key=lambda b: (not finite(b), b if finite(b) else 0))
    nsyncs = sorted(int(k) for k in frame["nsync"].unique())
    colors = {k: _PALETTE[i] for i, k in enumerate(nsyncs)}
    counts = sorted(int(n) for n in frame.loc[frame["kind"] != "predicted", "num_clients"].unique())
    fig, axes = _new_figure(len(QUANTITIES), len(bws), panel=(3.9, 3.0), sharex=True)
    for col, bw in enumerate(bws):
        title = f"every link {bw / 1e9:g} GB/s each way" if finite(bw) else "links: free"
        panel_bw = frame[(frame["cost.bandwidth_Bps"] == bw) | (frame["cost.bandwidth_Bps"].isna() & pd.isna(bw))]
        for row, q in enumerate(QUANTITIES):
            ax = axes[row, col]
            panel = panel_bw[panel_bw["quantity"] == q]
            for k in nsyncs:
                mine = panel[panel["nsync"] == k]
                pred = mine[mine["kind"] == "predicted"].sort_values("num_clients")
                ax.plot(pred["num_clients"], pred["value"], color=colors[k], linestyle="--", lw=1.3)
                for kind, style in MARKERS.items():
                    mean_minmax(ax, mine[(mine["kind"] == kind) & ~mine["diverged"].astype(bool)], color=colors[k],
                                lw=0.8, capsize=2, linestyle="none", **style)
                if len(pred) and (mine["kind"] != "predicted").any():   # what binds at the largest N
                    last = pred.iloc[-1]
                    ax.annotate(last["binding"], (last["num_clients"], last["value"]), color=colors[k],
                                fontsize="x-small", xytext=(3, 0), textcoords="offset points", va="center")
            if q == "speedup":
                ax.plot(counts, counts, color="0.6", lw=0.8, linestyle=":")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2 if q == "speedup" else 10)
            plain_log_ticks(ax.yaxis, subs=None if q == "speedup" else (1.0, 2.0, 5.0))
            ax.set_xticks(counts, [str(c) for c in counts])
            ax.set_xlim(counts[0] / 1.3, counts[-1] * 2.6)
            ax.minorticks_off()
            ax.set(title="" if row else title, ylabel=QUANTITIES[q] if col == 0 else "",
                   xlabel="clients N" if row == len(QUANTITIES) - 1 else "")
    handles = [legend_key(colors[k], marker="o", linestyle="--") for k in nsyncs]
    labels = [f"nsync {k}" for k in nsyncs]
    handles += [legend_key(linestyle="none", **MARKERS[MEASURED]), legend_key(linestyle="none", **MARKERS[LOCKSTEP]),
                legend_key(linestyle="--"), legend_key("0.6", linestyle=":")]
    labels += ["measured, clients out of step (the profile's jitter; steady state; bars: min-max over seeds)",
               "measured in lockstep (cost.jitter=none: clients that start together stay together)",
               "predicted bound: min(clients' own pace, each shared resource), labelled where it binds at the right",
               "linear speedup"]
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize="small")
    profile = "/".join(sorted(str(p) for p in frame["cost.profile"].unique()))
    fig.suptitle(f"What limits speedup: measured throughput beside the ceiling predicted from the cost profile "
                 f"({profile})\nclients share hosts' links, the server's link (full duplex) and its apply\n"
                 f"the bound needs clients out of step (jitter): in lockstep a link's two ways take turns")
    return fig


# its axes: with jitter and without (clients in lockstep) in one figure
register_figure("ceiling", ceiling_frame, draw_ceiling, exps=("ceiling",), extra=printed_table(table, digits=4),
                axes=("num_clients", "nsync", "cost.bandwidth_Bps", "cost.jitter"))
