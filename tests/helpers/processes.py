"""Processes and sockets as ``/proc`` shows them: a launcher's session, a process tree (torchrun
starts its workers in sessions of their own), the clients a launcher spawned, a free loopback
port, the TCP sockets a set of processes holds and the addresses they are bound to.

Linux only, like the real-driver tests that use it. Every waiting helper also cleans up: a test
that fails still leaves no process behind.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def _stat(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()   # fields from 3 (state) on


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``: the launcher's whole tree."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        if fields and int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(pid))
    return out


def assert_no_leftovers(proc: subprocess.Popen, within_s: float = 5.0) -> None:
    """Nothing of ``proc``'s session is alive ``within_s`` after it ended (what is, is killed)."""
    deadline = time.monotonic() + within_s
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = session_processes(proc.pid)
    for pid in left:   # never leave strays behind, even when failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def _children_of(launcher_pid: int) -> tuple[list[int], list[int]]:
    """The launcher's spawn children and its multiprocessing fork servers."""
    spawned, servers = [], []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if not fields:
            continue
        if int(fields[1]) == launcher_pid and b"spawn_main" in cmd:
            spawned.append(int(pid))
        elif int(fields[1]) == launcher_pid and b"multiprocessing.forkserver" in cmd:
            servers.append(int(pid))
    return spawned, servers


def fork_servers(launcher_pid: int) -> list[int]:
    """The multiprocessing fork servers a real run's launcher started (its children)."""
    return _children_of(launcher_pid)[1]


def client_pids(launcher_pid: int) -> list[int]:
    """The client processes of a real run's launcher: forks of its multiprocessing fork server
    (the launcher's child), or spawn children of the launcher itself."""
    pids, servers = _children_of(launcher_pid)
    for server in servers:
        with contextlib.suppress(OSError):
            pids += [int(c) for c in Path(f"/proc/{server}/task/{server}/children").read_text().split()]
    return sorted(pids)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            tree.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(pid))
    return tree


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (torchrun starts each worker in a session of its own,
    so the session does not find them)."""
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def is_worker(pid: int) -> bool:
    """``pid`` is a live (non-zombie) ``repro.run`` process, e.g. a torchrun worker."""
    try:
        return b"repro.run" in Path(f"/proc/{pid}/cmdline").read_bytes() and \
            Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def workers_left(workers: set[int], within_s: float) -> list[int]:
    """The ``workers`` still live (:func:`is_worker`) after waiting up to ``within_s`` for them to end."""
    deadline = time.monotonic() + within_s
    while any(is_worker(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in workers if is_worker(p)]


def find_rank0(workers: set[int]) -> int | None:
    """The worker among ``workers`` whose environment says RANK=0 (the server), if any."""
    for pid in sorted(workers):
        with contextlib.suppress(OSError):
            if is_worker(pid) and b"RANK=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
    return None


def free_port() -> int:
    """A loopback TCP port nobody listened on a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def non_loopback_interface() -> str | None:
    """A network interface with an IPv4 address other than loopback (eth0 first)."""
    from repro.real.groups import ipv4_of   # (torch.distributed: only for the tests that ask)

    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        return None
    names.sort(key=lambda n: n != "eth0")
    return next((n for n in names if (a := ipv4_of(n)) and not ipaddress.ip_address(a).is_loopback), None)


def proc_net_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6} (host byte order, 32-bit words)."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(raw)
    return addr.ipv4_mapped or addr if isinstance(addr, ipaddress.IPv6Address) else addr


def tcp_sockets(pids: list[int]) -> list[tuple[int, str, str]]:
    """(pid, local address, state) of every TCP socket the processes hold (state 0A = listening)."""
    owner = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        owner[link[8:-1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in owner:
                    found.append((owner[fields[9]], fields[1], fields[3]))
    return found
