"""The local grid launcher (``hydra/launcher=parallel``): Hydra's joblib launcher, except that a
grid point whose worker process dies costs only that point.

Hydra's joblib launcher hands every point to one loky pool. When one worker dies (the kernel's
out-of-memory killer, a ``kill -9``), loky marks the whole pool broken and SIGKILLs every other
worker: one lost process ended the grid with a 40-line traceback and killed healthy points
mid-push, leaving them ``running``. Here each of the ``n_jobs`` slots is a loky executor of its
own with one worker (reused point after point, so torch is imported once per slot, as before): a
worker that dies breaks only its slot. Its point is reported in one line (its folder stays as the
kill left it, so ``resume=auto`` continues it), a fresh worker takes the slot, and the grid goes
on. Points are handed out in grid order, one at a time, as slots free up.

A point that exits (``sys.exit``: bad input, a folder another run holds) also costs only itself;
the grid then ends with that exit status once every other point has run (Hydra reports it).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, setup_globals
from hydra_plugins.hydra_joblib_launcher import joblib_launcher
from hydra_plugins.hydra_joblib_launcher._core import execute_job
from joblib import effective_n_jobs
from joblib.externals.loky import ProcessPoolExecutor
from joblib.externals.loky.process_executor import BrokenProcessPool

from repro.config.help import job_name
from repro.grid import _varying

log = logging.getLogger(__name__)

# what joblib's loky backend puts in its workers' environment: one BLAS/OpenMP pool per core
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMBA_NUM_THREADS", "NUMEXPR_NUM_THREADS")


class PointsLauncher(joblib_launcher.JoblibLauncher):
    """``hydra/launcher=parallel``: ``n_jobs`` loky worker processes, one executor each. (Hydra
    instantiates launchers only from ``hydra_plugins``: ``hydra_plugins.repro_launcher`` names it.)"""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        n_jobs = max(1, min(effective_n_jobs(self.joblib.get("n_jobs", -1)), len(job_overrides)))
        log.info(f"joblib (loky): launching {len(job_overrides)} jobs in {n_jobs} worker process(es)")
        log.info(f"Launching jobs, sweep output dir : {sweep_dir}")
        for idx, overrides in enumerate(job_overrides):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        names = [job_name(list(o)) for o in job_overrides]
        self._short = _varying(names)
        self._label = f"grid {self.config.get('exp_name', '')}".strip()
        _start_resource_trackers()
        slots = _Slots(n_jobs)
        returns: dict[int, JobReturn] = {}
        todo = list(enumerate(job_overrides))[::-1]   # popped from the end: grid order
        running: dict = {}
        singleton_state = Singleton.get_state()
        try:
            while todo or running:
                while todo and slots.free():
                    idx, overrides = todo.pop()
                    slot = slots.take()
                    future = slots.executor(slot).submit(
                        execute_job, initial_job_idx + idx, overrides, self.hydra_context, self.config,
                        self.task_function, singleton_state)
                    running[future] = (idx, names[idx], slot)
                done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in done:
                    idx, name, slot = running.pop(future)
                    returns[idx] = self._outcome(future, job_overrides[idx], name, slots, slot)
        finally:
            slots.close()
        return [returns[i] for i in range(len(job_overrides))]

    def _outcome(self, future, overrides: Sequence[str], name: str, slots: "_Slots", slot: int) -> JobReturn:
        """The point's JobReturn; a dead worker or a point that exited is reported, not raised."""
        exc = future.exception()
        if exc is None:
            slots.give_back(slot)
            return future.result()
        if isinstance(exc, BrokenProcessPool):   # its worker died: only this slot is broken
            slots.discard(slot)
            print(f"[{self._label}] {self._short.get(name, name)}: its worker process died "
                  f"({_exit_reason(exc)}); the other points go on, and the same command with "
                  "resume=auto continues this one", file=sys.stderr, flush=True)
            return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
        slots.give_back(slot)
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return JobReturn(overrides=list(overrides), status=JobStatus.COMPLETED)
        # the point said why (bad input: exit 2); the others still run, then Hydra reports it
        return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=exc)


def _start_resource_trackers() -> None:
    """Start loky's and multiprocessing's resource trackers deaf to SIGHUP, as they already are
    to SIGINT and SIGTERM: a closed terminal's SIGHUP reaches the whole process group, and a
    tracker it kills is relaunched empty and prints a traceback per resource it is told to free.
    (An ignored signal stays ignored across exec; a handler would not.)"""
    import multiprocessing.resource_tracker

    from joblib.externals.loky.backend import resource_tracker

    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
        multiprocessing.resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def _exit_reason(exc: BaseException) -> str:
    """'killed by SIGKILL, e.g. the out-of-memory killer' from loky's message, when it says."""
    text = str(exc)
    for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGBUS):
        if f"{sig.name}(-{int(sig)})" in text or f"{{-{int(sig)}}}" in text:
            return f"killed by {sig.name}" + (", e.g. the out-of-memory killer" if sig == signal.SIGKILL else "")
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


class _Slots:
    """``n`` single-worker loky executors, made when first needed and again after a death."""

    def __init__(self, n: int):
        self.executors: list[ProcessPoolExecutor | None] = [None] * n
        self.idle = list(range(n))[::-1]

    def free(self) -> bool:
        return bool(self.idle)

    def take(self) -> int:
        return self.idle.pop()

    def give_back(self, slot: int) -> None:
        self.idle.append(slot)

    def executor(self, slot: int) -> ProcessPoolExecutor:
        if self.executors[slot] is None:
            n = len(self.executors)
            env = {v: os.environ.get(v, str(max(effective_n_jobs(-1) // n, 1))) for v in THREAD_VARS}
            self.executors[slot] = ProcessPoolExecutor(max_workers=1, env=env)
        return self.executors[slot]

    def discard(self, slot: int) -> None:
        executor, self.executors[slot] = self.executors[slot], None
        if executor is not None:
            executor.shutdown(wait=False, kill_workers=True)
        self.idle.append(slot)

    def close(self) -> None:
        """Every point has returned, or the launcher is stopping (a second Ctrl-C): end the
        workers now, not at interpreter exit (their polite shutdown costs seconds)."""
        for executor in self.executors:
            if executor is not None:
                executor.shutdown(wait=False, kill_workers=True)
        self.executors = [None] * len(self.executors)
