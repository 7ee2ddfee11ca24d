"""Guarantee 0: the invariant checker every fault case ends with rejects every kind of damage
it claims to find, so a passing case means something.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from repro.config.settings import ProtocolConfig
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.runs import SIM, sim_cfg
from tests.helpers.tables import drop_line, duplicate_line, edit_cell, edit_json


CHECKER_CATCHES = {
    "no summary": lambda d: (d / "summary.json").unlink(),
    "summary not JSON": lambda d: (d / "summary.json").write_text("{"),
    "status running": edit_json("summary.json", status="running"),
    "summary version off": edit_json("summary.json", version=47),
    "summary samples_seen off": edit_json("summary.json", samples_seen=1),
    "a version missing": drop_line("updates.csv", 11),
    "a version repeated": duplicate_line("updates.csv", 11),
    "samples_seen not the running sum": edit_cell("updates.csv", 11, 8, "1"),
    "staleness wrong": edit_cell("updates.csv", 11, 5, "7"),
    "a field missing": edit_cell("updates.csv", 11, 11, "0.5,"),
    "a number that is not": edit_cell("updates.csv", 11, 10, "abc"),
    "a NUL byte": edit_cell("evals.csv", 3, 5, "0.\x001"),
    "last line cut": lambda d: (d / "evals.csv").write_bytes((d / "evals.csv").read_bytes()[:-1]),
    "evaluation versions not increasing": duplicate_line("evals.csv", 3),
    "client id beyond num_clients": edit_json("config.json", num_clients=2),
    "client 0 under a protocol that does not merge": edit_cell("updates.csv", 11, 3, "0"),
    "num_steps not nsync": edit_json("config.json", nsync=3),
    "a temp file left": lambda d: (d / "checkpoint.pt.tmp").write_bytes(b"PK"),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert simulate(SIM, run_dir)["status"] == "completed"
    return run_dir


@pytest.mark.parametrize("name", list(CHECKER_CATCHES))
def test_0_the_invariant_checker_rejects_damage(tmp_path, finished, name):
    """The checker every case ends with accepts a finished simulator run and rejects each kind
    of damage it is meant to find (so a passing case means something)."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    check_run_folder(run_dir, "completed")
    with pytest.raises(AssertionError, match="status"):
        check_run_folder(run_dir, "interrupted")
    CHECKER_CATCHES[name](run_dir)
    with pytest.raises(AssertionError):
        check_run_folder(run_dir)


@pytest.mark.parametrize("protocol", ["sync", "rennala"])
def test_0_a_merging_protocols_run_passes_the_checker(tmp_path, protocol):
    """sync and rennala log each merged apply as client 0 (repro.files.schema.UPDATE_COLUMNS):
    their finished runs pass the checker, which rejected client 0 before; a client's own id
    there is damage."""
    run_dir = tmp_path / "run"
    assert simulate(sim_cfg(protocol=ProtocolConfig(name=protocol)), run_dir)["status"] == "completed"
    check_run_folder(run_dir, "completed")
    edit_cell("updates.csv", 5, 3, "1")(run_dir)
    with pytest.raises(AssertionError, match="client 0"):
        check_run_folder(run_dir)
