"""A run's evaluations and the one rule of divergence they set, for the run core.

When (every ``eval_every`` epochs of applied samples) and where (inline in the simulator, free in
virtual time; on a snapshot in a thread in the real server, so it never stalls the pushes; one at
a time), each one's ``evals.csv`` row or why it found the run diverged (non-finite parameters or
losses; no evaluation follows), and the reference loss each push is checked against. The core
turns what :meth:`Evaluations.drain` and :meth:`Evaluations.check_loss` say into the run's
divergence; a failed evaluation is raised, and fails the run.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from repro.asgd.algorithm import Push
from repro.runs.runlog import RunLog
from repro.runtime import abandon, stop_asked
from repro.workload.build import Problem, evaluate


def nonfinite(result: dict, version: int) -> str:
    """Why an evaluation's result means divergence, or "". Finite parameters with non-finite
    losses at version 0 are not a blow-up of training but of what it starts from: said so."""
    if result.get("nonfinite"):
        return f"non-finite parameters at the evaluation of version {version}"
    bad = {k: v for k, v in result.items() if not math.isfinite(v)}
    if not bad:
        return ""
    what = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
    if version == 0:
        return (f"the evaluation of version 0 gives non-finite {what} although the initial "
                "parameters are finite: the data hold non-finite values, or the model overflows "
                "at its initial parameters; nothing was trained")
    return f"non-finite losses at the evaluation of version {version} ({what})"


@dataclass
class EvalRequest:
    version: int
    time_s: float
    samples_seen: int
    params: Tensor


class Evaluations:
    """The evaluations of one run, one at a time, writing their rows into ``runlog``."""

    def __init__(self, problem: Problem, runlog: RunLog, divergence_factor: float, in_thread: bool,
                 reference_loss: float | None = None, wait_s: float = 0.0):
        self.runlog, self.divergence_factor, self.in_thread = runlog, divergence_factor, in_thread
        self.wait_s = wait_s   # how long submit waits for one in its thread (0: the server goes on)
        self.net, self.sets, self.num_classes = problem.net, problem.eval_sets, problem.dataset.num_classes
        self.reference_loss = reference_loss   # set by the first evaluation (version 0's)
        self.cpu_s: list[float] = []   # CPU seconds of each evaluation (cost=fit's eval_s)
        self._results: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.running: EvalRequest | None = None   # submitted, row not yet written (a checkpoint keeps it)
        self.asked = -1         # the version of the last one submitted

    def check_loss(self, push: Push) -> str:
        """Why this push's training loss means divergence, or "". The reference is the larger of
        the version-0 training loss and the loss of a uniform guess (ln C for cross-entropy), so a
        warm start's small initial loss does not make its first stale transient 'divergence'."""
        if not math.isfinite(push.train_loss):
            return f"client {push.client} pushed a non-finite training loss ({push.train_loss})"
        ref, factor = self.reference_loss, self.divergence_factor
        if ref is not None and push.train_loss > factor * ref:
            return (f"client {push.client} pushed training loss {push.train_loss:.4g} > "
                    f"divergence_factor {factor:g} x reference loss {ref:.4g}")
        return ""

    def due(self) -> bool:
        """An evaluation is due (applied samples reached the next multiple of eval_every epochs)
        and none is running (its row comes before the next is asked)."""
        return self.runlog.samples_seen >= self.runlog.next_eval and self.running is None

    def submit(self, version: int, time_s: float, params: Tensor, inline: bool = False,
               samples_seen: int | None = None) -> None:
        """Evaluate a snapshot of ``params`` (a copy: the server applies on while a thread runs);
        ``samples_seen``: the count at the snapshot (a resumed checkpoint's :attr:`running`)."""
        samples = self.runlog.samples_seen if samples_seen is None else samples_seen
        req = self.running = EvalRequest(version, time_s, samples, params.detach().clone())
        self.asked = version
        if inline or not self.in_thread:
            self._evaluate(req)
            return
        self._thread = threading.Thread(target=self._evaluate, args=(req,), name="evaluator", daemon=True)
        self._thread.start()
        self._thread.join(self.wait_s)   # in a thread even so: a hung one must not hold the server for good

    def _evaluate(self, req: EvalRequest) -> None:
        # CPU time of this thread, not wall time: what an evaluation takes from the machine's
        # cores, however long the clients beside it made it wait
        start = time.thread_time()
        try:
            finite = bool(torch.isfinite(req.params).all())
            result: dict | Exception = evaluate(self.net, req.params, self.sets) if finite else {"nonfinite": True}
        except Exception as exc:  # drain() raises it, which fails the run
            result = exc
        self.cpu_s.append(time.thread_time() - start)
        self._results.put((req, result))

    def join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the evaluation in its thread to end (the process should
        not end under it: a thread killed mid-kernel is not), or until a stop is asked (a first
        Ctrl-C; one asked before the wait does not end it); whether none is running now. One
        still running is left to the process's exit (:func:`repro.runtime.abandon`)."""
        asked, end = stop_asked(), time.monotonic() + timeout_s
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < end:
            if stop_asked() and not asked:
                break
            self._thread.join(min(0.05, end - time.monotonic()))   # (a signal's handler runs between)
        if self._thread is None or not self._thread.is_alive():
            return True
        abandon(self._thread)   # the process's exit ends it, not torch's teardown under it
        return False

    def drain(self) -> list[str]:
        """Write the rows of finished evaluations; return why each one that found divergence
        did. An evaluation that failed (an exception, not the numbers) fails the run: raised."""
        diverged = []
        while not self._results.empty():
            req, result = self._results.get()
            self.running = None
            if isinstance(result, Exception):
                raise RuntimeError(f"evaluation at version {req.version} failed: {result}") from result
            why = nonfinite(result, req.version)
            if why:
                self.runlog.next_eval = math.inf   # no more evaluations of a diverged run
                diverged.append(why)
                continue
            if self.reference_loss is None:
                self.reference_loss = max(result["train_loss"], math.log(self.num_classes))
            self.runlog.log_eval(version=req.version, time_s=req.time_s, samples_seen=req.samples_seen,
                                 **result)
        return diverged

    def final(self, version: int, time_s: float, params: Tensor) -> list[str]:
        """A completed run's last look at its parameters: evaluated (unless its last evaluation
        was of this version) and checked finite; why the run diverged after all, if it did."""
        diverged = []
        if self.runlog.last_eval_version != version:
            self.submit(version, time_s, params, inline=True)
            diverged = self.drain()
        if not bool(torch.isfinite(params).all()):
            diverged.append("non-finite parameters at the end of the run")
        return diverged
