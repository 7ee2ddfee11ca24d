"""Guarantee 5, signals: every ending is terminal. SIGINT, SIGTERM, SIGHUP (and a second SIGINT)
end a real or simulator run ``interrupted``, also during a torchrun rendezvous, leaving no
process. (The full disk, the other ending of guarantee 5: tests/test_faults_disk.py.)

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from repro.config.settings import BackendConfig, to_dict
from tests.helpers.invariants import check_run_folder
from tests.helpers.paths import ROOT
from tests.helpers.processes import assert_no_leftovers, free_port
from tests.helpers.runs import LAUNCHER, launch_real, real_cfg, start_sim_cli, stop_process, wait_rows


REAL_SIGNALS = [
    pytest.param([signal.SIGHUP], id="SIGHUP", marks=pytest.mark.slow),
    pytest.param([signal.SIGTERM], id="SIGTERM", marks=pytest.mark.slow),
    pytest.param([signal.SIGINT], id="SIGINT", marks=pytest.mark.slow),
    pytest.param([signal.SIGINT, signal.SIGINT], id="SIGINTx2", marks=pytest.mark.slow),
]

def ends_after(proc: subprocess.Popen, sig: int, within_s: float) -> bool:
    """Send ``sig`` to ``proc``; whether it has ended ``within_s`` later."""
    proc.send_signal(sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=within_s)
    return proc.poll() is not None


@pytest.mark.parametrize("signals", REAL_SIGNALS)
def test_5_signals_end_a_real_run_interrupted(tmp_path, signals):
    """Fault: SIGHUP, SIGTERM, SIGINT, or SIGINT twice in quick succession (a forced stop) to a
    real run's launcher while it trains. Guarantee 5: it ends within a minute, status
    interrupted at the version the table holds, a resume hint in the message, no process left."""
    proc, run_dir = launch_real(tmp_path, real_cfg(num_epochs=500.0, checkpoint_every=5))
    try:
        wait_rows(proc, run_dir, 10)
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.05)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    summary = check_run_folder(run_dir, "interrupted")
    assert "resume=true" in summary["message"], summary["message"]


_CTRL_C_TO_THE_FORK_SERVER = """
import os, signal
import multiprocessing.forkserver as forkserver
from repro.runtime import fork_server_context

ctx = fork_server_context(start=True)
os.kill(forkserver._forkserver._forkserver_pid, signal.SIGINT)   # a Ctrl-C, while it imports torch
proc = ctx.Process(target=os.getpid)
proc.start()
proc.join(60)
print(proc.exitcode)
"""


@pytest.mark.timeout(120)
def test_5_a_ctrl_c_while_the_clients_fork_server_imports_torch_does_not_kill_it():
    """Fault: Ctrl-C in the terminal during a real run's first seconds: it reaches the whole
    process group, the clients' fork server too, which ignores SIGINT only once it has imported
    torch: it died with a KeyboardInterrupt traceback, the launcher's start of a client with
    EOFError, and the run ended ``failed`` with that traceback. Guarantee 5: it survives (the
    launcher alone decides: interrupted), and forks its clients."""
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_TO_THE_FORK_SERVER], cwd=ROOT, capture_output=True,
                          text=True, timeout=100)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "0\n", "")


def test_5_a_fork_server_killed_during_start_up_ends_the_real_run_in_one_line(tmp_path, monkeypatch):
    """Fault: the clients' fork server killed while the launcher starts a client (a SIGTERM to the
    process group while it imports torch; the out-of-memory killer). The EOFError of the start
    escaped as a traceback, the run ``failed`` naming only "EOFError: unexpected EOF". Guarantee
    5: a start-up error naming the fork server; ``interrupted`` when a stop was asked for."""
    from repro.real import processes
    from repro.real.launch import run_real
    from repro.runtime import StopRequest, request_stop

    class DeadForkServer:
        def Process(self, *args, **kwargs):
            class Unstartable:
                def start(self):
                    raise EOFError("unexpected EOF")   # what reading a dead fork server's answer gives
            return Unstartable()

    monkeypatch.setattr(processes, "client_context", lambda start=False: DeadForkServer())
    summary = run_real(real_cfg(), tmp_path / "killed")
    assert summary["status"] == "failed"
    assert summary["message"].startswith("the clients' fork server ended before client 1 started (EOFError")
    check_run_folder(tmp_path / "killed", "failed")
    with StopRequest():
        request_stop("SIGTERM")
        assert run_real(real_cfg(), tmp_path / "stopped")["status"] == "interrupted"
    check_run_folder(tmp_path / "stopped", "interrupted")


@pytest.mark.timeout(120)
def test_5_a_real_run_stopped_during_start_up_says_how_to_go_on(tmp_path):
    """Fault: a real run stopped while its clients start ends ``interrupted`` (exit 130) with
    no checkpoint, so resume=true, the way on that exit 130 promises, is refused; its message
    and its log line said only "interrupted while the clients were starting". Guarantee 5: they
    end with the way on (force=true starts it over), and that way works."""
    from repro.real.launch import run_real
    from repro.runtime import StopRequest, request_stop

    with StopRequest():
        request_stop("SIGINT")
        summary = run_real(real_cfg(), tmp_path / "run")
    assert summary["status"] == "interrupted"
    assert summary["message"] == ("interrupted while the clients were starting; no checkpoint was "
                                  "written: force=true starts over"), summary["message"]
    assert run_real(real_cfg(num_epochs=1.0, force=True), tmp_path / "run")["status"] == "completed"
    check_run_folder(tmp_path / "run", "completed")


@pytest.mark.slow   # found by this suite: the rendezvous blocked the stop request for 60 s
def test_5_sigterm_during_a_torchrun_rendezvous_ends_within_seconds(tmp_path):
    """Fault: SIGTERM (what torchrun sends on a restart or a shutdown) to rank 0 of a torchrun
    world while it waits for a peer that never comes (backend.timeout_s=60). Guarantee 5: it
    ends interrupted within seconds (torchrun's grace before SIGKILL is 30 s), with a terminal
    summary; no process left."""
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    cfg = real_cfg(num_clients=1, backend=BackendConfig(name="real", client_device="cpu", timeout_s=60.0))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_dir), json.dumps(to_dict(cfg))], cwd=ROOT,
                            env={**os.environ, **env}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "summary.json").exists():   # the run core is built: now connecting
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1)
        ended = ends_after(proc, signal.SIGTERM, 20)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)   # what torchrun does after its grace period
            proc.wait()
        assert_no_leftovers(proc)
    assert ended, "rank 0 still waited for its peers 20 s after SIGTERM"
    check_run_folder(run_dir, "interrupted")


SILENT_CLIENT = """
import json, sys, torch
from repro.config.checks import from_dict
from repro.real.client import _hello, build_client
from repro.real.groups import connect
from repro.real.transport import Channel
cfg = from_dict(json.loads(sys.argv[1]))
setup = build_client(cfg, 1, torch.device("cpu"))
channel = Channel(connect(1, 2, 60.0)[1], 0, 60.0)
if sys.argv[2] == "greeting":   # it takes the server's HELLO and never sends its own
    channel.recv(setup.inbox)
elif sys.argv[2] != "connecting":   # (that one never takes the server's HELLO)
    _hello(channel, setup, cfg)
    header = channel.recv(setup.inbox)   # its first parameters; from here on it posts no receive
if sys.argv[2] == "pushes":   # one push: the server's reply to it waits for a receive never posted
    setup.client.fetch(setup.inbox.payload, header.version)
    channel.send_push(setup.client.compute_push(setup.net, cfg.nsync, out=setup.outbox.payload), setup.outbox)
print("silent", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow   # found by this suite: torchrun's Ctrl-C left the run folder running
@pytest.mark.parametrize("silent_after", ["connecting", "greeting", "fetching", "pushes"])
def test_5_a_stop_waits_for_no_client_that_does_not_answer(tmp_path, silent_after):
    """Fault: SIGINT (torchrun passes a Ctrl-C on) to rank 0 of a torchrun world whose client
    answers nothing once it has connected, once it has taken rank 0's HELLO (its own never
    comes), once it has its parameters, or once it has pushed (stopped, dying, stuck: it posts
    no receive), with backend.client_timeout_s=60. Rank 0's HELLO to it, or its wait for the
    client's HELLO, or its STOP, or the reply to its push holding the server's lock, waited the whole
    client timeout, past torchrun's 30 s grace before its SIGKILL, which left summary.json
    ``running``. Guarantee 5: rank 0 ends interrupted within seconds, with a terminal summary."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    cfg = real_cfg(num_clients=1, num_epochs=500.0, backend=BackendConfig(
        name="real", client_device="cpu", timeout_s=60.0, client_timeout_s=60.0))
    run_dir, spec = tmp_path / "run", json.dumps(to_dict(cfg))
    server = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_dir), spec], cwd=ROOT, env=env,
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = subprocess.Popen([sys.executable, "-c", SILENT_CLIENT, spec, silent_after], cwd=ROOT,
                              env={**env, "RANK": "1", "LOCAL_RANK": "1"}, start_new_session=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline() == "silent\n"
        time.sleep(0.5)
        ended = ends_after(server, signal.SIGINT, 15)
    finally:
        for proc in (server, client):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)   # (torchrun's SIGKILL after its grace)
            proc.wait()
            assert_no_leftovers(proc)
    assert ended, "rank 0 still waited for a silent client 15 s after SIGINT"
    check_run_folder(run_dir, "interrupted")


SIM_SIGNALS = {"SIGTERM": [signal.SIGTERM], "SIGHUP": [signal.SIGHUP], "SIGINTx2": [signal.SIGINT, signal.SIGINT]}


@pytest.mark.parametrize("name", SIM_SIGNALS)
def test_5_signals_end_a_simulator_run_interrupted(tmp_path, name):
    """Fault: SIGTERM, SIGHUP, or SIGINT twice to ``python -m repro.run`` (simulator, hours of
    budget) while it trains. Guarantee 5: it ends within a minute, interrupted with a terminal
    summary, and no traceback on stderr."""
    proc = start_sim_cli(tmp_path / name, tmp_path, name)
    try:
        wait_rows(proc, tmp_path / name, 8, timeout_s=90)
        for sig in SIM_SIGNALS[name]:
            proc.send_signal(sig)
            time.sleep(0.002)
        proc.wait(timeout=60)
    finally:
        stop_process(proc)
    stderr = (tmp_path / f"{name}.err").read_text()
    assert "Traceback" not in stderr, f"{name}: {stderr[-2000:]}"
    check_run_folder(tmp_path / name, "interrupted")


def test_5_a_second_ctrl_c_inside_a_checkpoint_write_is_the_interrupt_not_a_traceback(tmp_path):
    """Fault: the second SIGINT lands inside ``torch.save`` while it writes a tensor's bytes (seen
    in the suite: the zip writer's clean-up then failed with "unexpected pos", a RuntimeError that
    hid the interrupt, and the run printed a traceback). Guarantee 5: the write raises the
    interrupt itself, keeps the old checkpoint and leaves no temp file."""
    from repro.files.storage import atomic_write, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    save_checkpoint({"version": 1}, path)
    before = path.read_bytes()

    def torch_save_interrupted(f):   # what torch.save does when interrupted in write_record
        f.write(b"PK half a zip")
        try:
            raise KeyboardInterrupt("second SIGINT: stopping now")
        finally:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")

    with pytest.raises(KeyboardInterrupt, match="second SIGINT"):
        atomic_write(path, torch_save_interrupted)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["checkpoint.pt"]   # no temp file, whatever its name
