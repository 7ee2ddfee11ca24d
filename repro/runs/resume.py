"""What a resume reads before it continues a run: the checkpoint (written by the same driver and
holding every part a resume reads) and the tables up to it. The tables must be intact up to the
checkpoint (:func:`repro.files.schema.check_table`; timings.csv, one row per handled push, up to
the row count the checkpoint recorded: :func:`repro.files.schema.check_handled`). Rows after the
checkpoint are dropped (the resumed run recomputes them); a damaged row before it is refused,
naming the file and line. :mod:`repro.runs.folder` decides whether a run resumes at all.
"""
from __future__ import annotations

from pathlib import Path

import torch

from repro.errors import ConfigError
from repro.files import schema
from repro.files.storage import atomic_write_text, read_checkpoint
from repro.logs import get_logger

log = get_logger("repro.runs.resume")

# What a checkpoint must hold for a resume to read it (key: type), per part.
REQUIRED = {"server": dict, "server.params": torch.Tensor, "server.version": int, "server.rule": dict,
            "runlog": dict, "runlog.version": int, "runlog.samples_seen": int, "runlog.next_eval": float,
            "runlog.time_s": float, "runlog.last_eval_version": int, "runlog.events": list,
            "runlog.final": dict, "runlog.wall_time_s": float, "driver": dict}

DRIVER = {"sim": {"driver.clients": dict, "driver.scheduler": dict}, "real": {"driver.clients": dict}}


def resume_state(run_dir: Path, kind: str, device: torch.device | str) -> dict:
    """The checkpoint to resume from, its tables repaired up to it (each repair logged)."""
    state = load_checkpoint(run_dir, kind, device)
    runlog = state["runlog"]
    notes = [repair_table(run_dir, schema.UPDATES_FILE, schema.UPDATE_COLUMNS, int(runlog["version"])),
             repair_table(run_dir, schema.EVALS_FILE, schema.EVAL_COLUMNS, int(runlog["last_eval_version"])),
             repair_timings(run_dir, runlog)]
    for note in filter(None, notes):
        log.info(f"resume: {note}")
    return state


def repair_table(run_dir: Path, name: str, columns: tuple, upto: int) -> str:
    """Verify table ``name`` up to version ``upto`` and drop the rows after it. Returns what was
    repaired (for the log), or ""; raises ConfigError naming file and line when a row the
    resumed run needs is damaged or missing."""
    path = Path(run_dir) / name
    kept, dropped = schema.check_table(path, columns, upto, contiguous=name == schema.UPDATES_FILE)
    if not dropped:
        return ""
    atomic_write_text(path, "".join(kept))
    return f"{name}: dropped {dropped} row(s) after version {upto} (recomputed now)"


def repair_timings(run_dir: Path, runlog: dict) -> str:
    """Keep the timings.csv rows written before the checkpoint (``runlog`` holds their count; a
    checkpoint older than that count: the rows up to its version) and record in ``runlog`` how
    many were kept, so the resumed run counts on from them. Returns what was repaired, or ""."""
    path = Path(run_dir) / schema.TIMINGS_FILE
    rows = runlog.get("timing_rows")
    kept, dropped = schema.check_handled(path, schema.TIMING_COLUMNS, int(runlog["version"]),
                                         None if rows is None else int(rows))
    runlog["timing_rows"] = len(kept) - 1
    if not dropped:
        return ""
    atomic_write_text(path, "".join(kept))
    return f"{schema.TIMINGS_FILE}: dropped {dropped} row(s) written after the checkpoint (recomputed now)"


def load_checkpoint(run_dir: Path, kind: str, device: torch.device | str) -> dict:
    """The run folder's checkpoint, which must have been written by the ``kind`` driver and
    hold the server, the run log and the driver's state."""
    path = Path(run_dir) / schema.CHECKPOINT_FILE
    if not path.exists():
        raise ConfigError("resume", True, f"a run folder holding {schema.CHECKPOINT_FILE} "
                          f"(none at {path}: nothing to resume; force=true starts over)")
    state = read_checkpoint(path, device)
    if state.get("kind") != kind:
        raise ConfigError("resume", True, f"a {kind!r} checkpoint ({path} was written by the "
                          f"{state.get('kind')!r} backend)")
    missing = _missing(state, {**REQUIRED, **DRIVER[kind]})
    if missing:
        raise ConfigError("resume", str(path), f"a complete checkpoint (it lacks {', '.join(missing)})")
    return state


def _missing(state: dict, required: dict) -> list[str]:
    """The required keys (dotted) absent from ``state`` or of the wrong type."""
    out = []
    for key, kind in required.items():
        node = state
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        ok = isinstance(node, kind) or (kind is float and isinstance(node, int) and not isinstance(node, bool))
        if not ok:
            out.append(key)
    return out
