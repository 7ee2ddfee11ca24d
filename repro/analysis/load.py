"""Reading run folders (the contract in :mod:`repro.files.schema`) into tidy DataFrames: finding
them under ``results/<exp_name>/``, validating each, flattening its ``config.json`` into dotted
columns and concatenating its CSVs. A folder is a run iff it holds ``config.json``; a finished
one is kept (a diverged one too), a partial or corrupt one skipped with a warning
(docs/failures.md lists what is refused). A bad folder never raises; a missing experiment folder
does (:class:`NoRunsError`).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from repro.config.renames import read_recorded
from repro.config.settings import unknown_keys
from repro.errors import ConfigError
from repro.files import schema
from repro.files.locks import lock_held
from repro.files.schema import LOCK_FILE
from repro.files.storage import NotRegular, read_regular

# Config columns copied onto every evals/updates row so that figures can group without a join.
GROUP_COLUMNS = ("exp_name", "job", "num_clients", "nsync", "seed", "start", "backend.name",
                 "target_error", "status")
REQUIRED_CONFIG_KEYS = ("num_clients", "nsync", "seed")
SKIPPED_COLUMNS = ("run_dir", "exp_name", "job", "kind", "reason")
# Counts in the CSVs: stored as int64 when every value is a whole number (NaN keeps float).
INT_COLUMNS = ("version", "client", "read_version", "staleness", "num_steps", "num_samples",
               "samples_seen")


class NoRunsError(ConfigError):
    """The experiment folder is missing or holds no usable run (the CLI exits with code 2)."""


class BadRun(Exception):
    """Why one folder was skipped; caught by :func:`load_runs`, never escapes it."""

    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclasses.dataclass(frozen=True)
class Runs:
    """The tidy tables of one results tree: ``runs`` (one row per kept run: config and summary
    columns), ``evals`` and ``updates`` (every CSV row plus ``run_dir`` and :data:`GROUP_COLUMNS`),
    ``skipped`` (one row per partial or corrupt folder)."""

    runs: pd.DataFrame
    evals: pd.DataFrame
    updates: pd.DataFrame
    skipped: pd.DataFrame

    def __len__(self) -> int:
        return len(self.runs)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"algo": {"lr": 0.1}}`` -> ``{"algo.lr": 0.1}``; lists become JSON strings (one cell)."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, else :class:`BadRun` saying why (:func:`read_regular`: not a regular file)."""
    try:
        return read(path)
    except (OSError, ValueError, RecursionError, csv.Error) as e:   # decode errors are ValueErrors; JSON
        # nested past the parser's depth a RecursionError (a traceback, where a bad folder never raises)
        raise BadRun("corrupt", str(e) if isinstance(e, NotRegular) else f"{path.name} is unreadable ({e})") from None


def read_table(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """One of the run's CSVs, strictly: :class:`BadRun` for a missing column, a ragged or cut row,
    or a schema column (``clock`` aside) holding a non-number (blank, nan, inf are numbers)."""
    if not path.exists():
        raise BadRun("corrupt", f"{path.name} is missing")
    text = _read(path, lambda p: read_regular(p, newline=""))
    if text and not text.endswith("\n"):   # a cut inside the last cell leaves a number, a smaller one
        raise BadRun("corrupt", f"{path.name} ends inside a row: its last line was cut (truncated write?)")
    rows = _read(path, lambda p: list(csv.reader(io.StringIO(text, newline=""))))
    if not rows:
        raise BadRun("corrupt", f"{path.name} is empty (no header)")
    header, body = rows[0], [r for r in rows[1:] if r]  # csv gives [] for a blank line
    missing = [c for c in columns if c not in header]
    if missing:
        raise BadRun("corrupt", f"{path.name} lacks columns {missing}")
    for lineno, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise BadRun("corrupt", f"{path.name} line {lineno} has {len(row)} fields, "
                                    f"header has {len(header)} (truncated write?)")
    cols = list(zip(*body)) if body else [()] * len(header)
    return pd.DataFrame({name: list(values) if name == "clock" else _numbers(values, path.name, name, name in columns)
                         for name, values in zip(header, cols)}, columns=header)


def _numbers(values: tuple[str, ...], file: str, column: str, schema_column: bool) -> np.ndarray | list[str]:
    """The cells as floats (blank: NaN; :data:`INT_COLUMNS` as int64 when all are whole); a
    non-number is :class:`BadRun` in a ``schema_column``, else the column stays text."""
    cleaned = [v if v.strip() else "nan" for v in values]
    try:
        array = np.array(cleaned, dtype=float)   # float()'s values (pandas 2's parser can differ)
    except ValueError:
        if not schema_column:
            return list(values)
        for bad in cleaned:   # the first cell float() refuses
            try:
                float(bad)
            except ValueError:
                raise BadRun("corrupt",
                             f"{file} column '{column}' has non-numeric value {bad!r}") from None
    if column in INT_COLUMNS and np.isfinite(array).all() and (array == np.round(array)).all():
        return array.astype(np.int64)
    return array


def _summary_row(summary: dict[str, Any], taken: set[str]) -> dict[str, Any]:
    """Summary fields as columns: ``status``, ``final_test_error``, ``time_to_target.0.1``, ..."""
    row: dict[str, Any] = {k: summary.get(k) for k in ("status", "clock", "message", "wall_time_s")}
    row.update({f"final_{key}": summary.get(key) for key in ("version", "samples_seen", "epoch", "time_s")})
    final = summary.get("final")
    final = final if isinstance(final, dict) else {}
    row.update({f"final_{key}": final.get(key) for key in ("test_loss", "test_error", "train_loss", "train_error")})
    ttt = summary.get("time_to_target") or {}
    if isinstance(ttt, dict):
        row.update({f"time_to_target.{target}": t for target, t in ttt.items()})
    classes = summary.get("final_class_test_error")   # one cell, as config lists (flatten)
    if isinstance(classes, list):
        row["final_class_test_error"] = json.dumps(classes)
    events = summary.get("events") or []
    row["num_events"] = len(events) if isinstance(events, list) else 0
    known = set(schema.SUMMARY_KEYS) - {"backend"}
    for key, value in summary.items():  # keys a driver added (``**extra``), when scalar
        if key not in known and isinstance(value, (str, int, float, bool, type(None))):
            row[f"summary.{key}"] = value
    # A config key with the same name keeps its name; the summary one gets a prefix.
    return {(f"summary.{k}" if k in taken and not k.startswith("summary.") else k): v
            for k, v in row.items()}


def read_run(run_dir: Path, exp_dir: Path) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame]:
    """One run folder -> (runs row, evals, updates). Raises :class:`BadRun` to skip the folder."""
    config = _read(run_dir / schema.CONFIG_FILE, lambda p: read_recorded(p.parent))   # old spellings: new columns
    lacking = [k for k in REQUIRED_CONFIG_KEYS if k not in config]
    if lacking:
        raise BadRun("corrupt", f"{schema.CONFIG_FILE} lacks {lacking}")
    unknown = unknown_keys(config)
    if unknown:   # read, as other columns are; but a figure's configuration (configs.py) never sees it
        warnings.warn(f"run {run_dir}: {schema.CONFIG_FILE} key(s) unknown to this version: {', '.join(unknown)} "
                      "(written by another version, or by hand): kept as columns, but no figure tells "
                      "runs apart by them", stacklevel=3)
    if not (run_dir / schema.SUMMARY_FILE).exists():
        raise BadRun("partial", f"no {schema.SUMMARY_FILE} (" + (
            "still running: a live process holds its lock)" if lock_held(run_dir / LOCK_FILE)
            else "killed before its first summary: no process holds it)"))
    summary = _read(run_dir / schema.SUMMARY_FILE, lambda p: json.loads(read_regular(p)))
    if not isinstance(summary, dict):
        raise BadRun("corrupt", f"{schema.SUMMARY_FILE} is not a JSON object")
    status = summary.get("status")
    if status not in schema.STATUSES:
        raise BadRun("corrupt", f"{schema.SUMMARY_FILE} status {status!r} is not one of "
                                f"{list(schema.STATUSES)}")
    if status == "running":
        raise BadRun("partial", "still running (a live process holds its lock)" if lock_held(
            run_dir / LOCK_FILE) else "killed (its summary says running but no process holds it)")
    if status not in schema.FINISHED_STATUSES:
        raise BadRun("partial", f"status {status!r}" + (f": {summary['message']}"
                                                         if summary.get("message") else ""))
    evals = read_table(run_dir / schema.EVALS_FILE, schema.EVAL_COLUMNS)
    updates = read_table(run_dir / schema.UPDATES_FILE, schema.UPDATE_COLUMNS)
    check_versions(evals, updates, summary)
    cfg = flatten(config)
    ident = {"run_dir": str(run_dir), "exp_name": cfg.pop("exp_name", exp_dir.name),
             "job": run_dir.name}
    leading = {k: cfg.pop(k) for k in GROUP_COLUMNS if k in cfg}  # the grouping keys first
    row = {**ident, **leading, **cfg}
    row.update(_summary_row(summary, set(row)))
    fallback = row.get("clock") or {"sim": "virtual", "real": "wall"}.get(row.get("backend.name"))
    for table in (evals, updates):
        if fallback and len(table):   # empty clock cells: the summary's clock, else the backend's
            table["clock"] = [c if c else fallback for c in table["clock"]]
        table.insert(0, "run_dir", ident["run_dir"])
        for name in GROUP_COLUMNS:
            table[name] = row.get(name)
    return row, evals, updates


def check_versions(evals: pd.DataFrame, updates: pd.DataFrame, summary: dict[str, Any]) -> None:
    """:class:`BadRun` for tables a resume would refuse (:func:`repro.files.schema.versions_fault`),
    or an ``evals.csv`` without rows (a run evaluates at its start: it was cut)."""
    final = summary.get("version")
    end = final if isinstance(final, int) and not isinstance(final, bool) else None
    completed = str(summary.get("status")).startswith("completed")
    why = (schema.versions_fault(schema.UPDATES_FILE, updates["version"].tolist(), True, end)
           or ("" if len(evals) else f"{schema.EVALS_FILE} has no rows (a run evaluates at its start)")
           or schema.versions_fault(schema.EVALS_FILE, evals["version"].tolist(), False, end if completed else None))
    if why:
        raise BadRun("corrupt", why)


def find_run_dirs(exp_dir: Path) -> tuple[list[Path], list[Path]]:
    """(folders with config.json, folders with run files but no config.json), sorted; links are
    followed, each real folder walked once (a link to a folder above it would loop)."""
    runs, orphans, walked = set(), set(), set()
    for top, dirs, files in os.walk(exp_dir, followlinks=True):
        real = os.path.realpath(top)
        if real in walked:
            dirs[:] = []
            continue
        walked.add(real)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))   # .hydra/ and friends
        names = {*files, *dirs}   # a run file that is a folder is still the run's (read_run says so)
        if schema.CONFIG_FILE in names:
            runs.add(Path(top))
        elif names & {schema.SUMMARY_FILE, schema.EVALS_FILE, schema.UPDATES_FILE}:
            orphans.add(Path(top))
    return sorted(runs), sorted(orphans)


def load_runs(results_dir: str | Path, exp_name: str | None = None, jobs: Iterable[str] | None = None) -> Runs:
    """Every run under ``results_dir/exp_name`` (every experiment when None); a partial or corrupt
    folder is skipped with a warning naming it and why (given ``jobs``, a grid's points: only
    theirs). Raises :class:`NoRunsError` only when the folder itself does not exist."""
    root = Path(results_dir)
    found = sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith((".", "_")))
    wanted = root / exp_name if exp_name else root
    if not wanted.is_dir():
        names = ", ".join(p.name for p in found) or "none"
        raise NoRunsError("exp", str(wanted), f"an experiment folder under {root} "
                                              f"(found: {names})")
    exp_dirs = [wanted] if exp_name else found
    read, skipped = [], []
    jobs = None if jobs is None else set(jobs)
    for exp_dir in exp_dirs:
        run_dirs, orphans = find_run_dirs(exp_dir)
        for orphan in orphans:
            _skip(skipped, orphan, exp_dir, BadRun("corrupt", f"no {schema.CONFIG_FILE}"), jobs)
        for run_dir in run_dirs:
            try:
                read.append(read_run(run_dir, exp_dir))
            except BadRun as bad:
                _skip(skipped, run_dir, exp_dir, bad, jobs)
    rows, evals, updates = ([run[i] for run in read] for i in range(3))   # (runs row, evals, updates) each
    return Runs(runs=_frame(rows, ("run_dir", "exp_name", "job", *REQUIRED_CONFIG_KEYS, "status")),
                evals=_concat(evals, schema.EVAL_COLUMNS),
                updates=_concat(updates, schema.UPDATE_COLUMNS),
                skipped=_frame(skipped, SKIPPED_COLUMNS))


def _skip(skipped: list[dict[str, Any]], run_dir: Path, exp_dir: Path, bad: BadRun, jobs: set | None) -> None:
    if jobs is None or run_dir.name in jobs:
        warnings.warn(f"skipping {bad.kind} run {run_dir}: {bad.reason}", stacklevel=3)
    skipped.append({"run_dir": str(run_dir), "exp_name": exp_dir.name, "job": run_dir.name,
                    "kind": bad.kind, "reason": bad.reason})


def _frame(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pd.DataFrame:
    # every row holds ``columns``; an empty tree still has them: downstream code selects them
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=list(columns))


def _concat(frames: list[pd.DataFrame], columns: tuple[str, ...]) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=["run_dir", *columns, *GROUP_COLUMNS]))


def recorded(runs: pd.DataFrame, key: str) -> Any:
    """What the first of ``runs`` records under ``key`` beside its settings (e.g.
    ``network.param_bytes``; a list as a list); :class:`NoRunsError` for a folder that does not."""
    values = runs[key].tolist() if key in runs else [None] * len(runs)
    for folder, value in zip(runs["run_dir"], values):
        if not isinstance(value, str) and not finite(value):
            raise NoRunsError(key, None, f"run folders whose config.json records it: {folder} was "
                                         "written before they did; run it again with force=true")
    value = values[0]
    return json.loads(value) if isinstance(value, str) and value.startswith("[") else value


def is_diverged(status: pd.Series) -> pd.Series:
    """Boolean mask of diverged runs (status column of any of the tables)."""
    return status.astype(object).eq("diverged")


def finite(x: Any) -> bool:
    """True for a real finite number (None, NaN and inf are not)."""
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
