"""How well the simulator predicts, in the five numbers the best simulators report (SimAI,
Proteus, Lumos): ``python -m repro.bench simreal`` prints them under its table.

Over every grid point with both sides (:func:`repro_bench.instruments.points.points_table`), each
point's samples/s error e = predicted / measured - 1 (medians over seeds):

* **MAPE**: the mean of |e| over all points, links together (points without samples/s on a side,
  a run of one push, or with none measured, are left out of these four numbers, and counted);
* **worst point**: the point of the largest |e|, named, with its signed error;
* **bias**: the mean of e (the mean signed error): above 0 the simulator over-predicts samples/s,
  below 0 it under-predicts;
* **Kendall's tau** (tau-b, ties counted as neither order) between predicted and measured
  samples/s across the points: 1 when the simulator orders the configurations as reality does;
* **time to target**: per point, the predicted median time to the target error against the
  measured median, |predicted / measured - 1|, beside the real runs' own seed spread at that point
  (half their range over seeds, relative to their median; none with one seed): an error inside
  it cannot be told from the noise between seeds. Points where a run of either side never
  reached the target, or where the real runs' median time is 0 (the evaluation before the first
  push met it), are left out, and counted.

Pure arithmetic on the frames; nothing here runs anything.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from repro_bench.instruments.points import KEYS


@dataclass(frozen=True)
class Accuracy:
    """The five numbers (see the module docstring); NaN where no point allows one."""
    points: int
    mape: float
    worst_point: str
    worst_error: float
    bias: float
    kendall_tau: float
    ttt_points: int                # points where both sides reached the target
    ttt_mape: float                # mean |time-to-target error| over them
    ttt_seed_spread: float         # mean of the real runs' seed spread over them (NaN: one seed each)
    ttt_within_spread: int         # points whose error lies inside their own spread
    ttt_missing: int               # points left out: a run never reached the target
    left_out: int = 0              # points without samples/s on a side (NaN), or none measured (0)

    def lines(self) -> list[str]:
        """The report, one line per number."""
        lost = (f" ({self.left_out} point(s) left out: no samples/s on a side, or none measured)"
                if self.left_out else "")
        if not self.points:
            return ["no grid point with both a measured and a predicted run" + lost]
        tau = "n/a (fewer than 2 points, or all tied)" if math.isnan(self.kendall_tau) else f"{self.kendall_tau:+.3f}"
        side = ("over-predicts" if self.bias > 0 else "under-predicts" if self.bias < 0
                else "neither over- nor under-predicts")
        spread = (f" against the real runs' seed spread ±{self.ttt_seed_spread:.1%}; {self.ttt_within_spread} of "
                  f"{self.ttt_points} point(s) within their spread" if not math.isnan(self.ttt_seed_spread) else
                  f" over {self.ttt_points} point(s); the real runs' seed spread: n/a (one seed per point)")
        ttt = (f"time to target: mean |error| {self.ttt_mape:.1%}{spread}"
               if self.ttt_points else "time to target: no point where both sides reached the target")
        if self.ttt_missing:
            ttt += (f" ({self.ttt_missing} point(s) left out: a run never reached the target, or the real runs"
                    " reached it before their first push)")
        return [f"samples/s MAPE over {self.points} point(s): {self.mape:.1%}{lost}",
                f"worst point: {self.worst_point}: {self.worst_error:+.1%}",
                f"bias (mean signed error): {self.bias:+.1%}: the simulator {side} samples/s",
                f"Kendall's tau, predicted against measured samples/s across the points: {tau}",
                ttt]


def kendall_tau(x, y) -> float:
    """Kendall's tau-b of two equal-length sequences (scipy's): ties count as neither order; NaN
    when either has no untied pair (one point, or all tied)."""
    from scipy.stats import kendalltau

    with warnings.catch_warnings():   # scipy warns on a constant input, whose NaN we report
        warnings.simplefilter("ignore")
        return float(kendalltau(x, y).statistic)


def seed_spread(times: pd.Series) -> float:
    """Half the range of ``times`` over seeds relative to their median (NaN with one seed: its 0
    read as a spread that no error lies inside)."""
    t = times.dropna()
    return float((t.max() - t.min()) / 2 / t.median()) if len(t) > 1 and t.median() > 0 else math.nan


def time_to_target_errors(runs: pd.DataFrame) -> pd.DataFrame:
    """Per point with both sides: the relative error of the predicted median time to target
    against the measured median, and the measured runs' seed spread (error NaN where a run of
    either side never reached the target)."""
    rows = []
    for key, g in runs.groupby(KEYS):
        m, p = g[g.side == "measured"].time_to_target_s, g[g.side == "predicted"].time_to_target_s
        if m.empty or p.empty:
            continue
        meas, pred = m.median(), p.median()
        # a run that never reached it has no time: medians and spread of the others would pass for the point's
        reached = m.notna().all() and p.notna().all()
        error = pred / meas - 1 if reached and meas > 0 else math.nan
        rows.append({**dict(zip(KEYS, key)), "ttt_error": error, "seed_spread": seed_spread(m)})
    return pd.DataFrame(rows, columns=[*KEYS, "ttt_error", "seed_spread"])


def accuracy(table: pd.DataFrame, runs: pd.DataFrame) -> Accuracy:
    """The five numbers of the points ``table`` (:func:`~repro_bench.instruments.points.points_table`)
    and their ``runs`` (:func:`~repro_bench.instruments.points.read_runs`)."""
    t = table[np.isfinite(table.samples_error.astype(float))]   # a lone push: NaN; none measured: inf
    if t.empty:
        return Accuracy(0, math.nan, "", math.nan, math.nan, math.nan, 0, math.nan, math.nan, 0, 0, len(table))
    e = t.samples_error.astype(float)
    worst = t.loc[e.abs().idxmax()]
    ttt = time_to_target_errors(runs)
    reached = ttt.dropna(subset=["ttt_error"])
    spread = reached.seed_spread.dropna()   # none with one seed per point
    return Accuracy(
        points=len(t), mape=float(e.abs().mean()),
        worst_point=f"{worst.link}, nsync {worst.nsync}, {worst.num_clients} client(s)",
        worst_error=float(worst.samples_error), bias=float(e.mean()),
        kendall_tau=kendall_tau(t.predicted_samples_per_s.to_numpy(float), t.measured_samples_per_s.to_numpy(float)),
        ttt_points=len(reached), ttt_mape=float(reached.ttt_error.abs().mean()) if len(reached) else math.nan,
        ttt_seed_spread=float(spread.mean()) if len(spread) else math.nan,
        ttt_within_spread=int((reached.ttt_error.abs() <= reached.seed_spread).sum()),
        ttt_missing=len(ttt) - len(reached), left_out=len(table) - len(t))
