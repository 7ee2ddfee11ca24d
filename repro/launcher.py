"""The local grid's workers (``hydra/launcher=parallel``): a point whose worker dies costs only itself,
:class:`PointSlots` answering joblib's ``loky`` with one single-worker executor per slot (docs/architecture.md,
"Grids")."""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections import deque
from concurrent.futures import Future
from typing import Callable

from joblib import cpu_count, register_parallel_backend
from joblib.externals.loky import ProcessPoolExecutor
from joblib.externals.loky.process_executor import BrokenProcessPool
from joblib.parallel import ParallelBackendBase

from repro.errors import BAD_POINTS
from repro.hydra_internals import job_return


def use_point_slots(label: str, lost: Callable[[], str]) -> None:
    """Run this process's joblib ``loky`` work (Hydra's joblib launcher) on :class:`PointSlots`;
    ``label`` starts its lines (``grid fig3``), ``lost()`` names the point whose worker died."""
    register_parallel_backend("loky", functools.partial(PointSlots, label=label, lost=lost))


class PointSlots(ParallelBackendBase):
    """``n_jobs`` single-worker loky executors, made when first needed and again after a death."""

    supports_retrieve_callback = True   # Parallel's main thread polls: a signal handler runs at once

    def __init__(self, nesting_level: int | None = None, label: str = "grid",
                 lost: Callable[[], str] = lambda: "a grid point", **kwargs) -> None:
        super().__init__(nesting_level=nesting_level, **kwargs)
        self.label, self.lost, self.lock = label, lost, threading.RLock()
        self.executors: list[ProcessPoolExecutor | None] = []
        self.idle: list[int] = []
        self.queue: deque = deque()
        self.broken: list[ProcessPoolExecutor] = []

    def effective_n_jobs(self, n_jobs: int | None) -> int:
        """As joblib counts: -1 every core, -2 all but one; 0 or None one."""
        n = int(n_jobs or 1)
        return max(cpu_count() + 1 + n, 1) if n < 0 else n

    def configure(self, n_jobs: int = 1, parallel=None, **kwargs) -> int:
        n = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        _start_resource_trackers()
        self.executors, self.idle = [None] * n, list(range(n))[::-1]
        # one BLAS/OpenMP pool per core, as joblib's loky backend gives its workers
        self.env = {v: os.environ.get(v, str(max(cpu_count() // n, 1))) for v in self.MAX_NUM_THREADS_VARS}
        return max(n, 2)   # Parallel runs n_jobs=1 in the launcher itself: a point's death would end it

    def submit(self, func, callback=None) -> Future:
        future: Future = Future()
        future.add_done_callback(callback)   # Parallel always hands one (supports_retrieve_callback)
        with self.lock:
            self.queue.append((func, future))
            self._start()
        return future

    def retrieve_result_callback(self, future: Future):
        return future.result()

    def _start(self) -> None:
        """Hand queued points to idle slots (under the lock: a slot's callback thread calls it too)."""
        with self.lock:
            while self.queue and self.idle:
                func, future = self.queue.popleft()
                slot = self.idle.pop()
                if self.executors[slot] is None:
                    self.executors[slot] = ProcessPoolExecutor(max_workers=1, env=self.env)
                self.executors[slot].submit(func).add_done_callback(functools.partial(self._done, slot, future))

    def _done(self, slot: int, future: Future, inner: Future) -> None:
        """A point returned, exited or lost its worker: free its slot, answer Parallel, go on."""
        exc = inner.exception()
        with self.lock:
            if isinstance(exc, BrokenProcessPool):   # its worker died: only this slot is broken
                self.broken.append(self.executors[slot])
                self.executors[slot] = None
            self.idle.append(slot)
        if isinstance(exc, BrokenProcessPool):
            print(f"[{self.label}] {self.lost()}: its worker process died ({_exit_reason(exc)}); the other "
                  "points go on, and the same command with resume=auto continues this one", file=sys.stderr, flush=True)
            future.set_result([job_return()])
        elif isinstance(exc, SystemExit) and getattr(exc, "point", None):   # bad input, named by its worker
            BAD_POINTS.append(exc.point)   # a finished job to Hydra, so the figure is drawn; cli exits 2 after it
            future.set_result([job_return()])
        elif isinstance(exc, SystemExit):   # the point said why (a stopped grid: 130)
            future.set_result([job_return(exc)])
        elif exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(inner.result())
        self._start()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """The launcher stops (a signal, an error): end every worker now (``ensure_ready``: Parallel never
        reuses this backend)."""
        self.queue.clear()
        self.terminate()

    def terminate(self) -> None:
        """Every point has returned, or the launcher is stopping: end the workers now, not at
        interpreter exit (their polite shutdown costs seconds)."""
        with self.lock:
            executors, self.executors = self.executors + self.broken, [None] * len(self.executors)
            self.broken = []
        for executor in executors:
            if executor is not None:
                executor.shutdown(wait=False, kill_workers=True)


def _start_resource_trackers() -> None:
    """Start loky's and multiprocessing's resource trackers deaf to SIGHUP (as to SIGINT and
    SIGTERM): a closed terminal's SIGHUP reaches the process group, and a killed tracker is
    relaunched empty and prints a traceback per resource it is told to free. (An ignored signal
    stays ignored across exec; a handler would not.)"""
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
