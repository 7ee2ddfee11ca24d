"""The run folder: the contract between the drivers (writers) and :mod:`repro.analysis` (reader):
its file names, columns and summary keys, and the integrity check of a table read back. Each file's
meaning: docs/getting-started.md, "What a run leaves behind".
"""
from __future__ import annotations

import contextlib
import math
from pathlib import Path

from repro.errors import ConfigError

CONFIG_FILE = "config.json"
UPDATES_FILE = "updates.csv"
EVALS_FILE = "evals.csv"
TIMINGS_FILE = "timings.csv"
SUMMARY_FILE = "summary.json"
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".lock"   # held while a process writes the folder (repro.files.locks)
# the names a run writes, as prefixes (their .tmp files, .hydra_incoming_PID): a folder holding
# only these is a run's, or one killed before its config.json: the run core judges it
RUN_OWN = (CONFIG_FILE, UPDATES_FILE, EVALS_FILE, TIMINGS_FILE, SUMMARY_FILE, CHECKPOINT_FILE, LOCK_FILE,
           "run.log", ".hydra", "_tmp")
# a grid's folder holds, beside its points' run folders: Hydra's record, stop marks, submitit's files
GRID_OWN = ("multirun.yaml", ".grid_stops", ".submitit")

UPDATE_COLUMNS = (
    "version",        # server version after this push was applied (1, 2, 3, ...)
    "time_s",         # when the server applied it (seconds since the run started)
    "clock",          # "virtual" (sim) or "wall" (real)
    "client",         # client id, 1..num_clients (the client's rank in the real driver); 0 in
                      # every row of a protocol that merges pushes (sync's round, rennala's step)
    "read_version",   # server version the client last fetched before computing this push
    "staleness",      # version before apply - read_version: updates the client did not see
    "num_steps",      # local minibatch steps in this push (always nsync; a replay copies the record)
    "num_samples",    # training samples behind this push
    "samples_seen",   # cumulative samples over all applied pushes
    "epoch",          # samples_seen / training-set size
    "train_loss",     # mean minibatch loss over the pushed segment
    "train_error",    # fraction misclassified over the pushed segment
)

# one row per push the server handled (version and time_s: as updates.csv's, once it was handled), then
# where its round trip went (docs/getting-started.md); apply_s is nan where a schedule has no model
TIMING_COLUMNS = ("version", "time_s", "clock", "client", "read_version", "to_client_s", "compute_s", "to_server_s",
                  "queue_s", "apply_s")
TIMING_PARTS = TIMING_COLUMNS[TIMING_COLUMNS.index("to_client_s"):]   # a push's five timed parts

EVAL_COLUMNS = ("version", "time_s", "clock", "epoch", "samples_seen", "test_loss", "test_error",
                "train_loss", "train_error")   # train_*: on a fixed subset of the training set

STATUSES = ("running", "completed", "completed_degraded", "diverged", "interrupted", "failed")
FINISHED_STATUSES = ("completed", "completed_degraded", "diverged")

# final values (time_to_target: {target_key(target): time_s or null}); each: docs/getting-started.md
SUMMARY_KEYS = ("status", "backend", "clock", "version", "samples_seen", "epoch", "time_s", "wall_time_s", "final",
                "time_to_target", "events", "message")
# Written when they apply: "discarded_pushes", "collected_pushes", "final_class_test_error", "eval_cpu_s"


def holds_others(folder: Path, grid: bool = False) -> bool:
    """Whether ``folder`` is a file, or holds files no run wrote (:data:`OTHERS`), asked before anything
    is written; ``grid``: a grid's folder, holding :data:`GRID_OWN` and runs' folders (:data:`GRID_OTHERS`)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():   # a file: mkdir's raw FileExistsError
        return True
    with contextlib.suppress(OSError):   # unreadable: the run's own checks say so
        if grid:
            return any(p.name not in GRID_OWN and holds_others(p) and (p.is_symlink() or holds_others(p, grid))
                       for p in folder.iterdir())   # never down a link: a loop would never end
        return not any((folder / name).exists() for name in (CONFIG_FILE, SUMMARY_FILE)) \
            and any(not p.name.startswith(RUN_OWN) for p in folder.iterdir())
    return False


OTHERS = ("a new or empty folder, or a run's (holding its config.json): this one is a file or holds others, "
          "which a run is never mixed with")
GRID_OTHERS = ("a new or empty folder, or a grid's (its multirun.yaml and run folders): this one is a file or "
               "holds others, which a grid is never mixed with")


def target_key(target: float) -> str:
    """The key of ``time_to_target`` in summary.json for ``target``: the float's repr ("0.05", "1.0")."""
    return str(float(target))


def version_fault(name: str, line: int, version, last: int | None, contiguous: bool) -> str:
    """Why ``version`` on line ``line`` of table ``name`` cannot follow ``last`` (None: first row), or "".
    ``contiguous`` (updates.csv): 1, 2, 3, ... without gaps; else (evals.csv): unique and increasing."""
    try:
        whole = math.isfinite(float(version)) and float(version) == int(version) and version >= 0
    except (TypeError, ValueError):
        whole = False
    if not whole:
        return f"{name} line {line} has version {version!r}; versions are whole numbers >= 0"
    version = int(version)
    if last is not None and version == last:
        return f"{name} line {line} repeats version {version} (a duplicated row)"
    if contiguous and version != (last or 0) + 1:
        after = "the header" if last is None else f"version {last}"
        return (f"{name} line {line} has version {version} after {after}; versions must run "
                "1, 2, 3, ... without gaps or repeats")
    if last is not None and version < last:
        return (f"{name} line {line} goes back to version {version} after version {last}; "
                "evaluation versions must be unique and increasing")
    return ""


def end_fault(name: str, last: int | None, end: int, source: str) -> str:
    """Why a table ending at version ``last`` is not the one ``source`` says ends at ``end``, or ""."""
    return "" if (last or 0) == end else \
        f"{name} ends at version {last or 0} but {source} says version {end} (rows lost or added)"


def versions_fault(name: str, versions, contiguous: bool, end: int | None = None) -> str:
    """The first fault of a whole table's ``version`` column (rows in file order, line 2 first)
    by :func:`version_fault`, then, with the summary's ``end``, :func:`end_fault`; "" if whole."""
    last = None
    for i, version in enumerate(versions):
        why = version_fault(name, i + 2, version, last, contiguous)
        if why:
            return why
        last = int(version)
    return end_fault(name, last, end, SUMMARY_FILE) if end is not None else ""


def check_table(path: Path, columns: tuple, upto: int, contiguous: bool) -> tuple[list[str], int]:
    """(lines to keep, header included; rows dropped): what a resume keeps of a table: rows up to version
    ``upto``, whole and in order (:func:`version_fault`); later ones are dropped. Else a ConfigError."""
    first = 1 if contiguous else 0
    lines = _read_lines(path, columns, needed=upto >= first)
    kept, last = lines[:1] or [_header(columns)], None
    for lineno, line in enumerate(lines[1:], start=2):
        if upto < first or (last is not None and last >= upto):
            break   # everything the resumed run needs is here: the rest is recomputed
        version = parse_row(line, len(columns), columns.index("version"))
        if version is None:
            raise _refused(upto, f"{path.name} line {lineno} is damaged ({line[:40]!r})")
        if version > upto:
            break
        why = version_fault(path.name, lineno, version, last, contiguous)
        if why:
            raise _refused(upto, why)
        kept.append(line)
        last = version
    why = end_fault(path.name, last, upto, "the checkpoint") if contiguous else ""
    if why:
        raise _refused(upto, why)
    return kept, max(len(lines) - len(kept), 0)


def check_handled(path: Path, columns: tuple, upto: int, rows: int | None) -> tuple[list[str], int]:
    """As :func:`check_table` for timings.csv (versions repeat): the first ``rows`` rows (the checkpoint's
    count), whole, never going back nor past ``upto``; ``rows`` None (an older checkpoint): the rows up to
    the first that is not."""
    lines = _read_lines(path, columns, needed=bool(rows))
    kept, last = lines[:1] or [_header(columns)], 0
    for lineno, line in enumerate(lines[1:], start=2):
        if rows is not None and len(kept) > rows:
            break
        version = parse_row(line, len(columns), columns.index("version"))
        why = (f"{path.name} line {lineno} is damaged ({line[:40]!r})" if version is None else
               f"{path.name} line {lineno} has version {version} after version {last}" if version < last
               else f"{path.name} line {lineno} has version {version}, past the checkpoint's"
               if version > upto else "")
        if why and rows is None:
            break
        if why:
            raise _refused(upto, why)
        kept.append(line)
        last = version
    if rows is not None and len(kept) <= rows:
        raise _refused(upto, f"{path.name} has {len(kept) - 1} row(s) but the checkpoint counts {rows} (rows lost)")
    return kept, max(len(lines) - len(kept), 0)


def _header(columns: tuple) -> str:
    return ",".join(columns) + "\n"


def _read_lines(path: Path, columns: tuple, needed: bool) -> list[str]:
    """The table's lines (unreadable: none); a ConfigError when its header is wrong, or missing where ``needed``."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    lines = text.splitlines(keepends=True)
    if lines and lines[0] != _header(columns) or not lines and needed:
        raise ConfigError("resume", True, f"an intact {path.name}: its header is missing or not "
                          f"{_header(columns).strip()!r}; force=true starts over")
    return lines


def _refused(upto: int, why: str) -> ConfigError:
    return ConfigError("resume", True, f"tables intact up to the checkpoint's version {upto}: "
                       f"{why}; force=true starts over")


def parse_row(line: str, width: int, version_col: int) -> int | None:
    """The row's version, or None if it is damaged (cut, NUL bytes, wrong width, not numbers)."""
    if not line.endswith("\n") or "\x00" in line or "\ufffd" in line:
        return None
    fields = line.rstrip("\n").split(",")
    if len(fields) != width:
        return None
    try:
        values = [float(f) for f in fields if f not in ("virtual", "wall")]
    except ValueError:
        return None
    version = float(fields[version_col])
    if len(values) != width - 1 or not math.isfinite(version) or version != int(version):
        return None
    return int(version)
