"""A run folder's life, for either driver: one writer (:func:`open_folder`), what an existing folder
means (:func:`decide`), the checks a resume makes before it touches a file, and a terminal summary
on every ending (:func:`run_folder`). The guarantees: docs/failures.md, "Run folders"."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.config.checks import validated
from repro.config.renames import read_recorded
from repro.config.settings import RunConfig, differences, get, unknown_keys
from repro.errors import ConfigError
from repro.files import schema
from repro.files.locks import FileLock, LockHeld
from repro.files.storage import is_read_only, read_checkpoint, write_denied, write_json
from repro.logs import get_logger
from repro.runs.runlog import read_summary
from repro.runtime import StopRequest, torchrun_env

log = get_logger("repro.runs.folder")

# Hydra's record of a job goes to a folder of this process's own (hydra.output_subdir) and becomes
# the folder's .hydra/ once this run has the folder: a refused or skipped run keeps the folder's record
HYDRA_RECORD, INCOMING_RECORD = ".hydra", ".hydra_incoming_{pid}"

RUN_FILES = (schema.CONFIG_FILE, schema.UPDATES_FILE, schema.EVALS_FILE, schema.SUMMARY_FILE, schema.CHECKPOINT_FILE)


@dataclass
class Decision:
    action: str                   # "fresh", "skip" or "resume"
    summary: dict | None = None   # what the folder holds (skip: returned as the run's summary)


@contextlib.contextmanager
def open_folder(run_dir: str | Path):
    """Hold the run folder's lock for the duration (ConfigError if another live run holds it)."""
    run_dir = Path(run_dir)
    made, path = not run_dir.exists(), run_dir / schema.LOCK_FILE
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if not write_denied(exc):
            raise
        raise refuse_read_only(run_dir, exc) from None
    fresh_lock = not path.exists()
    try:
        lock = FileLock(path).acquire()
    except LockHeld as held:
        h = held.holder
        raise ConfigError("run folder", str(run_dir), f"a folder no other run is writing: pid "
                          f"{h.get('pid', '?')} on {h.get('host', '?')} (started {h.get('started', '?')}) "
                          f"holds it; wait for it to end, or choose another exp_name") from None
    except OSError as exc:
        if not write_denied(exc):
            raise
        lock = None   # nobody writes a read-only folder: no lock; run_folder only skips there
    try:   # yielded outside the except: the body's errors carry no OSError context
        yield run_dir
    except ConfigError:
        # refused: the lock file this run made goes, and a folder it made and left empty too
        if lock is not None and fresh_lock:
            path.unlink(missing_ok=True)
            if made and not any(run_dir.iterdir()):
                run_dir.rmdir()
        raise
    finally:
        if lock is not None:
            lock.release()


def refuse_read_only(run_dir: Path, exc: OSError | None = None) -> ConfigError:
    why = f" ({exc.strerror})" if exc is not None else ""
    return ConfigError("run folder", str(run_dir), f"a writable folder; this one is read-only{why}: a "
                       "finished run there is only skipped, continuing or starting one needs a "
                       "writable results_dir (or hydra.run.dir); nothing was changed")


def incoming_record(run_dir: Path) -> Path:
    """Where this process's Hydra record goes: the run folder, or the temp folder where that is read-only."""
    name = INCOMING_RECORD.format(pid=os.getpid())
    run_dir = Path(run_dir)
    return run_dir / name if not run_dir.is_dir() or not is_read_only(run_dir) else Path(tempfile.gettempdir()) / name


def adopt_hydra_record(run_dir: Path) -> None:
    """This run has the folder (a fresh run, or a resume whose checkpoint passed): its Hydra record too."""
    if (incoming := incoming_record(run_dir)).is_dir():
        shutil.rmtree(run_dir / HYDRA_RECORD, ignore_errors=True)
        os.replace(incoming, run_dir / HYDRA_RECORD)


def drop_hydra_record(run_dir: Path) -> None:
    """A refused or skipped run: its Hydra record goes, the folder's stays."""
    shutil.rmtree(incoming_record(run_dir), ignore_errors=True)


def decide(cfg: RunConfig, run_dir: Path) -> Decision:
    """What to do with ``run_dir`` for ``cfg`` (its lock held); ConfigError where no flag typed allows it."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)   # one a run wrote (a status we know), not someone's own file
    summary = summary if summary and summary.get("status") in schema.STATUSES else None
    holds_run = summary is not None or _is_run_config(run_dir)
    foreign = [name for name in RUN_FILES if (run_dir / name).exists()] if not holds_run else []
    if foreign:   # someone's own files (not a run's): no flag may overwrite or delete them
        raise ConfigError("run folder", str(run_dir), f"a folder that holds a run or none of a run's "
                          f"files: {', '.join(foreign)} there {'is' if len(foreign) == 1 else 'are'} not "
                          "a run's (no summary.json or config.json a run wrote); nothing was touched: "
                          "choose another exp_name or hydra.run.dir")
    if cfg.force or not holds_run:
        if cfg.resume is True and not cfg.force:
            raise ConfigError("resume", True, f"a run folder holding a run to continue ({run_dir} "
                              "holds none; drop resume=true to start it)")
        return Decision("fresh")
    status = summary.get("status", "running") if summary else "running"
    if status in schema.FINISHED_STATUSES:
        check_config(cfg, run_dir, f"a folder whose finished ({status}) run has these settings "
                                   "(force=true starts it over); these differ (recorded -> now): ")
        log.info(f"skip {run_dir}: already {status}; a finished run is never changed (force=true re-runs it)")
        return Decision("skip", summary)
    version = int(summary.get("version", 0)) if summary else 0
    what = f"an {status} run" if status[0] in "aeiou" else f"a {status} run"
    if status == "running":   # a killed run: the version of its last updates.csv row
        what = "a killed run (" + ("its summary still says running)" if summary else "it has no readable summary.json)")
        with contextlib.suppress(OSError):
            lines = (run_dir / schema.UPDATES_FILE).read_text(errors="replace").splitlines()
            rows = (schema.parse_row(line + "\n", len(schema.UPDATE_COLUMNS), 0) for line in reversed(lines[1:]))
            version = max(version, next((r for r in rows if r is not None), version))
    has_checkpoint = (run_dir / schema.CHECKPOINT_FILE).exists()
    # a killed run's rows reach updates.csv at its checkpoints: with none, how far it got is unknown
    at = (f"at version {version}" if version or has_checkpoint or status != "running"
          else "before its first checkpoint")
    if not cfg.resume:   # killed before its first checkpoint: resume=true would refuse it too
        if has_checkpoint:   # nor can resume=true continue a run whose config.json is unreadable
            recorded_config(cfg, run_dir)
        how = (GRID_HOW if in_grid(run_dir) else "resume=true continues it, force=true starts over"
               if has_checkpoint else f"no {schema.CHECKPOINT_FILE} to continue it from, force=true starts over")
        raise ConfigError("resume", False, f"a fresh folder: {run_dir} holds {what} {at}: {how}")
    if not has_checkpoint:
        if cfg.resume == "auto":
            log.info("resume=auto: %s holds %s but no checkpoint: starting over", run_dir, what)
            return Decision("fresh")
        raise ConfigError("resume", cfg.resume, f"a checkpoint to continue from: this folder holds {what} {at} "
                          f"but no {schema.CHECKPOINT_FILE}; force=true starts over")
    check_config(cfg, run_dir, resuming=True)
    return Decision("resume", summary)


def finished(cfg: RunConfig, run_dir: str | Path) -> dict | None:
    """The summary of the finished run in ``run_dir`` when :func:`run_folder` would only skip it,
    else None: a grid point asks before its driver loads torch. What a driver rewrites or answers
    first (cost.path; a torchrun world's other ranks) is its own to decide."""
    run_dir = Path(run_dir)
    try:
        if cfg.force or cfg.cost.path or not (run_dir / schema.SUMMARY_FILE).is_file() or torchrun_env():
            return None
        validated(cfg)
        with open_folder(run_dir):
            decision = decide(cfg, run_dir)
    except ConfigError:   # refused: the driver refuses it the same way, as before
        return None
    if decision.action != "skip":
        return None
    drop_hydra_record(run_dir)
    return decision.summary


RUN_CONFIG_KEYS = {"exp_name", "seed", "num_clients", "nsync", "backend"}


def _is_run_config(run_dir: Path) -> bool:
    """A config.json a run wrote (the resolved settings), not someone else's file of that name."""
    try:
        return RUN_CONFIG_KEYS <= set(read_recorded(run_dir))
    except (OSError, ValueError):
        return False


def check_config(cfg: RunConfig, run_dir: Path, what: str = "the configuration the run was "
                 "started with; these training-shaping keys differ (recorded -> now): ",
                 resuming: bool = False) -> None:
    """Refuse to continue (or skip) a run of other training-shaping settings (``resuming``: or unknown keys)."""
    recorded = recorded_config(cfg, run_dir)
    diffs = differences(recorded, cfg) + [f"{key}: {get(recorded, key)!r} -> (no such key in this version)"
                                          for key in (unknown_keys(recorded) if resuming else ())]
    # a replay's pushes are its recording's (cost.path names no folder): another recording was skipped as this one's
    old = (recorded.get("cost") or {}).get("path")
    if cfg.cost.schedule == "replay" and not _same_folder(old, cfg.cost.path):
        diffs.append(f"cost.path: {old!r} -> {cfg.cost.path!r} (another recording: replay it under another "
                     "exp_name or hydra.run.dir, where force=true would delete this replay)")
    if diffs:
        raise ConfigError(*_typed(cfg, run_dir), what + "; ".join(diffs))


def recorded_config(cfg: RunConfig, run_dir: Path) -> dict:
    """The folder's config.json, or a ConfigError naming what the user typed (resume, else the folder)."""
    try:
        return read_recorded(run_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(*_typed(cfg, run_dir), f"a readable {Path(run_dir) / schema.CONFIG_FILE} to "
                          f"check the configuration against ({e}); force=true starts over") from None


def _typed(cfg: RunConfig, run_dir: Path) -> tuple[str, Any]:
    return ("resume", cfg.resume) if cfg.resume else ("run folder", str(run_dir))


def _same_folder(a, b) -> bool:
    with contextlib.suppress(OSError, TypeError):   # gone, or None: not the same
        return a == b or os.path.samefile(a, b)
    return False


class FolderRun:
    """What :func:`run_folder` yields: the decision, the checkpoint to resume from, and the core
    once the driver builds it; ``summary``: the run's summary after the ``with`` block."""

    def __init__(self, cfg: RunConfig, run_dir: Path, decision: Decision, stop: StopRequest):
        self.cfg, self.run_dir, self.decision, self.stop = cfg, run_dir, decision, stop
        self.core: Any = None   # the run core (repro.runs.core.RunCore) once the driver builds it

    @property
    def summary(self) -> dict:
        if self.core is not None and self.core.finished is not None:
            return self.core.finished
        if self.decision.summary is not None and self.skip:
            return self.decision.summary
        return {"status": "interrupted", "backend": self.cfg.backend.name, "clock": "", "version": 0,
                "samples_seen": 0, "epoch": 0.0, "time_s": 0.0, "wall_time_s": 0.0, "final": {},
                "time_to_target": {}, "events": [], "lost_clients": [],
                "message": "stopped before the run started; nothing was written"}

    @property
    def skip(self) -> bool:
        return self.decision.action == "skip"

    def checkpoint(self, kind: str, device) -> dict | None:
        """The checkpoint to resume from (None for a fresh run), its tables repaired up to it."""
        from repro.runs.resume import resume_state   # torch: not for a run that is only skipped
        if self.decision.action != "resume":
            return None
        state = resume_state(self.run_dir, kind, device, self.cfg)
        adopt_hydra_record(self.run_dir)
        return state


@contextlib.contextmanager
def run_folder(cfg: RunConfig, run_dir: str | Path):
    """``with run_folder(cfg, run_dir) as run:`` hold the folder, decide what it means, stop on
    signals, and end with a terminal summary whatever happens inside: a forced stop (a second
    signal) is absorbed (``interrupted``); any other exception is re-raised once it says ``failed``."""
    run_dir = Path(run_dir)
    validated(cfg)   # every entry point, not only the command line: no number may hang a run
    with open_folder(run_dir), StopRequest() as stop:
        try:   # a read-only folder allows only a skip; a refusal drops the Hydra record
            decision = decide(cfg, run_dir)
            if decision.action != "skip" and is_read_only(run_dir):
                raise refuse_read_only(run_dir)
        except ConfigError as exc:
            drop_hydra_record(run_dir)
            if not is_read_only(run_dir):
                raise
            raise refuse_read_only(run_dir) from exc
        if decision.action == "fresh":   # what an earlier run left (force=true): tables, summary, checkpoint
            for name in RUN_FILES:
                (run_dir / name).unlink(missing_ok=True)
            shutil.rmtree(run_dir / "_tmp", ignore_errors=True)
            adopt_hydra_record(run_dir)   # a resume's once its checkpoint passes (FolderRun.checkpoint)
        run = FolderRun(cfg, run_dir, decision, stop)
        try:
            yield run
        except KeyboardInterrupt:   # forced (a second signal): the state may be mid-push
            _end(run, "interrupted", "forced stop (second signal); ")
        except ConfigError as exc:   # a check that knows no cfg (the checkpoint's, the tables') names resume=True
            _end(run, "failed", "bad input: ", early=False)
            raise ConfigError("resume", cfg.resume, exc.expected) if exc.key == "resume" and exc.value is True else exc
        except BaseException as exc:
            _end(run, "failed", f"{type(exc).__name__}: {exc}; ")
            raise
        else:   # a driver that returned without a status: the folder is never left running (an exception: above)
            if run.core is not None and run.core.finished is None:
                _end(run, "failed", "the driver ended without a status; ")
        finally:   # a skipped run's record, or a refused resume's (never adopted), goes: the folder's stays
            drop_hydra_record(run_dir)


def _end(run: FolderRun, status: str, why: str, early: bool = True) -> None:
    core = run.core
    try:
        if core is not None and core.finished is None:
            core.finish(status, why + resume_hint(core.run_dir), clean=False)
        elif core is None and early and run.decision.action == "fresh":
            # ended before its core existed: say so, not an empty folder that looks never started
            write_json(Path(run.run_dir) / schema.SUMMARY_FILE, {**run.summary, "status": status, "message":
                       why + "nothing was trained; resume=auto (or force=true) starts it again"})
    except Exception as exc:   # the summary could not be written either: say so on stderr (run.log, opened at
        with contextlib.suppress(OSError):   # its first line, may be refused too: the run's error is the first)
            log.error(f"could not record the end of {run.run_dir}: {exc}")


GRID_HOW = ("it is a grid point: the grid's command with resume=auto continues every interrupted point "
            "from its checkpoint, and starts the points that have none or never ran (resume=true would "
            "refuse those); force=true starts the points over")


def in_grid(run_dir: Path) -> bool:
    """Whether Hydra's record of this launch (this process's, or the folder's) says ``mode: MULTIRUN``."""
    for record in (incoming_record(run_dir), Path(run_dir) / HYDRA_RECORD):
        try:
            text = (record / "hydra.yaml").read_text()
        except OSError:
            continue
        return re.search(r"^\s+mode:\s*MULTIRUN\s*$", text, re.M) is not None
    return False


def resume_hint(run_dir: Path) -> str:
    """How to continue this folder's run, from what its checkpoint holds."""
    path = Path(run_dir) / schema.CHECKPOINT_FILE
    if not path.exists():
        return "no checkpoint was written: force=true starts over"
    try:   # (torch is loaded only here: a run only skipped never loads it)
        version = f"version {int(read_checkpoint(path)['server']['version'])}"
    except Exception:
        version = "the last checkpoint"
    if in_grid(run_dir):
        return (f"the grid's command with resume=auto continues {run_dir} from {version} and "
                "starts the points that never ran")
    return f"resume=true continues from {version}"
