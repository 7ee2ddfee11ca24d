"""Building a figure end to end: run folders -> tidy frame -> PNG, PDF and CSV on disk.

Owns the figure registry (name -> frame builder, figure function), each figure's default
experiment folder, and :func:`build_figure`, which both the CLI (``python -m repro.analysis``)
and the training entry point (after a sweep) call.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib as mpl
import pandas as pd

from repro.analysis import figures, frames
from repro.analysis.load import NoRunsError, Runs, load_runs
from repro.analysis.tables import format_speedup_table, summarise_speedups
from repro.registry import Registry


@dataclass(frozen=True)
class FigureSpec:
    """A registered figure: ``frame(runs, target) -> DataFrame`` (pure), ``draw(frame) ->
    Figure`` (pure), the experiment folders it reads by default (the first that exists), and
    optionally ``extra(frame, out_dir) -> [paths]`` for more outputs (fig4's speedup table)."""

    frame: Callable
    draw: Callable
    exps: tuple[str, ...] = ()
    extra: Callable | None = None


FIGURES: Registry[FigureSpec] = Registry("figure")
# The staleness lab's figures live in their own modules, each registering itself on import.
LAB_MODULES = ("repro.analysis.lab.stability", "repro.analysis.lab.momentum",
               "repro.analysis.lab.sync", "repro.analysis.lab.mitigation", "repro.analysis.lab.ceiling")


def register_figure(name: str, frame: Callable, draw: Callable, exps: tuple[str, ...] = (),
                    extra: Callable | None = None) -> None:
    FIGURES.add(name, FigureSpec(frame, draw, exps or (name,), extra))


def _speedup_table(frame: pd.DataFrame, out: Path) -> list[Path]:
    table = summarise_speedups(frame)
    print(format_speedup_table(table))
    table.to_csv(out / "fig4_speedup.csv", index=False)
    return [out / "fig4_speedup.csv"]


register_figure("fig1", lambda runs, target: frames.fig1_frame(runs), figures.fig1)
register_figure("fig2", lambda runs, target: frames.fig2_frame(runs), figures.fig2)
register_figure("fig3", lambda runs, target: frames.fig3_frame(runs), figures.fig3)
register_figure("fig4", frames.fig4_frame, figures.fig4, extra=_speedup_table)
# The staleness figure reads its own sweep, else fig3's full grid.
register_figure("staleness", lambda runs, target: frames.staleness_frame(runs), figures.staleness,
                ("staleness", "fig3"))


def _load_labs() -> None:
    for module in LAB_MODULES:
        if importlib.util.find_spec(module) is not None and module not in sys.modules:
            importlib.import_module(module)


def figure_names() -> tuple[str, ...]:
    """Every figure that can be drawn (the paper's and the lab's), in registration order."""
    _load_labs()
    return tuple(FIGURES)


def spec(name: str) -> FigureSpec:
    _load_labs()
    return FIGURES[name]


def default_exp(name: str, results_dir: str | Path) -> str:
    """The experiment folder a figure reads by default (the first of its exps that exists)."""
    candidates = spec(name).exps
    return next((c for c in candidates if (Path(results_dir) / c).is_dir()), candidates[0])


def figure_frame(name: str, results_dir: str | Path, exp_name: str | None = None,
                 target: float | None = None, runs: Runs | None = None) -> pd.DataFrame:
    """The tidy frame of one figure, read from ``results_dir/exp_name``.

    ``runs``: that folder already loaded (:func:`load_runs`), so that a caller building several
    figures from one experiment folder reads it, and warns about its bad folders, only once.
    Raises :class:`NoRunsError` when the folder is missing or nothing in it is usable.
    """
    figure = spec(name)   # ConfigError naming the figures there are
    exp = exp_name or default_exp(name, results_dir)
    runs = load_runs(results_dir, exp) if runs is None else runs
    where = str(Path(results_dir) / exp)
    if runs.runs.empty:
        raise NoRunsError("exp", where, "a folder holding at least one finished run "
                                        f"({len(runs.skipped)} skipped: see the warnings)")
    frame = figure.frame(runs, target)
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
        fig = spec(name).draw(frame)
        for ext in ("png", "pdf"):
            paths.append(out / f"{name}.{ext}")
            fig.savefig(paths[-1])
    paths.append(out / f"{name}.csv")
    frame.to_csv(paths[-1], index=False)
    if spec(name).extra is not None:
        paths += spec(name).extra(frame, out)
    return paths


def _build_all(results_dir, out_dir, exp_name, target) -> list[Path]:
    paths, failures = [], []
    for name in figure_names():
        try:
            paths += build_figure(name, results_dir, out_dir, exp_name, target)
        except NoRunsError as e:
            failures.append(f"{name}: {e}")
            print(f"skipping {name}: {e}")
    if not paths:
        raise NoRunsError("results", str(results_dir), "usable runs for at least one figure; "
                                                       + "; ".join(failures))
    return paths
