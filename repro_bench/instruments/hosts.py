"""Two hosts on one machine: two Linux network namespaces joined by a rate-limited veth pair.

This module owns the namespaces, the link between them and every process started in them, and
their removal. A "host" is a network namespace with its own loopback and one end of a veth
pair; the server host is ``10.213.0.1``, the client host ``10.213.0.2`` (a private /30 that exists
only inside these namespaces, so nothing here can reach any other address). The link is shaped
on both ends with ``tc qdisc ... tbf`` (token bucket: ``rate``, ``burst``, ``latency``), optionally
under a ``netem`` delay: each end's egress, so the server's link is limited both ways, full
duplex, as the simulator's cost model has it (DESIGN.md, "The clock"). The client host talks to
no one but the server, so its egress is the server's ingress.

Life cycle. :class:`TwoHosts` is a context manager. On entry it first sweeps leftovers of dead
owners (names carry the owner's pid: ``repro-hosts-<pid>-<n>-server``), so a caller killed by
SIGKILL, which nothing can clean up after, costs nothing the next time. On exit, also after an
exception, a Ctrl-C or a SIGTERM (turned into :class:`Terminated` while the context is open), it
SIGKILLs every process in both namespaces (``ip netns pids``: also the grandchildren that
torchrun starts in sessions of their own) and deletes them; the veth pair goes with them. The
clean-up itself is not interrupted by a second signal: it is deferred and re-raised after.

Where namespaces cannot be made (not root, no ``ip``/``tc``, a sandbox refusing ``ip netns add``,
a kernel without ``tbf`` or ``netem``) entering raises :class:`HostsUnavailable`, after removing
whatever part was made.

The real driver across the two hosts (``torchrun --nnodes=2``) is :mod:`repro_bench.instruments.two_hosts`;
``python -m repro_bench.instruments.hosts`` measures the link's throughput against its configured rate.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from repro.gridpoint import process_alive
from repro_bench import positive

PREFIX = "repro-hosts-"
SERVER_ADDR, CLIENT_ADDR, PREFIX_LEN = "10.213.0.1", "10.213.0.2", 30
_serial = itertools.count()


class HostsUnavailable(RuntimeError):
    """Namespaces, veth or tc cannot be used here; ``reason`` says why (for ``pytest.skip``)."""

    def __init__(self, reason: str):
        super().__init__(f"unavailable: {reason}")
        self.reason = reason


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) reached the process while two hosts were up: unwinds like Ctrl-C, so
    the ``with`` block's clean-up runs (Python's default for SIGTERM is to die on the spot)."""


@dataclass(frozen=True)
class Link:
    """The shaping of each end of the veth pair."""
    rate_mbit: float = 100.0
    """tbf rate, megabits per second, each way."""
    burst_kb: float = 32.0
    """tbf bucket, kilobytes: bytes that may leave at line speed after a pause."""
    latency_ms: float = 50.0
    """tbf queue: the longest a packet may wait for tokens before it is dropped."""
    delay_ms: float = 0.0
    """netem one-way delay, milliseconds (0: no netem, which some kernels lack)."""


@dataclass(frozen=True)
class Host:
    netns: str     # the network namespace's name (``ip netns``)
    ifname: str    # its end of the veth pair: GLOO_SOCKET_IFNAME for processes in it
    addr: str      # that end's address


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HostsUnavailable(f"'ip {' '.join(args)}' failed: {done.stderr.strip() or done.returncode}")
    return done


def namespaces() -> list[str]:
    """Names of this module's namespaces on the machine, any owner's."""
    if shutil.which("ip") is None:
        return []
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def cmdline(pid: int) -> bytes:
    """Process ``pid``'s command line as /proc holds it (empty once it has exited)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def netns_pids(netns: str) -> set[int]:
    """Every live process in ``netns`` (zombies have left their namespaces and are not listed)."""
    out = _ip("netns", "pids", netns, check=False).stdout
    return {int(p) for p in out.split() if p.isdigit()}


def kill_netns(netns: str, deadline_s: float = 10.0) -> set[int]:
    """SIGKILL every process in ``netns`` until none is left (a parent may fork while its
    siblings die, so once is not enough); the pids that would not die by the deadline."""
    deadline = time.monotonic() + deadline_s
    while (pids := netns_pids(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    return pids


def _owner_alive(netns: str) -> bool:
    pid = netns[len(PREFIX):].split("-")[0]
    return pid.isdigit() and process_alive(int(pid), None)


def sweep() -> list[str]:
    """Remove the namespaces (and their processes) of owners that died without cleaning up;
    a live owner's are left alone (another test session may be using them). The names removed."""
    gone = [ns for ns in namespaces() if not _owner_alive(ns)]
    for ns in gone:
        kill_netns(ns)
        _ip("netns", "del", ns, check=False)
    return gone


def _check_tools() -> None:
    if not sys.platform.startswith("linux"):
        raise HostsUnavailable(f"network namespaces need Linux, not {sys.platform}")
    if os.geteuid() != 0:
        raise HostsUnavailable("network namespaces need root (ip netns add)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise HostsUnavailable(f"no '{tool}' command (iproute2)")


class TwoHosts:
    """A server host and a client host joined by a shaped veth pair; see the module docstring.

    ``with TwoHosts(Link(rate_mbit=50)) as hosts: hosts.popen(hosts.server, [...])``.
    """

    def __init__(self, link: Link = Link()):
        self.link = link
        n = next(_serial)
        tag = f"{PREFIX}{os.getpid()}-{n}"
        short = f"{os.getpid() % 10**7}x{n % 1000}"   # interface names: 15 chars at most
        self.server = Host(f"{tag}-server", f"rh{short}s", SERVER_ADDR)
        self.client = Host(f"{tag}-client", f"rh{short}c", CLIENT_ADDR)
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []
        self._handlers: dict = {}

    # -- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> "TwoHosts":
        _check_tools()
        sweep()
        atexit.register(self.close)   # an interpreter exit that skips __exit__ still cleans up
        self._trap_signals()
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _make(self) -> None:
        s, c = self.server, self.client
        for host in (s, c):
            self._made.append(host.netns)   # first: a signal between the two must not orphan it
            _ip("netns", "add", host.netns)
        # both ends created straight inside their namespaces: never a name in the caller's
        _ip("link", "add", s.ifname, "netns", s.netns, "type", "veth", "peer", "name", c.ifname, "netns", c.netns)
        for host in (s, c):
            _ip("-n", host.netns, "addr", "add", f"{host.addr}/{PREFIX_LEN}", "dev", host.ifname)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            _ip("-n", host.netns, "link", "set", host.ifname, "up")
            self._shape(host)

    def _shape(self, host: Host) -> None:
        link = self.link
        tbf = ["tbf", "rate", f"{int(link.rate_mbit * 1e6)}bit", "burst", str(int(link.burst_kb * 1024)),
               "latency", f"{link.latency_ms:g}ms"]
        parent, qdisc = ["root"], ["netns", "exec", host.netns, "tc", "qdisc", "add", "dev", host.ifname]
        if link.delay_ms > 0:
            _ip(*qdisc, "root", "handle", "1:", "netem", "delay", f"{link.delay_ms:g}ms")
            parent = ["parent", "1:1"]
        _ip(*qdisc, *parent, "handle", "10:", *tbf)

    def close(self) -> None:
        """Kill every process in both namespaces and delete them; safe to call twice, and not
        interrupted by a Ctrl-C or SIGTERM (deferred until it is done, then delivered)."""
        with self._signals_deferred():
            for proc in self.procs:
                if proc.poll() is None:   # not reaped yet, so its group id cannot be anyone else's
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)   # each runs in a session of its own
            for ns in self._made:
                kill_netns(ns)
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
            for ns in self._made:
                _ip("netns", "del", ns, check=False)
            self._made, self.procs = [], []
            atexit.unregister(self.close)

    # -- signals ------------------------------------------------------------------------------

    def _trap_signals(self) -> None:
        """SIGTERM/SIGHUP unwind through ``__exit__`` (only where Python left the default)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def unwind(signum, frame):
            raise Terminated(f"signal {signum}")

        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._handlers[sig] = signal.signal(sig, unwind)

    @contextlib.contextmanager
    def _signals_deferred(self):
        """Signals that arrive meanwhile are held, then the caller's own handlers come back (our
        traps end with the hosts) and the first held signal is delivered to them."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        pending: list[int] = []
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        before = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in sigs}
        try:
            yield
        finally:
            before.update(self._handlers)
            self._handlers = {}
            for sig, handler in before.items():
                signal.signal(sig, handler)
            for signum in pending[:1]:
                os.kill(os.getpid(), signum)

    # -- processes ----------------------------------------------------------------------------

    def popen(self, host: Host, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``host``'s namespace, in a session of its own (a terminal's Ctrl-C
        is the caller's to handle); killed and reaped by :meth:`close`."""
        if host.netns not in self._made:
            raise RuntimeError(f"{host.netns} is not up (use TwoHosts as a context manager)")
        proc = subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self, host: Host) -> set[int]:
        return netns_pids(host.netns)

    def sent_bytes(self, host: Host) -> int:
        """Bytes ``host`` has sent through its shaped end of the link (tc's counters)."""
        done = subprocess.run(["ip", "netns", "exec", host.netns, "tc", "-s", "qdisc", "show", "dev", host.ifname],
                              capture_output=True, text=True, timeout=30, check=True)
        words = next(line.split() for line in done.stdout.splitlines() if line.strip().startswith("Sent"))
        return int(words[1])   # the root qdisc's line comes first: all the host sent

    def kill(self, host: Host) -> set[int]:
        """SIGKILL every process on ``host`` (a host's crash); the pids that survived, if any."""
        return kill_netns(host.netns)


# ---------------------------------------------------------------------------------------------
# The link's throughput (a benchmark: prints a ratio, asserted by no test beyond a sanity bound)
# ---------------------------------------------------------------------------------------------

_SINK = """
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1); print("ready", flush=True)
conn, _ = srv.accept(); total, first, buf = 0, None, bytearray(1 << 16)
while (n := conn.recv_into(buf)):
    first = first or time.perf_counter(); total += n
print(total, time.perf_counter() - first, flush=True)
"""
_SOURCE = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
s.sendall(bytes(int(sys.argv[3]))); s.shutdown(socket.SHUT_WR); s.recv(1); s.close()
"""


def measure_link(hosts: TwoHosts, num_bytes: int = 4 * 2**20, port: int = 5201) -> float:
    """Megabits per second of one TCP transfer of ``num_bytes`` from the server host to the
    client host (the direction a fetch of parameters takes), timed by the receiver from its
    first byte: the bucket's initial burst is included, TCP's and IP's headers are not."""
    sink = hosts.popen(hosts.client, [sys.executable, "-c", _SINK, CLIENT_ADDR, str(port)],
                       stdout=subprocess.PIPE, text=True)
    if sink.stdout.readline().strip() != "ready":
        raise RuntimeError("the receiving end of the link measurement did not start")
    source = hosts.popen(hosts.server, [sys.executable, "-c", _SOURCE, CLIENT_ADDR, str(port), str(num_bytes)])
    out, _ = sink.communicate(timeout=120)
    source.wait(30)
    total, seconds = out.split()
    if int(total) != num_bytes:
        raise RuntimeError(f"the link measurement received {total} of {num_bytes} bytes")
    return 8 * int(total) / float(seconds) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro_bench.instruments.hosts", description=(
        "Two network namespaces joined by a tbf-limited veth pair (needs root): measure a TCP "
        "transfer's throughput across the link and print it against the configured rate."))
    parser.add_argument("--rate-mbit", type=positive(float), default=50.0, help="tbf rate (default: %(default)s)")
    parser.add_argument("--burst-kb", type=positive(float), default=32.0, help="tbf burst (default: %(default)s)")
    parser.add_argument("--megabytes", type=positive(float), default=8.0, help="bytes sent (default: %(default)s)")
    args = parser.parse_args(argv)
    link = Link(rate_mbit=args.rate_mbit, burst_kb=args.burst_kb)
    try:
        with TwoHosts(link) as hosts:
            measured = measure_link(hosts, int(args.megabytes * 2**20))
    except HostsUnavailable as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"link {link.rate_mbit:g} Mbit/s (tbf, burst {link.burst_kb:g} KB): measured {measured:.1f} Mbit/s "
          f"of TCP payload, ratio {measured / link.rate_mbit:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
