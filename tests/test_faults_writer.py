"""Guarantee 1: one writer per run folder. A second run (API, command line, resume, force) on a
folder a live process holds is refused, naming the holder, and changes nothing; a dead holder's
lock does not block.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import multiprocessing
import signal
import socket

import pytest

from repro.errors import ConfigError
from repro.real import run_real
from repro.sim.driver import simulate
from tests.helpers.grids import cli_run
from tests.helpers.invariants import check_run_folder
from tests.helpers.processes import assert_no_leftovers
from tests.helpers.runs import (
    CLI_ARGS,
    SIM,
    cli,
    launch_real,
    lock_holder,
    real_cfg,
    start_sim_cli,
    stop_process,
    wait_rows,
)
from tests.helpers.tables import changed, snapshot, table_bytes


@pytest.mark.parametrize("flags", [{}, {"resume": True}, {"force": True}], ids=["plain", "resume", "force"])
def test_1_api_run_on_a_folder_a_live_process_holds_is_refused(interrupted, flags):
    """Fault: a second writer (the simulator API, plain, resume=true or force=true) on a folder
    whose lock a live process holds. Guarantee 1: ConfigError naming the holder's pid and host;
    nothing in the folder changes."""
    before = snapshot(interrupted)
    with lock_holder(interrupted) as holder:
        with pytest.raises(ConfigError) as err:
            simulate(SIM.replace(**flags), interrupted)
    message = str(err.value)
    assert f"pid {holder.pid}" in message and socket.gethostname() in message, message
    assert changed(before, snapshot(interrupted)) == []
    check_run_folder(interrupted, "interrupted")


def test_1_dead_holders_lock_does_not_block(interrupted, reference):
    """Fault: the process holding the folder's lock was SIGKILLed (its lock file still names it).
    Guarantee 1: a new run proceeds: resume=true continues the interrupted run to the end."""
    with lock_holder(interrupted) as holder:
        holder.kill()
        holder.wait()
    assert f'"pid": {holder.pid}' in (interrupted / ".lock").read_text()   # never released
    summary = simulate(SIM.replace(resume=True), interrupted)
    assert summary["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


# slow: test_1_refused_cli_run_leaves_the_live_runs_folder_alone (the command line refused by a
# live holder, naming it), test_1_api_run_on_a_folder_a_live_process_holds_is_refused[resume] and
# test_5_signals_end_a_simulator_run_interrupted (SIGTERM) cover the same path in the default suite
@pytest.mark.slow
def test_1_two_cli_runs_on_one_folder(tmp_path):
    """Fault: a second ``python -m repro.run resume=true`` on the folder of a first one that is
    still training. Guarantee 1: the second exits 2 naming the first's pid and host; the first
    goes on, and its folder is intact when it ends (SIGTERM). (A plain second run: see
    test_1_refused_cli_run_leaves_the_live_runs_folder_alone.)"""
    run_dir = tmp_path / "run"
    first = start_sim_cli(run_dir, tmp_path, "first")
    try:
        wait_rows(first, run_dir, 8, timeout_s=60)
        second = cli(f"hydra.run.dir={run_dir}", "data=synthetic", "model=mlp", "num_epochs=5000",
                     "progress=false", "resume=true")
        assert first.poll() is None, "the first run ended while the second was refused"
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    finally:
        stop_process(first)
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid} on {socket.gethostname()}" in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    check_run_folder(run_dir, "interrupted")


@pytest.mark.parametrize("state", [
    # found by this suite: the refusal's clean-up deleted the live run's folder and lock, and
    # Hydra's record of the refused command replaced the live run's
    pytest.param("starting"),
    pytest.param("training"),
])
def test_1_refused_cli_run_leaves_the_live_runs_folder_alone(tmp_path, monkeypatch, capsys, state):
    """Fault: a second CLI run on a folder held by a live run, (starting) in the live run's
    start-up (its lock taken, data still loading: no config.json yet), or (training) once it
    has written config.json and Hydra's record. Guarantee 1: the refused run changes nothing in
    that folder: the lock file and the live run's ``.hydra/`` record stay, so no third run can
    take the folder while the first is alive."""
    run_dir = tmp_path / "run"
    if state == "training":   # the live run's tables and Hydra's record of its command line
        assert simulate(SIM, run_dir)["status"] == "completed"
        (run_dir / ".hydra").mkdir()
        (run_dir / ".hydra" / "overrides.yaml").write_text("- data=synthetic\n- model=mlp\n")
    with lock_holder(run_dir) as holder:
        before = snapshot(run_dir)
        lock_inode = (run_dir / ".lock").stat().st_ino
        # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run);
        # the holder is a process of its own, as a live run is
        proc = cli_run(monkeypatch, capsys, f"hydra.run.dir={run_dir}", *CLI_ARGS, "force=true", "seed=3")
        assert proc.returncode == 2 and f"pid {holder.pid}" in proc.stderr, proc.stderr
        assert (run_dir / ".lock").exists() and (run_dir / ".lock").stat().st_ino == lock_inode, \
            "the live run's lock file was deleted: the next run would take the folder"
        assert changed(before, snapshot(run_dir)) == []
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"):
            simulate(SIM, run_dir)   # still refused: the folder still has one writer
    if state == "training":
        check_run_folder(run_dir, "completed")


@pytest.mark.slow
def test_1_resume_while_a_real_run_is_alive_is_refused(tmp_path):
    """Fault: ``resume=true`` on the folder of a real run that is still training (in another
    process). Guarantee 1: ConfigError naming the live launcher's pid and host, before any
    client is spawned; the live run ends (SIGINT) with its folder intact."""
    cfg = real_cfg(num_epochs=500.0, checkpoint_every=5)
    proc, run_dir = launch_real(tmp_path, cfg)
    try:
        wait_rows(proc, run_dir, 10)
        with pytest.raises(ConfigError) as err:
            run_real(cfg.replace(resume=True), run_dir)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        assert_no_leftovers(proc)
    assert f"pid {proc.pid} on {socket.gethostname()}" in str(err.value)
    assert multiprocessing.active_children() == []
    check_run_folder(run_dir, "interrupted")
