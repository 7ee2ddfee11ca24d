"""Rank 0 of the real driver: receive a push, hand it to the run core, carry the replies.

One receiver thread per client (:class:`~repro.real.transport.Receiver`) hands each push to
:meth:`Dispatcher.on_message`, which holds the server lock while the run core applies it (the simulator's
:class:`~repro.asgd.algorithm.ParameterServer`) and the replies go out: pushes are served one at a time, in the
order ``updates.csv`` records. The main thread only watches. However the run stops, every client still in it is sent
STOP at once.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
import traceback

import torch

from repro.config.settings import RunConfig
from repro.logs import mark
from repro.real.elastic import BUSY_KEY, ENDED, Refused
from repro.real.frames import Frame, Header, Kind, LinkLost, check_hello, fingerprint, hello, trained
from repro.real.groups import bounded, first_line, forget_pair, pair_group
from repro.real.transport import Channel, Receiver, Silence, log
from repro.runtime import StopRequest, naming_fork_server

STOPPING_S = 2.0   # once a stop is asked for, the most a send waits for a client that answers nothing


def greeted(channel: Channel, k: int, frame: Frame, out: Frame, cfg: RunConfig) -> None:
    """HELLO both ways, ours from ``out``, client ``k``'s into ``frame``; LinkLost if they disagree (once the
    client is told STOP), or when the link ends first."""
    channel.send(hello(out, cfg), out)
    try:
        check_hello(channel.recv(frame), frame, k, cfg)
    except LinkLost:
        with contextlib.suppress(LinkLost):
            channel.send(Header(Kind.STOP, k, 0, 0), out)
        raise


class Dispatcher:
    """The server's side of a run, from the first fetch to the last STOP."""

    def __init__(self, cfg: RunConfig, core, channels: dict[int, Channel], stop: StopRequest,
                 processes: dict | None = None, resume: dict | None = None):
        self.cfg, self.core, self.server = cfg, core, core.server
        self.channels, self.stop = channels, stop
        self.processes = {k: p for k, p in (processes or {}).items() if k in channels}   # spawn mode's
        self.device = self.server.params.device
        self.lock = threading.Lock()   # one push (or one watch round) at a time
        self.closed = False            # set under the lock: receivers stop serving
        self.stopping = False          # set under the lock: every client is told STOP, no joiner admitted
        self.receivers = {k: Receiver(k, ch, self.frame(), self.on_message, self.on_lost) for k, ch in channels.items()}
        self.reply = self.frame()   # every reply leaves from this frame
        self.params_in_reply = False   # CPU: from start() on, the server's parameters live in the reply frame
        resumed = (resume or {}).get("driver", {}).get("clients", {})
        self.positions = {k: resumed.get(str(k), {}).get("stream_position") for k in channels}
        self.sent_version: dict[int, int] = {}
        self.lost: dict[int, str] = {}
        self.stopped: set[int] = set()
        self.devices: dict[int, str] = {}   # where each client trains (from its pushes)
        self.t0, self.time_offset = time.perf_counter(), core.time_s
        self.kept_alive = time.monotonic()   # the last HEARTBEAT to clients whose reply is held
        self.silence = Silence(cfg.backend.client_timeout_s)   # judges the receivers' waits (see watch)
        self.next_id = max([cfg.num_clients, *core.used_clients, *channels]) + 1   # a joiner's: never used
        self.max_clients = cfg.backend.max_clients or cfg.num_clients
        self.pending: set[int] = set()   # admitted, not yet connected
        self.acceptor = None              # set by the launcher when joins are served

    def frame(self) -> Frame:
        """A frame for the parameters (pinned for a GPU server: the staging buffer)."""
        return Frame(self.server.params.numel(), pin=self.device.type == "cuda")

    def now(self) -> float:
        return self.time_offset + time.perf_counter() - self.t0

    def live(self) -> list[int]:
        return [k for k in self.channels if k not in self.lost and k not in self.stopped]

    def driver_state(self) -> dict:
        return {"clients": {str(k): {"stream_position": list(p) if p is not None else None,
                                     "read_version": self.sent_version.get(k, 0)}
                            for k, p in self.positions.items()}}

    def send_params(self, k: int, position=None, preempt: bool = False) -> None:
        """The parameters to client ``k``. ``preempt``: it is still computing a dropped segment and its
        receiver is listening, so no receive is posted and nothing released."""
        params = self.reply.payload
        if not self.params_in_reply:
            params.copy_(self.server.params)   # GPU server: D2H, synchronous (orders the apply)
        header = Header(Kind.PARAMS, k, self.server.version, params.numel(),
                        position=tuple(position) if position is not None else None,
                        sent_at=time.monotonic())
        try:
            self.channels[k].send(header, self.reply)
            self.sent_version[k] = self.server.version
            if not preempt:   # from here on the frame may be overwritten: the reply released its push
                self.channels[k].post(self.receivers[k].frame)   # its next push lands without waiting on us
        except LinkLost as exc:   # (a client that died just after the reply: its post fails)
            self.lose(k, str(exc))
            return
        if not preempt:
            self.receivers[k].release()   # a held client's receiver may listen again

    def send_stop(self, k: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()   # the apply read the buffer
        self.stopped.add(k)
        self.receivers[k].finish()
        try:
            self.channels[k].send(Header(Kind.STOP, k, self.server.version, 0), self.reply)
        except LinkLost as exc:
            log.info(f"client {k} left before it could be told to stop ({exc})")

    def lose(self, k: int, reason: str) -> None:
        if k in self.lost or k in self.stopped or k not in self.receivers:
            return
        self.lost[k] = reason = naming_fork_server(self.processes.get(k), reason)
        self.receivers[k].finish()
        if self.stop.is_set():
            return   # shutting down on purpose: peers leaving is expected, not an event
        log.info(f"client {k} lost at version {self.server.version}: {reason}; "
                 f"{len(self.live())} client(s) still training")
        outcome = self.core.lose(k, reason, now := self.now())
        self.carry(outcome.replies)   # a barrier it held opens: a version it applies is settled now
        if outcome.stopping or (not self.closed and self.core.settle(now, waiting=self.keep_alive).stopping):
            self.stop_clients()

    def carry(self, replies) -> None:
        """Send each reply the core gave: the parameters, or STOP."""
        for reply in replies:
            if reply.client in self.lost or reply.client in self.stopped:
                continue
            if reply.stop:
                self.send_stop(reply.client)
            else:
                self.send_params(reply.client, preempt=reply.preempt)

    def stop_clients(self) -> None:
        """Once the run is stopping, STOP to every client still in it, computing ones included."""
        self.stopping = True
        for k in self.live():
            self.send_stop(k)

    def keep_alive(self, evaluating: bool = True) -> None:
        """A HEARTBEAT every quarter of ``backend.timeout_s`` to each client whose reply has been held that long
        (docs/real.md); ``evaluating`` (under the lock): to clients awaiting our HELLO too, and a count of BUSY_KEY."""
        every = self.cfg.backend.timeout_s / 4
        if time.monotonic() - self.kept_alive < every:
            return
        self.kept_alive = time.monotonic()
        if evaluating and self.acceptor is not None:
            self.acceptor.store.add(BUSY_KEY, 1)
        for k in self.live():
            if evaluating and not self.receivers[k].is_alive() or self.receivers[k].held_s() >= every:
                try:
                    self.channels[k].send(Header(Kind.HEARTBEAT, k, self.server.version, 0), self.reply)
                except LinkLost as exc:
                    if not evaluating:   # (its HELLO, or the next round, loses it: the core is mid-begin or mid-settle)
                        self.lose(k, str(exc))

    def poll_processes(self) -> None:
        for k, proc in self.processes.items():
            if proc.exitcode is not None and k not in self.stopped:
                self.lose(k, f"process exited with code {proc.exitcode}")

    def greet(self) -> None:
        with self.lock:
            self.start()

    def start(self) -> None:
        self.t0 = time.perf_counter()   # all clients are connected: wall time 0 (or resumed)
        home = self.reply.payload if self.device.type != "cuda" else None
        begun = self.core.begin(sorted(self.channels), self.now(), driver_state=self.driver_state, params_home=home,
                                waiting=self.keep_alive)   # a resumed run's rounds start afresh
        self.params_in_reply = home is not None
        self.stopping = begun.stopping   # version 0 diverged: nobody is served
        for k, receiver in self.receivers.items():
            if self.stopping:
                self.send_stop(k)
                continue
            try:   # HELLO both ways (see greeted): a client that fails it is lost
                greeted(self.channels[k], k, receiver.frame, self.reply, self.cfg)
            except LinkLost as exc:
                self.lose(k, str(exc))
                continue
            self.send_params(k, self.positions[k])   # before the receiver runs: one user at a time
            receiver.start()
        log.info(f"serving {len(self.channels)} client(s) from version {self.server.version}")
        mark("server", "serving")

    def watch(self) -> bool:
        """The main thread's round, under the lock: evaluations, processes, heartbeats, silence; False: none is left."""
        drained = self.core.drain()
        self.poll_processes()
        self.keep_alive(evaluating=False)
        for k, why in self.silence.judge({k: self.channels[k] for k in self.live()}).items():
            self.lose(k, why)
        if drained.stopping:
            self.stop_clients()
        return bool(self.live()) and not self.core.error

    def run(self) -> tuple[str, str]:
        """Serve until every client is stopped or lost; return (status, message)."""
        try:   # the greetings in a thread: a HELLO waits on its client, and a stop must be heard
            bounded(self.greet, math.inf, "greeting the clients", self.stop)
            while not self.stop.wait(0.05):   # wakes at once on Ctrl-C
                self.silence.stalled(self.channels, STOPPING_S)   # a send under the lock (a receiver's): said
                if self.lock.acquire(timeout=0.5):   # (a reply may wait on its client under it: see below)
                    try:
                        if not self.watch():
                            break
                    finally:
                        self.lock.release()
        except InterruptedError:
            pass   # stopped while a HELLO waited: the ending below
        finally:
            self.closed = True   # whatever happened, receivers serve no more pushes
            if self.acceptor is not None:
                self.acceptor.done.set()
        # torchrun SIGKILLs rank 0 30 s after its signal: a stop waits for no client that answers nothing
        # (a receiver's reply holding the lock, the greeting's HELLO, a STOP)
        while not self.lock.acquire(timeout=0.1):
            if self.stop.is_set() and self.held_by_silence():
                return self.core.final_status(interrupted=True)
        try:   # an interrupt or a failure: nobody computes on for nothing
            for channel in self.channels.values() if self.stop.is_set() else ():
                channel.hurry(STOPPING_S)
            self.stop_clients()   # (every receiver is finished now: its client stopped or lost)
            return self.core.final_status(interrupted=self.stop.is_set())
        finally:
            self.lock.release()

    def held_by_silence(self) -> bool:
        """Whether the lock's holder has waited over STOPPING_S on a client: a send to any, or the greeting's
        receive of a HELLO. Such a holder touches the core no more once stopped, so the ending need not wait."""
        listening = {k for k, r in list(self.receivers.items()) if r.is_alive()}   # (a joiner's: set after its channel)
        return any(ch.sending_s() > STOPPING_S or (ch.receiving_s() > STOPPING_S and k not in listening)
                   for k, ch in list(self.channels.items()))

    def admit(self, request: dict) -> int:
        """The id a joiner gets, or :class:`~repro.real.elastic.Refused` saying why not."""
        with self.lock:
            if self.closed or self.stopping:
                raise Refused(ENDED)
            if request.get("fingerprint") != fingerprint(self.cfg):
                ours, theirs = trained(self.cfg), request.get("trained")
                theirs = theirs if isinstance(theirs, dict) else {}   # an older joiner's: no keys
                named = "; ".join(f"{k}={theirs[k]!r}, the run's {v!r}" for k, v in ours.items()
                                  if theirs.get(k, v) != v) or "data, model, algo, protocol, seed, nsync or num_clients"
                raise Refused(f"its config differs from the run's in what is trained ({named}): join with the run's "
                              "overrides")
            asked = request.get("client")
            lost = set(self.core.lost_clients) | set(self.lost)
            if asked is not None and (int(asked) not in lost or int(asked) in self.pending):
                raise Refused(f"backend.join_client={asked} is not a lost client of this run "
                              f"(lost: {sorted(lost - self.pending)}); an id is never shared by two processes")
            if len(self.live()) + len(self.pending) >= self.max_clients:
                raise Refused(f"the run has backend.max_clients={self.max_clients} clients training")
            if asked is None:
                k, self.next_id = self.next_id, self.next_id + 1
            else:
                k = int(asked)   # a restarted client takes its lost place back: client_rejoined
            self.pending.add(k)
            return k

    def add_client(self, k: int, store, prefix: str) -> None:
        """Connect admitted client ``k`` through its pair group, swap HELLOs, then serve it the current version;
        only the last step takes the lock, so a joiner that never connects holds nobody up."""
        timeout = self.cfg.backend.client_timeout_s
        try:
            try:
                group = pair_group(store, prefix, 0, timeout)
            except Exception as exc:
                log.info(f"joining client {k} did not connect within backend.client_timeout_s={timeout:g} s: "
                         f"{first_line(exc)}")
                return
            channel = Channel(group, k, timeout, peer_in_group=1)
            frame = self.frame()
            try:   # HELLO from the joiner's own frame: the reply frame belongs to the locked loop
                greeted(channel, k, frame, frame, self.cfg)
            except LinkLost as exc:
                log.info(f"joining client {k} refused: {exc}")
                return
            with self.lock:
                if self.closed or self.stopping:
                    with contextlib.suppress(LinkLost):
                        channel.send(Header(Kind.STOP, k, 0, 0), frame)
                    return
                self.channels[k] = channel
                self.receivers[k] = Receiver(k, channel, frame, self.on_message, self.on_lost)
                self.lost.pop(k, None)
                self.stopped.discard(k)
                self.processes.pop(k, None)   # a rejoiner's dead predecessor is not this client
                self.positions[k] = None
                joined = "rejoined" if self.core.join(k, self.now()) else "joined"   # (a lost client of the run, back)
                log.info(f"client {k} {joined} at version {self.server.version}; {len(self.live())} client(s) training")
                self.send_params(k)
                self.receivers[k].start()
        finally:   # made (both ends passed HELLO) or given up: its store keys are read no more
            forget_pair(store, prefix)
            with self.lock:
                self.pending.discard(k)

    def on_message(self, k: int, header: Header, update: torch.Tensor) -> bool:
        """A push from client ``k``; False when that client is done (stopped or lost)."""
        with self.lock:
            if self.closed or k in self.lost or k in self.stopped:
                return False
            try:
                self.on_push(k, header, update)
            except Exception as exc:   # a bug, or a full disk (named: no traceback): end the run (see watch)
                if not isinstance(exc, OSError):
                    traceback.print_exc()
                self.core.fail(f"{type(exc).__name__} serving client {k}: {exc}")
                self.closed = True
                return False
            return k not in self.lost and k not in self.stopped

    def on_lost(self, k: int, reason: str) -> None:
        with self.lock:
            self.lose(k, reason)

    def on_push(self, k: int, h: Header, update: torch.Tensor) -> None:
        taken_at = time.monotonic()   # the lock is held: a push's queue ends here
        if h.kind == Kind.PUSH and h.client == k and h.version < self.sent_version.get(k, 0):
            return   # computed before a preemption reached it: its new parameters are on the way
        if (h.kind != Kind.PUSH or h.client != k or h.version != self.sent_version.get(k)
                or h.length != self.server.params.numel()):
            self.lose(k, f"protocol error: {h.kind.name} from client {h.client} read_version "
                         f"{h.version}, expected a PUSH from client {k} read_version {self.sent_version.get(k)}")
            return
        push = h.to_push(update)   # its read_version is the version sent to k (checked above)
        now, started = self.now(), time.monotonic()
        outcome = self.core.on_push(push, now)
        apply_s, received_at = time.monotonic() - started, h.received_at or taken_at
        self.core.record_timing(now, k, push.read_version, to_client_s=h.to_client_s, compute_s=h.compute_s,
                                to_server_s=received_at - h.sent_at, queue_s=taken_at - received_at, apply_s=apply_s)
        if outcome.applied or any(r.client == k and not r.stop for r in outcome.replies):
            self.positions[k] = push.stream_position   # applied, or answered (e.g. discarded): its stream moved on
        if k not in self.devices:   # (its first push: not a string per push)
            self.devices[k] = f"cuda:{h.device}" if h.device >= 0 else "cpu"
        if all(r.client != k for r in outcome.replies):
            self.receivers[k].hold()   # its reply waits for the protocol (a round, the slowest)
        self.carry(outcome.replies)
        # (closed: the run ended while a reply waited, and its end checkpoints, not this push)
        if not self.closed and self.core.settle(now, waiting=self.keep_alive).stopping:
            self.stop_clients()

    def join_receivers(self, timeout_s: float) -> None:
        """Wait for the receiver threads, so that the process groups are destroyed under none of them."""
        deadline = time.monotonic() + timeout_s
        for receiver in self.receivers.values():
            if receiver.is_alive():   # (one never started cannot be joined)
                receiver.join(max(0.0, deadline - time.monotonic()))
