"""Building a figure end to end: run folders -> tidy frame -> PNG, PDF and CSV on disk.

Owns the figure registry (name -> frame builder, figure function), each figure's default
experiment folder, and :func:`build_figure`, which both the CLI (``python -m repro.analysis``)
and the training entry point (after a sweep) call.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import matplotlib as mpl
import pandas as pd

from repro.analysis import figures, frames
from repro.analysis.load import NoRunsError, Runs, load_runs
from repro.analysis.tables import format_speedup_table, summarise_speedups
from repro.errors import ConfigError

FIGURES: dict[str, tuple[Callable, Callable]] = {
    "fig1": (frames.fig1_frame, figures.fig1),
    "fig2": (frames.fig2_frame, figures.fig2),
    "fig3": (frames.fig3_frame, figures.fig3),
    "fig4": (frames.fig4_frame, figures.fig4),
    "staleness": (frames.staleness_frame, figures.staleness),
}
NAMES = (*FIGURES, "all")
# Where each figure reads its runs when no experiment is named: the first folder that exists.
# The staleness figure has no sweep of its own unless someone adds one; fig3 has the full grid.
DEFAULT_EXPS = {"staleness": ("staleness", "fig3")}


def default_exp(name: str, results_dir: str | Path) -> str:
    """The experiment folder a figure reads by default (its own name, see DEFAULT_EXPS)."""
    candidates = DEFAULT_EXPS.get(name, (name,))
    return next((c for c in candidates if (Path(results_dir) / c).is_dir()), candidates[0])


def figure_frame(name: str, results_dir: str | Path, exp_name: str | None = None,
                 target: float | None = None, runs: Runs | None = None) -> pd.DataFrame:
    """The tidy frame of one figure, read from ``results_dir/exp_name``.

    ``runs``: that folder already loaded (:func:`load_runs`), so that a caller building several
    figures from one experiment folder reads it, and warns about its bad folders, only once.
    Raises :class:`NoRunsError` when the folder is missing or nothing in it is usable.
    """
    if name not in FIGURES:
        raise ConfigError("figure", name, NAMES)
    exp = exp_name or default_exp(name, results_dir)
    runs = load_runs(results_dir, exp) if runs is None else runs
    where = str(Path(results_dir) / exp)
    if runs.runs.empty:
        raise NoRunsError("exp", where, "a folder holding at least one finished run "
                                        f"({len(runs.skipped)} skipped: see the warnings)")
    make_frame = FIGURES[name][0]
    frame = make_frame(runs, target) if name == "fig4" else make_frame(runs)
    if frame.empty:
        raise NoRunsError("exp", where, f"runs that {name} can use"
                                        + (" (1-client runs)" if name == "fig1" else ""))
    return frame


def build_figure(name: str, results_dir: str | Path = "results", out_dir: str | Path = "figures",
                 exp_name: str | None = None, target: float | None = None) -> list[Path]:
    """Write ``out_dir/<name>.png``, ``.pdf`` and ``.csv`` (fig4: also ``fig4_speedup.csv``,
    printed too) and return the paths written. ``name="all"`` builds every figure whose
    experiment folder holds usable runs and raises :class:`NoRunsError` only if none does.
    """
    if name == "all":
        return _build_all(results_dir, out_dir, exp_name, target)
    frame = figure_frame(name, results_dir, exp_name, target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with mpl.rc_context(figures.style_rc()):  # our style, without touching the caller's rcParams
        fig = FIGURES[name][1](frame)
        for ext in ("png", "pdf"):
            paths.append(out / f"{name}.{ext}")
            fig.savefig(paths[-1])
    paths.append(out / f"{name}.csv")
    frame.to_csv(paths[-1], index=False)
    if name == "fig4":
        table = summarise_speedups(frame)
        print(format_speedup_table(table))
        paths.append(out / "fig4_speedup.csv")
        table.to_csv(paths[-1], index=False)
    return paths


def _build_all(results_dir, out_dir, exp_name, target) -> list[Path]:
    paths, failures = [], []
    for name in FIGURES:
        try:
            paths += build_figure(name, results_dir, out_dir, exp_name, target)
        except NoRunsError as e:
            failures.append(f"{name}: {e}")
            print(f"skipping {name}: {e}")
    if not paths:
        raise NoRunsError("results", str(results_dir), "usable runs for at least one figure; "
                                                       + "; ".join(failures))
    return paths
