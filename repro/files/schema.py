"""The run folder: the contract between the drivers (writers) and :mod:`repro.analysis` (reader).

``results/<exp_name>/<job>/`` holds

* ``config.json``  -- the fully resolved configuration (nested dict of the config dataclasses),
  plus measured values such as a calibrated compute time;
* ``updates.csv``  -- one row per push the server applied, columns :data:`UPDATE_COLUMNS`;
* ``evals.csv``    -- one row per evaluation of the server's parameters, :data:`EVAL_COLUMNS`;
* ``summary.json`` -- :data:`SUMMARY_KEYS`; ``status`` is one of :data:`STATUSES`;
* ``checkpoint.pt`` -- the latest server checkpoint (tensors and numbers only), when enabled.

``time_s`` is virtual time for the simulator and wall time for the real driver; the ``clock``
column says which (``virtual`` or ``wall``). Column names are the paper's vocabulary and are the
same in config keys, dataclass fields and plot labels.
"""
from __future__ import annotations

import math
from pathlib import Path

from repro.errors import ConfigError

CONFIG_FILE = "config.json"
UPDATES_FILE = "updates.csv"
EVALS_FILE = "evals.csv"
SUMMARY_FILE = "summary.json"
CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = ".lock"   # held while a process writes the folder (repro.files.locks)

UPDATE_COLUMNS = (
    "version",        # server version after this push was applied (1, 2, 3, ...)
    "time_s",         # when the server applied it (seconds since the run started)
    "clock",          # "virtual" (sim) or "wall" (real)
    "client",         # client id, 1..num_clients (the client's rank in the real driver)
    "read_version",   # server version the client last fetched before computing this push
    "staleness",      # version before apply - read_version: updates the client did not see
    "num_steps",      # local minibatch steps in this push (always nsync; a replay copies the record)
    "num_samples",    # training samples behind this push
    "samples_seen",   # cumulative samples over all applied pushes
    "epoch",          # samples_seen / training-set size
    "train_loss",     # mean minibatch loss over the pushed segment
    "train_error",    # fraction misclassified over the pushed segment
)

EVAL_COLUMNS = (
    "version",
    "time_s",
    "clock",
    "epoch",
    "samples_seen",
    "test_loss",
    "test_error",
    "train_loss",     # on a fixed subset of the training set, server parameters
    "train_error",
)

STATUSES = ("running", "completed", "completed_degraded", "diverged", "interrupted", "failed")
FINISHED_STATUSES = ("completed", "completed_degraded", "diverged")

SUMMARY_KEYS = (
    "status",         # one of STATUSES
    "backend",        # "sim" or "real"
    "clock",
    "version",        # final server version
    "samples_seen",
    "epoch",
    "time_s",         # final time on the run's clock
    "wall_time_s",    # wall time the run took
    "final",          # {"test_loss", "test_error", "train_loss", "train_error"} at the last eval
    "time_to_target", # {"<target_error>": time_s or null}: first eval with train_error <= target
    "events",         # list of {"type": "client_lost"|"resumed"|"diverged", "time_s", "version", ...}
    "message",        # human-readable reason for a non-completed status, else ""
)


# ---------------------------------------------------------------------------------------------
# A table read back: the one integrity check, for a resume and for the analysis
# ---------------------------------------------------------------------------------------------

def check_table(path: Path, columns: tuple, upto: int, contiguous: bool) -> tuple[list[str], int]:
    """(lines to keep, header included; rows dropped). Rows up to version ``upto`` must parse and
    (``contiguous``: updates, from 1) run 1, 2, ..., upto, or (evals, from 0) increase; anything
    after them may be damaged and is dropped."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        text = ""
    lines = text.splitlines(keepends=True)
    header = ",".join(columns) + "\n"
    first = 1 if contiguous else 0
    if lines and lines[0] != header or not lines and upto >= first:
        raise ConfigError("resume", True, f"an intact {path.name}: its header is missing or not "
                          f"{header.strip()!r}; force=true starts over")
    kept, last = [header], None
    for lineno, line in enumerate(lines[1:], start=2):
        if upto < first or (last is not None and last >= upto):
            break   # everything the resumed run needs is here: the rest is recomputed
        version = parse_row(line, len(columns), columns.index("version"))
        if version is None:
            raise ConfigError("resume", True, f"an intact {path.name}: line {lineno} is damaged "
                              f"({line[:40]!r}), before the checkpoint's version {upto}; force=true starts over")
        if version > upto:
            break
        if (contiguous and version != (last or 0) + 1) or (last is not None and version <= last):
            raise ConfigError("resume", True, f"contiguous versions in {path.name}: line {lineno} has "
                              f"version {version} after {last}; force=true starts over")
        kept.append(line)
        last = version
    if contiguous and (last or 0) != upto:
        raise ConfigError("resume", True, f"{path.name} up to the checkpoint's version {upto}: it "
                          f"ends at version {last or 0}; force=true starts over")
    return kept, max(len(lines) - len(kept), 0)


def parse_row(line: str, width: int, version_col: int) -> int | None:
    """The row's version, or None if it is damaged (cut, NUL bytes, wrong width, not numbers)."""
    if not line.endswith("\n") or "\x00" in line or "\ufffd" in line:
        return None
    fields = line.rstrip("\n").split(",")
    if len(fields) != width:
        return None
    try:
        values = [float(f) for i, f in enumerate(fields) if f != "virtual" and f != "wall"]
    except ValueError:
        return None
    version = float(fields[version_col])
    if len(values) != width - 1 or not math.isfinite(version) or version != int(version):
        return None
    return int(version)
