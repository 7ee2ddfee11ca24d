"""A figure end to end: run folders -> tidy frame -> PNG, PDF and CSV. Owns the figure registry
and :func:`build_figure`, which the CLI and the grid callback both call.
"""
from __future__ import annotations

import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import matplotlib as mpl
import pandas as pd

from repro.analysis import configs, figures, frames
from repro.analysis.load import NoRunsError, Runs, load_runs
from repro.analysis.tables import format_speedup_table, summarise_speedups
from repro.errors import ConfigError
from repro.files.storage import LONGEST_NAME, atomic_write, shortened
from repro.registry import Registry


@dataclass(frozen=True)
class FigureSpec:
    """A registered figure: ``frame(runs, target)`` and ``draw(frame)`` (pure), its default
    experiment folders (the first that exists), ``extra(frame, out_dir, stem) -> [paths]`` for more
    outputs, and the ``axes`` it draws across besides the seed (``"cost."``: a whole group)."""

    frame: Callable
    draw: Callable
    exps: tuple[str, ...] = ()
    extra: Callable | None = None
    axes: tuple[str, ...] = ()


# Declared in repro.registry: the paper's figures here, the lab's in repro.analysis.lab.*.
FIGURES: Registry[FigureSpec] = Registry("figure")


def register_figure(name: str, frame: Callable, draw: Callable, exps: tuple[str, ...] = (),
                    extra: Callable | None = None, axes: tuple[str, ...] = ()) -> None:
    """Register figure ``name``; the calling module must be the one repro.registry declares for it."""
    FIGURES.add(name, FigureSpec(frame, draw, exps or (name,), extra, tuple(axes)),
                module=sys._getframe(1).f_globals["__name__"])


def printed_table(table: Callable[[pd.DataFrame], pd.DataFrame], digits: int = 3) -> Callable:
    """A lab figure's ``extra``: print ``table(frame)`` whole, to ``digits`` significant digits;
    it writes no file."""
    def extra(frame: pd.DataFrame, out_dir, stem: str) -> list:
        with pd.option_context("display.width", 220, "display.max_columns", 20, "display.max_rows", 500):
            print(table(frame).to_string(index=False, float_format=lambda x: f"{x:.{digits}g}"))
        return []
    return extra


def _speedup_table(frame: pd.DataFrame, out: Path, stem: str) -> list[Path]:
    table = summarise_speedups(frame)
    print(format_speedup_table(table))
    write_csv(table, out / f"{stem}_speedup.csv")
    return [out / f"{stem}_speedup.csv"]


LONGEST_STEM = LONGEST_NAME - len("_speedup.csv")   # fig4's table: the longest name a figure writes
CURVES = ("num_clients", "nsync")   # fig2-fig4: one curve or point per client count and nsync
register_figure("fig1", frames.fig1_frame, figures.fig1, axes=("num_clients",))   # 1-client runs
# fig2 has one nsync: its curves are per client count only
register_figure("fig2", frames.fig2_frame, figures.fig2, axes=("num_clients",))
register_figure("fig3", frames.fig2_frame, figures.fig3, axes=CURVES)
register_figure("fig4", frames.fig4_frame, figures.fig4, extra=_speedup_table, axes=CURVES)
# The staleness figure reads its own sweep, else fig3's full grid.
register_figure("staleness", frames.staleness_frame, figures.staleness, ("staleness", "fig3"),
                axes=CURVES)
# The paper's regime (conf/exp/fig3_paper.yaml, fig4_paper.yaml): the same figures, own files.
register_figure("fig3_paper", frames.fig2_frame, figures.fig3, axes=CURVES)
register_figure("fig4_paper", frames.fig4_frame, figures.fig4, extra=_speedup_table, axes=CURVES)


def figure_frame(name: str, results_dir: str | Path, exp_name: str | None = None,
                 target: float | None = None, runs: Runs | None = None,
                 config: str | None = None) -> pd.DataFrame:
    """The tidy frame of one figure from the runs of one configuration (:func:`figure_runs`);
    ``runs``: that folder already loaded, so that it is read (and warned about) once."""
    parts, where = figure_runs(name, results_dir, exp_name, runs, config)
    return _frame(name, parts[0][1], where, target)


def figure_runs(name: str, results_dir: str | Path, exp_name: str | None = None,
                runs: Runs | None = None, config: str | None = None,
                jobs: list[str] | None = None, each: bool = False, refused: list[str] = ()):
    """``([(label, runs)], where)``: the runs ``name`` draws from ``results_dir/exp_name`` (only ``jobs``
    less ``refused``, matching ``config``), as :func:`repro.analysis.configs.one_grid` splits them."""
    figure = FIGURES[name]   # ConfigError naming the figures there are
    exp = exp_name or next((e for e in figure.exps if (Path(results_dir) / e).is_dir()),
                           figure.exps[0])   # by default the first of its folders that exists
    jobs = None if jobs is None else [j for j in jobs if j not in refused]
    runs = load_runs(results_dir, exp, jobs) if runs is None else runs
    where = str(Path(results_dir) / exp)
    if runs.runs.empty:
        skipped = f" ({len(runs.skipped)} skipped: see the warnings)" if len(runs.skipped) else ""
        raise NoRunsError("exp", where, "a folder holding at least one finished run" + skipped)
    if jobs is not None:
        runs, others = configs.only_jobs(runs, jobs)
        others = [o for o in others if o not in refused]
        if refused:
            warnings.warn(f"{name}: {figures.plural(len(refused), 'grid point')} refused as bad input left out "
                          f"(not run with this grid's settings): {configs.list_folders(refused)}", stacklevel=2)
        if others:
            warnings.warn(f"{name}: drawn from this grid's runs only; {len(others)} other run(s) "
                          f"in {where} left out (another configuration or grid): "
                          f"{configs.list_folders(others)}", stacklevel=2)
    runs = configs.choose(runs, config)
    if runs.runs.empty:
        raise NoRunsError("exp", where, "finished runs of this grid" if config is None else
                          f"finished runs with {config}")
    return configs.one_grid(runs, figure.axes, where, config, each), where


def _frame(name: str, runs: Runs, where: str, target: float | None) -> pd.DataFrame:
    try:
        frame = FIGURES[name].frame(runs, target)
    except KeyError as e:   # a setting their config.json does not record (another experiment's, an old run)
        raise NoRunsError("exp", where, f"runs that {name} can use (their config.json records no {e})") from None
    if frame.empty:
        raise NoRunsError("exp", where, f"runs that {name} can use"
                                        + (" (1-client runs)" if name == "fig1" else ""))
    return frame


def build_figure(name: str, results_dir: str | Path = "results", out_dir: str | Path = "figures",
                 exp_name: str | None = None, target: float | None = None,
                 config: str | None = None, jobs: list[str] | None = None,
                 stem: str | None = None, each: bool = False, refused: list[str] = ()) -> list[Path]:
    """Write ``out_dir/<stem>.png``, ``.pdf`` and ``.csv`` (fig4: also ``<stem>_speedup.csv``) of
    the runs :func:`figure_runs` chooses (``each``: one set of files per configuration,
    ``<stem>-<its settings>``) and return their paths; ``name="all"``: every figure with runs."""
    if name == "all":
        return _build_all(results_dir, out_dir, exp_name, target, config)
    stem = stem or name
    parts, where = figure_runs(name, results_dir, exp_name, config=config, jobs=jobs, each=each, refused=refused)
    figure, out, paths = FIGURES[name], Path(out_dir), []
    for label, runs in parts:
        full = f"{stem}-{file_label(label)}" if len(parts) > 1 else stem
        files = shortened(full, LONGEST_STEM)   # a grid's stem and settings: else 'File name too long'
        if files != full:
            warnings.warn(f"{name}: the files {files}.* stand for {full} (a file name holds at most "
                          f"{LONGEST_STEM} bytes)", stacklevel=2)
        frame = _frame(name, runs, where, target)
        paths += save_figure(lambda: figure.draw(frame), frame, out, files, len(runs.skipped), len(refused))
        paths += figure.extra(frame, out, files) if figure.extra is not None else []
    return paths


def file_label(text: str) -> str:
    """Settings as part of a file name: ``algo=sgd,num_epochs=3`` (a path's ``/`` and other
    characters a file name should not hold become ``_``)."""
    return re.sub(r"[^\w.=,+-]", "_", text)


def save_figure(draw: Callable, frame: pd.DataFrame, out: Path, stem: str, left_out: int = 0,
                refused: int = 0) -> list[Path]:
    """``draw()``'s figure as ``out/<stem>.png`` and ``.pdf`` and ``frame`` as ``.csv``, each whole or
    not at all; the folders ``left_out`` and points ``refused`` counted above it (docs/failures.md)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.{ext}" for ext in ("png", "pdf", "csv")]
    with mpl.rc_context(figures.style_rc()):  # our style, without touching the caller's rcParams
        fig = draw()
        note = "; ".join([f"{figures.plural(left_out, 'run folder')} left out as unusable"] * bool(left_out)
                         + [f"{figures.plural(refused, 'refused grid point')} left out"] * bool(refused))
        if note:   # the warnings naming them stay behind on stderr: a PNG shared later looked whole
            fig.draw_without_rendering()   # laid out, so the line goes above all of it (below it, a
            box = fig.get_tightbbox()      # tight save would move a legend under the axes onto it)
            fig.text((box.x0 + box.x1) / 2 / fig.get_figwidth(), (box.y1 + 0.05) / fig.get_figheight(),
                     f"{note} (why: the warnings on stderr)", ha="center", va="bottom",
                     fontsize="small", color="0.3")
            warnings.warn(f"{stem}: {note}, each named above", stacklevel=3)
        for path in paths[:2]:
            atomic_write(path, lambda f: fig.savefig(f, format=path.suffix[1:]))
    write_csv(frame, paths[2])
    return paths


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """``frame`` as the CSV ``path``, whole or not at all (Ctrl-C inside to_csv left a cut file
    under its final name); a run folder's name may not be UTF-8."""
    atomic_write(path, lambda f: frame.to_csv(f, index=False, errors="backslashreplace"))


def _build_all(results_dir, out_dir, exp_name, target, config) -> list[Path]:
    paths, refused = [], []
    for name in FIGURES:
        try:   # a variant (config) under its settings' name, never over the figure as committed
            paths += build_figure(name, results_dir, out_dir, exp_name, target, config,
                                  stem=f"{name}-{file_label(config)}" if config else None)
        except NoRunsError as e:   # the figure's own folder: not an 'exp' (all refuses --exp)
            print(f"skipping {name}: " + (f"{e.value}: expected {e.expected}" if e.key == "exp" else str(e)))
        except ConfigError as e:   # runs it refuses (mixed configurations): the rest are still drawn
            refused.append(name)
            print(f"error: {name}: {e}", file=sys.stderr)
    if refused:   # the figures drawn are named before the exit 2 the refused ones earn
        print("".join(f"wrote {path}\n" for path in paths), end="")
        raise ConfigError("figure", "all", f"figures that draw their runs; {', '.join(refused)} refused "
                          "them (said above), the others with runs were written")
    if not paths:
        raise NoRunsError("results", str(results_dir), "usable runs for at least one figure: no figure has "
                                                       "any there (each one's reason is said above)")
    return paths
