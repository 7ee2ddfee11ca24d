"""Guarantee 11: server loss is survived by a torchrun restart. Rank 0 SIGKILLed under
``torchrun --max-restarts=1 ... resume=auto``: the restarted job continues from the checkpoint
and completes, and no worker is left behind.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.grids import cli_run
from tests.helpers.invariants import check_run_folder
from tests.helpers.paths import ROOT
from tests.helpers.processes import descendants, find_rank0, workers_left
from tests.helpers.tables import row_count


@pytest.mark.slow   # found by this suite: a restart read the dead attempt's gloo addresses
def test_11_torchrun_restart_survives_the_loss_of_rank_0(tmp_path):
    """Fault: rank 0 (the server) of ``torchrun --standalone --nproc-per-node=3
    --max-restarts=1 ... resume=auto checkpoint_every=5`` is SIGKILLed mid-run. Guarantee 11:
    torchrun restarts the job, which continues from the checkpoint and completes: versions
    contiguous, no row duplicated, one 'resumed' event; no worker is left behind."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node=3", "--max-restarts=1", "-m", "repro.run",
           "backend=real", "resume=auto", "checkpoint_every=5", f"results_dir={tmp_path}", "num_epochs=30",
           "algo.lr=0.2", "algo.momentum=0", "progress=false", "backend.timeout_s=20"]
    log = open(tmp_path / "torchrun.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers: set[int] = set()
    tail = lambda: (tmp_path / "torchrun.log").read_text()[-3000:]   # noqa: E731
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.rglob("updates.csv")) or row_count(next(tmp_path.rglob("updates.csv")).parent) < 15:
            assert proc.poll() is None and time.monotonic() < deadline, tail()
            workers |= descendants(proc.pid)
            time.sleep(0.05)
        run_dir = next(tmp_path.rglob("updates.csv")).parent
        rank0 = find_rank0(workers | descendants(proc.pid))
        assert rank0 is not None, "no process with RANK=0 in its environment"
        os.kill(rank0, signal.SIGKILL)
        killed_at = row_count(run_dir)
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            workers |= descendants(proc.pid)
            time.sleep(0.1)
        assert proc.poll() is not None, "torchrun did not end within 180 s"
    finally:
        if proc.poll() is None:
            workers |= descendants(proc.pid)
            proc.kill()
            proc.wait()
        log.close()
        left = workers_left(workers, 10)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"workers left behind: {left}"
    assert len(workers) >= 6, f"expected 3 workers before and 3 after the restart: {sorted(workers)}"
    assert proc.returncode == 0, tail()
    summary = check_run_folder(run_dir, "completed")
    assert [e["type"] for e in summary["events"]].count("resumed") == 1, summary["events"]
    assert summary["version"] > killed_at


@pytest.mark.parametrize("key,value", [("RANK", "x"), ("MASTER_PORT", "abc")])
def test_a_torchrun_variable_that_is_not_a_count_is_bad_input(tmp_path, key, value):
    """Fault: torchrun's variables exported by hand with a value that is not a count (RANK=x: a
    raw ValueError traceback; MASTER_PORT=abc: a start-up that waited backend.timeout_s and left
    a failed folder). Guarantee: one line naming the variable and its value, exit 2, no folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555", key: value}
    proc = subprocess.run([sys.executable, "-m", "repro.run", "backend=real", f"results_dir={tmp_path}/r",
                           "num_epochs=1", "backend.timeout_s=5"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: invalid value for '{key}': '{value}'"), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_a_master_addr_other_than_torchruns_is_bad_input(tmp_path, monkeypatch, capsys):
    """Fault: ``torchrun --master-addr=A ... backend.master_addr=B``: the world met at A and B was
    ignored in silence (config.json recorded B). Guarantee: one line naming the key and both
    addresses, exit 2, no folder (rank 0 under torchrun's variables; the world never formed).
    The command runs in this process (what it says and leaves is the point, not a fresh
    interpreter's exit status after torch loads: tests/test_config.py tests that)."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    proc = cli_run(monkeypatch, capsys, "backend=real", f"results_dir={tmp_path}/r", "num_epochs=1",
                   "backend.master_addr=10.9.9.9", "backend.timeout_s=5")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: invalid value for 'backend.master_addr': '10.9.9.9'") and "127.0.0.1" in last, last
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def test_config_json_records_the_address_torchrun_gave(monkeypatch):
    """Fault: under torchrun a left-out ``backend.master_addr`` was recorded in config.json as
    127.0.0.1 (its default) and ``master_port`` as 0, where the world met at torchrun's
    MASTER_ADDR:MASTER_PORT (``localhost`` under --standalone). Guarantee: the resolved config,
    which config.json records, holds the address the run used (one typed for the same host too)."""
    from repro import run as entry
    from repro.config.settings import BackendConfig, RunConfig

    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "localhost", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(key, value)
    for typed in ({}, {"master_addr": "127.0.0.1", "master_port": 29555}):
        resolved = entry.resolve(RunConfig(backend=BackendConfig(name="real", **typed)))
        assert (resolved.backend.master_addr, resolved.backend.master_port) == ("localhost", 29555), typed


@pytest.mark.slow   # a torchrun job: ~10 s
def test_a_sigkilled_torchrun_takes_its_workers_along_and_the_run_ends_interrupted(tmp_path):
    """Fault: ``torchrun`` itself (the agent, not a rank) SIGKILLed mid-run. Its workers trained
    on headless to the end of the budget, holding the run folder (a relaunch with resume=auto
    was a second writer). Guarantee: each rank gets one SIGTERM, torchrun's own stop: no worker
    is left behind and the run ends ``interrupted`` with its checkpoint, for resume=auto."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node=3", "-m", "repro.run", "backend=real",
           f"results_dir={tmp_path}", "num_epochs=100000", "eval_every=1000", "progress=false"]
    log = open(tmp_path / "torchrun.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.rglob("updates.csv")) or row_count(next(tmp_path.rglob("updates.csv")).parent) < 15:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "torchrun.log").read_text()
            workers |= descendants(proc.pid)
            time.sleep(0.05)
        workers |= descendants(proc.pid)
        env = Path(f"/proc/{find_rank0(workers)}/environ").read_bytes().split(b"\0")
        met = {k: v for k, _, v in (e.decode().partition("=") for e in env) if k in ("MASTER_ADDR", "MASTER_PORT")}
    finally:
        proc.kill()
        proc.wait()
        log.close()
        left = workers_left(workers, 30)   # the budget takes minutes: only a stop ends them sooner
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert len(workers) == 3 and not left, f"workers left behind: {left} of {sorted(workers)}"
    run_dir = next(tmp_path.rglob("updates.csv")).parent
    summary = check_run_folder(run_dir, "interrupted")
    # one stop, not a forced one: each of rank 0's threads sent a parent-death signal of its own
    assert "forced" not in summary["message"] and (run_dir / "checkpoint.pt").is_file(), summary["message"]
    # where the world met, as rank 0's environment says (--standalone: localhost), not the left-out default
    backend = json.loads((run_dir / "config.json").read_text())["backend"]
    assert (backend["master_addr"], str(backend["master_port"])) == (met["MASTER_ADDR"], met["MASTER_PORT"]), met


def test_a_joiner_torchrun_starts_asks_for_its_agents_death_signal_before_it_joins(monkeypatch):
    """Fault: a client torchrun started as a joiner (``backend.join``, torchrun's elastic form)
    set no parent-death signal, as its ranks do: a SIGKILLed torchrun left it training headless.
    Guarantee: it asks for SIGUSR1 (one SIGTERM, torchrun's stop) before it joins (in process;
    the join itself not run; tests/test_elastic_edges.py kills a real torchrun)."""
    from repro import run as entry
    from repro.real import elastic
    from repro.runtime import PR_SET_PDEATHSIG

    calls = []
    monkeypatch.setattr(entry, "prctl", lambda option, value: calls.append((option, value)))
    monkeypatch.setattr(elastic, "join_process", lambda cfg: calls.append("join") or sys.exit(0))
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["repro.run", "backend=real", "backend.join=127.0.0.1:29400"])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    try:
        with pytest.raises(SystemExit):
            entry.cli()
    finally:   # the command line's own signal handling is for its process, not for pytest's
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert calls == [(PR_SET_PDEATHSIG, signal.SIGUSR1), "join"], calls
