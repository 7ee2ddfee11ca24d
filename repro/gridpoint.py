"""Where a grid point runs: it stops with its grid (its launch's stop mark) and never outlives its
launcher (:class:`PointGuard`); its state read from its folder alone; each point's folder known before
any runs; and a run refused before it starts leaves no folder. How: docs/architecture.md, "Grids".
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from repro.files.locks import read_holder
from repro.files.schema import FINISHED_STATUSES, LOCK_FILE
from repro.hydra_internals import job_folders, override_values, sweep_jobs, sweeps
from repro.logs import get_logger
from repro.runs.runlog import read_summary
from repro.runtime import EXIT_INTERRUPTED, request_stop, runs_active

log = get_logger()

STOP_DIR = ".grid_stops"   # in the sweep folder: one mark per launch asked to stop
DEFAULT_SUBDIR = "${job_name:${hydra:overrides.task}}"   # conf/config.yaml's hydra.sweep.subdir
DEFAULT_SWEEP_DIR = "${results_dir}/${exp_name}"            # and its hydra.sweep.dir


class PointGuard:
    """A daemon thread of a point's process (one per process: a joblib worker runs many points): every
    ``POLL_S`` it stops the run (as a first signal, :func:`repro.runtime.request_stop`) at its launch's
    stop mark, and ends the process, at most ``stop_wait_s`` later, once the launcher on its host is gone."""

    POLL_S = 0.5
    _current: "PointGuard | None" = None

    @classmethod
    def start(cls, grid: Any) -> None:
        """Guard this process for ``grid`` (a :class:`repro.grid.Grid`)."""
        if cls._current is None or not cls._current.thread.is_alive():
            cls._current = cls(grid)
        cls._current.grid = grid   # the launch of the point starting now

    def __init__(self, grid: Any):
        self.grid = grid
        self.thread = threading.Thread(target=self._run, name="grid-point-guard", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            grid = self.grid
            if grid.mark_path().exists():
                request_stop("the grid was stopped")
            if grid.main_host == socket.gethostname() and not process_alive(grid.main_pid, grid.main_started):
                request_stop("the grid's launcher ended")
                deadline = time.monotonic() + grid.stop_wait_s
                while runs_active() and time.monotonic() < deadline:
                    time.sleep(0.1)
                os._exit(EXIT_INTERRUPTED)


def proc_stat(pid: int | None) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (which may hold spaces and parentheses):
    [0] the state, [1] the parent, [11] user and [12] system clock ticks, [19] the start time;
    None where /proc does not say (not Linux, or the process has exited)."""
    with contextlib.suppress(OSError, ValueError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()
    return None


def process_started(pid: int | None) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells it from a later process
    given the same pid; None where /proc does not say."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def process_alive(pid: int, started: str | None) -> bool:
    """Whether process ``pid`` (started at ``started``, when known) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or process_started(pid) in (None, started)


def forget_folder(run_dir: Path) -> None:
    """A point that does not start leaves no folder: only Hydra's record of it was written."""
    from repro.runs.folder import drop_hydra_record
    drop_hydra_record(run_dir)
    with contextlib.suppress(OSError):
        run_dir.rmdir()   # only when empty


def remove_empty_run_dir(run_dir: Path, results_dir: Path) -> None:
    """Hydra made the folder (and our record in it) before we could check: leave nothing like a run, nor
    an empty experiment folder; one holding anything else is touched only for our record."""
    forget_folder(run_dir)
    parent = run_dir.parent
    while parent != results_dir and results_dir in parent.parents and parent.is_dir() \
            and all(p.name == "multirun.yaml" for p in parent.iterdir()):
        shutil.rmtree(parent, ignore_errors=True)
        parent = parent.parent


def lock_holder(run_dir: Path) -> dict | None:
    """Who holds the run folder's lock (:func:`repro.files.locks.read_holder`), read without taking it."""
    return read_holder(Path(run_dir) / LOCK_FILE)


def point_state(run_dir: Path) -> str:
    """``running`` (its lock is held), ``done`` (a finished run), ``interrupted``, ``failed``,
    ``killed`` (its summary still says running, nobody holds it) or ``waiting`` (no run yet)."""
    if lock_holder(run_dir) is not None:
        return "running"
    return {"running": "killed", "interrupted": "interrupted", "failed": "failed",
            **dict.fromkeys(FINISHED_STATUSES, "done")}.get(summary_status(run_dir), "waiting")


def summary_status(run_dir: Path) -> str | None:
    """The status the folder's summary.json records (None: no readable summary)."""
    return (read_summary(run_dir) or {}).get("status")


def _named_jobs(config: DictConfig) -> list[tuple[list[str], str]] | None:
    """(overrides, run-folder name) of every job Hydra's basic sweeper launches for ``config``, in launch
    order; None when another sweeper decides the jobs or a name cannot be read (never a reason to stop a
    grid). Sweeps it cannot expand, or that give no point, exit 2."""
    from repro.config.loader import exit_bad_input, job_name
    try:   # the basic sweeper's own split, which it makes next, after the grid's folder and multirun.yaml
        jobs = sweep_jobs(config)
    except Exception as exc:   # range(1,5,0), interval(...): its traceback, exit 1
        exit_bad_input(f"the grid's sweeps cannot be expanded: {str(exc).partition(chr(10))[0]}")
    if jobs == []:   # range(0,0): nothing ran, 'finished: 0/0 done', exit 0
        given = [o for o in config.hydra.overrides.task if sweeps([o])]
        exit_bad_input(f"the grid has no point: a sweep gives it no value ({', '.join(given)})")
    try:
        return None if jobs is None else [(job, job_name(job)) for job in jobs]
    except Exception as exc:
        log.debug("a grid without its job list: %s", exc)
        return None


def grid_points(config: DictConfig) -> list[str] | None:
    """The run-folder names of the grid's jobs, in launch order (None: see :func:`_named_jobs`)."""
    jobs = _named_jobs(config)
    return None if jobs is None else [name for _, name in jobs]


def point_folders(config: DictConfig) -> list[str] | None:
    """Each point's run folder relative to the grid's: :func:`grid_points`' names, moved where the point
    sets exp_name or results_dir; where ``hydra.sweep.dir`` or ``.subdir`` is the user's, the launcher's."""
    jobs = _named_jobs(config)
    if jobs is None:
        return None
    sweep = OmegaConf.to_container(config.hydra.sweep)
    # the user's (resolved per job): a point's results_dir no longer moves its folder out of hydra.sweep.dir
    if (sweep["dir"], sweep["subdir"]) != (DEFAULT_SWEEP_DIR, DEFAULT_SUBDIR):
        from repro.config.loader import exit_bad_input
        try:
            return [os.path.relpath(f, config.hydra.sweep.dir) for f in job_folders(config, [j for j, _ in jobs])]
        except Exception as exc:   # ${oops}: Hydra only warns of a callback's error, then its traceback
            exit_bad_input(f"cannot name a grid point's folder (hydra.sweep.subdir): {str(exc).partition(chr(10))[0]}")
    folders = []
    for job, name in jobs:   # quoted values read unquoted: results_dir='/a' named each folder under ./'/a'
        given = override_values(job)
        place = Path(str(given.get("results_dir", config.results_dir))) / str(given.get("exp_name", config.exp_name))
        moved = {"results_dir", "exp_name"} & set(given)
        folders.append(os.path.relpath(place / name, config.hydra.sweep.dir) if moved else name)
    return folders


def check_distinct(folders: list[str]) -> None:
    """Two points of one folder (``seed=0,-0``, ``backend.timeout_s=60,120``, ``hydra.sweep.subdir=same``)
    raced for its lock or ran one run twice: exit 2 before any runs."""
    from repro.config.loader import exit_bad_input
    twice = sorted({f for f in folders if folders.count(f) > 1})
    if twice:
        exit_bad_input(f"grid points share a run folder ({'; '.join(twice)}): sweep values that differ, "
                       "of keys that shape training (paths, timeouts, ports and progress name no folder), and a "
                       "hydra.sweep.subdir that tells them apart")
