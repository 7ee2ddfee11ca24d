"""A run folder's life around the training loop: one writer, what an existing folder means, and
the checks a resume makes before it touches a file.

* **One writer.** :func:`open_folder` takes the folder's lock (:mod:`repro.locks`) for the whole
  run; a second writer (a second launch, or ``resume=true`` while the first is alive) is refused
  with exit 2 naming the holder. A dead holder's lock is taken over.
* **What is already there** (:func:`decide`): nothing: a fresh run. A finished run
  (completed, degraded, diverged): skipped, also by ``resume=true`` (a finished run is never
  changed). An interrupted, failed or killed run: refused unless ``resume=true`` (continue it) or
  ``force=true`` (start over); starting over is never silent. ``resume=auto`` continues what can
  be continued and starts what cannot, for launchers that restart a job (torchrun).
* **Resume checks** (before any file is touched): every training-shaping key must equal the
  recorded one (:func:`repro.config.differences`), and the tables must be intact up to the
  checkpoint: contiguous versions, parseable rows. Rows after the checkpoint are dropped (the
  resumed run recomputes them); a damaged row before it is refused, naming the file and line.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from repro import schema
from repro.config import RunConfig, differences
from repro.errors import ConfigError
from repro.locks import FileLock, LockHeld
from repro.logs import get_logger
from repro.runlog import atomic_write_text, read_summary

log = get_logger("repro.runfolder")
LOCK_FILE = ".lock"
# Hydra writes a job's record (.hydra/config.yaml, overrides.yaml, hydra.yaml) before our code
# runs; it goes to a folder of this process's own (conf/config.yaml: hydra.output_subdir), and
# becomes the folder's .hydra/ only once this run has the folder (a refused or skipped run must
# not overwrite the record of the run the folder holds).
HYDRA_RECORD, INCOMING_RECORD = ".hydra", ".hydra_incoming_{pid}"
RUN_FILES = (schema.CONFIG_FILE, schema.UPDATES_FILE, schema.EVALS_FILE, schema.SUMMARY_FILE,
             schema.CHECKPOINT_FILE)


@dataclass
class Decision:
    action: str                   # "fresh", "skip" or "resume"
    summary: dict | None = None   # what the folder holds (skip: returned as the run's summary)


@contextlib.contextmanager
def open_folder(run_dir: str | Path):
    """Hold the run folder's lock for the duration (ConfigError, exit 2, if another live run
    holds it)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(run_dir / LOCK_FILE)
    try:
        lock.acquire()
    except LockHeld as held:
        h = held.holder
        raise ConfigError("run folder", str(run_dir), f"a folder no other run is writing: pid "
                          f"{h.get('pid', '?')} on {h.get('host', '?')} (started {h.get('started', '?')}) "
                          f"holds it; wait for it to end, or choose another exp_name") from None
    try:
        yield run_dir
    finally:
        lock.release()


def incoming_record(run_dir: Path) -> Path:
    return Path(run_dir) / INCOMING_RECORD.format(pid=os.getpid())


def adopt_hydra_record(run_dir: Path) -> None:
    """This run has the folder: its Hydra record becomes the folder's."""
    incoming = incoming_record(run_dir)
    if incoming.is_dir():
        shutil.rmtree(Path(run_dir) / HYDRA_RECORD, ignore_errors=True)
        os.replace(incoming, Path(run_dir) / HYDRA_RECORD)


def drop_hydra_record(run_dir: Path) -> None:
    """A refused or skipped run: its Hydra record goes, the folder's stays."""
    shutil.rmtree(incoming_record(run_dir), ignore_errors=True)


def recorded_version(run_dir: Path, summary: dict | None) -> int:
    """The version a folder's run reached: its summary's, or, for a run killed before its
    summary moved on (it still says running), the last row of updates.csv."""
    version = int(summary.get("version", 0)) if summary else 0
    if summary is None or summary.get("status") == "running":
        try:
            lines = (Path(run_dir) / schema.UPDATES_FILE).read_text(errors="replace").splitlines()
            for line in reversed(lines[1:]):
                row = _parse_row(line + "\n", len(schema.UPDATE_COLUMNS), 0)
                if row is not None:
                    return max(version, row)
        except OSError:
            pass
    return version


def decide(cfg: RunConfig, run_dir: Path) -> Decision:
    """What to do with ``run_dir`` for ``cfg`` (call with the folder's lock held). Raises
    ConfigError when the answer is 'not without resume=true or force=true', or when a resume
    would change a training-shaping key."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    holds_run = summary is not None or (run_dir / schema.CONFIG_FILE).exists()
    if cfg.force or not holds_run:
        if cfg.resume is True and not cfg.force:
            raise ConfigError("resume", True, f"a run folder holding a run to continue ({run_dir} "
                              "holds none; drop resume=true to start it)")
        return Decision("fresh")
    status = summary.get("status", "running") if summary else "running"
    if status in schema.FINISHED_STATUSES:
        check_config(cfg, run_dir, f"a folder whose finished ({status}) run has these settings "
                                   "(force=true starts it over); these differ (recorded -> now): ")
        log.info(f"skip {run_dir}: already {status}; a finished run is never changed "
                 "(force=true re-runs it)")
        return Decision("skip", summary)
    version = recorded_version(run_dir, summary)
    what = "a killed run (its summary still says running)" if status == "running" else f"an {status} run" \
        if status[0] in "aeiou" else f"a {status} run"
    if not cfg.resume:
        raise ConfigError("resume", False, f"a fresh folder: this folder holds {what} at version "
                          f"{version}: resume=true continues it, force=true starts over")
    if not (run_dir / schema.CHECKPOINT_FILE).exists():
        if cfg.resume == "auto":
            log.info("resume=auto: %s holds %s but no checkpoint: starting over", run_dir, what)
            return Decision("fresh")
        raise ConfigError("resume", True, f"a checkpoint to continue from: this folder holds {what} at "
                          f"version {version} but no {schema.CHECKPOINT_FILE}; force=true starts over")
    check_config(cfg, run_dir)
    return Decision("resume", summary)


def check_config(cfg: RunConfig, run_dir: Path, what: str = "the configuration the run was "
                 "started with; these training-shaping keys differ (recorded -> now): ") -> None:
    """Refuse to continue (or to skip as done) a run with other training-shaping settings,
    listing every difference."""
    path = Path(run_dir) / schema.CONFIG_FILE
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError("resume", True, f"a readable {path} to check the configuration against "
                          f"({e}); force=true starts over") from None
    diffs = differences(recorded, cfg)
    if diffs:
        raise ConfigError("resume" if cfg.resume else "run folder", cfg.resume if cfg.resume else str(run_dir),
                          what + "; ".join(diffs))


def start_fresh(run_dir: Path) -> None:
    """Remove what an earlier run left (force=true): its tables, summary and checkpoint."""
    for name in RUN_FILES:
        (Path(run_dir) / name).unlink(missing_ok=True)
    shutil.rmtree(Path(run_dir) / "_tmp", ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The tables, up to the checkpoint
# ---------------------------------------------------------------------------------------------

def repair_tables(run_dir: Path, columns: dict[str, tuple], upto: dict[str, int]) -> list[str]:
    """Verify each table ``name`` up to version ``upto[name]`` and drop the rows after it.
    Returns what was repaired (for the log); raises ConfigError naming file and line when a row
    the resumed run needs is damaged or missing."""
    notes = []
    for name, cols in columns.items():
        path = Path(run_dir) / name
        kept, dropped = check_table(path, cols, upto[name], contiguous=name == schema.UPDATES_FILE)
        if dropped:
            atomic_write_text(path, "".join(kept))
            notes.append(f"{name}: dropped {dropped} row(s) after version {upto[name]} (recomputed now)")
    return notes


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
        version = _parse_row(line, len(columns), columns.index("version"))
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


def _parse_row(line: str, width: int, version_col: int) -> int | None:
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
