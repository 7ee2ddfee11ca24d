"""Rank 0 of the real driver: the parameter server's loop, its evaluator and its checkpoints.

This module owns what the server process does once the transport is up. One receiver thread
per client (:class:`~repro.real.transport.Receiver`) hands each push to :meth:`ServerLoop.on_push`,
which holds the server lock while it applies the push with the same
:class:`~repro.algorithm.Server` the simulator runs, writes the row, and replies to that client
with the new parameters and version (Downpour's push + fetch round trip, ``nfetch = npush =
nsync``): pushes from any client are served one at a time, in the order they take the lock, and
``updates.csv`` records that order. The main thread only watches: interrupts, client processes,
finished evaluations. Evaluations run on snapshots in a thread so they never stall the pushes;
their rows are written under the lock, so the server is the run folder's only writer. Client
loss, divergence, the end of the budget and interrupts all end the same way: every remaining
client gets STOP on its next push.
"""
from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from repro import schema
from repro.algorithm import Push, Server, Worker
from repro.checkpoint import save_checkpoint
from repro.components import EvalSets, evaluate
from repro.real.transport import Channel, Frame, Header, Kind, LinkLost, Receiver, check_hello, hello
from repro.logs import get_logger
from repro.runlog import Progress, RunLog

if TYPE_CHECKING:
    from repro.real.launch import Prepared


_log = get_logger("repro.real.server")


def log(msg: str) -> None:
    _log.info(f"[real server] {msg}")


@dataclass
class EvalRequest:
    version: int
    time_s: float
    samples_seen: int
    params: torch.Tensor


class Evaluator:
    """Evaluates one parameter snapshot at a time, in a thread (or inline); the loop drains."""

    def __init__(self, worker: Worker, sets: EvalSets, in_thread: bool):
        self.worker, self.sets, self.in_thread = worker, sets, in_thread
        self._results: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._outstanding = 0   # submitted, result not yet handed to the loop

    @property
    def busy(self) -> bool:
        """Until its result is polled: eval_due() stays true until the row is written, so a
        finished-but-unpolled evaluation must still count, or the loop would submit another."""
        return self._outstanding > 0

    def submit(self, req: EvalRequest) -> None:
        self._outstanding += 1
        if not self.in_thread:
            self._evaluate(req)
            return
        self._thread = threading.Thread(target=self._evaluate, args=(req,), name="evaluator", daemon=True)
        self._thread.start()

    def _evaluate(self, req: EvalRequest) -> None:
        try:
            self._results.put((req, evaluate(self.worker, req.params, self.sets)))
        except Exception as exc:  # reported to the loop, which fails the run with it
            self._results.put((req, exc))

    def poll(self, wait: bool = False) -> list:
        if wait and self._thread is not None:
            self._thread.join()
        out = []
        while not self._results.empty():
            out.append(self._results.get())
        self._outstanding -= len(out)
        return out


# ---------------------------------------------------------------------------------------------
# Checkpoints: plain tensors, numbers, strings, lists and dicts (torch.load(weights_only=True))
# ---------------------------------------------------------------------------------------------

def _cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)   # copy: a view would save its whole storage
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    return obj


def checkpoint_state(server: Server, clients: dict, runlog: RunLog) -> dict:
    """``clients``: {"k": {"stream_position": [epoch, index] or None, "read_version": v}}."""
    return {"kind": "real", "server": _cpu(server.state_dict()), "clients": clients,
            "runlog": runlog.state_dict()}


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------

class ServerLoop:
    """The server's side of a run, from the first fetch to the summary."""

    def __init__(self, prep: Prepared, runlog: RunLog, channels: dict[int, Channel],
                 stop_requested: threading.Event, processes: dict | None = None):
        cfg, server = prep.cfg, prep.server
        self.cfg, self.server, self.runlog, self.evaluator = cfg, server, runlog, prep.evaluator
        self.channels, self.stop_requested = channels, stop_requested
        self.processes = processes or {}            # spawn mode: {client: Process}
        self.budget = cfg.num_epochs * prep.num_train
        self.device = server.params.device
        self.lock = threading.Lock()   # one push (or one watch round) at a time
        self.closed = False            # set under the lock: receivers stop serving
        numel, pin = server.params.numel(), self.device.type == "cuda"
        self.receivers = {k: Receiver(k, ch, Frame(numel, pin), cfg.backend.client_timeout_s,
                                      self.on_message, self.on_lost) for k, ch in channels.items()}
        self.reply = Frame(numel, pin)   # every reply leaves from this frame
        if not pin:   # CPU: the parameters live in the reply frame, so a reply copies nothing
            self.reply.payload.copy_(server.params)
            server.params = self.reply.payload
        resumed = prep.checkpoint["clients"] if prep.checkpoint else {}
        self.positions = {k: resumed.get(str(k), {}).get("stream_position") for k in channels}
        self.sent_version: dict[int, int] = {}
        self.lost: dict[int, str] = {}
        self.stopped: set[int] = set()
        self.devices: dict[int, str] = {}   # where each client trains (from its pushes)
        self.stopping, self.diverged, self.message, self.error = False, False, "", ""
        self.progress = Progress(f"real {cfg.exp_name}/{runlog.run_dir.name}", cfg.num_epochs, cfg.progress)
        self.t0, self.time_offset = time.perf_counter(), runlog.time_s

    def now(self) -> float:
        return self.time_offset + time.perf_counter() - self.t0

    def live(self) -> list[int]:
        return [k for k in self.channels if k not in self.lost and k not in self.stopped]

    # -- messages out ---------------------------------------------------------------------------
    def send_params(self, k: int, position=None) -> None:
        params = self.reply.payload
        if params.data_ptr() != self.server.params.data_ptr():
            params.copy_(self.server.params)   # GPU server: D2H, synchronous (orders the apply)
        header = Header(Kind.PARAMS, k, self.server.version, params.numel(),
                        position=tuple(position) if position is not None else None)
        try:
            self.channels[k].send(header, self.reply)
        except LinkLost as exc:
            self.lose(k, str(exc))
            return
        self.sent_version[k] = self.server.version
        self.channels[k].post(self.receivers[k].frame)   # its next push lands without waiting on us

    def greet(self, k: int) -> bool:
        """HELLO both ways: the client's frames must carry as many parameters as ours."""
        channel, frame = self.channels[k], self.receivers[k].frame
        try:
            channel.send(hello(self.reply), self.reply)
            theirs = channel.recv(frame, self.cfg.backend.client_timeout_s)
        except LinkLost as exc:
            self.lose(k, str(exc))
            return False
        try:
            check_hello(theirs, frame, k)
            return True
        except LinkLost as exc:
            with contextlib.suppress(LinkLost):   # tell it to go (a header fits any frame)
                channel.send(Header(Kind.STOP, k, 0, 0), self.reply)
            self.lose(k, str(exc))
            return False

    def send_stop(self, k: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()   # the apply read the buffer
        self.stopped.add(k)
        self.receivers[k].finish()
        try:
            self.channels[k].send(Header(Kind.STOP, k, self.server.version, 0), self.reply)
        except LinkLost as exc:
            log(f"client {k} left before it could be told to stop ({exc})")

    # -- events ---------------------------------------------------------------------------------
    def lose(self, k: int, reason: str) -> None:
        if k in self.lost or k in self.stopped:
            return
        self.lost[k] = reason
        self.receivers[k].finish()
        if self.stop_requested.is_set():
            return   # shutting down on purpose: peers leaving is expected, not an event
        self.runlog.add_event("client_lost", client=k, reason=reason)
        log(f"client {k} lost at version {self.server.version}: {reason}; "
            f"{len(self.live())} client(s) still training")

    def diverge(self, reason: str) -> None:
        if not self.diverged:
            self.diverged, self.stopping, self.message = True, True, reason
            self.runlog.add_event("diverged", reason=reason)
            log(f"diverged: {reason}; stopping all clients")

    def poll_processes(self) -> None:
        for k, proc in self.processes.items():
            if proc.exitcode is not None and k not in self.stopped:
                self.lose(k, f"process exited with code {proc.exitcode}")

    # -- the loop -------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.perf_counter()   # all clients are connected: wall time 0 (or resumed)
        self.stopping = self.runlog.samples_seen >= self.budget   # resuming a finished run
        self.maybe_eval()
        for k, receiver in self.receivers.items():
            if self.stopping:
                self.send_stop(k)
            elif self.greet(k):
                self.send_params(k, self.positions[k])   # before the receiver runs: one user at a time
                receiver.start()
        log(f"serving {len(self.channels)} client(s) from version {self.server.version}")

    def run(self) -> str:
        """Serve until every client is stopped or lost; return the final status."""
        try:
            with self.lock:
                self.start()
            while not self.stop_requested.wait(0.05):   # wakes at once on Ctrl-C
                with self.lock:
                    self.drain_evals()
                    self.poll_processes()
                    if not self.live() or self.error:
                        break
        finally:
            self.closed = True   # whatever happened, receivers serve no more pushes
        with self.lock:
            return self.finish()

    # -- called by the receiver threads -------------------------------------------------------
    def on_message(self, k: int, header: Header, update: torch.Tensor) -> bool:
        """A push from client ``k``; False when that client is done (stopped or lost)."""
        with self.lock:
            if self.closed or k in self.lost or k in self.stopped:
                return False
            try:
                self.on_push(k, header, update)
            except Exception as exc:   # a bug: end the run (the main thread sees `error`)
                traceback.print_exc()
                self.error, self.closed = f"{type(exc).__name__} serving client {k}: {exc}", True
                return False
            return k not in self.lost and k not in self.stopped

    def on_lost(self, k: int, reason: str) -> None:
        with self.lock:
            self.lose(k, reason)

    def on_push(self, k: int, h: Header, update: torch.Tensor) -> None:
        if (h.kind != Kind.PUSH or h.client != k or h.version != self.sent_version.get(k)
                or h.length != self.server.params.numel()):
            self.lose(k, f"protocol error: {h.kind.name} from client {h.client} read_version "
                         f"{h.version}, expected a PUSH from client {k} read_version {self.sent_version.get(k)}")
            return
        if self.stopping:
            self.send_stop(k)   # the budget is spent (or the run diverged): discard the push
            return
        if not math.isfinite(h.train_loss):
            self.diverge(f"client {k} pushed a non-finite training loss ({h.train_loss})")
            self.send_stop(k)
            return
        push = Push(client=k, read_version=self.sent_version[k], update=update,
                    num_steps=h.num_steps, num_samples=h.num_samples, train_loss=h.train_loss,
                    train_error=h.train_error, stream_position=h.position)
        applied = self.server.apply(push)
        self.runlog.log_push(version=applied.version, time_s=self.now(), client=k,
                             read_version=push.read_version, staleness=applied.staleness,
                             num_steps=h.num_steps, num_samples=h.num_samples,
                             train_loss=h.train_loss, train_error=h.train_error)
        self.positions[k] = h.position
        self.devices.setdefault(k, f"cuda:{h.device}" if h.device >= 0 else "cpu")
        if not self.server.params_finite():
            self.diverge(f"parameters became non-finite at version {applied.version}")
        elif self.runlog.samples_seen >= self.budget:
            self.stopping = True
        if self.stopping:
            self.send_stop(k)
        else:
            self.send_params(k)
        self.maybe_checkpoint()
        self.maybe_eval()
        self.progress.update(self.runlog.epoch, applied.version, self.runlog.final.get("test_error"))

    def maybe_eval(self) -> None:
        if self.runlog.eval_due() and not self.evaluator.busy and not self.diverged:
            self.evaluator.submit(EvalRequest(self.server.version, self.now(), self.runlog.samples_seen,
                                              self.server.params.detach().clone()))

    def drain_evals(self, wait: bool = False) -> None:
        for req, result in self.evaluator.poll(wait):
            if isinstance(result, Exception):
                raise RuntimeError(f"evaluation at version {req.version} failed: {result}") from result
            self.runlog.log_eval(version=req.version, time_s=req.time_s,
                                 samples_seen=req.samples_seen, **result)

    def maybe_checkpoint(self, force: bool = False) -> None:
        every = self.cfg.checkpoint_every
        if every > 0 and (force or self.server.version % every == 0):
            clients = {str(k): {"stream_position": list(p) if p is not None else None,
                                "read_version": self.sent_version.get(k, 0)}
                       for k, p in self.positions.items()}
            save_checkpoint(checkpoint_state(self.server, clients, self.runlog),
                            Path(self.runlog.run_dir) / schema.CHECKPOINT_FILE)

    # -- the end --------------------------------------------------------------------------------
    def finish(self) -> str:
        for receiver in self.receivers.values():
            receiver.finish()   # a receive still waiting ends with its client (killed) or timeout
        if self.stop_requested.is_set():
            self.drain_evals(wait=True)
            self.maybe_checkpoint(force=True)   # no push is being served: a clean state
            self.message = ("interrupted (SIGINT/SIGTERM); " + (
                f"resume=true continues from version {self.server.version}" if self.cfg.checkpoint_every
                else "checkpoint_every=0: no checkpoint to resume from"))
            return "interrupted"
        if self.error:
            self.message = self.error
            return "failed"
        if self.diverged:
            return "diverged"
        self.drain_evals(wait=True)
        if self.runlog.last_eval_version != self.server.version:
            self.maybe_eval_final()
        if self.runlog.samples_seen < self.budget:
            self.message = (f"all {len(self.channels)} clients were lost before the budget "
                            f"(epoch {self.runlog.epoch:.2f} of {self.cfg.num_epochs:g}); "
                            f"see the client_lost events")
            return "failed"
        if self.lost:
            self.message = f"clients {sorted(self.lost)} were lost; the others finished the budget"
            return "completed_degraded"
        return "completed"

    def maybe_eval_final(self) -> None:
        self.evaluator.in_thread = False   # nothing left to overlap with
        self.evaluator.submit(EvalRequest(self.server.version, self.now(), self.runlog.samples_seen,
                                          self.server.params.detach().clone()))
        self.drain_evals()

    def join_receivers(self, timeout_s: float) -> bool:
        """Wait for the receiver threads (each ends when its client leaves or its bounded wait
        expires); True if all ended, so the process groups can be destroyed safely."""
        deadline = time.monotonic() + timeout_s
        for receiver in self.receivers.values():
            if receiver.is_alive():
                receiver.join(max(0.0, deadline - time.monotonic()))
        return not any(r.is_alive() for r in self.receivers.values())
