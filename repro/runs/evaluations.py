"""A run's evaluations and the one rule of divergence they set, for the run core: inline in the simulator,
on a snapshot in a thread in the real server (never stalling the pushes), one at a time; each one's
``evals.csv`` row or why it found the run diverged, and the reference loss each push is checked against."""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from repro.asgd.algorithm import Push
from repro.runs.runlog import RunLog
from repro.runtime import abandon, stop_asked
from repro.workload.build import Problem, evaluate


def nonfinite(result: dict, version: int) -> str:
    """Why an evaluation's result means divergence, or "" (at version 0: what training starts from)."""
    if result.get("nonfinite"):
        return f"non-finite parameters at the evaluation of version {version}"
    if not (bad := {k: v for k, v in result.items() if not math.isfinite(v)}):
        return ""
    what = ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))
    if version == 0:
        return (f"the evaluation of version 0 gives non-finite {what} although the initial parameters are finite: the "
                "data hold non-finite values, or the model overflows at its initial parameters; nothing was trained")
    return f"non-finite losses at the evaluation of version {version} ({what})"


@dataclass
class EvalRequest:
    version: int
    time_s: float
    samples_seen: int
    params: Tensor


class Evaluations:
    """The evaluations of one run, one at a time, writing their rows into ``runlog``; ``state``: a checkpoint's."""

    def __init__(self, problem: Problem, runlog: RunLog, divergence_factor: float, in_thread: bool, *,
                 state: dict, wait_s: float):
        self.runlog, self.divergence_factor, self.in_thread = runlog, divergence_factor, in_thread
        self.wait_s = wait_s   # how long submit waits for one in its thread (0: the server goes on)
        self.net, self.sets, self.num_classes = problem.net, problem.eval_sets, problem.dataset.num_classes
        self.reference_loss: float | None = state.get("reference_loss")   # set by the first evaluation (version 0's)
        self.resumed: dict | None = state.get("evaluating")   # the one running as that checkpoint was written
        self.cpu_s: list[float] = []   # CPU seconds of each evaluation (cost=fit's eval_s)
        self._results: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.running: EvalRequest | None = None   # submitted, row not yet written (a checkpoint keeps it)
        self.asked = -1         # the version of the last one submitted
        self.hung = False       # one was not waited for (left running, abandoned)
        self.last_progress = 0.0   # when the one in its thread last moved on (monotonic)

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the reference loss, and the evaluation running (its snapshot)."""
        return {"reference_loss": self.reference_loss, **({"evaluating": vars(self.running)} if self.running else {})}

    def check_loss(self, push: Push) -> str:
        """Why this push's training loss means divergence, or "": the reference is the larger of the
        version-0 training loss and ln C, so a warm start's first stale transient is not 'divergence'."""
        if not math.isfinite(push.train_loss):
            return f"client {push.client} pushed a non-finite training loss ({push.train_loss})"
        ref, factor = self.reference_loss, self.divergence_factor
        if ref is not None and push.train_loss > factor * ref:
            return (f"client {push.client} pushed training loss {push.train_loss:.4g} > "
                    f"divergence_factor {factor:g} x reference loss {ref:.4g}")
        return ""

    def due(self) -> bool:
        """An evaluation is due (``next_eval`` reached) and none is running."""
        return self.runlog.samples_seen >= self.runlog.next_eval and self.running is None

    def submit(self, version: int, time_s: float, params: Tensor, inline: bool = False,
               samples_seen: int | None = None, waiting: Callable[[], None] | None = None) -> None:
        """Evaluate a snapshot of ``params``; ``waiting`` is called while the caller waits (``wait_s``)."""
        samples = self.runlog.samples_seen if samples_seen is None else samples_seen
        req = self.running = EvalRequest(version, time_s, samples, params.detach().clone())
        self.asked = version
        if not self.in_thread:
            self._evaluate(req)
            return
        # in a thread even so: a hung one must not hold the server; the caller joins an ``inline`` one
        self._thread = threading.Thread(target=self._evaluate, args=(req,), name="evaluator", daemon=True)
        self.progressed()
        self._thread.start()
        until = time.monotonic() + (0.0 if inline else self.wait_s)
        while self._thread.is_alive() and (left := until - time.monotonic()) > 0:
            self._thread.join(min(0.05, left))   # in slices: the real server beats meanwhile, holding its lock
            if waiting:
                waiting()

    def _evaluate(self, req: EvalRequest) -> None:
        # this thread's CPU time, not wall time: what it takes from the cores, however long it waited
        start = time.thread_time()
        beats = self.net.module.register_forward_hook(self.progressed) if self.in_thread else None
        try:
            finite = bool(torch.isfinite(req.params).all())
            result: dict | Exception = evaluate(self.net, req.params, self.sets) if finite else {"nonfinite": True}
        except Exception as exc:  # drain() raises it, which fails the run
            result = exc
        if beats is not None:
            beats.remove()
        self.cpu_s.append(time.thread_time() - start)
        self._results.put((req, result))

    def progressed(self, *_) -> None:
        """The evaluation in its thread moved on (it started, or evaluated a batch)."""
        self.last_progress = time.monotonic()

    def join(self, timeout_s: float, key: str = "", waiting: Callable[[], None] | None = None) -> str:
        """Wait for the evaluation in its thread while it evaluates a batch every ``timeout_s`` (``key``
        names it), or until a stop is asked after the wait began; "" when none runs now, else why not.
        One still running is left to the process's exit, not waited for, nor reported, again."""
        if self.hung:
            return ""
        asked = stop_asked()
        while self._thread is not None and self._thread.is_alive() and \
                (left := self.last_progress + timeout_s - time.monotonic()) > 0:
            if stop_asked() and not asked:
                break
            self._thread.join(min(0.05, left))   # (a signal's handler runs between)
            if waiting:
                waiting()
        if self._thread is None or not self._thread.is_alive():
            return ""
        abandon(self._thread)   # the process's exit ends it, not torch's teardown under it
        self.hung = True
        stopped = stop_asked() and not asked
        return f"the evaluation at version {self.asked} " + (
            "was not waited for: a stop was asked" if stopped else f"evaluated no batch in {timeout_s:g} s{key}")

    def drain(self) -> list[str]:
        """Write the rows of finished evaluations; why each that found divergence did (one that raised: raised)."""
        diverged = []
        while not self._results.empty():
            req, result = self._results.get()
            self.running = None
            if isinstance(result, Exception):
                raise RuntimeError(f"evaluation at version {req.version} failed: {result}") from result
            if why := nonfinite(result, req.version):
                self.runlog.next_eval = math.inf   # no more evaluations of a diverged run
                diverged.append(why)
                continue
            if self.reference_loss is None:
                self.reference_loss = max(result["train_loss"], math.log(self.num_classes))
            self.runlog.log_eval(version=req.version, time_s=req.time_s, samples_seen=req.samples_seen, **result)
        return diverged
