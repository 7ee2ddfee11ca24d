"""The real driver's wire: one bounded-wait channel per client, the server's receiver threads and their judge.

This module owns how bytes move between the server (rank 0) and client ``k`` (rank ``k``), and
nothing about what they mean for training.

Groups: one 2-rank gloo group per client (:mod:`repro.real.groups`); messages: one frame each
way (:mod:`repro.real.frames`), sent as ONE gloo message. Every wait is bounded, and as gloo
cannot keep a receive pending across an expired timeout (see :mod:`repro.real.groups`), an
expired wait ends the channel: :class:`LinkLost`. The server's receivers are bounded by the server
instead (:class:`Silence`), in time its process ran: gloo's clock runs on while it is suspended.

Releasing a work. gloo's device thread still holds a message's buffer for a moment after it has
completed the work (it wakes the waiter first, then leaves the read or write), and destroying a
work whose buffer it holds *spins* (``std::this_thread::yield`` in gloo's
``~ShareableNonOwningPtr``) until it lets go. A work dropped the instant its wait returns races
with that thread, and on a busy 2-core machine the spinning thread can keep a core for a whole
scheduler tick while the thread it waits for waits for that core. Measured at 0.1M parameters
on 2 shared cores (issue 34): a client used 700-1000 us of CPU per round trip instead of ~250,
and one round trip in ten took 4 ms instead of ~0.3. So a channel keeps its last completed send
and receive, and releases each when the next one completes (long after gloo let go).

Has a message arrived? A client asks between two local steps (STOP, or a preemption's
parameters). A gloo receive reports its completion only through ``wait()``
(``work.is_completed()`` stays False until then, torch 2.13), and a short wait that expires
would close the connection, so a *watched* channel hands each posted receive to one watcher
thread that waits for it; the thread computing reads a flag (:meth:`Channel.arrived`) and
``recv`` waits on that flag, still bounded by its timeout. Without it a client never noticed a
preemption: it pushed its dropped segment anyway, and a server sending a second preemption
while that client pushed deadlocked until the client timeout dropped it.
"""
from __future__ import annotations

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

log = prefixed("repro.real.server", "[real server]")   # (the server's: Silence speaks for it)
TAG = 1
RESUMED_S = 0.5   # see Channel._await: ample for gloo's thread to read a socket, on 2 busy cores
WATCH = datetime.timedelta(days=30)   # a watcher's wait: longer than any push (it cannot be re-armed)


class Channel:
    """One end of a 2-rank group: send a frame, receive a frame, every wait bounded.

    Not thread-safe: one thread at a time uses a channel (the server hands each channel back and
    forth between its receiver thread and its main loop, never concurrently).
    """

    def __init__(self, group, peer: int, timeout_s: float, watched: bool = False,
                 peer_in_group: int | None = None):
        self.group, self.peer, self.timeout_s = group, peer, timeout_s
        # the group's own send/recv: the dist.isend/irecv wrappers add ~10 us of checks a call.
        # A pair group made on demand (pair_group) is no world's: its ranks are given, 0 the server
        self._peer_in_group = dist.get_group_rank(group, peer) if peer_in_group is None else peer_in_group
        self._pending: tuple | None = None   # (receive work, its Arrival), posted ahead
        # the last send and the last receive that completed, released only when the next one
        # completes: see "Releasing a work" in the module docstring
        self._last_send = self._last_recv = None
        self._watcher = _Watcher(f"watcher-{peer}") if watched else None
        self._timeout = datetime.timedelta(seconds=timeout_s)   # as gloo takes it, made once
        self._sent_at: float | None = None   # when the send under way began
        self.sending = Kind.HELLO            # what the last send carried
        self._recv_at: float | None = None   # when the receive under way began to wait
        self._receiving = None               # its work (see drop)

    def sending_s(self) -> float:
        """How long the send under way has waited for its peer (0: none is)."""
        sent_at = self._sent_at
        return 0.0 if sent_at is None else time.monotonic() - sent_at

    def receiving_s(self) -> float:
        """How long the receive under way has waited for its peer (0: none is)."""
        recv_at = self._recv_at
        return 0.0 if recv_at is None else time.monotonic() - recv_at

    def drop(self) -> str:
        """Close the link for silence, from another thread, so that the receive under way fails
        at once (a second wait on its work that expires closes the pair, as any expired wait
        does: see :mod:`repro.real.groups`); why, in a loss's words."""
        work = self._receiving
        try:   # (its expiry is the point)
            if work is not None:
                work.wait(datetime.timedelta(milliseconds=1))
        except RuntimeError:
            pass
        return str(self._lost("waiting for a message", None))

    def hurry(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` from now on (a wait already begun keeps its bound)."""
        self.timeout_s = min(self.timeout_s, timeout_s)
        self._timeout = datetime.timedelta(seconds=self.timeout_s)

    def _first_error(self, exc: RuntimeError) -> Exception:
        """Why the link ended, for a send's wait that failed with ``exc`` (a receive's own failure
        is that first error already). gloo tells a send queued on its
        socket nothing when the connection closes (a write refused with EPIPE is just queued), so a
        send made before gloo's thread read a close (a client continued after the server dropped
        it) times out instead; the receive posted on the pair was handed the pair's first error."""
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
        """``header`` and the first ``header.length`` payload values of ``frame``, as one message
        (HELLO and STOP: the header alone)."""
        self._transmit(header.pack(frame), header.payload_length, header.kind)

    def send_push(self, push: Push, frame: Frame, **envelope) -> None:
        """``push`` as a PUSH whose update fills ``frame``'s payload, with no header built on the
        way (a client's hot path: see :meth:`~repro.real.frames.Header.pack_push`)."""
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
        """Post the next receive now, so the peer's message lands without waiting for this
        process to come back to Python (e.g. before sending the message it answers); nothing
        when one is posted already."""
        if self._pending is None:
            try:
                work = self.group.recv(frame.message(frame.capacity), self._peer_in_group, TAG)
            except RuntimeError as exc:   # (as a send's call)
                raise self._lost("waiting for a message", exc) from exc
            arrival = self._watcher.watch(work) if self._watcher is not None else None
            self._pending = (work, arrival)

    def arrived(self, wait_s: float = 0.0) -> bool:
        """True when the receive posted ahead has completed, or its link failed (polled between
        local steps; a watched channel only: see the module docstring); ``wait_s``: how long to
        wait for it first."""
        if self._pending is None or self._pending[1] is None:
            return False
        return self._pending[1].wait(wait_s) if wait_s else self._pending[1].is_set()

    def recv(self, frame: Frame, judged: bool = False) -> Header:
        """The next message, into ``frame``; raises :class:`LinkLost` after the channel's
        ``timeout_s`` of silence (``judged``: once another thread judges it silent, :meth:`drop`).
        The payload is ``frame.payload[:header.length]``."""
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
            raise LinkLost(f"rank {self.peer}: protocol error: {header.length} values in a "
                           f"frame for {frame.capacity}")
        return header

    def _await(self, work, arrival, bound: datetime.timedelta | None = None) -> None:
        """Wait for a posted receive at most ``timeout_s`` (``bound`` instead: an unwatched judged
        one); LinkLost if it fails or expires."""
        if arrival is None:
            try:
                work.wait(bound or self._timeout)
            except RuntimeError as exc:  # gloo reports both a closed pair and a timeout this way
                raise self._lost("waiting for a message", exc) from exc
        elif not (arrival.wait(self.timeout_s) or arrival.wait(RESUMED_S)) or arrival.error is not None:
            # the watcher waits on gloo; we wait on it, as long as the timeout says, and a moment
            # more: a process suspended past its timeout (SIGSTOP, a starved core) wakes with the
            # wait over before gloo's thread has read what came meanwhile (a held client's
            # HEARTBEATs), and gave up on a server that had kept it
            raise self._lost("waiting for a message", arrival.error)


class _Arrival(threading.Event):
    """Set when a watched receive completed; ``error``: why it failed instead."""

    error: Exception | None = None


class _Watcher(threading.Thread):
    """Waits for a channel's posted receives, one after the other (see the module docstring)."""

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


# ---------------------------------------------------------------------------------------------
# The server's receive from any source: one thread per client
# ---------------------------------------------------------------------------------------------

class Receiver(threading.Thread):
    """Receives client ``k``'s pushes into one reusable frame and hands each to ``on_push``
    (the server loop, which takes its lock, applies, replies, and posts the next receive only
    with the client's reply; so the frame is never overwritten while read, also while the
    protocol holds the push until a later reply). ``on_push`` returns False when the client was
    told to stop; ``on_lost`` hears why the link ended otherwise. Each wait ends when its client
    speaks, its link closes, or the server judges it silent (:class:`Silence`).

    Why a thread per client that does the server's work under a lock, rather than threads that
    queue pushes for a main loop: the queue's extra thread wake-up cost ~0.1 ms per round trip
    here, a fifth of a 0.1M-parameter round trip. Pushes are still applied one at a time.
    """

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
        """The client's reply is held (a sync round, an ssp bound): do not listen for its next
        message until :meth:`release`; the client sends nothing while it waits, and a receive
        left waiting would time out and close its link."""
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
    """The server's judge of its receivers' waits, each unbounded in gloo (``Channel.recv(judged=True)``): gloo's
    bound counts time the process was suspended, and a whole run continued after a Ctrl-Z lost every client, none
    of which had failed. A gap between two of the server's rounds longer than half ``timeout_s`` (and a second: a
    round comes every 0.05 s, 0.27 s at most with 12 clients on 2 busy cores) is taken for such a suspension (or
    starvation), not its clients' doing: their silence counts from its end. Also the teller of its sends' waits."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.judged = self.since = time.monotonic()
        self.stalls: set[int] = set()   # clients whose send under way was said (see stalled)

    def judge(self, channels: dict[int, Channel]) -> dict[int, str]:
        """Drop each of ``channels`` ({client: its channel}) silent (no push, no HEARTBEAT) for ``timeout_s`` while
        this process ran (:meth:`Channel.drop`); why, by client."""
        now = time.monotonic()
        if now - self.judged > max(self.timeout_s / 2, 1.0):
            self.since = now
        self.judged = now
        return {k: ch.drop() for k, ch in channels.items() if min(ch.receiving_s(), now - self.since) > self.timeout_s}

    def stalled(self, channels: dict[int, Channel], after_s: float) -> None:
        """Say once which client a send has waited on for over ``after_s`` (one suspended, whose receive was not
        posted): the lock's holder, and with it the run, its end included, waits for it up to the channel's bound
        (``backend.client_timeout_s``), silent before."""
        for k, ch in list(channels.items()):
            if ch.sending_s() <= after_s:
                self.stalls.discard(k)   # (its send ended: a later one is said afresh)
            elif k not in self.stalls:
                self.stalls.add(k)
                log.info(f"waiting for client {k} to take the {ch.sending.name} sent to it (nothing taken for "
                         f"{after_s:g} s: suspended or hung?); the run waits up to backend.client_timeout_s="
                         f"{ch.timeout_s:g} s, then counts it lost")
