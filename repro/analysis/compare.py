"""Do two trees agree within the spread over seeds? (``python -m repro.analysis compare A B``)

Owns the rule, the verdicts and the report (the rule: docs/paper.md, 'How compare decides'); the
per-run metrics it compares come from :mod:`repro.analysis.trees`.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd

from repro.analysis.figures import plural
from repro.analysis.load import NoRunsError
from repro.analysis.trees import COMPARED, KIND, METRICS, Tree, read_tree, run_metrics, start_errors
from repro.errors import ConfigError

DEFAULT_TARGET = 0.01  # the target_error of conf/exp/fig2.yaml, fig3.yaml and fig4.yaml
DEFAULT_TARGETS = {"fig3_paper": 0.1}   # conf/exp/fig3_paper.yaml
ALWAYS_KEYS = ("num_clients", "nsync")
VARYING_KEYS = ("exp_name", "start", "backend.name", "config_id")  # grid keys when they vary
# metric -> (absolute floor, floor relative to the mean of the two means)
FLOORS = {"final_train_error_pct": (1.0, 0.0), "final_test_error_pct": (1.0, 0.0),
          "time_to_target_s": (0.0, 0.10), "speedup": (0.0, 0.10),
          "mean_staleness": (0.1, 0.10), "start_train_error_pct": (1.0, 0.0),
          "start_test_error_pct": (1.0, 0.0)}
BASELINE = "warm-start baseline"   # the grid point of the baseline's comparison
OTHER_CONFIG = "another configuration than the other tree's"
AGREE, DISAGREE, ONLY_A, ONLY_B = "agree", "DISAGREE", "only in A", "only in B"
STAT_COLUMNS = ("metric", "target", "n_a", "n_b", "nan_a", "nan_b", "mean_a", "mean_b", "diff",
                "sd", "tolerance", "verdict", "note")


def compare_values(a: Iterable[float] | None, b: Iterable[float] | None, k: float = 3.0,
                   floor_abs: float = 0.0, floor_rel: float = 0.0) -> dict:
    """The :data:`STAT_COLUMNS` from ``n_a`` on, comparing the seed values of A and of B (None: the
    grid point is not in that tree)."""
    sides = [_side(v) for v in (a, b)]
    (na, nan_a, ma, va), (nb, nan_b, mb, vb) = sides
    row = {"n_a": na, "n_b": nb, "nan_a": nan_a, "nan_b": nan_b, "mean_a": ma, "mean_b": mb,
           "diff": mb - ma, "sd": math.nan, "tolerance": math.nan, "note": ""}
    if a is None or b is None:
        return {**row, "verdict": ONLY_B if a is None else ONLY_A}
    mostly_nan = [2 * nan > n for n, nan, _, _ in sides]
    if all(mostly_nan):
        return {**row, "verdict": AGREE, "note": "NaN in both"}
    if any(mostly_nan):
        which, n, nan = ("A", na, nan_a) if mostly_nan[0] else ("B", nb, nan_b)
        return {**row, "verdict": DISAGREE, "note": f"NaN in {which}: {nan} of {n} seeds"}
    variances = [v for v in (va, vb) if not math.isnan(v)]
    sd = math.sqrt(sum(variances) / len(variances)) if variances else 0.0
    floor = max(floor_abs, floor_rel * (abs(ma) + abs(mb)) / 2)
    tolerance = max(k * sd, floor)
    said = [f"{nan} of {n} in {side}" for side, (n, nan, _, _) in zip("AB", sides) if nan]
    return {**row, "sd": sd, "tolerance": tolerance,
            "note": f"NaN seeds left out of the mean: {', '.join(said)}" if said else "",
            "verdict": DISAGREE if abs(mb - ma) > tolerance else AGREE}


def _side(values: Iterable[float] | None) -> tuple[int, int, float, float]:
    """(seeds, non-finite seeds, mean and sample variance of the finite ones; NaN if too few)."""
    v = np.asarray([] if values is None else list(values), dtype=float)
    fin = v[np.isfinite(v)]
    return (len(v), len(v) - len(fin), float(fin.mean()) if len(fin) else math.nan,
            float(fin.var(ddof=1)) if len(fin) >= 2 else math.nan)


def curve_target(name: str, a: Tree, b: Tree, override: float | None = None) -> float | None:
    """The target error (a fraction) of fig2/fig3's time to target, one for both trees."""
    if name not in ("fig2", "fig3", "fig3_paper"):
        return None
    if override is not None:
        return float(override)
    found = [t.targets[name] for t in (a, b) if t.targets.get(name) is not None]
    if len(found) == 2 and found[0] != found[1]:
        warnings.warn(f"{name}: the trees' runs have target_error {found[0]} (A) and {found[1]} "
                      f"(B); using A's", stacklevel=3)
    return found[0] if found else DEFAULT_TARGETS.get(name, DEFAULT_TARGET)


def _keys(name: str, per_run: list[pd.DataFrame]) -> list[str]:
    present = [m for m in per_run if m is not None]
    keys = list(ALWAYS_KEYS)
    for col in VARYING_KEYS:
        if not all(col in m for m in present):
            continue
        if any(m[col].nunique(dropna=False) > 1 for m in present):
            keys.append(col)
        elif len(present) == 2:
            va, vb = (m[col].iloc[0] if len(m) else None for m in present)
            same = va == vb or (pd.isna(va) and pd.isna(vb))
            if not same and col == "config_id":   # other settings: never one grid
                warnings.warn(f"{name}: A and B hold runs of different configurations "
                              f"(config_id {va} and {vb}): not compared; python -m "
                              f"repro.analysis {name} --results TREE draws a results tree's",
                              stacklevel=4)
                keys.append(col)
            elif not same and col != "exp_name":  # a renamed experiment is the same experiment
                warnings.warn(f"{name}: {col} is {va!r} in A and {vb!r} in B; comparing them "
                              "as one grid", stacklevel=4)
    return keys


def _normalise(per_run: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Key columns with one type in both kinds of tree (JSON, CSV and missing values differ)."""
    return per_run.assign(**{col: pd.to_numeric(per_run[col]).astype("int64") if col in ALWAYS_KEYS
                             else per_run[col].astype(object).where(per_run[col].notna(), "-").astype(str)
                             for col in keys})


def compare_figure(name: str, ma: pd.DataFrame | None, mb: pd.DataFrame | None, k: float = 3.0,
                   target: float | None = None) -> list[dict]:
    """Rows of one figure from the :func:`run_metrics` of A and of B (None: not in that tree)."""
    keys = _keys(name, [ma, mb])
    # keys holds num_clients and nsync at least, so each group's key is a tuple
    groups = [{} if m is None else dict(iter(_normalise(m, keys).groupby(keys, sort=True)))
              for m in (ma, mb)]
    other = "config_id" in keys and not any(m is None or m["config_id"].nunique() > 1
                                             for m in (ma, mb))
    rows = []
    for point in sorted(set(groups[0]) | set(groups[1])):
        ga, gb = (g.get(point) for g in groups)
        label = " ".join(f"{k.removesuffix('.name')}={v}" for k, v in zip(keys, point))
        for metric in METRICS[name]:
            stats = compare_values(None if ga is None else ga[metric],
                                   None if gb is None else gb[metric], k, *FLOORS[metric])
            if other:
                stats["note"] = OTHER_CONFIG
            elif not math.isnan(stats["tolerance"]) and stats["nan_a"] + stats["nan_b"]:
                # compared on the finite seeds, NaN seeds left out of a mean: say which, else a seed
                # that did not reach the target vanished from a mean whose seed count included it
                for side, group in zip("AB", (ga, gb)):
                    bad = group[~np.isfinite(pd.to_numeric(group[metric], errors="coerce").astype(float))]
                    if len(bad):
                        seeds = ", ".join(str(v) for v in bad["seed"]) if "seed" in bad else f"{len(bad)} seeds"
                        warnings.warn(f"{name} {label} {metric}: in {side}, seed {seeds} is NaN and left "
                                      f"out of the mean of the {len(group) - len(bad)} others", stacklevel=3)
            rows.append({"figure": name, "grid_point": label,
                         **dict(zip(keys, point)), "metric": metric,
                         "target": target if metric == "time_to_target_s" else math.nan,
                         **stats})
    return rows


def figure_names(figures: Iterable[str] | str | None) -> tuple[str, ...]:
    """``None`` -> every figure; ``"fig3,fig4"`` or a list -> those, checked."""
    if figures is None:
        return COMPARED
    names = [n for n in (f.strip() for f in (figures.split(",") if isinstance(figures, str) else figures)) if n]
    for n in names:
        if n not in COMPARED:
            raise ConfigError("figures", n, COMPARED)
    if not names:
        raise ConfigError("figures", figures, "a comma-separated list of " + ", ".join(COMPARED))
    return tuple(dict.fromkeys(names))


def check_options(k: float, target: float | None) -> None:
    """:class:`ConfigError` for a ``k`` or ``target`` no comparison can use."""
    if not (k >= 0 and math.isfinite(k)):
        raise ConfigError("k", k, "a finite number >= 0")
    if target is not None and not 0 <= target <= 1:
        raise ConfigError("target", target, "a training error as a fraction in [0, 1]")


def compare(a: Tree, b: Tree, k: float = 3.0, target: float | None = None) -> pd.DataFrame:
    """The comparison table of two read trees, options checked (see :func:`compare_trees`)."""
    rows = []
    for name in COMPARED:
        if name not in a.frames and name not in b.frames:
            continue
        t = curve_target(name, a, b, target)
        ma, mb = (run_metrics(name, tree.frames[name], t) if name in tree.frames else None
                  for tree in (a, b))
        found = [sorted(set(tree.frames[name]["target"].dropna())) if "target" in tree.frames.get(name, ()) else []
                 for tree in (a, b)]   # fig4's targets: a figures folder keeps its CSV's, whatever --target says
        if KIND.get(name, name) == "fig4" and all(found) and found[0] != found[1]:
            warnings.warn(f"{name}: A's speedups are to training error {', '.join(map(str, found[0]))}, "
                          f"B's to {', '.join(map(str, found[1]))}: they differ for that alone (a figures "
                          "folder's are as its fig4.csv was written; --target sets a results tree's)",
                          stacklevel=2)
        sa, sb = (start_errors(name, tree.frames[name]) if name in tree.frames else None for tree in (a, b))
        if sa is not None and sb is not None:   # both warm-started and recording it: the baseline first
            rows += [{"figure": name, "grid_point": BASELINE, "metric": metric, "target": math.nan,
                      **compare_values(sa[metric], sb[metric], k, *FLOORS[metric])}
                     for metric in ("start_train_error_pct", "start_test_error_pct")]
        rows += compare_figure(name, ma, mb, k, t)
    table = pd.DataFrame(rows)
    front = ["figure", "grid_point", *[c for c in (*ALWAYS_KEYS, *VARYING_KEYS) if c in table]]
    table = table.reindex(columns=[*front, *STAT_COLUMNS])
    if not table["verdict"].isin([AGREE, DISAGREE]).any():
        other = sorted(set(table.loc[table["note"] == OTHER_CONFIG, "figure"]))
        raise NoRunsError("compare", f"{a.path} vs {b.path}",
                          f"a grid point of some figure in both trees (A: {a.describe()}; "
                          f"B: {b.describe()})" + (f"; in {', '.join(other)} A and B hold runs "
                                                   "of different configurations" if other else ""))
    return table


def compare_trees(a: str | Path, b: str | Path, k: float = 3.0,
                  figures: Iterable[str] | str | None = None,
                  target: float | None = None) -> pd.DataFrame:
    """Compare two results trees or figures folders (any mix): one row per (figure, grid point,
    metric), the grid key columns, then :data:`STAT_COLUMNS`; :class:`ConfigError` for bad input."""
    names = figure_names(figures)
    check_options(k, target)
    return compare(read_tree(a, names, target), read_tree(b, names, target), k, target)


def figure_verdicts(table: pd.DataFrame) -> dict[str, str]:
    """One line per figure: ``fig3: agree (24 grid points x 2 metrics)``, ``fig3: DISAGREE at 3
    of 48 comparisons``, ``fig3: only in A``, ``fig3: incomplete (...)`` or ``fig3: not compared
    (...)``; a warm-start baseline that differs is said after it."""
    lines = {}
    for name, g in table.groupby("figure", sort=False):
        base, g = g[g["grid_point"] == BASELINE], g[g["grid_point"] != BASELINE]
        train = base[base["metric"] == "start_train_error_pct"]
        differs = not train.empty and (base["verdict"] == DISAGREE).any()
        lines[name] = _grid_verdict(name, g) + (
            f"; the warm-start baseline itself DIFFERS (training error {train['mean_a'].iloc[0]:.2f}% in A, "
            f"{train['mean_b'].iloc[0]:.2f}% in B): every grid point starts from it, so its grid points "
            "move together and the spread over seeds cannot cover that" if differs else "")
    return lines


def _grid_verdict(name: str, g: pd.DataFrame) -> str:
    verdicts = g["verdict"]
    both = g[verdicts.isin([AGREE, DISAGREE])]
    only = {side: g.loc[verdicts == side, "grid_point"].nunique() for side in (ONLY_A, ONLY_B)}
    if both.empty and len(g) and (g["note"] == OTHER_CONFIG).all():
        return f"{name}: not compared: A and B hold runs of different configurations"
    if both.empty and not only[ONLY_B]:
        return f"{name}: only in A"
    if both.empty and not only[ONLY_A]:
        return f"{name}: only in B"
    missing = ", ".join(f"{plural(n, 'grid point')} {side}" for side, n in only.items() if n)
    bad = int((both["verdict"] == DISAGREE).sum())
    points, metrics = both["grid_point"].nunique(), both["metric"].nunique()
    if bad:
        line = f"{name}: DISAGREE at {bad} of {len(both)} comparisons"
        return line + (f" (incomplete: {missing})" if missing else "")
    if not points:
        return f"{name}: incomplete (no common grid point: {missing})"
    if missing:
        return (f"{name}: incomplete ({missing}; the common {plural(points, 'grid point')} x "
                f"{plural(metrics, 'metric')} agree)")
    return f"{name}: agree ({plural(points, 'grid point')} x {plural(metrics, 'metric')})"


def exit_code(table: pd.DataFrame) -> int:
    """1 when any comparison disagrees, else 0 (incomplete and one-sided figures included)."""
    return 1 if (table["verdict"] == DISAGREE).any() else 0


def _left(texts: pd.Series) -> list[str]:
    """Left-aligned text cells (to_string right-aligns them; names read better aligned left)."""
    width = max(texts.astype(str).str.len().max(), 1)
    return [str(t).ljust(width) for t in texts]


def format_report(table: pd.DataFrame) -> str:
    """A fixed-width table per figure, then :func:`figure_verdicts`, one line each."""
    parts = []
    for name, g in table.groupby("figure", sort=False):
        target = g["target"].dropna()
        head = f"== {name}" + (f" (time to training error <= {100 * target.iloc[0]:g}%)"
                               if len(target) else "")
        if (g["grid_point"] == BASELINE).any():
            head += ("\nthe warm-start baseline first: every grid point starts from it, so when it "
                     "differs the grid points below differ together")
        shown = pd.DataFrame({
            "grid point": _left(g["grid_point"]), "metric": _left(g["metric"]),
            # the seeds each mean is over: a NaN seed is left out (the verdict's note says so)
            "seeds A/B": [f"{a - x}/{b - y}" for a, x, b, y in zip(g["n_a"], g["nan_a"], g["n_b"], g["nan_b"])],
            "mean A": g["mean_a"], "mean B": g["mean_b"], "tolerance": g["tolerance"],
            "verdict": [f"{v} ({n})" if n else v for v, n in zip(g["verdict"], g["note"])]})
        parts.append(head + "\n" + shown.to_string(index=False, na_rep="-",
                                                   float_format=lambda x: f"{x:.4g}"))
    return "\n\n".join([*parts, "\n".join(figure_verdicts(table).values())])
