"""Time to a target error, per-run speedups and the speedup table (the numbers behind fig4), defined
here once so that the figure and the table agree (docs/paper.md, 'What a figure's CSV holds').
"""
from __future__ import annotations

import math
import warnings

import pandas as pd

from repro.analysis.load import GROUP_COLUMNS, NoRunsError, Runs, finite

# A 1-client reference must agree with the N-client run on these (when present) and on the seed.
REFERENCE_KEYS = ("exp_name", "start", "backend.name", "config_id", "seed")
OUTCOMES = ("ok", "diverged", "not_reached", "no_reference", "reached_at_start")
TABLE_COLUMNS = ("nsync", "num_clients", "speedup_mean", "speedup_std", "speedup_min",
                 "speedup_max", "n", "n_runs", "n_diverged", "n_not_reached", "n_no_reference",
                 "time_to_target_mean_s", "target")


def resolve_target(frame: pd.DataFrame, override: float | None = None) -> float:
    """The target error: ``override`` if given, else the runs' config ``target_error`` (the
    first in run order, with a warning, when the runs disagree)."""
    if override is not None:
        return float(override)
    column = frame["target_error"] if "target_error" in frame else pd.Series(dtype=float)
    values = list(dict.fromkeys(float(v) for v in column if finite(v)))
    if not values:
        raise NoRunsError("target_error", None, "a target_error in the runs' config.json, "
                                                "or --target")
    if len(values) > 1:
        warnings.warn(f"runs disagree on target_error {values}; using {values[0]}", stacklevel=2)
    return values[0]


def time_to_target(evals: pd.DataFrame, target: float, metric: str = "train_error") -> pd.DataFrame:
    """One row per run: its grouping columns, ``clock``, ``target`` and ``time_to_target_s``, the
    first evaluation time at which ``metric`` <= ``target`` (the uneven lab's: ``train_loss``)."""
    keep = [c for c in ("run_dir", *GROUP_COLUMNS, "config_id") if c in evals]
    rows = []
    for _, run in evals.groupby("run_dir", sort=True):
        run = run.sort_values(["time_s", "version"], kind="stable")
        hit = run.loc[run[metric] <= target, "time_s"]  # NaN errors never count
        clocks = run["clock"].dropna().unique() if "clock" in run else ()   # a figures folder's CSV may lack it
        rows.append({**run.iloc[0][keep].to_dict(),
                     "clock": clocks[0] if len(clocks) == 1 else "mixed",
                     "target": float(target),
                     "time_to_target_s": float(hit.iloc[0]) if len(hit) else math.nan})
    return pd.DataFrame(rows, columns=[*keep, "clock", "target", "time_to_target_s"])


def times_to_target(runs: Runs, target: float, metric: str = "train_error") -> pd.Series:
    """:func:`time_to_target` of each run of ``runs.runs``, in its order (a lab frame's column)."""
    times = time_to_target(runs.evals, target, metric).set_index("run_dir")["time_to_target_s"]
    return runs.runs["run_dir"].map(times)


def _reference(row: pd.Series, ones: pd.DataFrame) -> pd.Series | None:
    keys = [k for k in REFERENCE_KEYS if k in ones]   # two missing values (None/NaN) also match
    match = ones[[all((pd.isna(r[k]) and pd.isna(row[k])) or bool(r[k] == row[k]) for k in keys)
                  for _, r in ones.iterrows()]]
    if match.empty:
        return None
    same_nsync = match[match["nsync"] == row["nsync"]]
    pool = same_nsync if len(same_nsync) else match
    pool = pool[pool["nsync"] == pool["nsync"].min()].sort_values("run_dir", kind="stable")
    if len(pool) > 1:
        warnings.warn(f"{len(pool)} 1-client runs could be the reference of {row['run_dir']} "
                      f"({', '.join(pool['run_dir'])}); using the first. Draw one configuration "
                      "(python -m repro.analysis NAME --config ...) to have exactly one",
                      stacklevel=3)
    return pool.iloc[0]


def run_speedups(evals: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per run: time to target, its 1-client reference, ``speedup`` and ``outcome`` (one of
    :data:`OUTCOMES`; ``speedup`` is finite only for ``ok``)."""
    times = time_to_target(evals, target)
    ones = times[times["num_clients"] == 1]
    rows = []
    for _, row in times.iterrows():
        ref = _reference(row, ones)
        ref_t = math.nan if ref is None or ref["status"] == "diverged" else ref["time_to_target_s"]
        t = row["time_to_target_s"]
        first = {"diverged": row["status"] == "diverged", "no_reference": not finite(ref_t),
                 "not_reached": not finite(t), "reached_at_start": t <= 0 or ref_t <= 0}   # the first that holds
        outcome = next((o for o, holds in first.items() if holds), "ok")
        rows.append({**row.to_dict(),
                     "ref_run_dir": None if ref is None else ref["run_dir"],
                     "ref_time_s": ref_t,
                     "speedup": ref_t / t if outcome == "ok" else math.nan,
                     "outcome": outcome})
    out = pd.DataFrame(rows, columns=[*times.columns, "ref_run_dir", "ref_time_s", "speedup",
                                      "outcome"])
    if (out["outcome"] == "reached_at_start").any():
        warnings.warn(f"some runs meet target error {target} at time 0 (warm start?): "
                      "no speedup can be measured for them; choose a lower --target",
                      stacklevel=2)
    return out


def summarise_speedups(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per-run speedups -> one row per (nsync, num_clients): mean/std/min/max and a count per outcome
    but ``reached_at_start`` (``n`` counts ``ok``; the columns: REPRODUCE.md)."""
    keys = [k for k in ("exp_name", "start", "backend.name")
            if k in per_run and per_run[k].nunique(dropna=False) > 1]
    keys += ["nsync", "num_clients"]
    rows = []
    for key, g in per_run.groupby(keys, sort=True, dropna=False):
        ok = g["outcome"] == "ok"
        s = g.loc[ok, "speedup"].astype(float)
        rows.append({**dict(zip(keys, key)),
                     "speedup_mean": s.mean(), "speedup_std": s.std(ddof=1),
                     "speedup_min": s.min(), "speedup_max": s.max(), "n": int(ok.sum()),
                     "n_runs": len(g),   # a run at its target at time 0: in n_runs alone
                     **{f"n_{o}": int((g["outcome"] == o).sum())
                        for o in ("diverged", "not_reached", "no_reference")},
                     "time_to_target_mean_s": g.loc[ok, "time_to_target_s"].mean(),
                     "target": g["target"].iloc[0]})
    return pd.DataFrame(rows, columns=[*keys[:-2], *TABLE_COLUMNS])


def speedup_table(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """The speedup table of ``runs`` at ``target`` (default: the runs' config ``target_error``,
    see :func:`resolve_target`)."""
    return summarise_speedups(run_speedups(runs.evals, resolve_target(runs.runs, target)))


def format_speedup_table(table: pd.DataFrame) -> str:
    """The table as fixed-width text for the terminal."""
    if table.empty:
        return "(no runs)"
    target = table["target"].iloc[0]
    body = table.drop(columns="target").to_string(index=False, float_format=lambda x: f"{x:.3g}",
                                                  na_rep="-")
    return f"speedup to training error <= {target:g} (1 client / N clients, over seeds)\n{body}"
