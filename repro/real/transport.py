"""The real driver's wire: one bounded-wait channel per client, the server's receiver threads and their judge.

This module owns how bytes move between the server (rank 0) and client ``k`` (rank ``k``), nothing of what they
mean. Every wait is bounded, and an expired one ends the channel (:class:`LinkLost`); the server's receivers are
judged by :class:`Silence` instead. Why a channel keeps its last works, and how a client hears a message between two
local steps: docs/real.md, "How messages move".
"""
from __future__ import annotations

import contextlib
import datetime
import queue
import threading
import time
from typing import Callable

import torch.distributed as dist
from torch import Tensor

from repro.asgd.algorithm import Push
from repro.logs import prefixed
from repro.real.frames import Frame, Header, Kind, LinkLost

log = prefixed("repro.real.server", "[real server]")   # the server's, made once (Silence speaks for it too)
TAG = 1
RESUMED_S = 0.5   # see Channel._await: ample for gloo's thread to read a socket, on 2 busy cores
WATCH = datetime.timedelta(days=30)   # a watcher's wait: longer than any push (it cannot be re-armed)


class Channel:
    """One end of a 2-rank group, every wait bounded; one thread at a time uses it (the server hands it over)."""

    def __init__(self, group, peer: int, timeout_s: float, watched: bool = False, peer_in_group: int | None = None):
        self.group, self.peer, self.timeout_s = group, peer, timeout_s
        # the group's own send/recv, without dist.isend/irecv's checks; a pair group's ranks are given
        self._peer_in_group = dist.get_group_rank(group, peer) if peer_in_group is None else peer_in_group
        self._pending: tuple | None = None   # (receive work, its Arrival), posted ahead
        self._last_send = self._last_recv = None   # released when the next completes (docs/real.md)
        self._watcher = _Watcher(f"watcher-{peer}") if watched else None
        self._timeout = datetime.timedelta(seconds=timeout_s)   # as gloo takes it, made once
        self._sent_at: float | None = None   # when the send under way began
        self.sending = Kind.HELLO            # what the last send carried
        self._recv_at: float | None = None   # when the receive under way began to wait
        self._receiving = None               # its work (see drop)

    def sending_s(self) -> float:
        """How long the send under way has waited for its peer (0: none is)."""
        return 0.0 if (sent_at := self._sent_at) is None else time.monotonic() - sent_at

    def receiving_s(self) -> float:
        """How long the receive under way has waited for its peer (0: none is)."""
        return 0.0 if (recv_at := self._recv_at) is None else time.monotonic() - recv_at

    def drop(self) -> str:
        """Close the link for silence, from another thread: a second, expiring wait on the receive under way
        closes the pair and fails it at once; why, in a loss's words."""
        work = self._receiving
        with contextlib.suppress(RuntimeError):   # (its expiry is the point)
            if work is not None:
                work.wait(datetime.timedelta(milliseconds=1))
        return str(self._lost("waiting for a message", None))

    def hurry(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` from now on (a wait already begun keeps its bound)."""
        self.timeout_s = min(self.timeout_s, timeout_s)
        self._timeout = datetime.timedelta(seconds=self.timeout_s)

    def _first_error(self, exc: RuntimeError) -> Exception:
        """Why the link ended, for a send's wait that failed with ``exc``: gloo tells a send queued on its
        socket nothing of a close (it times out), but the receive posted on the pair holds the first error."""
        if "Timed out" not in str(exc) or self._pending is None:
            return exc
        work, arrival = self._pending
        self._pending = None   # the link is over
        if arrival is not None:   # its watcher was told already, or is told now
            return arrival.error if arrival.wait(1.0) and arrival.error else exc
        try:
            work.wait(datetime.timedelta(seconds=1))   # fails at once: the pair has failed
        except RuntimeError as first:
            return first
        return exc

    def _lost(self, what: str, exc: Exception | None) -> LinkLost:
        text = "" if exc is None else str(exc)
        if exc is None or "Timed out" in text:
            why = f"silent for more than {self.timeout_s:g} s"
        elif "closed by peer" in text:   # gloo's words, with its source line and advice
            why = "connection closed by the peer (it dropped this link, or exited)"
        else:   # gloo's first line, long or not, cut between two words (a word cut in two misleads)
            line = text.splitlines()[0]
            why = f"connection lost ({line if len(line) <= 160 else line[:161].rsplit(' ', 1)[0] + ' ...'})"
        return LinkLost(f"rank {self.peer}: {what}: {why}")

    def send(self, header: Header, frame: Frame) -> None:
        """``header`` and ``frame``'s payload as one message (HELLO, STOP, HEARTBEAT: the header alone)."""
        self._transmit(header.pack(frame), header.payload_length, header.kind)

    def send_push(self, push: Push, frame: Frame, **envelope) -> None:
        """``push`` as a PUSH whose update fills ``frame``'s payload, no header built (a client's hot path)."""
        self._transmit(Header.pack_push(push, frame, frame.capacity, **envelope), frame.capacity, Kind.PUSH)

    def _transmit(self, frame: Frame, length: int, kind: Kind) -> None:
        self._sent_at, self.sending = time.monotonic(), kind   # (see sending_s, Silence.stalled)
        try:   # (on a connection already closed the call itself fails, at once)
            work = self.group.send(frame.message(length), self._peer_in_group, TAG)
            work.wait(self._timeout)
        except RuntimeError as exc:
            raise self._lost(f"sending {kind.name}", self._first_error(exc)) from exc
        finally:
            self._sent_at = None
        self._last_send = work

    def post(self, frame: Frame) -> None:
        """Post the next receive now, so the peer's message lands while this process is busy (none if one is posted)."""
        if self._pending is None:
            try:
                work = self.group.recv(frame.message(frame.capacity), self._peer_in_group, TAG)
            except RuntimeError as exc:   # (as a send's call)
                raise self._lost("waiting for a message", exc) from exc
            arrival = self._watcher.watch(work) if self._watcher is not None else None
            self._pending = (work, arrival)

    def arrived(self, wait_s: float = 0.0) -> bool:
        """Whether the receive posted ahead has completed or failed (a watched channel's), waiting ``wait_s`` first."""
        if self._pending is None or self._pending[1] is None:
            return False
        return self._pending[1].wait(wait_s) if wait_s else self._pending[1].is_set()

    def recv(self, frame: Frame, judged: bool = False) -> Header:
        """The next message, into ``frame``; :class:`LinkLost` after ``timeout_s`` of silence (``judged``: once
        another thread judges it silent, :meth:`drop`). The payload is ``frame.payload[:header.length]``."""
        self.post(frame)   # unless one was posted ahead
        work, arrival = self._pending
        self._pending = None
        self._recv_at, self._receiving = time.monotonic(), work   # (see receiving_s, drop)
        try:
            self._await(work, arrival, WATCH if judged else None)
        finally:
            self._recv_at = self._receiving = None
        self._last_recv = work
        header = Header.unpack(frame)
        if header.payload_length > frame.capacity:   # cannot happen after HELLO; never trust it blindly
            raise LinkLost(f"rank {self.peer}: protocol error: {header.length} values in a frame for {frame.capacity}")
        return header

    def _await(self, work, arrival, bound: datetime.timedelta | None = None) -> None:
        """Wait for a posted receive at most ``timeout_s`` (or ``bound``); LinkLost if it fails or expires."""
        if arrival is None:
            try:
                work.wait(bound or self._timeout)
            except RuntimeError as exc:  # gloo reports both a closed pair and a timeout this way
                raise self._lost("waiting for a message", exc) from exc
        elif not (arrival.wait(self.timeout_s) or arrival.wait(RESUMED_S)) or arrival.error is not None:
            # a moment more than the timeout: a process suspended past it wakes with the wait over before
            # gloo's thread has read what came meanwhile (a held client's HEARTBEATs)
            raise self._lost("waiting for a message", arrival.error)


class _Arrival(threading.Event):
    """Set when a watched receive completed; ``error``: why it failed instead."""

    error: Exception | None = None


class _Watcher(threading.Thread):
    """Waits for a channel's posted receives, one after the other."""

    def __init__(self, name: str):
        super().__init__(name=name, daemon=True)
        self._works: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def watch(self, work) -> _Arrival:
        arrival = _Arrival()
        self._works.put((work, arrival))
        return arrival

    def run(self) -> None:
        while True:
            work, arrival = self._works.get()
            try:
                work.wait(timeout=WATCH)
            except Exception as exc:   # a closed link (or, after WATCH, a timeout): recv says so
                arrival.error = exc
            arrival.set()


class Receiver(threading.Thread):
    """The server's receive from client ``k``: each push into one reusable frame, handed to ``on_push`` (under the
    server lock; the next receive is posted only with the reply, so the frame is never overwritten while read), False
    once the client is told to stop; ``on_lost`` hears why the link ended otherwise (a thread per client: why, docs)."""

    def __init__(self, client: int, channel: Channel, frame: Frame,
                 on_push: Callable[[int, Header, Tensor], bool], on_lost: Callable[[int, str], None]):
        super().__init__(name=f"receiver-{client}", daemon=True)
        self.client, self.channel, self.frame = client, channel, frame
        self.on_push, self.on_lost = on_push, on_lost
        self._done = False
        self._gate = threading.Event()   # cleared while the client waits for a held reply
        self._gate.set()
        self.held_since = 0.0            # when the held reply began (see held_s)

    def hold(self) -> None:
        """The client's reply is held (a sync round, an ssp bound): listen for nothing until :meth:`release`."""
        self.held_since = time.monotonic()
        self._gate.clear()

    def held_s(self) -> float:
        """How long the client's reply has been held (0: it is not)."""
        return 0.0 if self._gate.is_set() else time.monotonic() - self.held_since

    def release(self) -> None:
        if not self._gate.is_set():   # (set() takes a lock and notifies: once per reply otherwise)
            self._gate.set()

    def run(self) -> None:
        channel, frame, gate = self.channel, self.frame, self._gate
        while not self._done:
            if not gate.is_set():   # (Event.wait takes a lock even when set: once per push)
                gate.wait()
                if self._done:
                    return
            try:   # its silence the server judges (Silence), not gloo's bound
                header = channel.recv(frame, judged=True)
            except Exception as exc:  # LinkLost, or anything else: either way the client is gone
                if not self._done:
                    self.on_lost(self.client, str(exc))
                return
            header.received_at = time.monotonic()
            if header.kind is Kind.HEARTBEAT:
                continue   # alive and computing: wait again, the timeout starts over
            length = header.payload_length
            if not self.on_push(self.client, header,
                                frame.payload if length == frame.capacity else frame.payload[:length]):
                return

    def finish(self) -> None:
        """Stop after the current message (a receive already waiting ends with its link)."""
        self._done = True
        self._gate.set()


class Silence:
    """Judges the receivers' waits (unbounded in gloo): a gap over half ``timeout_s`` (and a second) between the
    server's rounds is its own suspension, silence counting from its end (docs/failures.md); and says stalled sends."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.judged = self.since = time.monotonic()
        self.stalls: set[int] = set()   # clients whose send under way was said (see stalled)

    def judge(self, channels: dict[int, Channel]) -> dict[int, str]:
        """Drop each of ``channels`` ({client: channel}) silent for ``timeout_s`` while this process ran; why."""
        now = time.monotonic()
        if now - self.judged > max(self.timeout_s / 2, 1.0):
            self.since = now
        self.judged = now
        return {k: ch.drop() for k, ch in channels.items() if min(ch.receiving_s(), now - self.since) > self.timeout_s}

    def stalled(self, channels: dict[int, Channel], after_s: float) -> None:
        """Say once which client a send has waited on for over ``after_s``: the run waits up to its client timeout."""
        for k, ch in list(channels.items()):
            if ch.sending_s() <= after_s:
                self.stalls.discard(k)   # (its send ended: a later one is said afresh)
            elif k not in self.stalls:
                self.stalls.add(k)
                log.info(f"waiting for client {k} to take the {ch.sending.name} sent to it (nothing taken for "
                         f"{after_s:g} s: suspended or hung?); the run waits up to backend.client_timeout_s="
                         f"{ch.timeout_s:g} s, then counts it lost")
