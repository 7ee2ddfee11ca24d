"""Joins that cannot go on (issue 32): each ends with one line that says what happened and an
exit code, never a hang, a C++ stack or a Python traceback.

* Nothing listens at ``backend.join`` (the run has ended): refused at once (exit 2), whatever
  ``backend.timeout_s`` is.
* A listener that accepts and never speaks (not a run): refused within ``backend.timeout_s``
  (exit 2); a Ctrl-C meanwhile ends the joiner at once (exit 130).
* A joiner the server dropped (the pair group closed under it) reads the loss as the link's end,
  not as gloo's raw error; under a real run (``slow``): a joiner suspended past the server's
  ``backend.client_timeout_s`` then continued, and one given Ctrl-C, each end in one line that
  says how to rejoin (``backend.join_client``), and the run trains on. A send gloo never tells
  of the close (queued on the socket when it closed) still reports the close, not silence; a
  client continued past the server's timeout hears of the close before it sends.

Every joiner is the command line a user types, in a session of its own; every wait is bounded
and each test removes what it started. Loopback only.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.helpers.channels import ScriptedChannel
from tests.helpers.joins import wait_log
from tests.helpers.paths import ROOT
from tests.helpers.processes import assert_no_leftovers, free_port
from tests.helpers.runs import wait_rows
from tests.helpers.tables import table_frames

# the run's overrides, the same for its joiners (a join must share what is trained)
RUN = ["backend=real", "data=synthetic", "model=mlp", "num_clients=1", "progress=false",
       "backend.client_device=cpu"]


def start_join(tmp_path, address: str, *extra: str, name: str = "joiner") -> subprocess.Popen:
    """``python -m repro.run <RUN> backend.join=ADDRESS``, its output in ``tmp_path/NAME.log``."""
    return subprocess.Popen([sys.executable, "-m", "repro.run", *RUN, f"backend.join={address}", *extra],
                            cwd=ROOT, stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def ended(proc: subprocess.Popen, timeout_s: float) -> int:
    """Its exit code; a process still alive after ``timeout_s`` is killed and the test fails."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout_s:g} s")
    finally:
        assert_no_leftovers(proc)


def lines(tmp_path, name: str = "joiner") -> list[str]:
    text = (tmp_path / f"{name}.log").read_text()
    for raw in ("Traceback", "frame #", "terminate called", "KeyboardInterrupt"):
        assert raw not in text, text
    return [line for line in text.splitlines() if line.strip()]


@contextlib.contextmanager
def silent_listener():
    """A loopback port whose connections the kernel accepts (into the backlog) and nobody
    ever answers: what a joiner meets at a wrong address taken by another program."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock


def test_a_join_where_nothing_listens_is_refused_at_once(tmp_path):
    """The run has ended (nothing listens at its address): refused with one line, exit 2, and
    not after backend.timeout_s (600 s here: the wait below would expire first)."""
    joiner = start_join(tmp_path, f"127.0.0.1:{free_port()}", "backend.timeout_s=600")
    assert ended(joiner, 120) == 2
    [line] = lines(tmp_path)
    assert "refused: no run is listening at backend.join=127.0.0.1:" in line


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
@pytest.mark.parametrize("torchrun", [False, True], ids=["joiner", "torchrun_worker"])
def test_an_override_hydra_cannot_read_is_one_line_for_a_joiner_and_a_torchrun_worker(tmp_path, torchrun):
    """An IPv6 address in brackets (Hydra's grammar reads ``[`` as a list) on a joiner's command
    line, or any unreadable override on a torchrun rank > 0: exit 2 with Hydra's message and the
    quoting hint, as a run's own command line says it, not a traceback."""
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())) \
        if torchrun else None
    arg = "exp_name=a(b" if torchrun else "backend.join=[::1]:5555"
    proc = subprocess.run([sys.executable, "-m", "repro.run", *RUN, arg], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "quote a value" in proc.stderr, proc.stderr


def test_a_join_to_a_silent_listener_is_refused_within_the_timeout(tmp_path):
    with silent_listener() as sock:
        port = sock.getsockname()[1]
        # 1 s: the listener stays silent however long the joiner waits, so a longer timeout
        # only makes the refusal later
        joiner = start_join(tmp_path, f"127.0.0.1:{port}", "backend.timeout_s=1")
        assert ended(joiner, 120) == 2
    [line] = lines(tmp_path)
    assert f"backend.join=127.0.0.1:{port}" in line and "backend.timeout_s=1" in line, line


def test_a_join_to_a_listener_that_answers_as_no_run_does_is_one_line(tmp_path):
    """A wrong port taken by a web server, which answers the store's ping with 'HTTP/1.1 400':
    TCPStore retried until backend.timeout_s and printed a C++ stack per try (43 lines in 2 s)
    before the refusal."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)

        def answer() -> None:
            with contextlib.suppress(OSError):   # until the socket closes
                while True:
                    conn, _ = sock.accept()
                    with conn:
                        conn.recv(64)
                        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=answer, daemon=True).start()
        port = sock.getsockname()[1]
        joiner = start_join(tmp_path, f"127.0.0.1:{port}", "backend.timeout_s=1")
        assert ended(joiner, 120) == 2
        sock.shutdown(socket.SHUT_RDWR)
    [line] = lines(tmp_path)
    assert f"nothing at backend.join=127.0.0.1:{port} answered as a run" in line, line


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_join_to_a_store_that_is_not_a_runs_is_refused_at_once(tmp_path):
    """A TCPStore that answers but is no run's (a torchrun run's, which serves no joins): refused
    with one line, exit 2, not after backend.timeout_s (600 s: the wait below expires first); it
    took a ticket there, waited backend.timeout_s for an answer and exited 1 'did not answer'."""
    store = new_store()
    joiner = start_join(tmp_path, f"127.0.0.1:{store.port}", "backend.timeout_s=600")
    assert ended(joiner, 120) == 2
    [line] = lines(tmp_path)
    assert f"backend.join=127.0.0.1:{store.port} is a store but not a run's" in line, line
    assert store.num_keys() == 0   # no ticket taken, no request written into a foreign store


def test_ctrl_c_ends_a_joiner_waiting_on_a_silent_listener(tmp_path):
    with silent_listener() as sock:
        sock.settimeout(120)
        joiner = start_join(tmp_path, f"127.0.0.1:{sock.getsockname()[1]}", "backend.timeout_s=600")
        try:
            conn, _ = sock.accept()   # the joiner is connecting: it waits for an answer now
        except TimeoutError:
            joiner.kill()
            raise
        with conn:
            joiner.send_signal(signal.SIGINT)
            assert ended(joiner, 60) == 130
    [line] = lines(tmp_path)
    assert "SIGINT" in line and "before joining" in line, line


# the server's end (rank 0) of pair group "p" of the test's store, as a process of its own
PEER = """
import os, sys, time
from repro.real.frames import Frame, LinkLost
from repro.real.transport import Channel
from repro.real.groups import pair_group
import torch.distributed as dist, datetime
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timeout=datetime.timedelta(seconds=60))
channel = Channel(pair_group(store, "p", 0, 60), 1, 60, peer_in_group=1)
"""
DROPPER = PEER + """
try:
    Channel(channel.group, 1, 0.2, peer_in_group=1).recv(Frame(4))   # the client is silent: dropped
except LinkLost as exc:
    print("dropped:", exc, flush=True)
time.sleep(120)   # the server goes on (and is killed by the test)
"""
# a receive for argv[2] values that gloo's thread fills as bytes come, until the process stops
QUEUER = PEER + """
channel.post(Frame(int(sys.argv[2])))
print("posted", flush=True)
time.sleep(120)
"""


def start_peer(tmp_path, script: str, store, *args: str) -> subprocess.Popen:
    """``script`` (:data:`PEER` and what it does then) on ``store``, its output in server.log."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return subprocess.Popen([sys.executable, "-c", script, str(store.port), *args], cwd=ROOT,
                            stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def new_store():
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def test_a_send_on_a_link_the_server_dropped_is_a_lost_link(tmp_path):
    """The server drops a silent client by letting its receive time out, which closes their pair
    group's connection; the client's next send then fails at once inside gloo's send call, not
    its wait. That is the link's end, LinkLost, which a client reports in one line; not gloo's
    RuntimeError, which escaped as a traceback (and in the server ended the whole run)."""
    from repro.real.frames import Frame, Header, Kind, LinkLost
    from repro.real.transport import Channel
    from repro.real.groups import pair_group

    store = new_store()
    server = start_peer(tmp_path, DROPPER, store)
    try:
        client = Channel(pair_group(store, "p", 1, 60), 0, 60, peer_in_group=0)
        wait_log(server, tmp_path / "server.log", "dropped: rank 1: waiting for a message: silent")
        with pytest.raises(LinkLost, match="sending HEARTBEAT: connection closed by the peer"):
            client.send(Header(Kind.HEARTBEAT, 1, 0, 0), Frame(4))
    finally:
        server.kill()
        server.wait()
        assert_no_leftovers(server)


def test_a_send_queued_when_its_link_closes_reports_the_close(tmp_path):
    """gloo tells a send whose bytes wait on the socket nothing when the connection closes: the
    send waits out its timeout and gloo says 'Timed out'. A client continued after the server
    dropped it met this when its first send beat gloo's thread to the close, and said the server
    was 'silent for more than 60 s'. The receive posted on the link was told the close, and the
    channel reports that: the link closed. Here the bytes wait because the peer is stopped (it
    reads nothing more), then the peer's end closes."""
    from repro.real.frames import Frame, Header, Kind, LinkLost
    from repro.real.transport import Channel
    from repro.real.groups import pair_group

    n = 16_000_000   # 64 MB: more than the two sockets' buffers hold
    store = new_store()
    server = start_peer(tmp_path, QUEUER, store, str(n))
    try:
        # a 3 s timeout: the send below waits it out; the close comes 1 s in (the Timer), so
        # 2 s are left for gloo's thread to read it
        client = Channel(pair_group(store, "p", 1, 60), 0, 3, watched=True, peer_in_group=0)
        client.post(Frame(4))   # as a client's, the receive of its next message is posted
        wait_log(server, tmp_path / "server.log", "posted")
        server.send_signal(signal.SIGSTOP)
        threading.Timer(1.0, server.kill).start()   # while the send below waits on the socket
        with pytest.raises(LinkLost, match="sending PARAMS: connection closed by the peer"):
            client.send(Header(Kind.PARAMS, 1, 0, n), Frame(n))
    finally:
        server.kill()
        server.wait()
        assert_no_leftovers(server)


class ClosingLink(ScriptedChannel):
    """A client's watched channel whose close gloo's thread has not read yet: it reports the
    close only to a caller that waits for it, and hands out the ``script``'s messages before
    its receive fails; records what is sent."""

    def __init__(self, script=()):
        super().__init__(list(script), arrive_after=0)

    def recv(self, frame):
        from repro.real.frames import LinkLost

        if not self.script:
            raise LinkLost("rank 0: waiting for a message: connection closed by the peer")
        return super().recv(frame)

    def arrived(self, wait_s: float = 0.0) -> bool:
        return wait_s > 0


def test_a_client_silent_past_the_server_timeout_hears_the_close_before_it_sends():
    """Suspended past the server's client_timeout_s, then continued, a client lets its link tell
    it of the close before its overdue heartbeat (a send made first would wait out
    backend.timeout_s: above); a client only a quarter of that timeout silent sends at once."""
    from repro.real.client import Heartbeat, ServerSpoke
    from repro.real.frames import Frame, Kind

    continued, busy = ClosingLink(), ClosingLink()
    beat = Heartbeat(continued, Frame(4), 2, timeout_s=5)
    beat.last -= 6
    with pytest.raises(ServerSpoke):
        beat()
    assert continued.sent == []
    beat = Heartbeat(busy, Frame(4), 2, timeout_s=5)
    beat.last -= 2
    beat()
    assert busy.sent == [Kind.HEARTBEAT]


def test_a_client_suspended_after_its_last_step_hears_the_close_before_it_pushes(monkeypatch):
    """The same between a push's last local step and its send: a client suspended there past
    the server's timeout, then continued, drops the push it computed and reads the closed link,
    rather than sending into it."""
    import time

    import torch

    from repro.asgd.algorithm import Client
    from repro.config.settings import BackendConfig, DataConfig, ModelConfig, RunConfig
    from repro.real.client import build_client, run_client
    from repro.real.frames import Header, Kind, hello

    cfg = RunConfig(num_clients=1, nsync=1, progress=False, data=DataConfig(name="synthetic"),
                    model=ModelConfig(name="mlp"), backend=BackendConfig(name="real", client_timeout_s=0.2))
    setup = build_client(cfg, 1, torch.device("cpu"))
    compute = Client.compute_push

    def suspended_after(self, *args, **kwargs):
        push = compute(self, *args, **kwargs)
        time.sleep(0.3)   # past client_timeout_s: the server has dropped it meanwhile
        return push

    monkeypatch.setattr(Client, "compute_push", suspended_after)
    numel = setup.inbox.capacity
    link = ClosingLink([hello(setup.inbox, cfg), Header(Kind.PARAMS, 1, 0, numel)])
    assert run_client(cfg, 1, link, setup) == 1
    assert link.sent == [Kind.HELLO]


@pytest.mark.slow
def test_a_joiner_dropped_or_interrupted_ends_in_one_line_and_the_run_goes_on(tmp_path):
    """Joiner 2 is suspended (SIGSTOP) until the server drops it (backend.client_timeout_s),
    then continued: it ends with exit 1 and one line saying the server closed its link and how
    to rejoin. Joiner 3 gets a Ctrl-C: it leaves at once, exit 130, one line, no abort. The run
    counts both lost and trains on."""
    port = free_port()
    run = [*RUN, "num_epochs=100000", "eval_every=50000", "backend.timeout_s=60",
           "backend.client_timeout_s=5", "backend.max_clients=3"]
    server = subprocess.Popen([sys.executable, "-m", "repro.run", *run, f"backend.master_port={port}",
                               f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                              stdout=open(tmp_path / "run.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    joiners = []
    try:
        wait_log(server, tmp_path / "run.log", "accepting joins at", timeout_s=120)
        for k in (2, 3):
            joiners.append(start_join(tmp_path, f"127.0.0.1:{port}", *run[len(RUN):], name=f"joiner{k}"))
            wait_log(server, tmp_path / "run.log", f"client {k} joined", timeout_s=120)
        joiners[0].send_signal(signal.SIGSTOP)
        wait_log(server, tmp_path / "run.log", "client 2 lost", timeout_s=120)
        joiners[0].send_signal(signal.SIGCONT)
        joiners[1].send_signal(signal.SIGINT)
        assert ended(joiners[1], 60) == 130, (tmp_path / "joiner3.log").read_text()
        assert ended(joiners[0], 120) == 1, (tmp_path / "joiner2.log").read_text()
        wait_log(server, tmp_path / "run.log", "client 3 lost", timeout_s=60)
        wait_rows(server, tmp_path / "run", sum(1 for _ in open(tmp_path / "run" / "updates.csv")) + 20)
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    finally:
        for proc in [*joiners, server]:   # what a failed check left running, so its error shows
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert_no_leftovers(server)
    dropped, left = lines(tmp_path, "joiner2")[-1], lines(tmp_path, "joiner3")[-1]
    assert "closed" in dropped and "backend.join_client=2" in dropped, dropped
    assert "SIGINT" in left and "backend.join_client=3" in left, left
    for name in ("joiner2", "joiner3"):   # joined, then why it ended
        assert len(lines(tmp_path, name)) == 2, lines(tmp_path, name)
    summary = table_frames(tmp_path / "run")[2]
    assert summary["status"] == "interrupted", summary["message"]
    events = [(e["type"], e["client"]) for e in summary["events"] if e["type"].startswith("client_")]
    assert events == [("client_joined", 2), ("client_joined", 3), ("client_lost", 2), ("client_lost", 3)], events


def test_a_rendezvous_error_with_no_message_still_ends_in_one_line(monkeypatch, capsys):
    """A client whose rendezvous fails with an error that says nothing (gloo's, or a store's)
    names the error's type in its one line; its first line was an IndexError before."""
    from repro.real import processes
    from tests.helpers.runs import real_cfg

    def fails(*args, **kwargs):
        raise RuntimeError()

    monkeypatch.setattr(processes, "connect", fails)
    assert processes.serve_as_client(real_cfg(), 1, 1, 2, setup=None, store=None) == 1
    assert capsys.readouterr().err.strip() == ("[real client 1] could not join the run within "
                                               "backend.timeout_s=30 s: RuntimeError")
