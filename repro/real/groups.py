"""How the real driver's ranks find each other: the world, one gloo group per client, the interface gloo binds.

This module owns joining and leaving process groups (from a rendezvous store or torchrun's env://), the bound on
joining's C++ waits (:func:`bounded`) and the interface gloo listens on. Why one 2-rank group per client (an expired
wait closes every pair of its group): docs/real.md, "One node".
"""
from __future__ import annotations

import contextlib
import datetime
import os
import socket
import struct
import threading
import time
from concurrent.futures import Future, wait as futures_wait

import torch.distributed as dist


def is_loopback(addr: str) -> bool:
    try:
        return all(info[4][0].startswith("127.") or info[4][0] == "::1" for info in socket.getaddrinfo(addr, None))
    except OSError:
        return False


def loopback_ifname() -> str | None:
    """Name of the loopback interface (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    try:
        return next((name for _, name in socket.if_nameindex() if name in ("lo", "lo0")), None)
    except OSError:
        return None


def pin_gloo(master_addr: str, single_node: bool) -> None:
    """Set GLOO_SOCKET_IFNAME: loopback for a loopback master (in a single-node run whatever the environment says);
    under torchrun a user's own, else for another master the interface routing to it (docs/real.md, torchrun)."""
    if not single_node and "GLOO_SOCKET_IFNAME" in os.environ:
        return
    if is_loopback(master_addr):
        name = loopback_ifname()
    else:
        name = None if single_node else interface_towards(master_addr)
    if name:
        os.environ["GLOO_SOCKET_IFNAME"] = name


def ipv4_of(name: str) -> str | None:
    """Interface ``name``'s IPv4 address, or None (none, or not Linux, whose number SIOCGIFADDR is)."""
    try:
        import fcntl
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            ifreq = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        return socket.inet_ntoa(ifreq[20:24])
    except (OSError, ImportError):
        return None


def interface_towards(addr: str) -> str | None:
    """The interface this host sends from to reach ``addr`` (IPv4: a UDP socket's route, no packet), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((addr, 9))
            local = probe.getsockname()[0]
        return next((name for _, name in socket.if_nameindex() if ipv4_of(name) == local), None)
    except OSError:
        return None


def connect(rank: int, world_size: int, timeout_s: float, store=None) -> dict[int, object]:
    """Join the world over gloo (``store``, else env://), make the per-client groups: {client: group}, this rank's."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:   # torchrun's, under a prefix of this restart attempt: its agent keeps the store across
        # restarts, with the dead attempt's gloo addresses under the keys ('Connection refused')
        store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        store = dist.PrefixStore(f"repro/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    # torch's process-wide count of groups names them (and so every rendezvous key): a failed
    # init_process_group leaves it up, and this process's groups would be named unlike its peers'
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "group_count") and not dist.is_initialized():
        world.group_count = 0
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout, store=store)
    # collective, every rank in the same order (use_local_synchronization names groups by how many a
    # process has, which differs between server and client: a deadlock)
    groups = {k: dist.new_group([0, k], timeout=timeout, backend="gloo") for k in range(1, world_size)}
    return {k: group for k, group in groups.items() if rank in (0, k)}


def pair_group(store, prefix: str, rank: int, timeout_s: float):
    """The 2-rank gloo group of a joining client (rank 1) and the server (rank 0) from ``prefix`` of the
    store, as torchft's parameter-server prototype makes one per client; waits for both, at most ``timeout_s``."""
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, 2, datetime.timedelta(seconds=timeout_s))


def forget_pair(store, prefix: str) -> None:
    """Delete a pair group's keys under ``prefix`` (gloo's two addresses), read by nobody once made or given up."""
    with contextlib.suppress(Exception):   # a store without list_keys, or one that is closing
        for key in store.list_keys():
            if key.startswith(prefix + "/"):
                store.delete_key(key)


def bounded(call, timeout_s: float, what: str, stop=None):
    """``call()`` in a daemon thread, waited for at most ``timeout_s`` (TimeoutError naming ``what``) or until ``stop``
    is set (InterruptedError): not every C++ wait of the store's and gloo's is bounded or hears a signal."""
    result: Future = Future()   # (not an executor's: its threads are joined at exit, a hung wait with them)

    def wait() -> None:
        try:
            result.set_result(call())
        except BaseException as exc:   # handed to the waiting thread
            result.set_exception(exc)

    threading.Thread(target=wait, name=what, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while not result.done() and (left := deadline - time.monotonic()) > 0:
        if stop is not None and stop.is_set():
            raise InterruptedError(what)
        futures_wait([result], min(left, 0.1))   # in slices: a stop request is heard at once
    if not result.done():
        raise TimeoutError(f"{what}: no answer within {timeout_s:g} s")
    return result.result()


def first_line(exc: BaseException) -> str:
    """An error's first line, for a one-line message (its type's name when it says nothing)."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def disconnect() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
