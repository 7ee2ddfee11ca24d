"""The real driver's wire: process groups, the message header, and one bounded-wait channel per client.

This module owns how bytes move between the server (rank 0) and client ``k`` (rank ``k``), and
nothing about what they mean for training.

Groups. Every rank joins the world group (``init_process_group`` over gloo), then all ranks create
one 2-rank gloo group ``[0, k]`` per client, in the same order (``dist.new_group`` is collective
over the world; its ``use_local_synchronization`` mode names groups by how many groups a process
already has, which differs between the server and a client, and deadlocks). All traffic of
client ``k`` goes through its own group. Why not one world group with an any-source receive:
measured on torch 2.13 / gloo, an any-source ``irecv`` on the world group does survive a
SIGKILLed peer (the others keep talking), but any ``work.wait(timeout=...)`` that expires calls
gloo's ``Context::signalException``, which closes *every* pair of that group. A hung client would
then take all clients down with it. With one group per client a timeout closes only that client's
pairs: its failure domain. The server's "receive from any source" is one :class:`Receiver`
thread per client, each handing its pushes to the server loop, which serves one at a time
(as in torchft's parameter-server prototype: one receiver thread per client group).

Messages: one frame each way (:mod:`repro.real.frames`), sent as ONE gloo message.

Every wait is bounded. gloo cannot keep a receive pending across an expired timeout (see above),
so an expired wait ends the channel: :class:`LinkLost`.

Releasing a work. gloo's device thread still holds a message's buffer for a moment after it has
completed the work (it wakes the waiter first, then leaves the read or write), and destroying a
work whose buffer it holds *spins* (``std::this_thread::yield`` in gloo's
``~ShareableNonOwningPtr``) until it lets go. A work dropped the instant its wait returns races
with that thread, and on a busy 2-core machine the spinning thread can keep a core for a whole
scheduler tick while the thread it waits for waits for that core. Measured at 0.1M parameters
on 2 shared cores (issue 34): a client used 700-1000 us of CPU per round trip instead of ~250,
and one round trip in ten took 4 ms instead of ~0.3. So a channel keeps its last completed send
and receive, and releases each when the next one completes (long after gloo let go). A plain
loop of ``dist.recv`` (which drops its work at once) pays the same: the benchmark's raw server
keeps each receive until it has posted the next.

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

import contextlib
import datetime
import os
import queue
import socket
import struct
import threading
import time
from typing import Callable

import torch.distributed as dist
from torch import Tensor

from repro.asgd.algorithm import Push
from repro.real.frames import Frame, Header, Kind, LinkLost

TAG = 1
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
        self._pending: tuple | None = None   # (receive work, its frame, its Arrival), posted ahead
        # the last send and the last receive that completed, released only when the next one
        # completes: see "Releasing a work" in the module docstring
        self._last_send = self._last_recv = None
        self._watcher = _Watcher(f"watcher-{peer}") if watched else None
        self._timeouts: dict[float | None, datetime.timedelta] = {}
        self._default_timeout = self._timeout(None)   # the hot path's waits: no lookup

    def _timeout(self, timeout_s: float | None) -> datetime.timedelta:
        """``timeout_s`` (None: the channel's) as gloo takes it, made once: every wait needs one."""
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = datetime.timedelta(seconds=timeout_s or self.timeout_s)
        return timeout

    def _first_error(self, exc: RuntimeError) -> Exception:
        """Why the link ended, for a wait that failed with ``exc``. gloo tells a send queued on its
        socket nothing when the connection closes (a write refused with EPIPE is just queued), so a
        send made before gloo's thread read a close (a client continued after the server dropped
        it) times out instead; the receive posted on the pair was handed the pair's first error."""
        if "Timed out" not in str(exc) or self._pending is None:
            return exc
        work, _, arrival = self._pending
        self._pending = None   # the link is over
        if arrival is not None:   # its watcher was told already, or is told now
            return arrival.error if arrival.wait(1.0) and arrival.error else exc
        try:
            work.wait(datetime.timedelta(seconds=1))   # fails at once: the pair has failed
        except RuntimeError as first:
            return first
        return exc

    def _lost(self, what: str, timeout: datetime.timedelta, exc: Exception | None) -> LinkLost:
        text = "" if exc is None else str(exc)
        if exc is None or "Timed out" in text:
            why = f"silent for more than {timeout.total_seconds():g} s"
        elif "closed by peer" in text:   # gloo's words, with its source line and advice
            why = "connection closed by the peer (it dropped this link, or exited)"
        else:
            why = f"connection lost ({text.splitlines()[0][:160]})"
        return LinkLost(f"rank {self.peer}: {what}: {why}")

    def _closed(self, what: str, exc: Exception) -> LinkLost:
        """gloo's send or receive call on a connection already closed fails at once, inside the
        call rather than in its wait (a client continued after the server dropped it; a server
        replying to a client that just died): the link's end as much as a failed wait."""
        return self._lost(what, datetime.timedelta(seconds=self.timeout_s), exc)

    def send(self, header: Header, frame: Frame) -> None:
        """``header`` and the first ``header.length`` payload values of ``frame``, as one message
        (HELLO and STOP: the header alone)."""
        length = header.payload_length
        if length > frame.capacity:
            raise ValueError(f"a frame for {frame.capacity} values cannot carry {header.length}")
        self._transmit(header.pack(frame), length, header.kind)

    def send_push(self, push: Push, frame: Frame, **envelope) -> None:
        """``push`` as a PUSH whose update fills ``frame``'s payload: what ``send(Header.of_push(
        push, frame.capacity, **envelope), frame)`` sends, with no header built on the way (a
        client's hot path: see :meth:`~repro.real.frames.Header.pack_push`)."""
        self._transmit(Header.pack_push(push, frame, frame.capacity, **envelope), frame.capacity, Kind.PUSH)

    def _transmit(self, frame: Frame, length: int, kind: Kind) -> None:
        try:
            work = self.group.send(frame.message(length), self._peer_in_group, TAG)
        except RuntimeError as exc:   # see _closed
            raise self._closed(f"sending {kind.name}", exc) from exc
        try:
            work.wait(self._default_timeout)
        except RuntimeError as exc:
            raise self._lost(f"sending {kind.name}", self._default_timeout, self._first_error(exc)) from exc
        self._last_send = work

    def post(self, frame: Frame) -> None:
        """Post the next receive now, so the peer's message lands without waiting for this
        process to come back to Python (e.g. before sending the message it answers)."""
        if self._pending is None:
            try:
                work = self.group.recv(frame.message(frame.capacity), self._peer_in_group, TAG)
            except RuntimeError as exc:   # see _closed
                raise self._closed("waiting for a message", exc) from exc
            arrival = self._watcher.watch(work) if self._watcher is not None else None
            self._pending = (work, frame, arrival)

    def arrived(self, wait_s: float = 0.0) -> bool:
        """True when the receive posted ahead has completed, or its link failed (polled between
        local steps; a watched channel only: see the module docstring); ``wait_s``: how long to
        wait for it first."""
        if self._pending is None or self._pending[2] is None:
            return False
        return self._pending[2].wait(wait_s) if wait_s else self._pending[2].is_set()

    def recv(self, frame: Frame, timeout_s: float | None = None) -> Header:
        """The next message, into ``frame``; raises :class:`LinkLost` after ``timeout_s`` of
        silence. The payload is ``frame.payload[:header.length]``."""
        if self._pending is None:
            self.post(frame)
        work, posted, arrival = self._pending
        if posted is not frame:
            raise ValueError("recv() into a different frame than the one posted")
        self._pending = None
        timeout = self._default_timeout if timeout_s is None else self._timeout(timeout_s)
        if arrival is None:
            try:
                work.wait(timeout)
            except RuntimeError as exc:  # gloo reports both a closed pair and a timeout this way
                raise self._lost("waiting for a message", timeout, self._first_error(exc)) from exc
        elif not arrival.wait(timeout.total_seconds()) or arrival.error is not None:
            # the watcher waits on gloo; we wait on it, as long as the timeout says
            raise self._lost("waiting for a message", timeout, arrival.error)
        self._last_recv = work
        header = Header.unpack(frame)
        if header.payload_length > frame.capacity:   # cannot happen after HELLO; never trust it blindly
            raise LinkLost(f"rank {self.peer}: protocol error: {header.length} values in a "
                           f"frame for {frame.capacity}")
        return header


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
    told to stop; ``on_lost`` hears why the link ended otherwise.

    Why a thread per client that does the server's work under a lock, rather than threads that
    queue pushes for a main loop: the queue's extra thread wake-up cost ~0.1 ms per round trip
    here, a fifth of a 0.1M-parameter round trip. Pushes are still applied one at a time.
    """

    def __init__(self, client: int, channel: Channel, frame: Frame, timeout_s: float,
                 on_push: Callable[[int, Header, Tensor], bool], on_lost: Callable[[int, str], None]):
        super().__init__(name=f"receiver-{client}", daemon=True)
        self.client, self.channel, self.frame, self.timeout_s = client, channel, frame, timeout_s
        self.on_push, self.on_lost = on_push, on_lost
        self._done = False
        self._gate = threading.Event()   # cleared while the client waits for a held reply
        self._gate.set()

    def hold(self) -> None:
        """The client's reply is held (a sync round, an ssp bound): do not listen for its next
        message until :meth:`release`; the client sends nothing while it waits, and a receive
        left waiting would time out and close its link."""
        self._gate.clear()

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
            try:
                header = channel.recv(frame, self.timeout_s)
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


# ---------------------------------------------------------------------------------------------
# Joining the world
# ---------------------------------------------------------------------------------------------

def is_loopback(addr: str) -> bool:
    try:
        return all(info[4][0].startswith("127.") or info[4][0] == "::1"
                   for info in socket.getaddrinfo(addr, None))
    except OSError:
        return False


def loopback_ifname() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def pin_gloo_to_loopback(master_addr: str, single_node: bool) -> None:
    """gloo binds its pairs to the interface GLOO_SOCKET_IFNAME names, else the one the host name
    resolves to, either of which may be a LAN address. A single-node run on a loopback master
    listens on loopback only, whatever the environment says (multi-node users export
    GLOO_SOCKET_IFNAME for torchrun, and it must not open a single-node run to the network).
    Under torchrun the environment is the user's to set."""
    name = loopback_ifname()
    if name and is_loopback(master_addr) and (single_node or "GLOO_SOCKET_IFNAME" not in os.environ):
        os.environ["GLOO_SOCKET_IFNAME"] = name


def interface_towards(addr: str) -> str | None:
    """The interface this host sends from to reach ``addr`` (IPv4), or None when that cannot be
    told. No packet is sent: connecting a UDP socket only asks the kernel for a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))
            local = probe.getsockname()[0]
            import fcntl   # each interface's address: SIOCGIFADDR, Linux's number (elsewhere
            # the ioctl fails and gloo's own choice stays)
            for _, name in socket.if_nameindex():
                with contextlib.suppress(OSError):
                    ifreq = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                    if socket.inet_ntoa(ifreq[20:24]) == local:
                        return name
    except (OSError, ImportError):
        pass
    return None


def pin_gloo_towards(master_addr: str) -> None:
    """Under torchrun with GLOO_SOCKET_IFNAME unset, gloo binds the address the host name resolves
    to, which is loopback on many machines (Debian's 127.0.1.1; a network namespace): the other
    nodes are then told to connect to their own loopback and a two-node run never starts
    ('Connect timeout'). Bind the interface that routes to the master instead: the one the
    other nodes reach this node through. A user's GLOO_SOCKET_IFNAME still wins."""
    if "GLOO_SOCKET_IFNAME" not in os.environ and not is_loopback(master_addr):
        name = interface_towards(master_addr)
        if name:
            os.environ["GLOO_SOCKET_IFNAME"] = name


def connect(rank: int, world_size: int, timeout_s: float, store=None) -> dict[int, object]:
    """Join the world over gloo (from ``store``, else from torchrun's env://) and create the
    per-client groups, all ranks in the same order. Returns {client: group} for the groups this
    rank belongs to."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = torchrun_store(rank, world_size, timeout)
    _count_groups_from_zero()
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout, store=store)
    groups = {}
    for k in range(1, world_size):
        group = dist.new_group([0, k], timeout=timeout, backend="gloo")
        if rank in (0, k):
            groups[k] = group
    return groups


def pair_group(store, prefix: str, rank: int, timeout_s: float):
    """The 2-rank gloo group of one joining client (rank 1) and the server (rank 0), made on
    demand from ``prefix`` of the rendezvous store, as torchft's parameter-server prototype makes
    one per client session: no world group, so a client's arrival or loss touches no one else
    (see :mod:`repro.real.elastic`). Blocks until both ends are there, at most ``timeout_s``."""
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2,
                                 datetime.timedelta(seconds=timeout_s))


def forget_pair(store, prefix: str) -> None:
    """Delete every key of a pair group's ``prefix`` (gloo leaves its two addresses there): once
    both ends have made the group, or one gave up, nobody reads them again, and a joinable run
    that stayed up for many joins would otherwise keep them all until it exits."""
    with contextlib.suppress(Exception):   # a store without list_keys, or one that is closing
        for key in store.list_keys():
            if key.startswith(prefix + "/"):
                store.delete_key(key)


def torchrun_store(rank: int, world_size: int, timeout: datetime.timedelta):
    """torchrun's store (env://), under a prefix of this restart attempt: after a restart
    (--max-restarts) torchrun's agent keeps its store, and the dead attempt's gloo addresses
    would still be under the keys the new attempt reads ('Connection refused')."""
    store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"repro/attempt_{attempt}", store)


def _count_groups_from_zero() -> None:
    """torch names process groups by a process-wide counter (the names prefix every rendezvous
    key). A failed ``init_process_group`` leaves it incremented and only a successful destroy
    resets it, so a process that saw one failure (a test, a sweep) would name its groups
    differently from fresh peers, which then wait on each other's keys until the timeout."""
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count") and not dist.is_initialized():
        world.group_count = 0


def disconnect() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
