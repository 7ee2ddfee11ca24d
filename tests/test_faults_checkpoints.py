"""Guarantee 8: checkpoint errors are clear. An empty, truncated, code-carrying or incomplete
``checkpoint.pt`` is refused naming the file and what is wrong, and nothing in it runs.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from repro.errors import ConfigError
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.runs import CLI_ARGS, SIM, STOP_AT, cli, cli_cfg
from tests.helpers.tables import changed, snapshot, table_bytes


class Payload:
    """Unpickling this calls ``print``: a harmless stand-in for code a malicious file runs."""

    def __reduce__(self):
        return (print, ("CODE FROM A CHECKPOINT RAN",))


def _state(path: Path) -> dict:
    return torch.load(path, weights_only=True)


BAD_CHECKPOINTS = {
    "empty": (lambda p, good: p.write_bytes(b""), "empty file"),
    "truncated": (lambda p, good: p.write_bytes(good[: len(good) // 2]), "truncated"),
    "torch file carrying code": (lambda p, good: torch.save({**_state(p), "x": Payload()}, p), "could run code"),
    "raw pickle carrying code": (lambda p, good: p.write_bytes(pickle.dumps({"server": Payload()})), "could run code"),
    "without 'server'": (lambda p, good: torch.save({k: v for k, v in _state(p).items() if k != "server"}, p),
                         "lacks server"),
    # found by this suite: torch's readers raise KeyError/IndexError on such bytes, and missing
    # inner keys surfaced as KeyErrors deep in the drivers
    "a text file": (lambda p, good: p.write_bytes(b"hello, this is not a checkpoint\n"), "not a torch checkpoint"),
    "another text file": (lambda p, good: p.write_bytes(b"a few words\n"), "not a torch checkpoint"),
    "runlog without its keys": (lambda p, good: torch.save({**_state(p), "runlog": {}}, p), "lacks runlog.version"),
    "driver without its clients": (lambda p, good: torch.save({**_state(p), "driver": {}}, p),
                                   "lacks driver.clients"),
    # a checkpoint of a model whose code changed since (or another torch's): torch's RuntimeError
    # from copy_ ("The size of tensor a (9610) must match ..."), a traceback on the command line
    "another model's parameters": (lambda p, good: torch.save({**_state(p), "server": {
        **_state(p)["server"], "params": _state(p)["server"]["params"][:-3]}}, p),
        "it holds 9607 parameters, the model 9610"),
}
CHECKPOINT_CASES = [pytest.param(make, expected, id=name) for name, (make, expected) in BAD_CHECKPOINTS.items()]


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("make,expected", CHECKPOINT_CASES)
def test_8_bad_checkpoint_is_a_clear_config_error(interrupted, reference, capfd, make, expected):
    """Fault: an interrupted run's checkpoint.pt replaced by an empty file, half of itself, a
    file whose unpickling would run code, one lacking 'server', text, or one whose
    inner dicts lack their keys. Guarantee 8: resume raises ConfigError naming checkpoint.pt and
    what is wrong, never suggesting weights_only=False, running nothing and changing nothing;
    with the good checkpoint back the run resumes to the uninterrupted run's tables."""
    path = interrupted / "checkpoint.pt"
    good = path.read_bytes()
    make(path, good)
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=True), interrupted)
    message = str(err.value)
    assert "checkpoint.pt" in message and expected in message, message
    assert "weights_only=False" not in message
    assert "CODE FROM A CHECKPOINT RAN" not in capfd.readouterr().out
    assert changed(before, snapshot(interrupted)) == []
    path.write_bytes(good)
    assert simulate(SIM.replace(resume=True), interrupted)["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


def test_8_a_checkpoint_of_another_runs_settings_is_refused_listing_them(interrupted, reference, tmp_path):
    """Fault: an interrupted run's checkpoint.pt replaced by another run's (nsync=3, copied
    between folders), whose config.json was not. It resumed: rows 1..20 of this run, then rows
    continued from the other's state, mixed in one updates.csv. Guarantee 8: resume refuses it
    before any file changes, listing each setting of the other run; with its own checkpoint back
    the run resumes to the uninterrupted run's tables."""
    other = tmp_path / "other"
    assert simulate(SIM.replace(nsync=3), other, stop_at_version=STOP_AT)["status"] == "interrupted"
    path = interrupted / "checkpoint.pt"
    good = path.read_bytes()
    path.write_bytes((other / "checkpoint.pt").read_bytes())
    before = snapshot(interrupted)
    for resume in (True, "auto"):
        with pytest.raises(ConfigError, match=r"written by a run with other settings \(checkpoint -> now\): "
                                              r"nsync: 3 -> 2\); force=true starts over"):
            simulate(SIM.replace(resume=resume), interrupted)
    assert changed(before, snapshot(interrupted)) == []
    path.write_bytes(good)
    assert simulate(SIM.replace(resume=True), interrupted)["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


# slow: test_8_bad_checkpoint_is_a_clear_config_error (the refusal, no code run) and
# test_6_cli_rerun_of_an_interrupted_run_exits_2 (a ConfigError inside the run: exit 2, one line)
# cover the same path in the default suite
@pytest.mark.slow
def test_8_cli_bad_checkpoint_exits_2(tmp_path):
    """Fault: ``python -m repro.run resume=true`` with a checkpoint.pt that carries code.
    Guarantee 8: exit 2, the message names checkpoint.pt and never says weights_only=False; the
    code does not run; the folder still holds the interrupted run."""
    run_dir = tmp_path / "run"
    assert simulate(cli_cfg(), run_dir, stop_at_version=STOP_AT)["status"] == "interrupted"
    path = run_dir / "checkpoint.pt"
    torch.save({**_state(path), "x": Payload()}, path)
    proc = cli(f"hydra.run.dir={run_dir}", *CLI_ARGS, "resume=true")
    assert proc.returncode == 2, proc.stderr
    assert "checkpoint.pt" in proc.stderr and "could run code" in proc.stderr, proc.stderr
    assert "weights_only=False" not in proc.stderr + proc.stdout and "Traceback" not in proc.stderr
    assert "CODE FROM A CHECKPOINT RAN" not in proc.stdout + proc.stderr
    check_run_folder(run_dir, "interrupted")


def test_8_truncated_checkpoint_says_damaged_and_how_to_start_over(interrupted):
    """Fault: an interrupted run's checkpoint.pt cut in half, then ``resume=true``. Guarantee 8:
    the refusal names the file, says it is damaged, quotes torch's reason as a whole sentence
    (it was cut at 120 characters, mid-word) and, as a damaged table's does, says force=true
    starts over."""
    path = interrupted / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(Exception) as torch_error:
        torch.load(path, weights_only=True)
    first = str(torch_error.value).splitlines()[0].split(". ")[0]
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=True), interrupted)
    message = str(err.value)
    assert str(path) in message and "damaged" in message, message
    assert f"{first})" in message and message.endswith("; force=true starts over"), message
    check_run_folder(interrupted, "interrupted")
