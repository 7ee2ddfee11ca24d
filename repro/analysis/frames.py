"""The tidy frame behind each figure, ``figN_frame(runs) -> DataFrame``: which runs and columns
it shows; the figure draws it and the CLI saves it as ``figures/<name>.csv`` (its columns:
docs/paper.md, 'What a figure's CSV holds').
"""
from __future__ import annotations

import dataclasses
import json
import typing
import warnings

import numpy as np
import pandas as pd

from repro.analysis.load import Runs, is_diverged
from repro.analysis.tables import resolve_target, run_speedups
from repro.config.settings import CostConfig

RUN_ID = ("exp_name", "run_dir", "seed", "num_clients", "nsync", "start", "backend.name",
          "status", "diverged")
CONFIG = "config_id"   # after RUN_ID when the runs were chosen as one configuration
CURVE_COLUMNS = (*RUN_ID, "clock", "version", "epoch", "time_s", "train_error_pct",
                 "test_error_pct")
START_COLUMNS = {"train_error": "start_train_error_pct", "test_error": "start_test_error_pct"}
GROUP_ONLY = ("job", "target_error")  # identity columns the figure frames leave out
METRICS = {"train_error_pct": "training error", "test_error_pct": "test error"}
# What a lab frame's predicted row holds in place of a run's identity (beside its quantity).
PREDICTED = {"seed": np.nan, "run_dir": None, "status": None, "diverged": False, "kind": "predicted"}


def measured_rows(runs: pd.DataFrame, columns: list[str], quantities) -> pd.DataFrame:
    """A lab frame's measured part: one row per (run, quantity) of ``runs`` (a column per
    quantity), with those of ``columns`` the runs have; ``kind`` and ``clock`` unless the runs say."""
    runs = runs.assign(kind=runs["kind"] if "kind" in runs else "measured", source="simulator (this run)",
                       clock=runs["clock"] if "clock" in runs else "virtual", diverged=is_diverged(runs["status"]))
    ident = [c for c in columns if c in runs and c not in ("quantity", "value")]
    return runs.melt(id_vars=ident, value_vars=list(quantities), var_name="quantity", value_name="value")


def cost_of(run: pd.Series, cls: type = CostConfig, prefix: str = "cost.") -> CostConfig:
    """A lab run's :class:`CostConfig` from its ``cost.*`` columns (absent or NaN: the field's
    default; a list: its JSON cell); a nested group from its own."""
    hints, values = typing.get_type_hints(cls), {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):   # cost.shared.*, cost.machine.*, cost.churn.*
            values[f.name] = cost_of(run, hints[f.name], f"{prefix}{f.name}.")
            continue
        v = run.get(f"{prefix}{f.name}")
        if v is None or (isinstance(v, float) and np.isnan(v)):
            continue
        if typing.Optional[int] == hints[f.name] or hints[f.name] is int:
            v = int(v)
        elif isinstance(v, str) and v.startswith("["):
            v = tuple(json.loads(v))   # cost.speeds
        values[f.name] = v.item() if isinstance(v, np.generic) else v
    return cls(**values)


def _ident(frame: pd.DataFrame, columns=RUN_ID) -> list[str]:
    """``columns`` (:data:`RUN_ID` first) with ``config_id`` after RUN_ID when ``frame`` has it."""
    return [*RUN_ID, *([CONFIG] if CONFIG in frame else []), *columns[len(RUN_ID):]]


def fig2_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Every evaluation of every run: fig2's (cold start) and fig3's (warm, a panel per nsync)."""
    ev = runs.evals.assign(diverged=is_diverged(runs.evals["status"]),
                           **{f"{m}_pct": 100.0 * runs.evals[m].astype(float) for m in START_COLUMNS})
    ev = ev.sort_values(["num_clients", "nsync", "seed", "run_dir", "time_s", "version"],
                        kind="stable")
    return ev[_ident(ev, CURVE_COLUMNS)].reset_index(drop=True)


def fig1_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Single-client baseline: training and test error (%) of every 1-client run, long format."""
    curves = fig2_frame(runs)
    curves = curves[curves["num_clients"] == 1]
    long = curves.melt(id_vars=[c for c in _ident(curves, CURVE_COLUMNS) if c not in METRICS],
                       value_vars=list(METRICS), var_name="metric", value_name="error_pct")
    long["metric"] = long["metric"].map(METRICS)
    return long.reset_index(drop=True)


def fig4_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Speedup per run at ``target`` (default: the runs' config ``target_error``)."""
    per_run = run_speedups(runs.evals, resolve_target(runs.runs, target))
    per_run["diverged"] = is_diverged(per_run["status"])
    if len(per_run) and not (per_run["outcome"] == "ok").any():
        warnings.warn("no run gives a speedup (outcomes: "
                      f"{per_run['outcome'].value_counts().to_dict()})", stacklevel=2)
    first = (runs.evals.sort_values(["time_s", "version"], kind="stable")
             .groupby("run_dir")[list(START_COLUMNS)].first())
    for column, name in START_COLUMNS.items():   # where the run started (compare: the baseline)
        per_run[name] = 100.0 * per_run["run_dir"].map(first[column]).astype(float)
    ident = _ident(per_run)
    extra = [c for c in per_run if c not in ident and c not in GROUP_ONLY]
    return per_run[[*ident, *extra]]


def staleness_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Staleness histogram of each run's pushes plus its final test error (%), stacked."""
    ident = [c for c in _ident(runs.runs) if c != "diverged"]
    hist = (runs.updates.groupby([*ident, "staleness"], dropna=False, sort=True).size()
            .rename("count").reset_index().rename(columns={"staleness": "value"}))
    hist.insert(len(ident), "quantity", "staleness")
    final = runs.runs[ident].assign(quantity="final_test_error_pct",
                                    value=100.0 * final_test_error(runs).to_numpy(), count=1)
    out = pd.concat([hist, final], ignore_index=True)
    out = out.assign(diverged=is_diverged(out["status"])).sort_values(
        ["quantity", "num_clients", "nsync", "seed", "run_dir", "value"], kind="stable")
    return out[[*_ident(out), "quantity", "value", "count"]].reset_index(drop=True)


def final_test_error(runs: Runs) -> pd.Series:
    """summary.json ``final.test_error``; the last evaluation's when the summary lacks it."""
    final = pd.to_numeric(runs.runs.get("final_test_error", pd.Series(np.nan, runs.runs.index)),
                          errors="coerce")
    last = (runs.evals.sort_values(["time_s", "version"], kind="stable")
            .groupby("run_dir")["test_error"].last())
    return final.fillna(runs.runs["run_dir"].map(last))
