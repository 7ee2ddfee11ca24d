"""A newcomer's first day (issue 22 §2, §3, §5): commands that work as pasted from a fresh shell,
a resume hint that fits a grid, input mistakes refused with a message, an API that cleans up.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from repro import api
from repro.config.settings import RunConfig
from repro.errors import ConfigError
from repro.run import check_overrides
from repro.runs import folder

from tests.helpers import docs_commands as dc
from tests.helpers.grids import cli_run
from tests.helpers.paths import ROOT


# ---------------------------------------------------------------------------------------------
# §2: the commands after set-up, from a shell nobody activated
# ---------------------------------------------------------------------------------------------

def test_readme_activates_the_environment_and_a_documented_command_then_works(tmp_path):
    """A fresh shell has no venv on PATH (here: python without hydra, or none). The README says
    how to activate it once; after that, a documented command works as pasted."""
    activate = dc.activation(ROOT / "README.md")
    assert activate, "README.md never says how to activate the environment"
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    if not (tmp_path / ".venv" / "bin" / "activate").is_file():
        pytest.skip("the tests' Python is no virtual environment: nothing to activate")
    env = {**dc.unactivated_env(), "PYTHONPATH": str(ROOT)}   # this checkout's code
    command = "python -m repro.run --help"                      # README: lists every key

    def shell(text: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", text], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    before = shell(command)
    if before.returncode == 0:
        pytest.skip("this machine's own python has the package's dependencies")
    after = shell(f"{activate} && {command}")
    assert after.returncode == 0, after.stderr[-2000:]
    assert "num_clients" in after.stdout


# ---------------------------------------------------------------------------------------------
# §3: a grid point's resume hint
# ---------------------------------------------------------------------------------------------

def _interrupted(run_dir: Path, grid: bool, version: int = 12) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"exp_name": "fig3", "seed": 0}))
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted", "version": version}))
    torch.save({"server": {"version": version}}, run_dir / "checkpoint.pt")
    record = folder.incoming_record(run_dir)           # what Hydra wrote for this launch
    record.mkdir()
    (record / "hydra.yaml").write_text("hydra:\n  run:\n    dir: x\n  mode: "
                                       + ("MULTIRUN" if grid else "RUN") + "\n")
    return run_dir


def test_a_grid_points_refusal_says_resume_auto_and_names_its_folder(tmp_path):
    run_dir = _interrupted(tmp_path / "results" / "fig3" / "nsync=4,seed=0", grid=True)
    with pytest.raises(ConfigError) as refused:
        folder.decide(RunConfig(), run_dir)
    text = str(refused.value)
    assert "resume=auto" in text and str(run_dir) in text
    assert "resume=true would refuse" in text             # what following the old hint did
    hint = folder.resume_hint(run_dir)
    assert "resume=auto" in hint and str(run_dir) in hint and "version 12" in hint


def test_a_single_runs_refusal_still_says_resume_true(tmp_path):
    run_dir = _interrupted(tmp_path / "run", grid=False)
    with pytest.raises(ConfigError, match="resume=true continues it") as refused:
        folder.decide(RunConfig(), run_dir)
    assert str(run_dir) in str(refused.value) and "resume=auto" not in str(refused.value)
    assert folder.resume_hint(run_dir) == "resume=true continues from version 12"


@pytest.mark.slow
def test_after_ctrl_c_on_a_grid_the_same_command_says_resume_auto(tmp_path):
    """End to end: Ctrl-C a grid, run its command again: the refusal names the folder and says
    resume=auto, and resume=auto then finishes every point."""
    cmd = [sys.executable, "-m", "repro.run", "+exp=fig1", "num_epochs=60", "eval_every=5",
           "checkpoint_every=50", "hydra/launcher=basic", "progress=false",
           f"results_dir={tmp_path / 'results'}", f"figures_dir={tmp_path / 'figures'}",
           "hydra.sweeper.params.seed='0,1'"]
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "results" / "fig1").glob("*/checkpoint.pt")):
            assert time.monotonic() < deadline and proc.poll() is None, "the grid never started"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    refusal = [line for line in again.stderr.splitlines() if line.startswith("error:")]
    assert refusal and "resume=auto" in refusal[0] and str(tmp_path / "results" / "fig1") in refusal[0]
    done = subprocess.run(cmd + ["resume=auto"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = [json.loads(p.read_text())["status"]
                for p in (tmp_path / "results" / "fig1").glob("*/summary.json")]
    assert statuses == ["completed", "completed"]


# ---------------------------------------------------------------------------------------------
# §5: smaller things
# ---------------------------------------------------------------------------------------------

def test_a_word_that_is_not_key_value_exits_2_naming_it(monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "num_clients", "4")
    assert proc.returncode == 2, proc.stderr
    assert "'num_clients' is not an override" in proc.stderr and "num_clients=4" in proc.stderr


def test_a_setting_given_twice_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as stop:
        check_overrides(["nsync=4", "nsync=8"])
    assert stop.value.code == 2 and "'nsync' is set twice" in capsys.readouterr().err
    # flags and their values, and Hydra's own settings given again, are not refused
    check_overrides(["--cfg", "job", "nsync=4", "hydra.sweeper.params.seed='0'",
                     "hydra.sweeper.params.seed='1'"])


def test_simulate_cleans_up_its_temporary_folder_and_keys_time_to_target_by_number(tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    y = (x[:, 0] > 0).long()
    result = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=2, nsync=2, num_epochs=2,
                          lr=0.1, momentum=0.0, cost="uniform", target_error=0.4)
    assert list(tmp_path.iterdir()) == []                 # nothing left behind
    assert result.run_dir is None and len(result.evals) and len(result.updates)
    assert set(result.summary["time_to_target"]) == {0.4}
    kept = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=2, nsync=2, num_epochs=2,
                        target_error=0.4, run_dir=tmp_path / "kept")
    assert kept.run_dir == tmp_path / "kept" and (kept.run_dir / "summary.json").is_file()
    on_disk = json.loads((kept.run_dir / "summary.json").read_text())["time_to_target"]
    assert list(on_disk) == ["0.4"]                       # the file's JSON is as it was


def test_the_docs_give_one_two_thread_command_and_one_statement_of_its_difference():
    # the README's reproducibility section moved to docs/paper.md (issue 33)
    readme, reproduce = ((ROOT / n).read_text() for n in ("docs/paper.md", "REPRODUCE.md"))
    pick = lambda text: [line for line in text.splitlines()           # noqa: E731
                         if line.startswith("python -m repro.run") and "num_threads=2" in line]
    assert pick(readme) == pick(reproduce) and "hydra/launcher=basic" in pick(readme)[0]
    # the size of the difference is stated once, in REPRODUCE.md, not again (and differently)
    sizes = re.compile(r"\d+(\.\d+)? points? of training error")
    assert not sizes.search(readme) and sizes.search(reproduce)
