"""Guarantee 10: liveness without false alarms. A client lost in start-up or mid-run degrades
the run and stays lost across interrupt and resume (10a, 10c); slow pushes with heartbeats are
never taken for a hung client (10b).

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pandas as pd
import pytest
import torch

from repro.config.settings import BackendConfig
from repro.real import run_real
from tests.helpers.invariants import check_run_folder
from tests.helpers.processes import assert_no_leftovers, client_pids, fork_servers
from tests.helpers.runs import launch_real, real_cfg, wait_rows
from tests.helpers.tables import changed, lines, row_count, snapshot, summary_of


@pytest.mark.slow   # found by this suite: a client lost in start-up made lose() raise KeyError
def test_10a_client_killed_during_startup_degrades_the_run(tmp_path):
    """Fault: one of 3 spawned clients is SIGKILLed the moment its process appears, before the
    run's first push. Guarantee 10a: the run goes on with the others and ends
    completed_degraded, lost_clients naming the dead one (which never pushed)."""
    proc, run_dir = launch_real(tmp_path, real_cfg(num_clients=3, num_epochs=6.0))
    try:
        deadline = time.monotonic() + 60
        while not (pids := client_pids(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "no client appeared"
            time.sleep(0.002)
        os.kill(pids[0], signal.SIGKILL)
        assert len(lines(run_dir / "updates.csv")) <= 1, "the kill came after the first push"
        proc.wait(timeout=120)
    finally:
        assert_no_leftovers(proc)
    summary = check_run_folder(run_dir, "completed_degraded")
    assert len(summary["lost_clients"]) == 1, summary
    pushed = {int(row.split(b",")[3]) for row in lines(run_dir / "updates.csv")[1:]}
    assert summary["lost_clients"][0] not in pushed and len(pushed) == 2


@pytest.mark.slow
def test_10b_slow_pushes_with_heartbeats_are_not_dropped(tmp_path):
    """Fault: ``backend.client_timeout_s=1`` while every push takes seconds (digits_cnn, nsync
    1000, one thread). Guarantee 10b: heartbeats keep the healthy clients in: the run
    completes with no client lost (and, checkpoint_every being 0, with a final checkpoint)."""
    cfg = real_cfg(nsync=1000, num_epochs=80.0, eval_every=80.0, num_threads=1,
                   backend=BackendConfig(name="real", client_device="cpu", timeout_s=60.0, client_timeout_s=1.0))
    summary = run_real(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["lost_clients"] == [], summary["message"]
    assert multiprocessing.active_children() == []
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert state["server"]["version"] == summary["version"]
    check_run_folder(tmp_path, "completed")


@pytest.mark.slow
def test_10c_lost_client_survives_interrupt_and_resume(tmp_path):
    """Fault: a client is SIGKILLed mid-run, then the launcher gets Ctrl-C, then the run is
    resumed. Guarantee 10c: the interrupted summary lists the lost client; the resume starts
    every client again, so the lost one is back: its loss and its rejoin are both in the events,
    it pushes again, and the run ends completed (it ended completed_degraded, saying the others
    finished the budget, while updates.csv held the lost client's pushes after the resume);
    resuming it once more changes nothing (a finished run is never changed)."""
    cfg = real_cfg(num_clients=3, num_epochs=20.0, checkpoint_every=5)
    proc, run_dir = launch_real(tmp_path, cfg)
    try:
        wait_rows(proc, run_dir, 10)
        os.kill(client_pids(proc.pid)[0], signal.SIGKILL)
        wait_rows(proc, run_dir, row_count(run_dir) + 15)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    first = check_run_folder(run_dir, "interrupted")
    assert len(first["lost_clients"]) == 1, first
    summary = run_real(cfg.replace(resume=True), run_dir)
    assert multiprocessing.active_children() == []
    assert summary["status"] == "completed", summary["message"]
    assert summary["lost_clients"] == []
    (lost,) = first["lost_clients"]
    events = [(e["type"], e.get("client")) for e in summary["events"]]
    assert ("client_lost", lost) in events and ("client_rejoined", lost) in events, events
    updates = pd.read_csv(run_dir / "updates.csv")
    assert (updates.client == lost).any() and updates[updates.client == lost].version.max() > first["version"]
    check_run_folder(run_dir, "completed")
    before = snapshot(run_dir)
    assert run_real(cfg.replace(resume=True), run_dir) == summary_of(run_dir)
    assert changed(before, snapshot(run_dir)) == []


def test_10d_a_loss_names_the_dead_fork_server_not_the_client(tmp_path):
    """Fault: the clients' fork server dies: every client dies with it (its parent), and each
    loss said only 'connection lost' or 'process exited with code 255' (multiprocessing's code
    when no status came), as if each client had failed alone. Guarantee 10d: the loss names the
    fork server, by a link or an exit seen first alike; another client's loss is its own."""
    from types import SimpleNamespace

    from repro.real.server import Dispatcher
    from repro.runs.core import RunCore
    from repro.runs.folder import run_folder
    from repro.runtime import StopRequest
    from repro.workload.start import build_problem

    class Channel:
        def send(self, header, frame):
            pass

    cfg = real_cfg(num_clients=3)
    with run_folder(cfg, tmp_path) as run:
        run.core = core = RunCore(cfg, build_problem(cfg, torch.device("cpu")), tmp_path, clock="wall", backend="real")
        procs = {1: SimpleNamespace(exitcode=255), 2: SimpleNamespace(exitcode=255), 3: SimpleNamespace(exitcode=-9)}
        loop = Dispatcher(cfg, core, {k: Channel() for k in procs}, StopRequest(), procs)
        core.begin([1, 2, 3])
        loop.lose(1, "rank 1: waiting for a message: connection lost")
        loop.poll_processes()
        core.finish(*core.final_status(interrupted=False))
    died = "the clients' fork server died, and every client with it"
    assert core.runlog.lost_clients == {"1": f"{died} (rank 1: waiting for a message: connection lost)",
                                        "2": f"{died} (process exited with code 255)",
                                        "3": "process exited with code -9"}


@pytest.mark.slow
def test_10d_the_fork_server_killed_mid_run_is_named_in_every_loss(tmp_path):
    """Fault: the clients' fork server is SIGKILLed mid-run. Guarantee 10d: every client is
    lost with it and the run ends failed, each client_lost event naming the fork server."""
    proc, run_dir = launch_real(tmp_path, real_cfg(num_clients=2, num_epochs=2000.0))
    try:
        wait_rows(proc, run_dir, 10)
        (server,) = fork_servers(proc.pid)
        os.kill(server, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    summary = check_run_folder(run_dir, "failed")
    reasons = [e["reason"] for e in summary["events"] if e["type"] == "client_lost"]
    assert len(reasons) == 2 and all(r.startswith("the clients' fork server died") for r in reasons), reasons
