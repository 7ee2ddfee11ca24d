"""Elastic clients at their edges (issue 20), all ``slow``: torchrun's elastic form restarting a
client that joined (and a SIGKILLed torchrun taking its joiner along), a joiner that hangs before
its first message, and ``resume=true`` of a run that had joiners. Every run listens on loopback only and each test removes its processes.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from repro.config.settings import to_dict
from tests.helpers.invariants import check_run_folder
from tests.helpers.joins import elastic_cfg, join_keys_left, start_joiner, wait_log
from tests.helpers.paths import ROOT
from tests.helpers.processes import assert_no_leftovers, descendants, free_port, is_worker, workers_left
from tests.helpers.runs import launch_real, wait_rows
from tests.helpers.tables import table_frames


# -- torchrun's elastic form restarts a client, which rejoins the running server ---------------

# the server is a plain single-node run (one spawned client); the clients torchrun starts join it
# (backend.join), so torchrun's restarts (which restart every local worker of the failed agent, and
# with a shared rendezvous every agent) never touch the server
TORCHRUN_RUN = ["backend=real", "data=synthetic", "model=mlp", "num_clients=1", "num_epochs=100000",
                "eval_every=50000", "progress=false", "backend.client_device=cpu", "backend.timeout_s=30",
                "backend.client_timeout_s=10"]


@pytest.mark.slow
def test_torchrun_restarts_a_killed_client_which_rejoins(tmp_path):
    """Under ``torchrun --nnodes=1:2 --max-restarts=2`` (c10d rendezvous on loopback) a client
    that joined a running server is SIGKILLed: torchrun restarts it, it joins again under a fresh
    id, and the server (never restarted) keeps its version count: versions contiguous, events
    client_joined, client_lost, client_joined; torchrun exits 0 once the run is stopped."""
    port, run_dir = free_port(), tmp_path / "run"
    server = subprocess.Popen([sys.executable, "-m", "repro.run", *TORCHRUN_RUN, "backend.max_clients=3",
                               f"backend.master_port={port}", f"hydra.run.dir={run_dir}"], cwd=ROOT,
                              stdout=open(tmp_path / "run.log", "w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    torchrun = None
    workers: set[int] = set()
    try:
        wait_log(server, tmp_path / "run.log", "accepting joins at")
        torchrun = subprocess.Popen(
            [str(Path(sys.executable).with_name("torchrun")), "--nnodes=1:2", "--nproc-per-node=1",
             "--max-restarts=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
             "-m", "repro.run", *TORCHRUN_RUN, f"backend.join=127.0.0.1:{port}"],
            cwd=tmp_path, stdout=open(tmp_path / "torchrun.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_log(server, tmp_path / "run.log", "client 2 joined", timeout_s=120)
        wait_rows(server, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 50)
        workers = {p for p in descendants(torchrun.pid) if is_worker(p)}
        assert len(workers) == 1, workers
        os.kill(workers.pop(), signal.SIGKILL)
        killed_at = sum(1 for _ in open(run_dir / "updates.csv")) - 1
        wait_log(server, tmp_path / "run.log", "client 3 joined", timeout_s=120)
        wait_rows(server, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 50)
        workers = {p for p in descendants(torchrun.pid) if is_worker(p)}
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        assert torchrun.wait(timeout=60) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        assert_no_leftovers(server)
        if torchrun is not None:
            if torchrun.poll() is None:
                torchrun.kill()
                torchrun.wait()
            assert_no_leftovers(torchrun)
        left = [p for p in workers if is_worker(p)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"torchrun workers left behind: {left}"
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "interrupted", summary["message"]
    events = [(e["type"], e["client"]) for e in summary["events"] if e["type"].startswith("client_")]
    assert events == [("client_joined", 2), ("client_lost", 2), ("client_joined", 3)], events
    lost = next(e for e in summary["events"] if e["type"] == "client_lost")
    assert lost["version"] >= killed_at   # the server went on counting: it was never restarted
    assert (upd[upd.version > lost["version"]].client == 3).any()
    assert "resumed" not in [e["type"] for e in summary["events"]]
    check_run_folder(run_dir)


@pytest.mark.slow
def test_a_sigkilled_torchrun_takes_its_joiner_along(tmp_path):
    """Fault: ``torchrun`` itself (the agent) SIGKILLed while the client it started as a joiner
    (``backend.join``) trains. The joiner had no parent-death signal (only torchrun's ranks set
    one): it trained on headless, a client nobody could stop but by its pid. Guarantee: it gets
    torchrun's own stop (one SIGTERM), leaves with its one line, and the server counts it lost."""
    port, run_dir = free_port(), tmp_path / "run"
    server = subprocess.Popen([sys.executable, "-m", "repro.run", *TORCHRUN_RUN, "backend.max_clients=2",
                               f"backend.master_port={port}", f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=open(tmp_path / "run.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
    torchrun, workers = None, set()
    try:
        wait_log(server, tmp_path / "run.log", "accepting joins at")
        torchrun = subprocess.Popen(
            [str(Path(sys.executable).with_name("torchrun")), "--nnodes=1:2", "--nproc-per-node=1",
             "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
             "-m", "repro.run", *TORCHRUN_RUN, f"backend.join=127.0.0.1:{port}"],
            cwd=tmp_path, stdout=open(tmp_path / "torchrun.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wait_log(server, tmp_path / "run.log", "client 2 joined", timeout_s=120)
        workers = {p for p in descendants(torchrun.pid) if is_worker(p)}
        assert len(workers) == 1, workers
        torchrun.kill()
        torchrun.wait()
        left = workers_left(workers, 15)
        if not left:   # else the server's stop ends the joiner, for the assertion below
            wait_log(server, tmp_path / "run.log", "client 2 lost", timeout_s=30)
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    finally:
        assert_no_leftovers(server)
        if torchrun is not None and torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait()
        stray = [p for p in workers if is_worker(p)]
        for pid in stray:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the joiner trained on headless: {left}"
    assert "SIGTERM: left the run" in (tmp_path / "torchrun.log").read_text()
    summary = check_run_folder(run_dir, "interrupted")
    assert ("client_lost", 2) in [(e["type"], e["client"]) for e in summary["events"]], summary["events"]


HANGER = """
import json, os, socket, sys, time
import torch.distributed as dist
from repro.config.checks import from_dict
from repro.real.elastic import COUNT_KEY, fingerprint, ticket_key
cfg = from_dict(json.loads(sys.argv[1]))
host, _, port = cfg.backend.join.rpartition(":")
store = dist.TCPStore(host, int(port), None, False)
n = store.add(COUNT_KEY, 1)
if sys.argv[2] == "answer":   # asks, is admitted, then never makes its pair group
    store.set(ticket_key(n, "request"), json.dumps({"fingerprint": fingerprint(cfg), "client": None,
                                                   "pid": os.getpid(), "host": socket.gethostname()}))
    print("answer", store.get(ticket_key(n, "answer")).decode(), flush=True)
print("hanging", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_joiner_that_hangs_is_dropped_and_the_run_goes_on(tmp_path):
    """Two joiners hang before their first message: one after taking its ticket (it never
    writes its request), one after its answer (it never makes its pair group). Each is dropped
    after backend.client_timeout_s, the run trains on meanwhile, a joiner after them is served,
    and no key of theirs stays in the store."""
    cfg = elastic_cfg(free_port(), num_epochs=1000.0, eval_every=500.0, max_clients=4)
    cfg = cfg.replace(backend=dataclasses.replace(cfg.backend, client_timeout_s=5.0))
    joiner_cfg = cfg.replace(backend=dataclasses.replace(cfg.backend, join=f"127.0.0.1:{cfg.backend.master_port}",
                                                         master_port=0))
    proc, run_dir = launch_real(tmp_path, cfg)
    hangers, joiner = [], None
    try:
        wait_log(proc, tmp_path / "run.log", "accepting joins at")
        wait_rows(proc, run_dir, 5)
        for how in ("ticket", "answer"):
            log = open(tmp_path / f"hang_{how}.log", "w")
            hangers.append(subprocess.Popen([sys.executable, "-c", HANGER, json.dumps(to_dict(joiner_cfg)), how],
                                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            wait_log(hangers[-1], tmp_path / f"hang_{how}.log", "hanging")
        before = sum(1 for _ in open(run_dir / "updates.csv"))
        joiner = start_joiner(tmp_path, cfg)
        wait_log(proc, tmp_path / "run.log", "wrote no request within backend.client_timeout_s")
        wait_log(proc, tmp_path / "run.log", r"joining client 3 did not connect within backend.client_timeout_s")
        wait_log(proc, tmp_path / "run.log", "client 4 joined")
        assert join_keys_left(cfg.backend.master_port) == []
        wait_rows(proc, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 20)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        assert joiner.wait(timeout=30) == 0
    finally:
        assert_no_leftovers(proc)
        for p in [*hangers, *([joiner] if joiner else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    upd, _, summary = table_frames(run_dir)
    assert summary["status"] == "interrupted", summary["message"]
    assert len(upd) > before   # it trained on while the hangers waited
    assert [(e["type"], e["client"]) for e in summary["events"] if e["type"].startswith("client_")] == \
        [("client_joined", 4)]   # the dropped one never joined: no event, its id 3 never reused
    assert 3 not in set(upd.client) and (upd.client == 4).any()
    check_run_folder(run_dir)


@pytest.mark.slow
def test_resume_of_a_run_with_joiners_restores_its_membership(tmp_path):
    """A real run that had a joiner (client 3) is interrupted and resumed (resume=true): the
    resumed run keeps its events (client_joined 3, then resumed), goes on from its version, and
    a joiner of the resumed run gets id 4: an id is never reused, across resumes too."""
    cfg = elastic_cfg(free_port(), num_epochs=1000.0, eval_every=500.0, max_clients=3, checkpoint_every=5)
    proc, run_dir = launch_real(tmp_path, cfg)
    joiners = []
    try:
        for client in (3, 4):   # one joiner in each attempt: the run's, then its resume's
            if client == 4:
                first = table_frames(run_dir)[2]
                assert first["status"] == "interrupted"
                proc, _ = launch_real(tmp_path, cfg.replace(resume=True), "run")   # the same folder
            wait_log(proc, tmp_path / "run.log", "accepting joins at")
            joiners.append(start_joiner(tmp_path, cfg, f"joiner{client}"))
            wait_log(proc, tmp_path / "run.log", f"client {client} joined")
            wait_rows(proc, run_dir, sum(1 for _ in open(run_dir / "updates.csv")) + 20)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
            assert joiners[-1].wait(timeout=30) == 0
    finally:
        assert_no_leftovers(proc)
        for j in joiners:
            assert_no_leftovers(j)
    upd, _, summary = table_frames(run_dir)
    kinds = [(e["type"], e.get("client")) for e in summary["events"]
             if e["type"].startswith("client_") or e["type"] == "resumed"]
    assert kinds == [("client_joined", 3), ("resumed", None), ("client_joined", 4)], kinds
    assert summary["version"] > first["version"]
    assert (upd[upd.version > first["version"]].client == 4).any()
    check_run_folder(run_dir)
