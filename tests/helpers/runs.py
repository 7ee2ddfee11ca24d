"""Runs a test starts, and waiting on them.

* The fault cases' simulator run :data:`SIM` (:func:`sim_cfg`): 48 versions of the ``mlp`` on
  ``synthetic`` data in a fraction of a second, byte-identical from its config; runs
  interrupted at :data:`STOP_AT`; the same run on the command line (:data:`CLI_ARGS`,
  :func:`cli_cfg`, :func:`cli`) and a long one in a session of its own (:func:`start_sim_cli`).
* A quick real run (:func:`real_cfg`), launched in a session of its own so a test can signal it
  and then check that nothing of it is left (:func:`launch_real`, :data:`LAUNCHER`).
* :func:`wait_rows` until a run has pushed; :func:`lock_holder`, a live process holding a run
  folder's lock as a running run does; :func:`sim_killed_at`, a simulator run that ends as a
  SIGKILL leaves it, deterministically; :func:`killing_a_client`, a client of a real run in
  this process SIGKILLed mid-run; :func:`torchrun_worker`, a rank > 0 of a world made by hand.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

from repro.config.settings import AlgoConfig, BackendConfig, CostConfig, DataConfig, ModelConfig, RunConfig, to_dict
from tests.helpers.paths import ROOT

STOP_AT = 20   # interrupted runs stop (and checkpoint) at this version; the whole run has 48


def sim_cfg(**kw) -> RunConfig:
    """3 clients, nsync 2, 6 epochs of 512 synthetic samples: 48 versions, an evaluation every 4,
    a checkpoint every 5. Deterministic: the same config gives byte-identical tables."""
    base = dict(num_clients=3, nsync=2, num_epochs=6.0, eval_every=0.5, checkpoint_every=5,
                progress=False, data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5), cost=CostConfig(profile="uniform", compute_s=0.01))
    base.update(kw)
    return RunConfig(**base)


SIM = sim_cfg()
# the same run on the command line (config composed from these overrides; see cli_cfg)
CLI_ARGS = ["data=synthetic", "model=mlp", "num_epochs=6", "eval_every=0.5", "checkpoint_every=5",
            "progress=false"]


def cli_cfg(*extra: str) -> RunConfig:
    """The RunConfig ``python -m repro.run *CLI_ARGS *extra`` runs (for folders the CLI resumes)."""
    from repro.run import compose, parse

    return parse(compose([*CLI_ARGS, *extra]))


def cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def start_sim_cli(run_dir: Path, tmp_path: Path, name: str, *extra: str) -> subprocess.Popen:
    """A long simulator run on the command line (hours of budget), in its own session."""
    err = open(tmp_path / f"{name}.err", "w")
    return subprocess.Popen([sys.executable, "-m", "repro.run", f"hydra.run.dir={run_dir}", "data=synthetic",
                             "model=mlp", "num_epochs=5000", "progress=false", *extra], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


LAUNCHER = """
import json, sys
from repro.config.checks import from_dict
from repro.real import run_real
summary = run_real(from_dict(json.loads(sys.argv[2])), sys.argv[1])
sys.exit(0 if summary["status"] in ("completed", "completed_degraded") else 1)
"""


def real_cfg(**changes) -> RunConfig:
    """A quick real run; clients on the CPU even on a GPU machine (the GPU tests ask for cuda)."""
    backend = BackendConfig(name="real", timeout_s=30.0, client_timeout_s=10.0, client_device="cpu")
    cfg = RunConfig(num_clients=2, nsync=4, num_epochs=3.0, eval_every=1.0, progress=False,
                    algo=AlgoConfig(lr=0.2, momentum=0.0), backend=backend)
    return cfg.replace(**changes)


def launch_real(tmp_path: Path, cfg: RunConfig, name: str = "run") -> tuple[subprocess.Popen, Path]:
    """A real run of ``cfg`` in a launcher subprocess (rank 0) in a session of its own; its
    output goes to ``tmp_path/NAME.log``."""
    run_dir = tmp_path / name
    log = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(run_dir), json.dumps(to_dict(cfg))],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, run_dir


def wait_rows(proc: subprocess.Popen, run_dir: Path, rows: int, timeout_s: float = 90) -> None:
    path, deadline = run_dir / "updates.csv", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and sum(1 for _ in open(path)) > rows:
            return
        assert proc.poll() is None, f"run ended early (exit {proc.returncode})"
        time.sleep(0.02)
    raise AssertionError(f"fewer than {rows} pushes after {timeout_s} s")


def sim_killed_at(cfg: RunConfig, run_dir: Path, version: int) -> None:
    """Simulate ``cfg`` into ``run_dir`` and end it at ``version`` as a SIGKILL would: no final
    checkpoint, no terminal summary (it still says ``running``), the tables holding the rows
    written after the last periodic checkpoint (flushed, as the kernel keeps them)."""
    from unittest import mock

    from repro.runs.core import RunCore
    from repro.sim.driver import simulate

    def killed(core, *args, **kwargs):
        core.runlog.close()
        core.finished = {"status": "running"}   # nothing more is written
        return core.finished

    with mock.patch.object(RunCore, "finish", killed):
        simulate(cfg, run_dir, stop_at_version=version)
    assert json.loads((Path(run_dir) / "summary.json").read_text())["status"] == "running"


HOLDER = """
import sys, time
from repro.files.locks import FileLock
FileLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(300)
"""


@contextlib.contextmanager
def lock_holder(run_dir: Path):
    """Another live process holding ``run_dir``'s lock (as a running run does)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir / ".lock")], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


@contextlib.contextmanager
def killing_a_client(run_dir: Path, rows: int, victim: int = 0):
    """While the ``with`` block runs a real run into ``run_dir`` in this process, a thread
    SIGKILLs the ``victim``-th of its clients (forks of this process's fork server, by pid) once
    it has pushed more than ``rows`` times. Yields the list that holds the killed pid. In this
    process, not a launcher's: the fork server is already up (no torch import per run), and
    what is tested is the client's death, not the launcher's."""
    import os
    import signal
    import threading

    from tests.helpers.processes import client_pids

    path, done, killed = Path(run_dir) / "updates.csv", threading.Event(), []

    def kill() -> None:
        while not done.is_set():
            if path.exists() and sum(1 for _ in open(path)) > rows and (pids := client_pids(os.getpid())):
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(pids[victim])
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill, name="client-killer", daemon=True)
    killer.start()
    try:
        yield killed
    finally:
        done.set()
        killer.join()


def torchrun_worker(cfg: dict, env: dict, log: str) -> None:
    """Rank ``env["RANK"]`` of a torchrun world made by hand, run as a fork of this process's
    fork server (``client_context().Process``; no interpreter importing torch afresh): ``cfg``
    (:func:`~repro.config.settings.to_dict`) through ``run_torchrun_worker``, its output into
    ``log``, its exit status the worker's."""
    import os

    os.environ.update(env)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(out, 1)
    os.dup2(out, 2)
    from repro.config.checks import from_dict
    from repro.real import run_torchrun_worker

    sys.exit(run_torchrun_worker(from_dict(cfg)))
