"""Staleness lab, ``mitigation`` (``python -m repro.run +exp=mitigation``): plain asynchronous
Downpour against its mitigations (:data:`MITIGATIONS`) at one client count, per nsync and seed.
Owns the figure's tidy frame (final test error, time to target, measured staleness beside the
expected staleness: no closed form exists for the error), drawing and table (TEACHING.md, step 5)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from repro.analysis.render import printed_table, register_figure
from repro.analysis.frames import PREDICTED, final_test_error, measured_rows
from repro.analysis.lab import legend_key, tidy
from repro.analysis.load import Runs, finite, is_diverged
from repro.analysis.tables import resolve_target, times_to_target

# (server rule, protocol) -> (short name on the axis, legend text with the source)
MITIGATIONS = {
    ("downpour", "async"): ("async", "async: Downpour, w -= lr sum g (Dean et al. 2012)"),
    ("staleness_scaled", "async"): ("staleness-scaled", "staleness-scaled: step / tau (Zhang et al. 2016)"),
    ("dcasgd", "async"): ("DC-ASGD-c", "DC-ASGD-c: g + lambda g*g*(w - w_bak) (Zheng et al. 2017)"),
    ("downpour", "ssp"): ("ssp", "ssp: wait when s pushes ahead (Ho et al. 2013)"),
    ("downpour", "sync"): ("sync", "sync: mean of the N pushes per round, staleness 0"),
}
QUANTITIES = ("final_test_error_pct", "time_to_target_s", "mean_staleness_steps",
              "mean_staleness_versions", "max_staleness_versions")
COLUMNS = ["mitigation", "server_rule", "protocol", "num_clients", "nsync", "seed", "run_dir",
           "status", "diverged", "quantity", "value", "kind", "source", "clock", "target",
           "algo.lr", "algo.momentum", "cost.profile"]


def mitigation_of(rule: str, protocol: str) -> str:
    return MITIGATIONS.get((rule, protocol), (f"{rule}+{protocol}",))[0]


def expected_mean_staleness(num_clients: int, pushes: int) -> float:
    """Mean staleness (server versions) of P async pushes of N equally fast clients: the first
    N pushes see 0, 1, .., N - 1 updates, every later one N - 1: (N-1)(1 - N/2P) for P >= N."""
    n, p = num_clients, max(pushes, 1)
    first = min(n, p)
    return (first * (first - 1) / 2 + (p - first) * (n - 1)) / p


def ssp_staleness_bound(num_clients: int, bound: int) -> int:
    """Worst staleness (versions) under SSP: while a client computes, each other client can go
    from s pushes behind it to s + 1 ahead before the clock rule holds it: (2s + 1)(N - 1)."""
    return (2 * bound + 1) * (num_clients - 1)


def mitigation_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """One row per (run, quantity) measured, plus the expected staleness per grid point."""
    target = resolve_target(runs.runs, target)
    r = runs.runs.copy()
    r["server_rule"], r["protocol"] = r["algo.server_rule"], r["protocol.name"]
    r["mitigation"] = [mitigation_of(a, b) for a, b in zip(r["server_rule"], r["protocol"])]
    r["diverged"] = is_diverged(r["status"])
    r["final_test_error_pct"] = 100.0 * final_test_error(runs)
    r["time_to_target_s"] = times_to_target(runs, target)
    st = runs.updates.groupby("run_dir")["staleness"].agg(["mean", "max"])
    r["mean_staleness_versions"] = r["run_dir"].map(st["mean"])
    r["max_staleness_versions"] = r["run_dir"].map(st["max"])
    r["mean_staleness_steps"] = r["mean_staleness_versions"] * r["nsync"]
    r["target"] = target
    measured = measured_rows(r, COLUMNS, QUANTITIES)
    rows = []
    for (mit, rule, proto, n, k), g in r.groupby(["mitigation", "server_rule", "protocol",
                                                  "num_clients", "nsync"], sort=False):
        pushes = int(g.loc[~g["diverged"], "final_version"].max()) if (~g["diverged"]).any() \
            else int(g["final_version"].max())
        base = {"mitigation": mit, "server_rule": rule, "protocol": proto, "num_clients": n,
                "nsync": k, **PREDICTED, "clock": g["clock"].iloc[0], "target": target,
                **{c: g[c].iloc[0] for c in ("algo.lr", "algo.momentum", "cost.profile")}}
        mean, src = ((0.0, "sync: 0 by construction") if proto == "sync" else
                     (expected_mean_staleness(int(n), pushes), "(N-1)(1 - N/2P) versions, equal speeds"))
        rows += [{**base, "quantity": "mean_staleness_versions", "value": mean, "source": src},
                 {**base, "quantity": "mean_staleness_steps", "value": mean * k, "source": src}]
        if proto == "ssp":
            s = int(g["protocol.staleness_bound"].iloc[0])
            rows.append({**base, "quantity": "max_staleness_versions", "source": "(2s+1)(N-1): SSP bound",
                         "value": float(ssp_staleness_bound(int(n), s))})
    return tidy(pd.concat([measured, pd.DataFrame(rows, columns=COLUMNS)], ignore_index=True), COLUMNS,
                ["quantity", "mitigation", "nsync", "kind", "seed"], mitigation=[m[0] for m in MITIGATIONS.values()])


def draw_mitigation(frame: pd.DataFrame):
    """(a) final test error, (b) time to target, (c) mean staleness in local steps; x: the
    mitigation, one colour per nsync; mean over seeds with min-max bars, diverged runs 'x'."""
    from repro.analysis.figures import (DIVERGED_MARKER, _new_figure, _require, _seeds, nsync_colors, ordered,
                                        plain_log_ticks)
    _require(frame, "mitigation")
    names = ordered(frame["mitigation"], [m[0] for m in MITIGATIONS.values()])
    levels = sorted(int(k) for k in frame["nsync"].unique())
    colors = nsync_colors(levels)
    width = 0.62 / max(len(levels), 1)
    pos = {(m, k): i + (j - (len(levels) - 1) / 2) * width
           for i, m in enumerate(names) for j, k in enumerate(levels)}
    fig, axes = _new_figure(1, 3, panel=(4.6, 5.6))
    target = float(frame["target"].iloc[0])
    panels = (("final_test_error_pct", "final test error (%)",
               "(a) final test error\n(no closed-form prediction exists: none drawn)"),
              ("time_to_target_s", "time to target (virtual s)",
               f"(b) time to {100 * target:g}% training error\n(no closed-form prediction)"),
              ("mean_staleness_steps", "mean staleness (local steps)",
               "(c) staleness each push saw, in local steps\n(= server versions x nsync; dashed: expected)"))
    for ax, (q, ylabel, title) in zip(axes[0], panels):
        panel = frame[frame["quantity"] == q]
        meas = panel[panel["kind"] == "measured"]
        # a diverged run's staleness is still what its pushes saw: only errors and times drop it
        bad = meas["value"].isna() | (meas["diverged"].astype(bool) & (q != "mean_staleness_steps"))
        ok, missing = meas[~bad], meas[bad]
        top = ok["value"].max() if len(ok) else 1.0
        for (m, k), g in ok.groupby(["mitigation", "nsync"]):
            v = g["value"]
            ax.errorbar([pos[(m, int(k))]], [v.mean()], yerr=[[v.mean() - v.min()], [v.max() - v.mean()]],
                        color=colors[int(k)], marker="o", capsize=3, ms=5)
        for _, row in missing.iterrows():
            diverged = bool(row["diverged"])
            y = row["value"] if q == "final_test_error_pct" and finite(row["value"]) else top * 1.5
            ax.plot([pos[(row["mitigation"], int(row["nsync"]))]], [y], linestyle="none",
                    color=colors[int(row["nsync"])],
                    **{**DIVERGED_MARKER, "marker": "x" if diverged else "v"})
        for _, row in panel[panel["kind"] == "predicted"].iterrows():
            x = pos[(row["mitigation"], int(row["nsync"]))]
            ax.plot([x - width / 2, x + width / 2], [row["value"]] * 2, color=colors[int(row["nsync"])],
                    linestyle="--", lw=1.4)
        if q == "mean_staleness_steps":
            ax.set_yscale("symlog", linthresh=1.0)
            plain_log_ticks(ax.yaxis)
        else:
            ax.set_yscale("log")
            plain_log_ticks(ax.yaxis, subs=(1.0, 2.0, 3.0, 5.0))
        # the one long name on two lines, so the ticks do not run into each other
        ax.set_xticks(range(len(names)), [m.replace("staleness-", "staleness-\n") for m in names])
        ax.set(ylabel=ylabel, title=title, xlim=(-0.6, len(names) - 0.4))
    handles = [legend_key(colors[k], marker="o", linestyle="none") for k in levels]
    labels = [f"nsync = {k}" for k in levels]
    handles += [legend_key(marker="o", linestyle="none"), legend_key(linestyle="none", **DIVERGED_MARKER),
                legend_key(linestyle="none", **{**DIVERGED_MARKER, "marker": "v"}), legend_key(linestyle="--")]
    labels += ["measured: mean over seeds, bars min-max (finished runs)",
               "diverged run ((a): its last test error; (b): above the data)",
               "target not reached within the budget",
               "expected staleness: (N-1)(1 - N/2P) versions x nsync for P pushes (equal speeds); sync 0"]
    sources = [text for short, text in MITIGATIONS.values() if short in names]   # each x label, with its source
    handles += [legend_key("none") for _ in sources]
    labels += sources
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small",
               columnspacing=4.0)
    n = "/".join(str(int(v)) for v in sorted(frame["num_clients"].unique()))
    first = frame.iloc[0]
    fig.suptitle(f"Mitigating staleness: {n} clients, plain async Downpour vs its fixes, per nsync\n"
                 f"(client SGD lr {first['algo.lr']:g}, momentum {first['algo.momentum']:g}; cost "
                 f"{first['cost.profile']}; {_seeds(frame)}; virtual time)")
    return fig


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (mitigation, nsync): final test error and time to target (mean, min, max over seeds),
    runs diverged / not reaching the target, and mean staleness measured vs expected."""
    meas = frame[frame["kind"] == "measured"]
    expected = frame[frame["kind"] == "predicted"].set_index(["mitigation", "nsync", "quantity"])["value"]
    rows = []
    for (m, k), g in meas.groupby(["mitigation", "nsync"], sort=False):
        def stat(q, ok_only=True):
            v = g[(g["quantity"] == q) & (~g["diverged"].astype(bool) if ok_only else True)]["value"]
            return v.mean(), v.min(), v.max()
        err, ttt = stat("final_test_error_pct"), stat("time_to_target_s")
        runs = g[g["quantity"] == "time_to_target_s"]
        rows.append({"mitigation": m, "nsync": int(k), "final_test_err_pct": err[0],
                     "err_min": err[1], "err_max": err[2], "time_to_target_s": ttt[0],
                     "ttt_min": ttt[1], "ttt_max": ttt[2], "runs": len(runs),
                     "diverged": int(runs["diverged"].astype(bool).sum()),
                     "not_reached": int(runs["value"].isna().sum()),
                     "staleness_measured": stat("mean_staleness_versions", False)[0],
                     "staleness_expected": expected.get((m, k, "mean_staleness_versions"), np.nan),
                     "max_staleness": stat("max_staleness_versions", False)[2],
                     "ssp_bound": expected.get((m, k, "max_staleness_versions"), np.nan)})
    return pd.DataFrame(rows)


# its axes: +mitigation chooses the server rule and the protocol
register_figure("mitigation", mitigation_frame, draw_mitigation, exps=("mitigation",),
                extra=printed_table(table), axes=("nsync", "algo.server_rule", "protocol.name"))
