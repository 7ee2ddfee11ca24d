"""Two real hosts: the server and the clients in two network namespaces joined by a tbf-limited
veth pair (:mod:`repro_bench.instruments.hosts`), the real driver across them with ``torchrun --nnodes=2``
(:mod:`repro_bench.instruments.two_hosts`). Issue 18, part 3.

Every test here needs root and iproute2 and skips with the harness's reason where namespaces
cannot be made. Every test ends by checking that nothing is left: no namespace of its own, no
interface, no process it saw in either namespace. Traffic goes only to addresses inside the
namespaces the harness makes (10.213.0.0/30).
"""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro_bench.instruments.hosts import HostsUnavailable, Link, TwoHosts, measure_link, namespaces, netns_pids
from repro_bench.instruments.two_hosts import start
from tests.helpers.invariants import check_run_folder
from tests.helpers.paths import ROOT

RATE_MBIT = 50   # digits_cnn: 153 KB a message, ~25 ms on this link: the link, not the CPU, binds
RUN = ["num_epochs=3", "algo.lr=0.2", "algo.momentum=0", "progress=false", "backend.timeout_s=60"]


def up(link: Link = Link(rate_mbit=RATE_MBIT)) -> TwoHosts:
    hosts = TwoHosts(link)
    try:
        return hosts.__enter__()
    except HostsUnavailable as exc:
        pytest.skip(exc.reason)


def alive(pid: int) -> bool:
    """A live process (not a zombie) that is ours: a python, torchrun or sleep we started."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and any(w in cmd for w in (b"repro", b"torch", b"sleep", b"python"))


def assert_gone(hosts: TwoHosts, seen: set[int]) -> None:
    """No namespace, interface or process of these hosts left."""
    names = (hosts.server.netns, hosts.client.netns)
    assert not set(names) & set(namespaces()), f"namespaces left behind: {namespaces()}"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert hosts.server.ifname not in links and hosts.client.ifname not in links, links
    deadline = time.monotonic() + 5   # SIGKILLed: gone as soon as the kernel has reaped them
    while (left := {p for p in seen if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {sorted(left)}"


def seen_pids(hosts: TwoHosts) -> set[int]:
    return hosts.pids(hosts.server) | hosts.pids(hosts.client)


def test_a_two_client_run_across_two_hosts_completes(tmp_path):
    """torchrun --nnodes=2: node 0 (server namespace) hosts rank 0 and the run folder, node 1
    (client namespace) two clients; the run completes with sane tables, both clients pushed, and
    every message crossed the shaped link (tc counted at least a payload per push each way)."""
    hosts, seen = up(), set()
    try:
        run = start(hosts, RUN, num_clients=2, results_dir=tmp_path)
        while run.server.poll() is None and (run.summary() or {}).get("status", "running") == "running":
            seen |= seen_pids(hosts)
            time.sleep(0.1)
        summary = run.wait(timeout_s=180)
        sent = {"server": hosts.sent_bytes(hosts.server), "client": hosts.sent_bytes(hosts.client)}
    finally:
        hosts.close()
    assert summary["status"] == "completed", summary["message"] + run.log(0)[-2000:] + run.log(1)[-2000:]
    assert not run.agents_killed, "both torchrun agents should end by themselves"
    assert run.server.returncode == 0 and run.client.returncode == 0, run.log(0)[-2000:]
    check_run_folder(run.run_dir(), "completed")
    assert summary["num_clients"] == 2
    with open(run.run_dir() / "updates.csv") as f:
        assert {row["client"] for row in csv.DictReader(f)} == {"1", "2"}
    payload = 4 * 38282   # digits_cnn parameters, float32: one push (client -> server), one reply back
    assert min(sent.values()) >= summary["version"] * payload, sent
    assert_gone(hosts, seen)


def test_b_killing_the_client_host_ends_the_run_terminal_and_leaves_nothing(tmp_path):
    """Every process on the client host (its torchrun agent and both clients) SIGKILLed mid-run:
    rank 0 ends the run completed_degraded or failed with a terminal summary and consistent tables;
    then no process, namespace or veth is left. Unlike (a), GLOO_SOCKET_IFNAME is unset: each rank
    binds the interface towards the master itself (the host name resolves to loopback here, so
    without that the run never starts: 'Connect timeout')."""
    hosts, seen = up(), set()
    try:
        run = start(hosts, [*(o for o in RUN if not o.startswith("num_epochs=")), "num_epochs=500"], num_clients=2, results_dir=tmp_path, gloo_ifname=False)
        deadline = time.monotonic() + 150
        while run.applied() < 5:
            assert run.server.poll() is None and time.monotonic() < deadline, run.log(0)[-3000:]
            seen |= seen_pids(hosts)
            time.sleep(0.1)
        seen |= seen_pids(hosts)
        assert not hosts.kill(hosts.client), "a process on the client host survived SIGKILL"
        summary = run.wait(timeout_s=90, grace_s=3)
        seen |= seen_pids(hosts)
    finally:
        hosts.close()
    assert summary["status"] in ("completed_degraded", "failed"), summary
    check_run_folder(run.run_dir(), summary["status"])
    assert summary["lost_clients"], summary
    assert_gone(hosts, seen)


def test_c_the_harness_removes_everything_when_the_body_raises():
    """An exception inside the ``with``: processes on both hosts (one with a grandchild in a
    session of its own) are killed, both namespaces and the veth pair deleted."""
    hosts = up()
    hosts.close()   # only to learn whether namespaces can be made here
    seen: set[int] = set()
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="the body failed"):
        with TwoHosts(Link(rate_mbit=RATE_MBIT)) as hosts:
            if before is signal.SIG_DFL:   # trapped while the hosts are up, so the clean-up runs
                assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            hosts.popen(hosts.client, [sys.executable, "-c", "import time; time.sleep(600)"])
            hosts.popen(hosts.server, ["sh", "-c", "setsid sleep 600 & sleep 600"])
            deadline = time.monotonic() + 30
            while len(seen_pids(hosts)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            seen = seen_pids(hosts)
            assert len(seen) >= 3, seen
            raise RuntimeError("the body failed")
    assert_gone(hosts, seen)
    assert signal.getsignal(signal.SIGTERM) is before   # the caller's handler is back


def test_c_a_failure_half_way_through_the_set_up_leaves_nothing():
    """A netem delay: on a kernel without netem (sch_netem) the set-up fails after both
    namespaces and the veth exist; that is HostsUnavailable with tc's reason, and nothing is left.
    Where netem exists the delay is in place under the rate limit."""
    up().close()   # skip where namespaces cannot be made at all
    hosts = TwoHosts(Link(rate_mbit=RATE_MBIT, delay_ms=5))
    try:
        with hosts:
            shown = subprocess.run(["ip", "netns", "exec", hosts.server.netns, "tc", "qdisc", "show"],
                                   capture_output=True, text=True, check=True).stdout
            assert "netem" in shown and "delay 5ms" in shown and "tbf" in shown, shown
    except HostsUnavailable as exc:
        assert "netem" in exc.reason and str(exc).startswith("unavailable: "), exc
    assert_gone(hosts, set())


OWNER = """
import sys, time
from repro_bench.instruments.hosts import Link, TwoHosts
with TwoHosts(Link(rate_mbit=50)) as hosts:
    hosts.popen(hosts.client, ["sleep", "600"])
    print(hosts.server.netns, hosts.client.netns, hosts.server.ifname, hosts.client.ifname, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_c_a_signal_to_the_owner_leaves_nothing(sig):
    """SIGTERM or Ctrl-C (SIGINT) to the process that owns two hosts: its clean-up runs. SIGKILL:
    nothing can clean up, so the next owner sweeps the dead owner's namespaces at its start."""
    up().close()   # skip where namespaces cannot be made
    # SIGINT as a terminal delivers it: pytest started in the background of a non-interactive
    # shell (nohup, a CI script's &) passes it on ignored, and the owner would sleep through it
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)},
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        server_ns, client_ns, *ifnames = owner.stdout.readline().split()
        deadline = time.monotonic() + 30
        while not netns_pids(client_ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = netns_pids(server_ns) | netns_pids(client_ns)
        assert seen, "the owner's sleep never started"
        owner.send_signal(sig)
        owner.wait(30)
    finally:
        if owner.poll() is None:
            owner.kill()
    if sig == signal.SIGKILL:
        assert {server_ns, client_ns} <= set(namespaces())   # left behind: nothing could remove them
        up().close()   # the next owner's sweep
    else:
        assert owner.returncode != 0
    assert not {server_ns, client_ns} & set(namespaces()), namespaces()
    deadline = time.monotonic() + 5
    while any(alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in seen if alive(p)]


@pytest.mark.parametrize("missing", ["root", "ip", "tc"])
def test_where_namespaces_cannot_be_made_entering_says_why(monkeypatch, missing):
    """Not root, or no ip/tc: HostsUnavailable("unavailable: REASON") before anything is made
    (what the tests above turn into a skip)."""
    import repro_bench.instruments.hosts as hosts_module
    if missing == "root":
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    else:
        which = hosts_module.shutil.which
        monkeypatch.setattr(hosts_module.shutil, "which", lambda tool: None if tool == missing else which(tool))
    monkeypatch.setattr(hosts_module.sys, "platform", "linux")
    def mine():   # this process's: the suite's other workers make their own meanwhile
        return [name for name in namespaces() if name.startswith(f"{hosts_module.PREFIX}{os.getpid()}-")]
    before = mine()
    with pytest.raises(HostsUnavailable, match=f"^unavailable: .*{missing}") as caught:
        TwoHosts().__enter__()
    assert missing in caught.value.reason
    assert mine() == before


def test_the_interface_towards_an_address_is_found_without_sending_anything():
    """pin_gloo's lookup under torchrun: the route's interface (a UDP connect sends no packet)."""
    from repro.real.groups import interface_towards, ipv4_of
    if not sys.platform.startswith("linux"):
        pytest.skip("interface names are Linux's here")
    assert interface_towards("127.0.0.1") == "lo"
    assert ipv4_of("lo") == "127.0.0.1" and ipv4_of("no-such-if") is None   # the tests' helper's too
    assert interface_towards("::1") is None   # IPv4 only: gloo's choice stays as it was


def test_the_rate_limit_is_real(capsys):
    """A TCP transfer across the link runs near the configured rate: printed as a ratio (the
    benchmark's measurement); asserted only within a generous sanity bound (without tbf a veth
    moves several Gbit/s here, 50x the rate)."""
    link = Link(rate_mbit=20)
    hosts = up(link)
    try:
        measured = measure_link(hosts, num_bytes=2 * 2**20)
    finally:
        hosts.close()
    ratio = measured / link.rate_mbit
    with capsys.disabled():
        print(f"\n  two-host link: configured {link.rate_mbit:g} Mbit/s, measured {measured:.1f} Mbit/s, "
              f"ratio {ratio:.3f}")
    assert 0.3 < ratio < 1.5, measured
    assert not {hosts.server.netns, hosts.client.netns} & set(namespaces())


@pytest.mark.slow
def test_d_a_stop_reaches_the_ranks_on_both_hosts_and_the_run_records_interrupted(tmp_path):
    """Issue 32, item 2: the ranks live in sessions of their own, out of a terminal's Ctrl-C; a
    stop asked of :meth:`TwoHostRun.wait` reaches each rank as one SIGINT, so rank 0 ends the run
    ``interrupted`` with consistent tables, and then nothing is left."""
    from repro.runtime import StopRequest

    hosts, seen = up(), set()
    try:
        run = start(hosts, [*(o for o in RUN if not o.startswith("num_epochs=")), "num_epochs=500"], num_clients=2,
                    results_dir=tmp_path)
        deadline = time.monotonic() + 150
        while run.applied() < 5:
            assert run.server.poll() is None and time.monotonic() < deadline, run.log(0)[-3000:]
            seen |= seen_pids(hosts)
            time.sleep(0.1)
        stop = StopRequest()
        stop.set("SIGINT")
        summary = run.wait(timeout_s=90, stop=stop)
        seen |= seen_pids(hosts)
    finally:
        hosts.close()
    assert summary["status"] == "interrupted", summary.get("message", "") + run.log(0)[-2000:]
    assert len(run.interrupted) == 3, run.interrupted   # rank 0 and both clients, once each
    check_run_folder(run.run_dir(), "interrupted")
    assert_gone(hosts, seen)


@pytest.mark.slow
def test_e_a_killed_run_is_refused_by_name_and_resume_auto_continues_it(tmp_path):
    """Issue 32, item 4: after both hosts were killed mid-run the folder still says 'running'.
    Launched again without resume, rank 0 refuses it: wait() raises with rank 0's own error line
    instead of returning that stale summary; with resume=auto the run is continued to its end."""
    hosts, seen = up(), set()
    try:
        run = start(hosts, RUN, num_clients=2, results_dir=tmp_path)
        deadline = time.monotonic() + 150
        while run.applied() < 5:
            assert run.server.poll() is None and time.monotonic() < deadline, run.log(0)[-3000:]
            time.sleep(0.1)
        seen |= seen_pids(hosts)
        hosts.kill(hosts.server), hosts.kill(hosts.client)
        run.server.wait(30), run.client.wait(30)
        assert run.summary()["status"] == "running"
        with pytest.raises(RuntimeError, match=r"rank 0 did not run it, the folder still says 'running': "
                                               r"error: invalid value for 'resume'"):
            start(hosts, RUN, num_clients=2, results_dir=tmp_path).wait(timeout_s=120, grace_s=3)
        seen |= seen_pids(hosts)
        again = start(hosts, [*RUN, "resume=auto"], num_clients=2, results_dir=tmp_path)
        summary = again.wait(timeout_s=180)
        seen |= seen_pids(hosts)
    finally:
        hosts.close()
    assert summary["status"] == "completed", summary.get("message", "") + again.log(0)[-2000:]
    check_run_folder(again.run_dir(), "completed")
    assert_gone(hosts, seen)
