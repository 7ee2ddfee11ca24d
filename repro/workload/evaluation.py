"""Evaluations of the server's parameters: what they measure (the test set and a fixed subset of
the training set, :class:`EvalSets`) and where they run: inline (the simulator: free in virtual
time) or on snapshots in a thread (the real server: an evaluation never stalls the pushes).

The run core submits a request when one is due and writes each result's row; an evaluation of
non-finite parameters reports them as such instead of computing losses of NaNs. At the end of a
finished run it also asks for the test error per class (:func:`class_errors`).
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from repro.asgd.flatnet import FlatNet

TRAIN_SUBSET = 1000  # training-error evaluations use this many fixed training samples


@dataclass
class EvalSets:
    """What an evaluation measures: the test set and a fixed subset of the training set."""

    x_test: Tensor
    y_test: Tensor
    x_train: Tensor
    y_train: Tensor

    @classmethod
    def of(cls, ds) -> "EvalSets":
        """From a :class:`repro.workload.data.Dataset`: its test set, a fixed training subset."""
        n = min(TRAIN_SUBSET, ds.num_train)
        idx = torch.randperm(ds.num_train, generator=torch.Generator().manual_seed(0))[:n]
        idx = idx.to(ds.x_train.device)
        return cls(ds.x_test, ds.y_test, ds.x_train[idx], ds.y_train[idx])


def evaluate(net: FlatNet, params: Tensor, sets: EvalSets) -> dict:
    """Test and train-subset loss and error of ``params`` (evals.csv's metric columns)."""
    test_loss, test_error = net.evaluate(params, sets.x_test, sets.y_test)
    train_loss, train_error = net.evaluate(params, sets.x_train, sets.y_train)
    return {"test_loss": test_loss, "test_error": test_error,
            "train_loss": train_loss, "train_error": train_error}


@torch.no_grad()
def class_errors(net: FlatNet, params: Tensor, sets: EvalSets, batch_size: int = 1024) -> list | None:
    """Test error of ``params`` on each class (index = label; None for a class the test set does
    not hold): summary.json's ``final_class_test_error``. Whether a method starves the classes
    only a slow client holds shows here, not in the mean. None for a loss that is not
    classification (the quadratic's labels mean nothing)."""
    if net.loss_fn is not torch.nn.functional.cross_entropy or not len(sets.y_test):
        return None
    net.load(params)
    outputs = [net.module(sets.x_test[i:i + batch_size]) for i in range(0, len(sets.x_test), batch_size)]
    predictions, labels = torch.cat([o.argmax(1) for o in outputs]), sets.y_test
    out = []
    for c in range(outputs[0].shape[1]):   # every class the network tells apart
        held = labels == c
        count = int(held.sum().item())
        out.append(None if count == 0 else (predictions[held] != c).sum().item() / count)
    return out


@dataclass
class EvalRequest:
    version: int
    time_s: float
    samples_seen: int
    params: Tensor


class Evaluator:
    """Evaluates one parameter snapshot at a time; :meth:`poll` hands results to the core."""

    def __init__(self, net: FlatNet, sets: EvalSets, in_thread: bool):
        self.net, self.sets, self.in_thread = net, sets, in_thread
        self._results: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._outstanding = 0   # submitted, result not yet polled
        self.cpu_s: list[float] = []   # CPU seconds of each evaluation (cost=fit's eval_s)

    @property
    def busy(self) -> bool:
        """Until its result is polled (eval_due() stays true until the row is written)."""
        return self._outstanding > 0

    def submit(self, req: EvalRequest, inline: bool = False) -> None:
        self._outstanding += 1
        if inline or not self.in_thread:
            self._evaluate(req)
            return
        self._thread = threading.Thread(target=self._evaluate, args=(req,), name="evaluator", daemon=True)
        self._thread.start()

    def _evaluate(self, req: EvalRequest) -> None:
        # CPU time of this thread, not wall time: what an evaluation takes from the machine's
        # cores, however long the clients beside it made it wait
        start = time.thread_time()
        try:
            if not bool(torch.isfinite(req.params).all()):
                result: dict | Exception = {"nonfinite": True}
            else:
                result = evaluate(self.net, req.params, self.sets)
        except Exception as exc:  # reported to the core, which fails the run with it
            result = exc
        self.cpu_s.append(time.thread_time() - start)
        self._results.put((req, result))

    def poll(self, wait: bool = False) -> list:
        if wait:
            self.join()
        out = []
        while not self._results.empty():
            out.append(self._results.get())
        self._outstanding -= len(out)
        return out

    def join(self, timeout_s: float | None = None) -> None:
        """Every evaluation ends before the process does (a thread killed mid-kernel is not)."""
        if self._thread is not None:
            self._thread.join(timeout_s)
