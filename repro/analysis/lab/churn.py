"""Staleness lab, ``churn`` (``python -m repro.run +exp=churn``): what losing and regaining clients
costs. Owns the figure: per protocol, samples per virtual second and time to target against the
preemption rate, beside what the live-client count alone predicts (TEACHING.md, step 9)."""
from __future__ import annotations

import pandas as pd

from repro.analysis.configs import one_run_each
from repro.analysis.render import register_figure
from repro.analysis.load import Runs
from repro.analysis.tables import resolve_target, times_to_target
from repro.files.schema import target_key

COLUMNS = ["protocol", "preempt_rate", "seed", "samples_per_s", "predicted_samples_per_s",
           "time_to_target_s", "live_fraction"]


def churn_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """One row per run: throughput, time to target, and the live-client prediction from its protocol's no-churn runs."""
    t = runs.runs
    if t.empty:
        return pd.DataFrame(columns=COLUMNS)
    # the frame has no column for a client count or another cost setting: two runs of one row
    # were averaged into one point and one prediction (a 2- and a 4-client run)
    one_run_each(t, ["protocol.name", "cost.churn.preempt_rate", "seed"], "protocol, preemption rate and seed")
    target = resolve_target(t, target)
    # a --target the summaries do not key: the evaluations, timed by the summaries' own rule
    ttt = f"time_to_target.{target_key(target)}"
    times = pd.to_numeric(t[ttt], errors="coerce") if ttt in t else times_to_target(runs, target)
    rows = pd.DataFrame({
        "protocol": t["protocol.name"].astype(str), "preempt_rate": t["cost.churn.preempt_rate"].astype(float),
        "seed": t["seed"].astype(int),
        "samples_per_s": t["final_samples_seen"].astype(float) / t["final_time_s"].astype(float),
        "time_to_target_s": times,
        "live_fraction": 1.0 / (1.0 + t["cost.churn.preempt_rate"].astype(float)
                                * t["cost.churn.preempt_down_s"].astype(float)),
    })
    base = rows[rows.preempt_rate == 0].groupby("protocol").samples_per_s.mean()
    rows["predicted_samples_per_s"] = rows.protocol.map(base) * rows.live_fraction
    out = rows[COLUMNS].sort_values(["protocol", "preempt_rate", "seed"]).reset_index(drop=True)
    # the title's client count rides on attrs, not a column, so churn.csv keeps its columns
    out.attrs["num_clients"] = sorted(int(n) for n in t["num_clients"].unique())
    return out


def draw_churn(frame: pd.DataFrame):
    from repro.analysis.figures import _new_figure, _require, plural
    _require(frame, "churn")
    fig, axes = _new_figure(1, 2, panel=(4.6, 3.4))
    mean = frame.groupby(["protocol", "preempt_rate"], as_index=False).mean(numeric_only=True)
    for name, d in mean.groupby("protocol"):
        line, = axes.flat[0].plot(d.preempt_rate, d.samples_per_s, "o-", label=name)
        axes.flat[0].plot(d.preempt_rate, d.predicted_samples_per_s, "--", color=line.get_color(),
                          label=f"{name}: live clients alone")
        axes.flat[1].plot(d.preempt_rate, d.time_to_target_s, "o-", label=name)
    axes.flat[0].set(xlabel="preemptions per client per virtual second", ylabel="samples per virtual second",
                     title="throughput under churn")
    axes.flat[1].set(xlabel="preemptions per client per virtual second", ylabel="virtual seconds",
                     title="time to target (mean over seeds that reached it)")
    for ax in axes.flat:
        ax.legend(fontsize="x-small")
    counts = frame.attrs["num_clients"]
    clients = plural(counts[0], "client") if len(counts) == 1 else f"{'/'.join(map(str, counts))} clients"
    fig.suptitle(f"What churn costs: {clients}, preempted clients back after cost.churn.preempt_down_s")
    return fig


register_figure("churn", churn_frame, draw_churn, exps=("churn",), axes=("num_clients", "protocol.name", "cost."))
