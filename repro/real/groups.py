"""How the real driver's ranks find each other: the world, one gloo group per client, the interface gloo binds.

This module owns joining and leaving process groups (from a rendezvous store or torchrun's
env://), the bound on joining's C++ waits (:func:`bounded`) and which network interface gloo
listens on; :mod:`repro.real.transport` owns how messages move once a group exists.

Groups. Every rank joins the world group (``init_process_group`` over gloo), then all ranks create
one 2-rank gloo group ``[0, k]`` per client, in the same order (``dist.new_group`` is collective
over the world; its ``use_local_synchronization`` mode names groups by how many groups a process
already has, which differs between the server and a client, and deadlocks). All traffic of
client ``k`` goes through its own group. Why not one world group with an any-source receive:
measured on torch 2.13 / gloo, an any-source ``irecv`` on the world group does survive a
SIGKILLed peer (the others keep talking), but any ``work.wait(timeout=...)`` that expires calls
gloo's ``Context::signalException``, which closes *every* pair of that group. A hung client would
then take all clients down with it. With one group per client a timeout closes only that client's
pairs: its failure domain. The server's "receive from any source" is one :class:`~repro.real.transport.Receiver`
thread per client, each handing its pushes to the server loop, which serves one at a time
(as in torchft's parameter-server prototype: one receiver thread per client group).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
import struct
import threading
import time

import torch.distributed as dist


def is_loopback(addr: str) -> bool:
    try:
        return all(info[4][0].startswith("127.") or info[4][0] == "::1"
                   for info in socket.getaddrinfo(addr, None))
    except OSError:
        return False


def loopback_ifname() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    try:
        return next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)
    except OSError:
        return None


def pin_gloo(master_addr: str, single_node: bool) -> None:
    """Which interface gloo binds its pairs to (GLOO_SOCKET_IFNAME): left to itself, the one the
    host name resolves to. A single-node run on a loopback master listens on loopback only,
    whatever the environment says (multi-node users export GLOO_SOCKET_IFNAME for torchrun, and
    it must not open a single-node run to the network). Under torchrun a user's
    GLOO_SOCKET_IFNAME wins; else a loopback master means loopback, and any other master the
    interface that routes to it: the host name resolves to loopback on many machines (Debian's
    127.0.1.1; a network namespace), and the other nodes, told to connect to their own loopback,
    never start ('Connect timeout')."""
    if not single_node and "GLOO_SOCKET_IFNAME" in os.environ:
        return
    if is_loopback(master_addr):
        name = loopback_ifname()
    else:
        name = None if single_node else interface_towards(master_addr)
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def ipv4_of(name: str) -> str | None:
    """Interface ``name``'s IPv4 address, or None (it has none; or not Linux, whose number
    SIOCGIFADDR is: the ioctl fails there and gloo's own choice stays)."""
    try:
        import fcntl
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            ifreq = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(ifreq[20:24])
    except (OSError, ImportError):
        return None


def interface_towards(addr: str) -> str | None:
    """The interface this host sends from to reach ``addr`` (IPv4), or None when that cannot be
    told. No packet is sent: connecting a UDP socket only asks the kernel for a route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))
            local = probe.getsockname()[0]
        return next((name for _, name in socket.if_nameindex() if ipv4_of(name) == local), None)
    except OSError:
        return None


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


def bounded(call, timeout_s: float, what: str, stop=None):
    """``call()`` in a daemon thread, waited for at most ``timeout_s`` (TimeoutError naming
    ``what``), or until ``stop`` (a StopRequest) is set (InterruptedError). The store's and
    gloo's C++ waits are not all bounded: a listener that accepts and never speaks holds
    TCPStore's constructor forever, deaf to signals. A thread left waiting so ends with the
    process."""
    result: dict = {}

    def wait() -> None:
        try:
            result["value"] = call()
        except BaseException as exc:   # handed to the waiting thread
            result["error"] = exc

    thread = threading.Thread(target=wait, name=what, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.is_set():
            raise InterruptedError(what)
        thread.join(min(left, 0.1))   # in slices: a stop request is heard at once
    if thread.is_alive():
        raise TimeoutError(f"{what}: no answer within {timeout_s:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def first_line(exc: BaseException) -> str:
    """An error's first line, for a one-line message (its type's name when it says nothing)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


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
