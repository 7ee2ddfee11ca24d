"""Each figure's per-run scalar metrics (docs/paper.md, 'How compare decides'), read from a
results tree (each frame built as when drawing) or from a figures folder (the CSVs
``build_figure`` wrote: the frames themselves); :mod:`repro.analysis.compare` compares them.
"""
from __future__ import annotations

import dataclasses
import io
import warnings
from pathlib import Path

import pandas as pd

from repro.analysis.frames import START_COLUMNS
from repro.analysis.render import FIGURES, figure_frame
from repro.analysis.load import NoRunsError, Runs, load_runs
from repro.analysis.tables import resolve_target, time_to_target
from repro.errors import ConfigError

KIND = {"fig3_paper": "fig3", "fig4_paper": "fig4"}   # the same figure in the paper's regime
METRICS = {"fig1": ("final_train_error_pct", "final_test_error_pct"),
           "fig2": ("time_to_target_s", "final_train_error_pct"),
           "fig4": ("speedup",),
           "staleness": ("mean_staleness", "final_test_error_pct")}
# Identity of a run besides seed and run_dir; the grid keys are chosen among these.
IDENTITY = ("exp_name", "start", "backend.name", "config_id", "num_clients", "nsync")
# Columns a figures-folder CSV must hold for its metrics to be computed.
REQUIRED = {"fig1": ("metric", "error_pct", "time_s", "version"),
            "fig2": ("train_error_pct", "time_s", "version"),
            "fig4": ("speedup", "outcome"),
            "staleness": ("quantity", "value", "count")}
for _name, _kind in {"fig3": "fig2", **KIND}.items():   # fig3's curves are fig2's, a panel per nsync
    METRICS[_name], REQUIRED[_name] = METRICS[_kind], REQUIRED[_kind]
# The registered figures compare reduces to per-run metrics (the paper's), in the registry's order.
COMPARED = tuple(name for name in FIGURES if name in METRICS)
# Read back the very floats build_figure wrote, so that a results tree and the figures folder
# built from it give equal metrics: pandas 3 does by default (and deprecates the option);
# pandas 2's default parser can be off by one unit in the last place.
_ROUND_TRIP = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


@dataclasses.dataclass(frozen=True)
class Tree:
    """One side of a comparison: its kind, each figure's tidy frame and its runs' ``target_error``
    (None when the tree does not say)."""

    path: Path
    kind: str  # "results" or "figures"
    frames: dict[str, pd.DataFrame]
    targets: dict[str, float | None]

    def describe(self) -> str:
        kind = "results tree" if self.kind == "results" else "figures folder"
        return f"{kind} {self.path} ({', '.join(self.frames) or 'no figure'})"


def tree_kind(path: str | Path) -> str:
    """``"results"`` or ``"figures"``; :class:`ConfigError` when it is neither or both."""
    root = Path(path)
    if not root.is_dir():
        raise NoRunsError("compare", str(root), "an existing results tree or figures folder")
    csvs = [n for n in COMPARED if (root / f"{n}.csv").is_file()]
    exps = [n for n in COMPARED if any((root / e).is_dir() for e in FIGURES[n].exps)]
    if csvs and exps:
        raise ConfigError("compare", str(root), "either a results tree or a figures folder, "
                                                f"not both (it holds {csvs[0]}.csv and "
                                                f"{exps[0]}/)")
    if csvs or exps:
        return "figures" if csvs else "results"
    hint = [str(root / d) for d in ("results", "figures") if (root / d).is_dir()]
    raise NoRunsError("compare", str(root),
                      "a results tree (folders fig1/ .. fig4/, staleness/) or a figures folder "
                      f"({', '.join(f'{n}.csv' for n in COMPARED)})"
                      + (f"; did you mean {' or '.join(hint)}?" if hint else ""))


def read_tree(path: str | Path, names: tuple[str, ...] = COMPARED,
              target: float | None = None, config: str | None = None) -> Tree:
    """Every figure of ``names`` that ``path`` holds (one without usable runs left out with a
    warning); :class:`ConfigError` for a malformed CSV or several configurations ``config`` does
    not choose among."""
    root = Path(path)
    kind = tree_kind(root)
    frames, targets = {}, {}
    loaded: dict[str, Runs] = {}  # staleness and fig3 may share one experiment folder
    for name in names:
        if kind == "figures":
            got = _read_csv(root, name)
            if got is not None:
                frames[name], targets[name] = got, _target(got)
            continue
        exp = next((e for e in FIGURES[name].exps if (root / e).is_dir()), None)
        if exp is None:
            continue
        if exp not in loaded:
            loaded[exp] = load_runs(root, exp)
        try:
            with warnings.catch_warnings(record=True) as caught:  # say which tree they are about
                warnings.simplefilter("always")
                frames[name] = figure_frame(name, root, exp, target, runs=loaded[exp],
                                            config=config)
        except NoRunsError as e:
            warnings.warn(f"{root}: leaving {name} out: {e}", stacklevel=2)
            continue
        finally:
            for w in caught:
                warnings.warn(f"{name} in {root}: {w.message}", w.category, stacklevel=2)
        targets[name] = _target(loaded[exp].runs)
    return Tree(root, kind, frames, targets)


def _target(frame: pd.DataFrame) -> float | None:
    try:
        return resolve_target(frame)
    except NoRunsError:
        return None


def _read_csv(root: Path, name: str) -> pd.DataFrame | None:
    path = root / f"{name}.csv"
    if not path.is_file():
        return None
    try:
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):   # a cut inside the last cell leaves a number, a smaller one
            raise ValueError("it ends inside a row: its last line was cut, a truncated write")
        frame = pd.read_csv(io.BytesIO(data), **_ROUND_TRIP)
    except (OSError, ValueError) as e:   # pandas' ParserError, EmptyDataError; UnicodeDecodeError
        raise ConfigError(f"{name}.csv", str(path), f"a CSV written by build_figure ({e})") \
            from None
    missing = [c for c in ("run_dir", "num_clients", "nsync", *REQUIRED[name])
               if c not in frame]
    if missing:
        raise ConfigError(f"{name}.csv", str(path),
                          f"the columns of the {name} frame (it lacks {missing})")
    if frame.empty:
        warnings.warn(f"{path} has no rows: leaving {name} out", stacklevel=3)
        return None
    if "config_id" in frame and frame["config_id"].nunique() > 1:   # never pooled: as drawing
        raise ConfigError(f"{name}.csv", str(path), "the runs of one configuration (it holds "
                          f"{frame['config_id'].nunique()}: config_id "
                          f"{', '.join(map(str, frame['config_id'].unique()))})")
    return frame


def run_metrics(name: str, frame: pd.DataFrame, target: float | None = None) -> pd.DataFrame:
    """One row per run: ``run_dir``, ``seed`` and :data:`IDENTITY` columns (those present), then
    the figure's :data:`METRICS`; ``target`` (a fraction) is fig2 and fig3's."""
    per_run = frame.drop_duplicates("run_dir").set_index("run_dir")
    out = per_run[[c for c in ("seed", *IDENTITY) if c in frame]]
    name = KIND.get(name, name)
    if name == "fig1":
        metrics = {f"final_{m}_error_pct": _last(frame[frame["metric"] == label], "error_pct")
                   for m, label in (("train", "training error"), ("test", "test error"))}
    elif name in ("fig2", "fig3"):
        times = time_to_target(frame, 100.0 * target, "train_error_pct")   # errors in percent, as the frame's
        metrics = {"time_to_target_s": times.set_index("run_dir")["time_to_target_s"],
                   "final_train_error_pct": _last(frame, "train_error_pct")}
    elif name == "fig4":
        out = out[out["num_clients"] != 1]
        metrics = {"speedup": per_run["speedup"].where(per_run["outcome"] == "ok")}
    else:   # staleness (compare asks only for the figures of METRICS)
        pushes = frame[frame["quantity"] == "staleness"]
        weighted = (pushes["value"] * pushes["count"]).groupby(pushes["run_dir"]).sum()
        final = frame[frame["quantity"] == "final_test_error_pct"]
        metrics = {"mean_staleness": weighted / pushes.groupby("run_dir")["count"].sum(),
                   "final_test_error_pct": final.groupby("run_dir")["value"].last()}
    return out.assign(**{column: pd.to_numeric(values, errors="coerce").reindex(out.index)  # NaN: none
                         for column, values in metrics.items()}).reset_index()


def _last(frame: pd.DataFrame, column: str) -> pd.Series:
    """The value at each run's last evaluation, NaN included (``groupby.last`` would skip it)."""
    ordered = frame.sort_values(["time_s", "version"], kind="stable")
    return ordered.groupby("run_dir").tail(1).set_index("run_dir")[column]


def start_errors(name: str, frame: pd.DataFrame) -> pd.DataFrame | None:
    """The first evaluation's errors (the shared baseline's) of a warm-started fig3/fig4 frame, one
    row per seed; None for other figures, cold starts, and frames that do not record it."""
    kind = KIND.get(name, name)
    if kind not in ("fig3", "fig4") or "start" not in frame or not (frame["start"] == "warm").all():
        return None
    if kind == "fig3":
        first = frame.sort_values(["run_dir", "time_s", "version"], kind="stable").groupby(
            "run_dir", sort=True).head(1)
        first = first.rename(columns={f"{m}_pct": start for m, start in START_COLUMNS.items()})
    elif "start_train_error_pct" in frame:
        first = frame.drop_duplicates("run_dir")
    else:
        return None
    return first.sort_values("run_dir", kind="stable").drop_duplicates("seed")[["seed", *START_COLUMNS.values()]]
