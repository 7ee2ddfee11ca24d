"""Other input that got through (issue 16, section 6): each is refused before any work with a
message naming the key and what to do, leaving no folder and touching nothing of the user's;
and a double Ctrl-C exits 130 whenever the second one lands."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from repro import api
from repro import run as cli_module
from repro.config.settings import BackendConfig, DataConfig, RunConfig
from repro.errors import ConfigError
from repro.real import run_real
from repro.runtime import cuda_missing
from repro.sim.driver import simulate

from tests.helpers.paths import ROOT  # noqa: E402


def tree(root: Path) -> list[str]:
    """Every path under ``root`` (the test's own folder), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---------------------------------------------------------------------------------------------
# The Python API
# ---------------------------------------------------------------------------------------------

def _problem(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 6, generator=torch.Generator().manual_seed(0))
    return x, (x[:, 0] > 0).long()


@pytest.mark.parametrize("where,value", [("train", float("nan")), ("test", float("inf"))])
def test_api_refuses_non_finite_inputs_instead_of_blaming_the_learning_rate(tmp_path, where, value):
    x, y = _problem()
    bad = x.clone()
    bad[5, 2] = value
    train, test = ((bad, y), (x, y)) if where == "train" else ((x, y), (bad, y))
    with pytest.raises(ConfigError) as err:
        api.simulate(nn.Linear(6, 2), train, test, run_dir=tmp_path / "run")
    assert err.value.key == where and "non-finite input" in str(err.value) and "sample 5" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_api_refuses_a_label_the_module_has_no_output_for(tmp_path):
    x, y = _problem()
    y = y.clone()
    y[3] = 12                                    # the module has 2 outputs
    with pytest.raises(ConfigError) as err:
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), run_dir=tmp_path / "run")
    assert err.value.key == "train" and "the module outputs 2 classes" in str(err.value)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# Where a run writes: exp_name, results_dir
# ---------------------------------------------------------------------------------------------

def cli_in_process(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """``python -m repro.run ARGS`` refused by the checks made before Hydra makes any folder."""
    monkeypatch.setattr(sys, "argv", ["repro.run", *args])
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit) as exc:
            cli_module.cli()
    finally:   # the command line's own signal handling is for its process, not for pytest's
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return exc.value.code, capsys.readouterr().err


@pytest.mark.parametrize("name", ["../../outside", "_warmstart", "_data", ".", "", "a/b"])
def test_an_exp_name_that_is_not_one_folder_inside_results_dir_is_refused(tmp_path, monkeypatch, capsys, name):
    work = tmp_path / "work"
    (work / "deep").mkdir(parents=True)
    monkeypatch.chdir(work / "deep")
    code, err = cli_in_process(monkeypatch, capsys, f"exp_name={name}", f"results_dir={work / 'deep' / 'results'}")
    assert code == 2 and "'exp_name'" in err and "a plain folder name inside results_dir" in err, err
    assert tree(tmp_path) == ["work", "work/deep"]          # nothing written, in or out of results


def test_a_grid_checks_exp_name_before_hydra_makes_its_sweep_folder(tmp_path, capsys):
    """A grid's points are checked only as each runs, in folders Hydra has made by then: the
    grid's callback checks where it writes first (Hydra makes the sweep folder after it)."""
    from repro.grid import Grid

    config = cli_module.compose(["+exp=fig1", "exp_name=../../outside", f"results_dir={tmp_path / 'r'}"],
                                return_hydra_config=True)
    with pytest.raises(SystemExit) as exc:
        Grid().on_multirun_start(config)
    assert exc.value.code == 2 and "'exp_name'" in capsys.readouterr().err
    assert tree(tmp_path) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc: no folder here refuses a new one")
@pytest.mark.parametrize("args", [(), ("-m", "nsync=1,2"), ("+exp=fig1",)], ids=["run", "grid", "exp"])
def test_a_results_dir_where_no_folder_can_be_made_is_refused_before_hydra(monkeypatch, capsys, args):
    """/proc: access() may say writable (to root), mkdir says no: a single run, a command-line
    grid (no grid callback checks it) and an experiment's grid exit 2 with one line naming the
    folder, instead of Hydra's mkdir traceback."""
    code, err = cli_in_process(monkeypatch, capsys, "results_dir=/proc/repro-test", *args)
    assert code == 2 and err.startswith("error: cannot make the") and ": /proc " in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_a_results_dir_that_is_a_file_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    for value in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "sub"):
        code, err = cli_in_process(monkeypatch, capsys, f"results_dir={value}")
        assert code == 2 and "'results_dir'" in err and "is a file" in err, err
    assert tree(tmp_path) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# A folder that holds someone's files, a refused fresh folder, a busy port
# ---------------------------------------------------------------------------------------------

SIM = RunConfig(num_clients=2, nsync=2, num_epochs=0.5, eval_every=0.5, progress=False,
                data=DataConfig(num_train=128, num_test=32))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("flags", [{}, {"resume": "auto"}, {"resume": True}, {"force": True}])
def test_someones_files_in_the_run_folder_are_never_touched(tmp_path, flags):
    """A folder (hydra.run.dir, run_dir) holding a config.json and summary.json that no run
    wrote is refused whatever the flags: their files are not a run to resume or start over."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model": "resnet", "lr": 0.1}))
    (folder / "summary.json").write_text("my notes")
    before = snapshot(folder)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(**flags), folder)
    message = str(err.value)
    assert "config.json, summary.json there are not a run's" in message, message
    assert "still says running" not in message and "choose another exp_name" in message
    assert snapshot(folder) == before and not (folder / ".lock").exists()


def test_a_killed_run_without_a_summary_is_named_for_what_it_is(tmp_path):
    run_dir = tmp_path / "run"
    assert simulate(SIM, run_dir)["status"] == "completed"
    (run_dir / "summary.json").unlink()          # killed before its first summary
    with pytest.raises(ConfigError) as err:
        simulate(SIM, run_dir)
    assert "a killed run (it has no readable summary.json)" in str(err.value), str(err.value)


def test_a_refused_run_leaves_no_folder_behind(tmp_path):
    with pytest.raises(ConfigError, match="resume"):
        simulate(SIM.replace(resume=True), tmp_path / "new")    # nothing to resume
    assert not (tmp_path / "new").exists()


def test_a_real_run_refused_for_a_busy_port_leaves_no_folder(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        cfg = SIM.replace(backend=BackendConfig(name="real", client_device="cpu",
                                                master_port=sock.getsockname()[1]))
        with pytest.raises(ConfigError, match="backend.master_port"):
            run_real(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()        # no .hydra, no .lock: the port was checked first


@pytest.mark.skipif(torch.cuda.is_available(), reason="refused only where CUDA is missing")
@pytest.mark.parametrize("key, choices", [("backend.server_device", "'cpu'"), ("backend.client_device", "'cpu' or 'auto'"),
                                          ("device", "'cpu' or 'auto'")])
def test_a_real_run_on_cuda_with_a_cpu_torch_is_refused_in_one_line(tmp_path, key, choices):
    """Only the GPU tests took the path that refuses cuda for the real server (its clients, the
    simulator): on a CPU-only torch the command line says why in one line, exit 2, and leaves no run folder."""
    backend = "sim" if key == "device" else "real"   # device is the simulator's
    proc = subprocess.run([sys.executable, "-m", "repro.run", f"backend={backend}", f"{key}=cuda", "num_epochs=0.1",
                           f"results_dir={tmp_path / 'results'}", "progress=false"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: invalid value for '{key}': 'cuda'; expected {choices}: {cuda_missing()}\n"
    assert tree(tmp_path) in ([], ["results"])   # Hydra made results_dir: it is left empty, no run folder


def test_the_simulators_device_key_is_refused_with_a_real_run(tmp_path):
    """``device`` places the simulator only: ``backend=real device=cuda`` ran on the CPU, exit 0, in a folder
    named ``device=cuda`` whose config.json said cuda. Refused in one line naming the real driver's keys."""
    proc = subprocess.run([sys.executable, "-m", "repro.run", "backend=real", "device=auto", "num_epochs=0.1",
                           f"results_dir={tmp_path / 'results'}", "progress=false"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == ("error: invalid value for 'device': 'auto'; expected cpu with backend=real (the key is "
                           "the simulator's; the real driver's: backend.server_device, backend.client_device)\n")
    assert tree(tmp_path) in ([], ["results"])


# ---------------------------------------------------------------------------------------------
# Ctrl-C twice: 130, whenever the second one lands
# ---------------------------------------------------------------------------------------------

LATE_SIGNAL = """
import os, signal, sys
from repro.runtime import EXIT_INTERRUPTED, exit_on_signal
class Late:
    def __del__(self):   # runs while Python finalises the modules, after its exit calls
        os.kill(os.getpid(), signal.SIGINT)
        os.write(2, b"lived")
sys.modules["late"] = Late()
exit_on_signal()
sys.exit(EXIT_INTERRUPTED)
"""


def test_a_ctrl_c_while_python_finalises_its_modules_still_exits_130():
    """The end of a run's process, made certain: a Ctrl-C that lands after the exit calls, while
    the modules are finalised (torch's take a while), used to kill the process by the signal
    (status -2) instead of letting it exit 130."""
    proc = subprocess.run([sys.executable, "-c", LATE_SIGNAL], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (130, "lived"), (proc.returncode, proc.stderr[-2000:])


def start_run(run_dir: Path, err: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "repro.run", f"hydra.run.dir={run_dir}", "data=synthetic",
                             "model=mlp", "num_epochs=5000", "progress=false"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=open(err, "w"), start_new_session=True)


def wait_for(condition, proc: subprocess.Popen, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, "the run never got there"
        time.sleep(0.05)


def status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def test_ctrl_c_exits_130_whenever_the_second_one_lands(tmp_path):
    """One Ctrl-C; two 2 ms apart (the second forces, mid-run); and a second one sent once the
    run has recorded 'interrupted' (it used to land in Python's default handler: a traceback
    and another exit code). Each exits 130 with the run interrupted and no traceback."""
    cases = {"once": [], "twice": [0.002], "after": ["interrupted"]}
    procs = {name: start_run(tmp_path / name, tmp_path / f"{name}.err") for name in cases}
    try:
        for name, proc in procs.items():
            wait_for(lambda: (tmp_path / name / "updates.csv").is_file()
                     and (tmp_path / name / "updates.csv").stat().st_size > 2000, proc)
            proc.send_signal(signal.SIGINT)
            for then in cases[name]:
                if then == "interrupted":
                    deadline = time.monotonic() + 60
                    while status(tmp_path / name) != "interrupted" and time.monotonic() < deadline:
                        time.sleep(0.005)
                else:
                    time.sleep(then)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
        codes = {name: proc.wait(timeout=60) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name in cases:
        err = (tmp_path / f"{name}.err").read_text()
        assert codes[name] == 130 and "Traceback" not in err, (name, codes[name], err[-2000:])
        assert status(tmp_path / name) == "interrupted"
