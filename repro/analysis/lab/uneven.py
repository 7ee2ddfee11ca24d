"""Staleness lab, ``uneven`` (``python -m repro.run +exp=uneven``): clients of different speeds, and
the methods made for them. Owns the figure's tidy frame (virtual time per server step and to a
target training loss; the predicted time per step where a closed form exists: TEACHING.md, step 7),
its drawing and table, and the names of the methods the lab compares (:func:`method_of`)."""
from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd

from repro.analysis.render import printed_table, register_figure
from repro.analysis.frames import PREDICTED, cost_of, measured_rows
from repro.analysis.lab import legend_key, tidy
from repro.analysis.tables import times_to_target
from repro.analysis.load import Runs, finite
from repro.sim.cost import step_time

TARGET_LOSS = 0.5   # training loss (cross-entropy, nats) whose first crossing times the methods
QUANTITIES = ("step_time_s", "time_to_target_s", "final_test_error_pct", "final_train_loss")
COLUMNS = ["method", "family", "server_rule", "protocol", "collection_size", "staleness_threshold",
           "num_clients", "nsync", "seed", "run_dir", "status", "diverged", "quantity", "value",
           "kind", "source", "clock", "target_loss", "cost.profile", "algo.lr"]
FAMILY_ORDER = ("async", "staleness-scaled", "ssp", "EASGD", "sync", "sync + backup", "Rennala", "Ringmaster")


def _int(value) -> int | None:
    return int(value) if finite(value) else None


def method_of(run: pd.Series) -> tuple[str, str]:
    """(method, family) of a run from its config columns: "Rennala S=4" in family "Rennala"."""
    rule, proto = run["algo.server_rule"], run["protocol.name"]
    n = int(run["num_clients"])
    if proto == "rennala":
        s = _int(run.get("protocol.collection_size")) or n
        return f"Rennala S={s}", "Rennala"
    if proto == "ringmaster":
        r = _int(run.get("protocol.staleness_threshold")) or n
        return f"Ringmaster R={r}", "Ringmaster"
    if proto == "sync":
        b = _int(run.get("protocol.backup_workers")) or 0
        return (f"sync + {b} backup", "sync + backup") if b else ("sync", "sync")
    if proto == "ssp":
        return f"ssp s={_int(run.get('protocol.staleness_bound'))}", "ssp"
    family = {"staleness_scaled": "staleness-scaled", "easgd": "EASGD", "downpour": "async"}.get(rule, rule)
    return family, family


def method_order(methods) -> list[str]:
    """Families in :data:`FAMILY_ORDER`, S and R ascending within theirs."""
    def key(m: str):
        family = next((i for i, f in enumerate(FAMILY_ORDER) if m.startswith(f)), len(FAMILY_ORDER))
        number = m.rsplit("=", 1)[-1]
        return family, int(number) if number.isdigit() else 0, m
    return sorted(set(methods), key=key)


def segment_times(run: pd.Series) -> list[float]:
    """tau_1..tau_N: each client's segment time, as the simulator's clock has it without jitter."""
    cost = cost_of(run)
    steps = int(run["nsync"]) * cost.compute_s
    return [step_time(cost, k, steps) for k in range(1, int(run["num_clients"]) + 1)]


def collection_time(taus: list[float], size: int) -> float:
    """Rennala's collection time t(S) = min{t : sum_i floor(t / tau_i) >= S}, the S-th push time."""
    heap = [(tau, tau, i) for i, tau in enumerate(taus)]
    heapq.heapify(heap)
    t = 0.0
    for _ in range(size):
        t, tau, i = heapq.heappop(heap)
        heapq.heappush(heap, (t + tau, tau, i))
    return t


def predicted_step_time(run: pd.Series) -> tuple[float, str]:
    """(time per server step, what it is) for the run's method, or (nan, reason)."""
    taus = segment_times(run)
    if run.get("cost.jitter", "none") != "none" or finite(run.get("cost.bandwidth_Bps")) \
            or float(run.get("cost.latency_s", 0.0)) or float(run.get("cost.server_apply_s", 0.0)):
        return math.nan, "none: the closed forms need fixed step times and free communication"
    proto = run["protocol.name"]
    if proto == "rennala":
        s = _int(run.get("protocol.collection_size")) or len(taus)
        return collection_time(taus, s), "t(S) = min{t : sum floor(t/tau_i) >= S} (Tyurin & Richtarik 2023)"
    if proto == "async":
        return 1.0 / sum(1.0 / t for t in taus), "1 / sum(1/tau_i): every push a step"
    if proto == "sync":
        b = _int(run.get("protocol.backup_workers")) or 0
        return sorted(taus)[len(taus) - b - 1], ("max tau_i: the slowest" if not b else
                                                 f"the (N-{b})-th smallest tau_i (Chen et al. 2016)")
    return math.nan, f"none: {proto} has no closed form here"


def uneven_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """One row per (run, quantity) measured, and the predicted step time of each method with one;
    ``target``: the training loss to reach (default :data:`TARGET_LOSS`)."""
    target = TARGET_LOSS if target is None else float(target)
    r = runs.runs.copy()
    r["method"], r["family"] = zip(*(method_of(row) for _, row in r.iterrows()))
    r["server_rule"], r["protocol"] = r["algo.server_rule"], r["protocol.name"]
    for col in ("collection_size", "staleness_threshold"):
        r[col] = r.get(f"protocol.{col}", np.nan)
    last = runs.updates.sort_values("version").groupby("run_dir")["time_s"].last()
    steps = runs.updates.groupby("run_dir")["version"].max()
    r["step_time_s"] = r["run_dir"].map(last / steps)   # from time 0 to the last apply
    r["time_to_target_s"] = times_to_target(runs, target, "train_loss")
    r["final_test_error_pct"] = 100.0 * pd.to_numeric(r["final_test_error"], errors="coerce")
    r["final_train_loss"] = pd.to_numeric(r["final_train_loss"], errors="coerce")
    r["target_loss"] = target
    measured = measured_rows(r, COLUMNS, QUANTITIES)
    ident = [c for c in COLUMNS if c in r and c not in ("quantity", "value")]
    rows = []
    for method, g in r.groupby("method", sort=False):
        first = g.iloc[0]
        value, source = predicted_step_time(first)
        if finite(value):
            rows.append({**{c: first[c] for c in ident}, **PREDICTED, "source": source,
                         "quantity": "step_time_s", "value": value})
    base = {c: r.iloc[0][c] for c in ident}   # the cluster itself: each client's segment time
    rows += [{**base, "method": "cluster", "family": "cluster", **PREDICTED, "quantity": "tau_s", "value": tau,
              "source": f"client {k}: nsync x compute_s x its relative step time"}
             for k, tau in enumerate(segment_times(r.iloc[0]), start=1)]
    out = pd.concat([measured, pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True)
    return tidy(out, COLUMNS, ["quantity", "method", "kind", "seed"], method=method_order(out["method"]))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per method: time per step measured (mean over seeds) / predicted, time to the target loss
    (mean, min, max; how many runs missed it), final test error."""
    meas = frame[frame["kind"] == "measured"]
    step = frame[(frame["kind"] == "predicted") & (frame["quantity"] == "step_time_s")].set_index("method")["value"]
    rows = []
    for method in method_order(meas["method"]):
        g = meas[meas["method"] == method]
        q = lambda name: g[g["quantity"] == name]["value"]   # noqa: E731
        ttt = q("time_to_target_s")
        rows.append({"method": method, "runs": len(ttt), "step_s": q("step_time_s").mean(),
                     "step_predicted_s": step.get(method, np.nan),
                     "time_to_target_s": ttt.mean(), "ttt_min": ttt.min(), "ttt_max": ttt.max(),
                     "not_reached": int(ttt.isna().sum()),
                     "diverged": int(g[g["quantity"] == "step_time_s"]["diverged"].astype(bool).sum()),
                     "final_test_err_pct": q("final_test_error_pct").mean()})
    return pd.DataFrame(rows)


def draw_uneven(frame: pd.DataFrame):
    """(a) time per server step per method, measured vs predicted; (b) Rennala's step time
    against S beside t(S); (c) time to the target loss; (d) final test error."""
    import matplotlib as mpl
    from repro.analysis.figures import DIVERGED_MARKER, _new_figure, _require, _seeds
    _require(frame, "uneven")
    methods = method_order(frame.loc[frame["kind"] == "measured", "method"])
    families = [f for f in FAMILY_ORDER if f in set(frame["family"])]
    colors = dict(zip(families, mpl.colormaps["tab10"].colors))
    x = {m: i for i, m in enumerate(methods)}
    meas, pred = frame[frame["kind"] == "measured"], frame[frame["kind"] == "predicted"]
    fig, axes = _new_figure(2, 2, panel=(7.2, 3.9))
    (a, b), (c, d) = axes
    family = dict(zip(frame["method"], frame["family"]))

    def per_method(ax, quantity):
        g = meas[meas["quantity"] == quantity]
        ok = g[g["value"].notna() & ~g["diverged"].astype(bool)]
        for m, v in ok.groupby("method")["value"]:
            ax.errorbar([x[m]], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]],
                        color=colors[family[m]], marker="o", capsize=3, ms=5, linestyle="none")
        top = ok["value"].max() if len(ok) else 1.0
        for _, row in g[~g.index.isin(ok.index)].iterrows():
            style = DIVERGED_MARKER if row["diverged"] else {**DIVERGED_MARKER, "marker": "v"}
            ax.plot([x[row["method"]]], [top * 1.4], linestyle="none",
                    color=colors[family[row["method"]]], **style)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize="small")
        ax.set_xlim(-0.6, len(methods) - 0.4)

    per_method(a, "step_time_s")
    for _, row in pred[pred["quantity"] == "step_time_s"].iterrows():
        a.plot([x[row["method"]] - 0.35, x[row["method"]] + 0.35], [row["value"]] * 2, color="0.2",
               linestyle="--", lw=1.2)
    a.set(ylabel="virtual s per server step", title="(a) time per server step (dashed: predicted\n"
          "for fixed step times: t(S), 1/sum(1/tau_i), the (N-b)-th tau_i)")

    ren = meas[(meas["family"] == "Rennala") & (meas["quantity"] == "step_time_s")]
    taus = frame[(frame["quantity"] == "tau_s") & (frame["kind"] == "predicted")]["value"].tolist()
    if len(ren):
        sizes = sorted({int(v) for v in ren["collection_size"].dropna()})
        grid = np.arange(1, max(sizes) + 1)
        b.step(grid, [collection_time(taus, int(s)) for s in grid], where="post", color="0.2",
               linestyle="--", lw=1.2, label="t(S) = min{t : sum floor(t/tau_i) >= S}")
        for s, v in ren.groupby("collection_size")["value"]:
            b.plot([s] * len(v), v, linestyle="none", marker="o", color=colors["Rennala"], ms=6)
        b.plot([], [], linestyle="none", marker="o", color=colors["Rennala"], label="measured (each seed)")
        b.set(xscale="log", yscale="log", xlabel="collection size S", ylabel="virtual s per server step",
              title="(b) Rennala: a step lasts the collection time t(S)")
        b.set_xticks(sizes, [str(s) for s in sizes])
        b.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        b.legend(fontsize="small")
    else:
        b.set_visible(False)
    target = float(frame["target_loss"].iloc[0])
    per_method(c, "time_to_target_s")
    c.set(ylabel="virtual s", title=f"(c) time to training loss {target:g} (no closed-form prediction)")
    per_method(d, "final_test_error_pct")
    d.set(ylabel="final test error (%)", title="(d) final test error (no closed-form prediction)")
    handles = [legend_key(marker="o", linestyle="none"), legend_key(linestyle="none", **DIVERGED_MARKER),
               legend_key(linestyle="none", **{**DIVERGED_MARKER, "marker": "v"}), legend_key("0.2", linestyle="--")]
    labels = ["measured: mean over seeds, bars min-max", "diverged run",
              "target not reached within the budget", "predicted (fixed step times, free communication)"]
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize="small")
    first = frame.iloc[0]
    fig.suptitle(f"An uneven cluster: {int(first['num_clients'])} clients, tau_i = 1 + sqrt(i) and one "
                 f"straggler, nsync {int(first['nsync'])}\n(client SGD lr {first['algo.lr']:g}; cost "
                 f"{first['cost.profile']}; {_seeds(frame)}; virtual time)")
    return fig


# its axes are what method_of names: another algo setting (algo.lr) has no column and was pooled
register_figure("uneven", uneven_frame, draw_uneven, exps=("uneven",), extra=printed_table(table, digits=4),
                axes=("algo.server_rule", "protocol."))
