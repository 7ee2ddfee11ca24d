"""Replay input (issue 16, section 5): a recording a replay cannot apply is refused before the
first push, naming the file, the line and what is wrong; a replay of an unfinished recording says
so; a replay never writes into its own recording.

The recordings are simulator runs (the same updates.csv as a real run's, and seconds to make)."""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
from pathlib import Path

import pytest

from repro.config.checks import validated
from repro.config.settings import BackendConfig, CostConfig, DataConfig, RunConfig
from repro.errors import ConfigError
from repro.sim.driver import simulate

from tests.helpers.grids import cli_run

CFG = RunConfig(num_clients=2, nsync=1, num_epochs=2.0, eval_every=1.0, progress=False,
                data=DataConfig(num_train=256, num_test=64))


def replay_cfg(source: Path, **changes) -> RunConfig:
    return CFG.replace(cost=CostConfig(profile="replay", schedule="replay", path=str(source)), **changes)


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recording")
    assert simulate(CFG.replace(results_dir=str(root)), root / "run")["status"] == "completed"
    return root / "run"


def copy_of(recording: Path, dest: Path) -> Path:
    shutil.copytree(recording, dest, ignore=shutil.ignore_patterns(".lock"))
    return dest


def edit_rows(run: Path, edit) -> None:
    """Rewrite updates.csv with ``edit(rows)`` (a list of dicts, changed in place or replaced)."""
    path = run / "updates.csv"
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns, rows = reader.fieldnames, list(reader)
    rows = edit(rows) or rows
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def set_row(index: int, **values):
    def edit(rows):
        rows[index].update({k: str(v) for k, v in values.items()})
    return edit


BAD_ROWS = {
    "zero_steps": (set_row(3, num_steps=0), "line 5 has num_steps 0"),
    "negative_steps": (set_row(3, num_steps=-5), "line 5 has num_steps -5"),
    "unknown_client": (set_row(3, client=7), "line 5 names client 7"),
    "nan_time": (set_row(3, time_s=math.nan), "line 5 has time_s nan"),
    "negative_time": (set_row(0, time_s=-1.0), "line 2 has time_s -1.0"),
    "time_going_back": (set_row(5, time_s=0.0), "earlier than the row before"),
    "wrong_read_version": (set_row(4, read_version=0), "line 6 says client"),
    "version_gap": (lambda rows: rows[:3] + rows[4:], "has version 5 where 4 belongs"),
    "no_rows": (lambda rows: rows.clear(), "at least one push"),
    "cut_but_completed": (lambda rows: rows[:3], "holds 3 rows"),   # the summary counts them all
}


@pytest.mark.parametrize("name", BAD_ROWS)
def test_a_recording_with_a_bad_row_is_refused_before_the_first_push(recording, tmp_path, name):
    edit, expected = BAD_ROWS[name]
    source = copy_of(recording, tmp_path / "source")
    edit_rows(source, edit)
    out = tmp_path / "replay"
    with pytest.raises(ConfigError) as err:
        simulate(replay_cfg(source), out)
    assert err.value.key == "cost.path" and expected in str(err.value), str(err.value)
    assert not out.exists()                          # refused before any folder was made


@pytest.mark.timeout(30)   # a FIFO's read waits for a writer for good: the old code hung here
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_recording_whose_updates_csv_is_not_a_file_is_refused_without_opening_it(recording, tmp_path, kind):
    source = copy_of(recording, tmp_path / "source")
    (source / "updates.csv").unlink()
    os.mkfifo(source / "updates.csv") if kind == "fifo" else (source / "updates.csv").mkdir()
    with pytest.raises(ConfigError) as err:
        simulate(replay_cfg(source), tmp_path / "replay")
    assert err.value.key == "cost.path" and "updates.csv is not a regular file" in str(err.value), str(err.value)
    assert not (tmp_path / "replay").exists()


@pytest.mark.parametrize("status", ["running", "interrupted", None])
def test_a_replay_of_an_unfinished_recording_says_so(recording, tmp_path, status):
    """A running (killed), interrupted or summary-less recording cut after 5 pushes replays
    those 5 pushes, and its summary says the recording was unfinished, not just 'completed'."""
    source = copy_of(recording, tmp_path / "source")
    edit_rows(source, lambda rows: rows[:5])
    if status is None:
        (source / "summary.json").unlink()
    else:
        summary = json.loads((source / "summary.json").read_text())
        (source / "summary.json").write_text(json.dumps({**summary, "status": status, "version": 5}))
    result = simulate(replay_cfg(source), tmp_path / "replay")
    assert result["version"] == 5
    assert "unfinished recording" in result["message"] and "before the budget" in result["message"]
    said = f"summary says {status}" if status else "no summary.json"
    assert said in result["message"], result["message"]


def test_a_finished_recording_replays_to_its_end_without_a_message(recording, tmp_path):
    result = simulate(replay_cfg(recording), tmp_path / "replay")
    assert result["status"] == "completed" and result["message"] == ""
    assert (tmp_path / "replay" / "updates.csv").read_text().count("\n") == \
        (recording / "updates.csv").read_text().count("\n")


def test_a_replay_of_another_recording_is_refused_not_skipped_as_the_one_its_folder_holds(recording, tmp_path):
    """Two recordings of the same settings (a real run's order differs run to run; here one cut
    after 5 pushes) replayed into one folder: the second was skipped as 'already completed' and
    its numbers were the first's, without a word. The same recording, however spelled, still is."""
    other = copy_of(recording, tmp_path / "other")
    edit_rows(other, lambda rows: rows[:5])
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "status": "interrupted", "version": 5}))
    first = simulate(replay_cfg(recording), tmp_path / "replay")
    with pytest.raises(ConfigError, match="cost.path: .*->.*other"):
        simulate(replay_cfg(other), tmp_path / "replay")
    assert simulate(replay_cfg(Path(f"{recording}/.")), tmp_path / "replay")["version"] == first["version"]
    assert simulate(replay_cfg(other), tmp_path / "replay2")["version"] == 5


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["itself", "inside"])
def test_a_replay_never_writes_into_its_own_recording(recording, tmp_path, where):
    """force=true on the recording's own folder used to delete the recording and write an empty run."""
    source = copy_of(recording, tmp_path / "source")
    before = snapshot(source)
    out = source if where == "itself" else source / "sub"
    with pytest.raises(ConfigError) as err:
        simulate(replay_cfg(source, force=True), out)
    assert err.value.key == "cost.path" and ("the recording itself" if where == "itself" else "inside it") in str(err.value)
    assert snapshot(source) == before


def test_cli_replay_into_its_source_exits_2_and_touches_nothing(recording, tmp_path, monkeypatch, capsys):
    source = copy_of(recording, tmp_path / "source")
    before = snapshot(source)
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "cost=replay", f"cost.path='{source}'", f"hydra.run.dir='{source}'",
                   "force=true", "progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cost.path" in proc.stderr and "the recording itself" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(source) == before


def test_cli_replay_of_a_run_simulate_made_on_the_callers_own_problem_says_why_it_cannot(tmp_path, monkeypatch, capsys):
    # it said only "invalid value for 'data.name': 'custom:...'; expected one of: 'cifar10', ...":
    # the recording's data and module are the notebook's, which no replay can load
    import torch

    from repro import api
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(0))
    api.simulate(torch.nn.Linear(6, 2), (x, (x[:, 0] > 0).long()), (x, (x[:, 0] > 0).long()), num_epochs=1,
                 nsync=1, run_dir=tmp_path / "custom")
    proc = cli_run(monkeypatch, capsys, "cost=replay", f"cost.path='{tmp_path / 'custom'}'",
                   f"hydra.run.dir='{tmp_path / 'replay'}'", "progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'cost.path'" in proc.stderr and "repro.api.simulate" in proc.stderr and "own data and module" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "replay" / "summary.json").exists()


@pytest.mark.parametrize("typed,said", [
    ("num_clients=5", "'num_clients': 5; expected the recording's num_clients 2"),
    ("seed=3", "'seed': 3; expected the recording's seed 0"),
    ("model=mlp", "'model': 'mlp'; expected the recording's model.name 'digits_cnn'"),
    # named the folder and changed nothing: a global group the replay overrules, a cost model's key
    ("+partition=by_class", "'+partition': 'by_class'; expected the recording's data.partition 'iid'"),
    ("+mitigation=dcasgd", "'+mitigation': 'dcasgd'; expected the recording's algo."),
    ("+exp=smoke", "'+exp': 'smoke'; expected the recording's nsync 1"),   # smoke's nsync=2, unchecked
    ("cost.compute_s=0.5", "'cost.compute_s': 0.5; expected left out: a replay has no cost model"),
    ("cost.latency_s=0.001", "'cost.latency_s': 0.001; expected left out"),
])
def test_cli_a_typed_setting_the_recording_overrules_is_refused_naming_both_values(recording, tmp_path, monkeypatch,
                                                                                   capsys, typed, said):
    """``cost=replay cost.path=<a 2-client recording> num_clients=5`` trained the recording's 2 clients
    in a folder named ``cost=replay,num_clients=5``, without a word."""
    proc = cli_run(monkeypatch, capsys, "cost=replay", f"cost.path='{recording}'", typed,
                   f"results_dir='{tmp_path}'", "exp_name=replay", "progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "replay").exists()


def test_cli_a_replay_takes_typed_settings_it_keeps_or_that_say_the_recordings_values(recording, tmp_path,
                                                                                      monkeypatch, capsys):
    proc = cli_run(monkeypatch, capsys, "cost=replay", f"cost.path='{recording}'", "num_clients=2", "seed=0",
                   "backend=sim", "device=cpu", "num_threads=1", f"results_dir='{tmp_path}'", "exp_name=replay",
                   "progress=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "replay" / "backend=sim,cost=replay,device=cpu,num_clients=2,num_threads=1,seed=0"
    assert (run / "updates.csv").read_bytes() == (recording / "updates.csv").read_bytes()


def test_cli_a_replay_splits_the_data_as_its_recording_did_for_the_slow_clients_classes(tmp_path, monkeypatch,
                                                                                         capsys):
    """A recording of ``data.slow_client_classes=[0,1] cost.straggler_client=2`` (classes client 2 alone
    holds): its replay took the command line's cost, which names no slow client, and was refused
    advising cost.straggler_client; typed so, any client was taken (``cost.straggler_client=1`` trained
    another split, in silence). The slow client is the recording's: the replay computes its numbers,
    and a typed slow client other than the recording's is refused."""
    cfg = CFG.replace(data=DataConfig(num_train=256, num_test=64, slow_client_classes=(0, 1)),
                      cost=CostConfig(straggler_client=2))
    assert simulate(cfg, tmp_path / "rec")["status"] == "completed"
    common = ("cost=replay", f"cost.path='{tmp_path / 'rec'}'", "progress=false")
    proc = cli_run(monkeypatch, capsys, *common, f"hydra.run.dir='{tmp_path / 'replay'}'")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "replay" / "updates.csv").read_bytes() == (tmp_path / "rec" / "updates.csv").read_bytes()
    proc = cli_run(monkeypatch, capsys, *common, "cost.straggler_client=1", f"hydra.run.dir='{tmp_path / 'other'}'")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'cost.straggler_client': 1; expected the recording's cost.straggler_client 2" in proc.stderr, proc.stderr
    assert not (tmp_path / "other").exists()


def test_cli_a_replay_takes_a_global_group_that_sets_the_recordings_values(tmp_path, monkeypatch, capsys):
    """``+partition=dirichlet_1`` beside cost=replay of a by_class recording replayed by_class in a
    folder named ``+partition=dirichlet_1``; the group the recording ran with is its own values."""
    assert simulate(CFG.replace(data=DataConfig(num_train=256, num_test=64, partition="by_class")),
                    tmp_path / "rec")["status"] == "completed"
    common = ("cost=replay", f"cost.path='{tmp_path / 'rec'}'", "progress=false", "cost.schedule=replay")
    proc = cli_run(monkeypatch, capsys, *common, "+partition=by_class", f"hydra.run.dir='{tmp_path / 'replay'}'")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "replay" / "updates.csv").read_bytes() == (tmp_path / "rec" / "updates.csv").read_bytes()
    proc = cli_run(monkeypatch, capsys, *common, "+partition=dirichlet_1", f"hydra.run.dir='{tmp_path / 'other'}'")
    assert proc.returncode == 2 and "'+partition': 'dirichlet_1'; expected the recording's data.partition " \
        "'by_class', data.alpha 0.5" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "other").exists()


def test_cli_a_replay_takes_an_experiment_that_sets_the_recordings_values(tmp_path, monkeypatch, capsys):
    """``+exp=NAME`` beside cost=replay was never checked against the recording (a global group's
    keys are, since +partition's): each key the experiment sets must be the recording's. +exp=smoke
    (2 clients, nsync 2, 2 epochs) replays a recording of those; of nsync 1 it is refused above."""
    assert simulate(CFG.replace(nsync=2), tmp_path / "rec")["status"] == "completed"
    proc = cli_run(monkeypatch, capsys, "cost=replay", f"cost.path='{tmp_path / 'rec'}'", "progress=false",
                   "+exp=smoke", f"hydra.run.dir='{tmp_path / 'replay'}'")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "replay" / "updates.csv").read_bytes() == (tmp_path / "rec" / "updates.csv").read_bytes()


def test_an_experiments_keys_include_those_of_the_global_groups_it_builds_on():
    """+exp=ceiling builds on /problem: quadratic (data, model, algo): its keys were 'problem',
    which names no key, so a replay compared none of the problem's."""
    from repro.sim.replay import option_keys

    assert {"data", "model", "algo", "algo.batch_size", "algo.lr"} <= set(option_keys("exp", "ceiling"))
    assert option_keys("exp", "smoke") == ["exp_name", "num_clients", "nsync", "num_epochs", "eval_every"]


def test_cli_a_grid_of_replays_refuses_each_point_the_recording_overrules(recording, tmp_path, monkeypatch, capsys):
    proc = cli_run(monkeypatch, capsys, "-m", "cost=replay", f"cost.path='{recording}'", "num_clients=2,5",
                   f"results_dir='{tmp_path}'", "exp_name=replay", "progress=false")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "num_clients=5 not run: invalid value for 'num_clients': 5" in proc.stderr, proc.stderr
    assert [p.name for p in (tmp_path / "replay").iterdir() if p.is_dir()] == ["cost=replay,num_clients=2"]


def test_cli_a_replay_of_another_recording_into_a_replays_folder_is_told_to_take_another_exp_name(
        recording, tmp_path, monkeypatch, capsys):
    """Two replays of different recordings land in one folder (``<exp>/cost=replay``): the second was
    refused advising only force=true, which deletes the first replay; another exp_name keeps both."""
    other = copy_of(recording, tmp_path / "other")   # another folder: another recording (a second real run)
    common = (f"results_dir='{tmp_path}'", "cost=replay", "progress=false")
    assert cli_run(monkeypatch, capsys, *common, f"cost.path='{recording}'", "exp_name=replay").returncode == 0
    first = snapshot(tmp_path / "replay")
    proc = cli_run(monkeypatch, capsys, *common, f"cost.path='{other}'", "exp_name=replay")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cost.path: " in proc.stderr and "another exp_name or hydra.run.dir" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and snapshot(tmp_path / "replay") == first
    assert cli_run(monkeypatch, capsys, *common, f"cost.path='{other}'", "exp_name=replay2").returncode == 0


def test_a_replay_under_the_real_backend_is_refused_naming_it(recording, tmp_path):
    """``backend=real cost=replay cost.path=REC`` ran a real run of the command line's own config
    (4 clients, 20 epochs: the defaults), its recording never read, without a word."""
    with pytest.raises(ConfigError, match="'backend': 'real'; expected sim with cost=replay"):
        validated(replay_cfg(recording, backend=BackendConfig(name="real")))
