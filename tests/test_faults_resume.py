"""Guarantees 2, 3 and 6: what ``resume`` and a re-run refuse. A finished run is never changed by
resume (2); resume checks the configuration (3); starting an unfinished run over is never
silent (6).

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

import repro.runs.folder
import repro.runs.runlog
from repro.asgd.algorithm import Push
from repro.asgd.protocols import _push_state
from repro.config.settings import AlgoConfig, ModelConfig
from repro.errors import ConfigError
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.grids import cli_run
from tests.helpers.runs import CLI_ARGS, SIM, STOP_AT, cli_cfg
from tests.helpers.tables import changed, snapshot, summary_of, table_bytes


# ---------------------------------------------------------------------------------------------
# 2. A finished run is never changed by resume
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,status", [
    (SIM.replace(checkpoint_every=0), "completed"),
    (SIM.replace(checkpoint_every=0, algo=AlgoConfig(lr=1e6, momentum=0.0)), "diverged"),
], ids=["completed", "diverged"])
def test_2_finished_run_is_never_changed_by_resume(tmp_path, cfg, status):
    """Fault: ``resume=true`` (and a plain re-run) on a folder whose run finished. Guarantee 2:
    the summary comes back as it is on disk and no file changes (bytes and mtimes); the run wrote
    a final checkpoint although checkpoint_every=0, loadable with weights_only=True."""
    run_dir = tmp_path / "run"
    assert simulate(cfg, run_dir)["status"] == status
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["server"]["version"] == summary_of(run_dir)["version"]
    before, on_disk = snapshot(run_dir), summary_of(run_dir)
    for again in (cfg.replace(resume=True), cfg):
        assert simulate(again, run_dir) == on_disk
        assert changed(before, snapshot(run_dir)) == []
    check_run_folder(run_dir, status)


# ---------------------------------------------------------------------------------------------
# 3. Resume checks the configuration
# ---------------------------------------------------------------------------------------------

CHANGES = {
    "num_clients": ({"num_clients": 2}, ["num_clients: 3 -> 2"]),
    "nsync": ({"nsync": 3}, ["nsync: 2 -> 3"]),
    "algo.lr": ({"algo": AlgoConfig(lr=0.1, momentum=0.5)}, ["algo.lr: 0.05 -> 0.1"]),
    "model": ({"model": ModelConfig(name="digits_cnn")}, ["model.name: 'mlp' -> 'digits_cnn'"]),
    "all four": ({"num_clients": 2, "nsync": 3, "algo": AlgoConfig(lr=0.1, momentum=0.5),
                  "model": ModelConfig(name="digits_cnn")},
                 ["num_clients: 3 -> 2", "nsync: 2 -> 3", "algo.lr: 0.05 -> 0.1",
                  "model.name: 'mlp' -> 'digits_cnn'"]),
}


@pytest.mark.parametrize("name", list(CHANGES))
def test_3_resume_with_other_settings_is_refused(interrupted, reference, name):
    """Fault: ``resume=true`` with other training-shaping settings than the interrupted run's.
    Guarantee 3: ConfigError listing every difference (recorded -> now); no file in the folder
    changes; the right settings then resume it to the uninterrupted run's tables."""
    change, expected = CHANGES[name]
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=True, **change), interrupted)
    for diff in expected:
        assert diff in str(err.value), str(err.value)
    assert changed(before, snapshot(interrupted)) == []
    assert simulate(SIM.replace(resume=True), interrupted)["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


def test_3_resume_of_a_run_recorded_with_a_key_this_version_lacks_is_refused(interrupted, reference):
    """Fault: the interrupted run's config.json holds a key this version has no setting for (another
    version wrote it, or a hand edit). The resume went on without it, silently, and rewrote
    config.json without it, so even the analysis's warning about the key was gone. Guarantee 3:
    refused naming the key, nothing changed; a key the recording lacks (an older version's) is
    this version's default, as before, and resumes."""
    path = interrupted / "config.json"
    recorded = json.loads(path.read_text())
    recorded["algo"]["nesterov"] = True
    del recorded["warm_start_epochs"]
    path.write_text(json.dumps(recorded))
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=True), interrupted)
    assert str(err.value).endswith("(recorded -> now): algo.nesterov: True -> (no such key in this version)")
    assert changed(before, snapshot(interrupted)) == []
    del recorded["algo"]["nesterov"]
    path.write_text(json.dumps(recorded))
    assert simulate(SIM.replace(resume=True), interrupted)["status"] == "completed"
    assert table_bytes(interrupted) == reference


def test_3_resume_of_a_calibrated_run_keeps_its_measured_step_time(tmp_path, monkeypatch):
    """Fault: ``resume=true`` of a run whose step time was measured (``cost.compute_s=calibrate``,
    as cost=local sets), on a machine that now measures another. Guarantee 3: the resume takes
    the step time recorded in its checkpoint (no second measurement), so it is byte-identical to
    the uninterrupted run of that step time; config.json keeps the measured value."""
    from repro.sim import driver

    measured = [0.01, 0.01, 0.03]   # the whole run's, the cut run's, a resume's if it measured
    monkeypatch.setattr(driver, "calibrate_compute_s", lambda step: (step(), measured.pop(0))[1])
    cfg = SIM.replace(cost=dataclasses.replace(SIM.cost, compute_s="calibrate"))
    assert simulate(cfg, tmp_path / "whole")["status"] == "completed"
    assert simulate(cfg, tmp_path / "cut", stop_at_version=STOP_AT)["status"] == "interrupted"
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    assert measured == [0.03]   # measured twice, not at the resume
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
    assert json.loads((tmp_path / "cut" / "config.json").read_text())["cost"]["compute_s"] == 0.01
    check_run_folder(tmp_path / "cut", "completed")


@pytest.mark.parametrize("resume", [False, True, "auto"])
def test_3_a_run_whose_config_json_is_cut_is_refused_naming_what_was_typed(interrupted, resume):
    """Fault: the interrupted run's config.json cut short. resume=auto was refused as "invalid
    value for 'resume': True", and a re-run without resume advised 'resume=true continues it',
    which then refused. Guarantee 3: each is refused naming what the user typed and config.json,
    with the one way on that works (force=true); nothing changes."""
    path = interrupted / "config.json"
    good = path.read_bytes()
    path.write_bytes(good[:100])
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=resume), interrupted)
    message = str(err.value)
    typed = f"'resume': {resume!r}" if resume else f"'run folder': {str(interrupted)!r}"
    assert message.startswith(f"invalid value for {typed}; expected a readable {path}"), message
    assert "resume=true" not in message and message.endswith("force=true starts over"), message
    assert changed(before, snapshot(interrupted)) == []
    path.write_bytes(good)
    check_run_folder(interrupted, "interrupted")


@pytest.mark.parametrize("resume", [True, "auto"])
def test_3_a_checkpoint_the_protocol_refuses_is_refused_naming_what_was_typed(tmp_path, resume):
    """Fault: a sync run's checkpoint holding a half-full round as an older version wrote it
    (its waiting clients, no pushes). Sync's own check knows no cfg and names resume=True, which
    was said for resume=auto too (the tables' and checkpoint's checks were mended one by one).
    Guarantee 3: the refusal names what the user typed."""
    cfg = SIM.replace(protocol=dataclasses.replace(SIM.protocol, name="sync"))
    assert simulate(cfg, tmp_path, stop_at_version=2)["status"] == "interrupted"   # (a round: one version)
    path = tmp_path / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    state["protocol"] = {**{k: v for k, v in state["protocol"].items() if k != "pushes"}, "waiting": [1]}
    torch.save(state, path)
    with pytest.raises(ConfigError, match=rf"^invalid value for 'resume': {resume!r}; expected a checkpoint of "
                                          "this version"):
        simulate(cfg.replace(resume=resume), tmp_path)


def _an_old_round(protocol: dict) -> None:   # a half-full round as an older version kept it: no pushes
    protocol["waiting"] = [1]
    del protocol["pushes"]


def _a_push_type_gone(protocol: dict) -> None:   # a held push of a type that no longer imports
    update = torch.zeros(3)
    push = Push(client=1, read_version=2, update=update, num_steps=2, num_samples=64, train_loss=1.0,
                train_error=0.5, stream_position=(0, 64))
    protocol["pushes"] = {"1": {**_push_state(push), "type": "gone_module:GonePush"}}


@pytest.mark.parametrize("damage,said", [
    (_an_old_round, "invalid value for 'resume': True; expected a checkpoint of this version (this one holds a "
                    "half-full sync round summed in arrival order, written by an older version); force=true "
                    "starts the run over"),
    (_a_push_type_gone, "gone_module:GonePush"),
], ids=["old round", "push type gone"])
def test_3_a_checkpoint_the_protocol_refuses_leaves_the_folder_as_it_was(tmp_path, monkeypatch, capsys, damage, said):
    """Fault: ``resume=true`` of an interrupted sync run whose checkpoint holds a round the protocol
    refuses (as an older version wrote it; a held push whose type no longer imports). The protocol
    read its state only as the run began: config.json was rewritten by then and the refusal wrote a
    'failed' summary, so the interrupted run's folder changed although nothing resumed. Guarantee 3:
    refused as before (exit 2, one line), before any file changes: every file byte-identical, the
    run still 'interrupted', and it resumes once the checkpoint is one this version reads."""
    run_dir = tmp_path / "run"
    assert simulate(cli_cfg("protocol=sync"), run_dir, stop_at_version=2)["status"] == "interrupted"
    good = (run_dir / "checkpoint.pt").read_bytes()
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    damage(state["protocol"])
    torch.save(state, run_dir / "checkpoint.pt")
    files = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    assert {"config.json", "summary.json", "updates.csv", "evals.csv", "timings.csv", "checkpoint.pt"} <= set(files)
    args = (f"hydra.run.dir={run_dir}", *CLI_ARGS, "protocol=sync", "resume=true")
    proc = cli_run(monkeypatch, capsys, *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if said in line]) == 1, proc.stderr
    assert {name: (run_dir / name).read_bytes() for name in files} == files
    check_run_folder(run_dir, "interrupted")
    (run_dir / "checkpoint.pt").write_bytes(good)
    assert cli_run(monkeypatch, capsys, *args).returncode == 0
    check_run_folder(run_dir, "completed")


@pytest.mark.parametrize("damage", ["checkpoint", "table"])
def test_3_a_refused_resume_leaves_no_hydra_record_in_the_folder(tmp_path, monkeypatch, capsys, damage):
    """Fault: a command-line resume refused by the checkpoint's or the tables' checks moved its launch's
    Hydra record in as the folder's ``.hydra`` first (run_folder adopted it before the driver read the
    checkpoint), so a refused resume left its overrides (``resume=true``) as the folder's record, or
    replaced the record of the run that wrote the folder. Guarantee 3: nothing of the refused launch stays."""
    run_dir = tmp_path / "run"
    assert simulate(cli_cfg("protocol=sync"), run_dir, stop_at_version=2)["status"] == "interrupted"
    if damage == "checkpoint":
        state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
        _an_old_round(state["protocol"])
        torch.save(state, run_dir / "checkpoint.pt")
    else:
        (run_dir / "evals.csv").write_bytes(b"x" + (run_dir / "evals.csv").read_bytes())
    before = sorted(p.name for p in run_dir.iterdir())
    proc = cli_run(monkeypatch, capsys, f"hydra.run.dir={run_dir}", *CLI_ARGS, "protocol=sync", "resume=true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before   # no .hydra, no .hydra_incoming_PID


def _another_backends_checkpoint(run_dir: Path) -> None:
    path = run_dir / "checkpoint.pt"
    torch.save({**torch.load(path, weights_only=True), "kind": "real"}, path)


DAMAGED = {   # what the checks of the tables and of the checkpoint refuse, and what they say
    "header": (lambda d: (d / "updates.csv").write_bytes(b"x" + (d / "updates.csv").read_bytes()), "intact updates"),
    "row": (lambda d: (d / "evals.csv").write_bytes((d / "evals.csv").read_bytes()[:-9] + b"\n"), "line "),
    "backend": (_another_backends_checkpoint, "written by the 'real' backend"),
}


@pytest.mark.parametrize("resume", [True, "auto"])
@pytest.mark.parametrize("damage", list(DAMAGED))
def test_3_a_damaged_table_or_checkpoint_is_refused_naming_what_was_typed(interrupted, damage, resume):
    """Fault: the interrupted run's tables or checkpoint damaged. resume=auto was refused as
    "invalid value for 'resume': True" (the checks knew no config). Guarantee 3: the refusal
    names what the user typed; nothing changes."""
    make, expected = DAMAGED[damage]
    good = {name: (interrupted / name).read_bytes() for name in ("updates.csv", "evals.csv", "checkpoint.pt")}
    make(interrupted)
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=resume), interrupted)
    message = str(err.value)
    assert message.startswith(f"invalid value for 'resume': {resume!r}; expected ") and expected in message, message
    assert changed(before, snapshot(interrupted)) == []
    for name, data in good.items():
        (interrupted / name).write_bytes(data)
    check_run_folder(interrupted, "interrupted")


# ---------------------------------------------------------------------------------------------
# 6. Starting over is never silent
# ---------------------------------------------------------------------------------------------

def _as_killed(run_dir: Path, running_summary: bytes) -> None:
    (run_dir / "summary.json").write_bytes(running_summary)


def _as_failed(run_dir: Path, running_summary: bytes) -> None:
    summary = summary_of(run_dir)
    summary.update(status="failed", message="RuntimeError: boom; resume=true continues from version 20")
    (run_dir / "summary.json").write_text(json.dumps(summary))


FOLDER_STATES = [
    pytest.param(None, "an interrupted run", id="interrupted"),
    # found by this suite: the refusal named the killed run's stale summary version (0)
    pytest.param(_as_killed, "a killed run", id="killed"),
    pytest.param(_as_failed, "a failed run", id="failed"),
]


@pytest.mark.parametrize("make,what", FOLDER_STATES)
def test_6_rerun_of_an_unfinished_run_needs_resume_or_force(tmp_path, monkeypatch, reference, make, what):
    """Fault: re-running, without resume or force, a folder holding an unfinished run
    (interrupted; killed: its summary still the 'running' one written at the start; failed).
    Guarantee 6: ConfigError saying 'resume=true continues it, force=true starts over' and
    naming the version reached (20); nothing changes; force=true then starts over from
    version 0 and gives the uninterrupted run's tables."""
    written = {}
    init = repro.runs.runlog.RunLog.__init__

    def keep_first_summary(self, *args, **kwargs):   # the summary a SIGKILLed run leaves
        init(self, *args, **kwargs)
        written.setdefault("running", (self.run_dir / "summary.json").read_bytes())

    monkeypatch.setattr(repro.runs.runlog.RunLog, "__init__", keep_first_summary)
    run_dir = tmp_path / "run"
    simulate(SIM, run_dir, stop_at_version=STOP_AT)
    monkeypatch.undo()
    if make is not None:
        make(run_dir, written["running"])
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as err:
        simulate(SIM, run_dir)
    message = str(err.value)
    assert "resume=true continues it, force=true starts over" in message and what in message, message
    assert changed(before, snapshot(run_dir)) == []
    assert f"version {STOP_AT}" in message, message
    summary = simulate(SIM.replace(force=True), run_dir)
    assert summary["status"] == "completed" and not any(e["type"] == "resumed" for e in summary["events"])
    assert table_bytes(run_dir) == reference
    check_run_folder(run_dir, "completed")


def test_6_rerun_of_a_run_killed_before_its_first_checkpoint_does_not_advise_resume(tmp_path):
    """Fault: a run killed before it wrote checkpoint.pt, re-run without resume or force: the
    refusal said 'resume=true continues it', and resume=true then refused (no checkpoint).
    Guarantee 6: the refusal says there is no checkpoint and that force=true starts over."""
    run_dir = tmp_path / "run"
    simulate(SIM, run_dir, stop_at_version=STOP_AT)
    (run_dir / "checkpoint.pt").unlink()
    with pytest.raises(ConfigError) as err:
        simulate(SIM, run_dir)
    message = str(err.value)
    assert "resume=true" not in message and "no checkpoint.pt" in message, message
    assert "force=true starts over" in message and f"version {STOP_AT}" in message, message
    with pytest.raises(ConfigError, match="no checkpoint.pt"):   # what the old advice led to
        simulate(SIM.replace(resume=True), run_dir)
    assert simulate(SIM.replace(force=True), run_dir)["status"] == "completed"


@pytest.mark.parametrize("grid", [False, True], ids=["run", "grid point"])
def test_6_a_run_killed_before_its_first_checkpoint_is_not_said_to_be_at_version_0(tmp_path, grid):
    """Fault: a run (or grid point) SIGKILLed after training a while but before its first
    checkpoint: its summary still the start's (version 0), no row flushed to updates.csv. The
    refusal said it was 'at version 0', and a grid point's that resume=auto 'continues it'
    (resume=auto starts it over: there is nothing to continue). Guarantee 6: it says what is
    known, 'before its first checkpoint', and what each flag does."""
    run_dir = tmp_path / "run"
    simulate(SIM, run_dir, stop_at_version=STOP_AT)
    summary = summary_of(run_dir)
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "running", "version": 0}))
    (run_dir / "checkpoint.pt").unlink()
    updates = run_dir / "updates.csv"
    updates.write_text(updates.read_text().splitlines(keepends=True)[0])
    for resume in (False, True):
        if grid:   # Hydra's record of this launch of a grid, as test_newcomer writes it (a refusal drops it)
            record = repro.runs.folder.incoming_record(run_dir)
            record.mkdir()
            (record / "hydra.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
        with pytest.raises(ConfigError) as err:
            simulate(SIM.replace(resume=resume), run_dir)
        message = str(err.value)
        assert "before its first checkpoint" in message and "version 0" not in message, message
        assert "force=true starts" in message, message
        assert "starts the points that have none" in message or not grid or resume, message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["summary.json", "config.json"])
def test_6_a_run_file_that_is_a_fifo_is_refused_never_waited_on(interrupted, name):
    """Fault: the run folder's summary.json (or config.json) replaced by a FIFO: the re-run
    blocked for good opening it (waiting for a writer; SIGTERM only asked it to stop). Guarantee
    6: refused as a killed run without a readable summary (or one whose config.json cannot be
    read), nothing changed."""
    path = interrupted / name
    path.unlink()
    os.mkfifo(path)
    before = snapshot(interrupted)
    with pytest.raises(ConfigError, match="no readable summary.json" if name == "summary.json"
                       else r"config.json is not a regular file\); force=true starts over"):
        simulate(SIM, interrupted)
    assert changed(before, snapshot(interrupted)) == []


def test_6_cli_rerun_of_an_interrupted_run_exits_2(tmp_path, monkeypatch, capsys):
    """Fault: ``python -m repro.run`` (no resume, no force) on a folder holding an interrupted
    run. Guarantee 6: exit 2, the message says how to continue or start over and names the
    version; the tables are untouched."""
    run_dir = tmp_path / "run"
    assert simulate(cli_cfg(), run_dir, stop_at_version=STOP_AT)["status"] == "interrupted"
    before = table_bytes(run_dir)
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, f"hydra.run.dir={run_dir}", *CLI_ARGS)
    assert proc.returncode == 2, proc.stderr
    assert "resume=true continues it, force=true starts over" in proc.stderr, proc.stderr
    assert f"version {STOP_AT}" in proc.stderr and "Traceback" not in proc.stderr
    assert table_bytes(run_dir) == before
    check_run_folder(run_dir, "interrupted")


@pytest.mark.parametrize("resume", [True, "auto"])
def test_6_resume_with_force_is_refused_alike_for_true_and_auto(interrupted, resume):
    """Fault: ``resume=auto force=true`` was accepted (force won: the interrupted run that auto
    would continue was thrown away) while ``resume=true force=true`` was refused. Guarantee 6:
    both are refused in the same words, and the folder is untouched."""
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=resume, force=True), interrupted)
    shown = str(resume).lower()
    assert str(err.value) == (f"invalid value for 'resume': {resume!r}; expected false with force=true (force=true "
                              f"starts the folder over, resume={shown} continues its run: keep one)"), str(err.value)
    assert changed(before, snapshot(interrupted)) == []
    check_run_folder(interrupted, "interrupted")
