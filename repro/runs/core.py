"""The run core: a run's bookkeeping, written once for both drivers.

A driver decides only *which* push comes next and *when* (the simulator: its scheduler and
virtual clock; the real driver: receiver threads and the wall clock) and carries the replies.
Everything else happens here, with the same rules for both:

* **apply and log** (:meth:`RunCore.on_push`): the protocol's decision (a policy,
  :mod:`repro.asgd.protocols`), the parameter server's apply (:class:`~repro.asgd.algorithm.Server`),
  one ``updates.csv`` row, then the replies the driver carries: the new parameters to fetch, or
  STOP once the run is ending;
* **cadence** (:meth:`RunCore.settle`, after the replies): an evaluation every ``eval_every``
  epochs of applied samples (inline, or on a snapshot in a thread for the real driver), a
  checkpoint every ``checkpoint_every`` versions (with the driver's own state), progress;
* **divergence**, one rule: a push whose training loss is not finite or exceeds
  ``divergence_factor`` x the reference loss, or an evaluation that finds non-finite parameters
  or losses, ends the run ``diverged`` (see :meth:`RunCore.check_loss`);
* **the budget**: ``num_epochs`` of applied samples;
* **the ending** (:meth:`RunCore.finish`): the status (completed, completed_degraded, diverged,
  interrupted, failed), a final evaluation when completed, a final checkpoint of a clean state,
  the summary. :func:`repro.runs.folder.run_folder` makes sure every ending has one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from repro.asgd.algorithm import Push, Server
from repro.asgd.protocols import Reply, make_protocol
from repro.config.settings import RunConfig, to_dict
from repro.files import schema
from repro.files.storage import save_checkpoint, to_cpu
from repro.logs import get_logger
from repro.problem.build import Problem
from repro.problem.evaluation import EvalRequest, Evaluator
from repro.runs.folder import resume_hint
from repro.runs.runlog import Progress, RunLog
from repro.runtime import environment

log = get_logger("repro.runs.core")

# ---------------------------------------------------------------------------------------------
# The core
# ---------------------------------------------------------------------------------------------


@dataclass
class RunState:
    """What the core knows about the run's course beyond the log."""

    stopping: bool = False          # no more pushes are applied (budget spent, diverged, stop)
    diverged: str = ""              # why, when it did
    error: str = ""                 # a failure a driver reported
    reference_loss: float | None = None
    driver_state: Callable[[], dict] = field(default=lambda: {})


class RunCore:
    """The server side of one run, writing ``run_dir``. Build it inside :func:`run_folder`."""

    def __init__(self, cfg: RunConfig, problem: Problem, run_dir: Path, *, clock: str, backend: str,
                 resume: dict | None = None, measured: dict | None = None, eval_in_thread: bool = False):
        self.cfg, self.problem, self.run_dir = cfg, problem, Path(run_dir)
        self.kind = backend
        self.server: Server = problem.make_server(cfg)
        self.state = RunState()
        if resume is not None:
            self.server.load_state_dict(resume["server"])
            self.state.reference_loss = resume.get("core", {}).get("reference_loss")
        self.budget = cfg.num_epochs * problem.dataset.num_train
        recorded = to_dict(cfg)
        for key, value in (measured or {}).items():   # e.g. a calibrated cost.compute_s
            section, _, leaf = key.rpartition(".")
            (recorded[section] if section else recorded)[leaf] = value
        recorded["environment"] = environment(self.server.params.device)
        recorded.update(problem.recorded())   # what is trained: the analysis reads it here
        self.runlog = RunLog(self.run_dir, recorded, clock=clock, backend=backend,
                             num_train=problem.dataset.num_train, eval_every=cfg.eval_every,
                             target_error=cfg.target_error,
                             resume_from=resume["runlog"] if resume else None)
        self.evaluator = Evaluator(problem.worker, problem.eval_sets, eval_in_thread)
        self.progress = Progress(f"{backend} {cfg.exp_name}/{self.run_dir.name}", cfg.num_epochs, cfg.progress)
        self.finished: dict | None = None
        self.protocol = None   # made by begin(), when the clients are known
        self._checkpointed = self.server.version   # the version of the last periodic checkpoint

    # -- the start ------------------------------------------------------------------------------
    def begin(self, clients: list[int], time_s: float = 0.0, protocol_state: dict | None = None) -> None:
        """Start serving ``clients`` (each holds the server's parameters now): the protocol, and
        version 0 evaluated before any push (inline in both drivers: it is the reference for
        divergence and the first point of every curve)."""
        self.protocol = make_protocol(self, clients)
        if protocol_state is not None:
            self.protocol.load_state_dict(protocol_state)
        for k in clients:
            self.server.fetched(k)
        if self.runlog.version == 0 and self.runlog.last_eval_version < 0:
            self.evaluate_now(time_s)
        self.state.stopping = self.runlog.samples_seen >= self.budget

    # -- a push ---------------------------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return not self.state.stopping

    def check_loss(self, push: Push) -> str:
        """Why this push's training loss means divergence, or "". The reference is the larger of
        the version-0 training loss and the loss of a uniform guess (ln C for cross-entropy), so a
        warm start's small initial loss does not make its first stale transient 'divergence'."""
        if not math.isfinite(push.train_loss):
            return f"client {push.client} pushed a non-finite training loss ({push.train_loss})"
        ref = self.state.reference_loss
        if ref is not None and push.train_loss > self.cfg.divergence_factor * ref:
            return (f"client {push.client} pushed training loss {push.train_loss:.4g} > "
                    f"divergence_factor {self.cfg.divergence_factor:g} x reference loss {ref:.4g}")
        return ""

    def on_push(self, push: Push, time_s: float) -> list[Reply]:
        """Hand ``push`` to the protocol (nothing is applied once the run is stopping) and say
        who gets what back: the pushing client, and any client the push released."""
        if self.state.stopping:
            return [Reply(push.client, stop=True)]
        return self._deliver(self.protocol.on_push(push, time_s))

    def apply(self, push: Push, time_s: float, check: bool = True):
        """Apply one push (or a protocol's merged push) with the server rule and log its row;
        None when its loss means divergence."""
        if check:
            why = self.check_loss(push)
            if why:
                self.diverge(why)
                return None
        applied = self.server.apply(push)
        self.runlog.log_push(version=applied.version, time_s=time_s, client=push.client,
                             read_version=push.read_version, staleness=applied.staleness,
                             num_steps=push.num_steps, num_samples=push.num_samples,
                             train_loss=push.train_loss, train_error=push.train_error)
        if self.runlog.samples_seen >= self.budget:
            self.state.stopping = True
        return applied

    def _deliver(self, replies: list[Reply]) -> list[Reply]:
        if self.state.stopping:   # whoever still waits on the protocol is told to stop too
            replies = [Reply(r.client, stop=True) for r in replies + self.protocol.stopping()
                       if not r.preempt]
        for r in replies:
            if not r.stop:
                self.server.fetched(r.client)   # delay-compensating rules remember w_bak
        return replies

    def settle(self, time_s: float) -> None:
        """After the replies went out: evaluation and checkpoint cadence, progress."""
        self.drain()
        if self.runlog.eval_due() and not self.evaluator.busy and not self.state.diverged:
            self.evaluator.submit(EvalRequest(self.server.version, time_s, self.runlog.samples_seen,
                                              self.server.params.detach().clone()))
            self.drain()
        every, version = self.cfg.checkpoint_every, self.server.version
        if every and version % every == 0 and version != self._checkpointed:
            self.save_checkpoint()
            self._checkpointed = version
        self.progress.update(self.runlog.epoch, self.server.version, self.runlog.final.get("test_error"))

    def evaluate_now(self, time_s: float) -> None:
        self.evaluator.submit(EvalRequest(self.server.version, time_s, self.runlog.samples_seen,
                                          self.server.params.detach().clone()), inline=True)
        self.drain()

    def drain(self, wait: bool = False) -> None:
        """Write the rows of finished evaluations; an evaluation that failed fails the run."""
        for req, result in self.evaluator.poll(wait):
            if isinstance(result, Exception):
                raise RuntimeError(f"evaluation at version {req.version} failed: {result}") from result
            if result.get("nonfinite") or not all(math.isfinite(v) for v in result.values()):
                self.runlog.next_eval = math.inf   # no more evaluations of a diverged run
                self.diverge(f"non-finite parameters or losses at the evaluation of version {req.version}")
                continue
            if self.state.reference_loss is None:
                ref = math.log(self.problem.dataset.num_classes)
                self.state.reference_loss = max(result["train_loss"], ref)
            self.runlog.log_eval(version=req.version, time_s=req.time_s, samples_seen=req.samples_seen,
                                 **result)

    def diverge(self, why: str) -> None:
        if not self.state.diverged:
            self.state.diverged, self.state.stopping = why, True
            self.runlog.add_event("diverged", reason=why)
            log.info(f"diverged: {why}")

    def lose(self, client: int, reason: str, time_s: float = 0.0) -> list[Reply]:
        """A client is gone (the real driver); the run goes on with the rest. Returns replies
        owed to clients the lost one held back (a barrier it no longer blocks)."""
        if str(client) not in self.runlog.lost_clients:
            self.runlog.lost_clients[str(client)] = reason
            self.runlog.add_event("client_lost", client=client, reason=reason)
        if self.protocol is None:
            return []
        return self._deliver(self.protocol.on_lost(client, time_s))

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        state = {"kind": self.kind, "server": to_cpu(self.server.state_dict()),
                 "runlog": self.runlog.state_dict(), "driver": self.state.driver_state(),
                 "core": {"reference_loss": self.state.reference_loss},
                 "protocol": to_cpu(self.protocol.state_dict()) if self.protocol else {}}
        save_checkpoint(state, self.run_dir / schema.CHECKPOINT_FILE)

    # -- the end --------------------------------------------------------------------------------
    def final_status(self, interrupted: bool, forced: bool = False) -> tuple[str, str]:
        """The status of a run whose loop has ended, and its message."""
        if self.state.error:
            return "failed", self.state.error
        if interrupted:
            return "interrupted", ""
        if self.state.diverged:
            return "diverged", self.state.diverged
        if self.runlog.samples_seen < self.budget:
            lost = sorted(int(k) for k in self.runlog.lost_clients)
            return "failed", (f"every client was lost before the budget (epoch {self.runlog.epoch:.2f} "
                              f"of {self.cfg.num_epochs:g}; lost: {lost}); see the client_lost events")
        if self.runlog.lost_clients:
            return "completed_degraded", (f"clients {sorted(int(k) for k in self.runlog.lost_clients)} "
                                          "were lost; the others finished the budget")
        return "completed", ""

    def finish(self, status: str, message: str = "", clean: bool = True, **extra) -> dict:
        """End the run: final evaluation (completed runs), final checkpoint of a clean state
        (``clean``: no push half-served), terminal summary, files closed. Idempotent."""
        if self.finished is not None:
            return self.finished
        self.evaluator.join(timeout_s=None if clean else 5.0)
        try:
            if clean:
                self.drain(wait=True)
                if status.startswith("completed") and self.runlog.last_eval_version != self.server.version:
                    self.evaluate_now(self.runlog.time_s)
                if status.startswith("completed") and not bool(torch.isfinite(self.server.params).all()):
                    self.diverge("non-finite parameters at the end of the run")
                if self.state.diverged and status.startswith("completed"):
                    status, message = "diverged", self.state.diverged
                self.save_checkpoint()
        except OSError as exc:   # a full disk: keep the last good checkpoint, say so
            status, message = "failed", f"could not write the run folder ({exc}); " + resume_hint(self.run_dir)
        if status == "interrupted" and not message:
            message = "interrupted; " + resume_hint(self.run_dir)
        if self.protocol is not None and getattr(self.protocol, "discarded", None) is not None:
            extra["discarded_pushes"] = self.protocol.discarded
        summary = self.runlog.write_summary(status, message=message, protocol=self.cfg.protocol.name,
                                            **extra)
        self.runlog.close()
        self.progress.update(self.runlog.epoch, self.server.version, self.runlog.final.get("test_error"),
                             force=True)
        self.finished = summary
        return summary

