"""A command line whose run folder's name would pass 255 bytes (issue 32, item 12).

``cost.speeds`` for 64 clients names a folder of over 300 bytes: it died with a raw ``OSError:
File name too long`` (exit 1) and left an empty folder. Such a folder now gets a short name (a
readable prefix and a hash of the whole), and config.json records the overrides it stands for;
an ``exp_name`` too long for one folder is refused (exit 2) before any folder is made.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repro.config.loader import job_name

from tests.helpers.grids import cli_run
from tests.helpers.paths import ROOT

SPEEDS = "cost.speeds=[" + ",".join(["1.25"] * 64) + "]"
SMALL = ["data=synthetic", "model=mlp", "num_clients=64", "num_epochs=0.5", "nsync=1", "progress=false"]


def repro_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "repro.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})


def test_a_long_name_is_shortened_readably_and_uniquely():
    full = ",".join(sorted([SPEEDS, "num_clients=64"]))
    name = job_name([SPEEDS, "num_clients=64"])
    assert len(name.encode()) <= 255 and name.startswith("cost.speeds=[1.25,1.25")
    other = job_name([SPEEDS.replace("1.25]", "1.5]"), "num_clients=64"])
    assert other != name and other.rsplit("-", 1)[0] == name.rsplit("-", 1)[0]   # the hash tells them apart
    assert job_name([SPEEDS, "num_clients=64"]) == name                        # and finds it again
    assert len(full.encode()) > 255
    assert job_name(["nsync=4", "num_clients=2"]) == "nsync=4,num_clients=2"   # short names unchanged


@pytest.mark.slow
def test_a_single_run_with_a_long_name_runs_and_records_its_overrides(tmp_path):
    done = repro_run(f"results_dir={tmp_path}", *SMALL, SPEEDS)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = (tmp_path / "default").iterdir()
    assert len(folder.name.encode()) <= 255 and folder.name.startswith("cost.speeds=[1.25")
    config = json.loads((folder / "config.json").read_text())
    shaping = sorted(a for a in [*SMALL, SPEEDS] if not a.startswith("progress"))
    assert config["overrides"] == ",".join(shaping) and len(config["cost"]["speeds"]) == 64
    again = repro_run(f"results_dir={tmp_path}", *SMALL, SPEEDS)   # the same folder: skipped
    assert again.returncode == 0 and "already completed" in again.stdout + again.stderr


@pytest.mark.slow
def test_grid_points_with_long_names_each_get_a_folder_of_their_own(tmp_path):
    done = repro_run("-m", f"results_dir={tmp_path}", "exp_name=long", *SMALL, SPEEDS, "seed=0,1")
    assert done.returncode == 0, done.stderr[-2000:]
    folders = sorted(p.parent for p in (tmp_path / "long").glob("*/summary.json"))
    assert len(folders) == 2 and all(len(f.name.encode()) <= 255 for f in folders)
    recorded = [json.loads((f / "config.json").read_text())["overrides"] for f in folders]
    assert sorted(r.rsplit(",", 1)[1] for r in recorded) == ["seed=0", "seed=1"]


def test_an_exp_name_too_long_for_a_folder_exits_2_naming_it(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    done = cli_run(monkeypatch, capsys, f"results_dir={tmp_path}", *SMALL, "exp_name=" + "x" * 300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "'exp_name'" in done.stderr and "255 bytes" in done.stderr and "hydra.run.dir" in done.stderr
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
