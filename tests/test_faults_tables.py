"""Guarantees 4 and 12: damaged tables. Resume checks the tables: damage after the checkpoint is
dropped, damage up to it refused naming file and line (4); the analysis skips a folder with a
duplicated row (12).

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from repro.errors import ConfigError
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.runs import SIM, STOP_AT
from tests.helpers.tables import append_bytes, changed, duplicate_line, lines, replace_line, snapshot, table_bytes


# ---------------------------------------------------------------------------------------------
# 4. Resume checks the tables
# ---------------------------------------------------------------------------------------------

def _rows_after_checkpoint(run_dir: Path) -> None:
    """What a run killed after its checkpoint leaves: plausible rows V+1..V+5 (the last row's
    values, versions and sample counts carried on)."""
    last = lines(run_dir / "updates.csv")[-1].decode().rstrip("\n").split(",")
    with open(run_dir / "updates.csv", "a") as f:
        for i in range(1, 6):
            row = list(last)
            row[0] = str(STOP_AT + i)
            row[8] = str(int(last[8]) + i * int(last[7]))
            f.write(",".join(row) + "\n")


def _eval_after_checkpoint(run_dir: Path) -> None:
    """An evaluation row of a version after the checkpoint's, then half of another."""
    last = lines(run_dir / "evals.csv")[-1].decode().rstrip("\n").split(",")
    last[0] = str(STOP_AT + 4)
    with open(run_dir / "evals.csv", "a") as f:
        f.write(",".join(last) + "\n" + "28,0.2,vir")


REPAIRED = {   # damage after the checkpoint: dropped on resume, the run completes
    "garbage line after the last row": append_bytes("updates.csv", b"garbage,\x01,!!\n"),
    "half a row after the last row": append_bytes("updates.csv", b"21,0.15,virt"),
    "rows after the checkpoint (killed after it)": _rows_after_checkpoint,
    "evaluation rows after the checkpoint": _eval_after_checkpoint,
    "timings after the checkpoint, the last cut": append_bytes(
        "timings.csv", b"20,0.21,virtual,1,18,0.0,0.02,0.0,0.0,0.0\n21,0.2"),
}
REFUSED = {    # damage up to the checkpoint: refused naming file and line
    "row of the checkpoint's version cut mid-line": (
        replace_line("updates.csv", STOP_AT + 1, lambda row: row[:15]), "updates.csv", STOP_AT + 1),
    "NUL bytes in a row before the checkpoint": (
        replace_line("updates.csv", 11, lambda row: b"\x00" * (len(row) - 1) + b"\n"), "updates.csv", 11),
    "NUL bytes inside a number before the checkpoint": (
        replace_line("updates.csv", 11, lambda row: row[:5] + b"\x00\x00" + row[7:]), "updates.csv", 11),
    "a duplicated row before the checkpoint": (duplicate_line("updates.csv", 6), "updates.csv", 7),
    "NUL bytes in an evaluation before the checkpoint": (
        replace_line("evals.csv", 3, lambda row: b"\x00" * (len(row) - 1) + b"\n"), "evals.csv", 3),
    "NUL bytes in a timing before the checkpoint": (
        replace_line("timings.csv", 9, lambda row: b"\x00" * (len(row) - 1) + b"\n"), "timings.csv", 9),
    "a timing row before the checkpoint cut mid-line": (
        replace_line("timings.csv", STOP_AT + 1, lambda row: row[:15]), "timings.csv", STOP_AT + 1),
}


@pytest.mark.parametrize("name", list(REPAIRED))
def test_4_damage_after_the_checkpoint_is_dropped_on_resume(interrupted, reference, name):
    """Fault: the tables hold more than the checkpoint (garbage, half a row, rows a killed run
    wrote after its checkpoint). Guarantee 4: resume drops them and recomputes: the tables end
    byte-identical to the uninterrupted run's, versions contiguous."""
    REPAIRED[name](interrupted)
    summary = simulate(SIM.replace(resume=True), interrupted)
    assert summary["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


@pytest.mark.parametrize("name", list(REFUSED))
def test_4_damage_up_to_the_checkpoint_is_refused(interrupted, reference, name):
    """Fault: a row the resumed run needs (up to the checkpoint's version) is cut, holds NUL
    bytes or is duplicated. Guarantee 4: resume refuses with a ConfigError naming the file and
    the line, before touching any file; put right by hand, the folder resumes as if nothing
    had happened."""
    damage, file, lineno = REFUSED[name]
    good = {n: (interrupted / n).read_bytes() for n in ("updates.csv", "evals.csv", "timings.csv")}
    damage(interrupted)
    before = snapshot(interrupted)
    with pytest.raises(ConfigError) as err:
        simulate(SIM.replace(resume=True), interrupted)
    message = str(err.value)
    assert file in message and re.search(rf"\bline {lineno}\b", message), message
    assert changed(before, snapshot(interrupted)) == []
    for n, data in good.items():
        (interrupted / n).write_bytes(data)
    assert simulate(SIM.replace(resume=True), interrupted)["status"] == "completed"
    assert table_bytes(interrupted) == reference
    check_run_folder(interrupted, "completed")


# ---------------------------------------------------------------------------------------------
# 12. The analysis rejects a duplicated row
# ---------------------------------------------------------------------------------------------

def test_12_analysis_skips_a_folder_with_a_duplicated_version(tmp_path):
    """Fault: updates.csv of a finished run holds one row twice (e.g. a hand-merged resume).
    Guarantee 12: repro.analysis.load_runs skips that folder with a warning naming it (the
    intact copy beside it is kept); the invariant checker rejects it too."""
    from repro.analysis import load_runs

    good, bad = tmp_path / "results" / "exp" / "good", tmp_path / "results" / "exp" / "dup"
    assert simulate(SIM.replace(exp_name="exp"), good)["status"] == "completed"
    shutil.copytree(good, bad)
    duplicate_line("updates.csv", 11)(bad)
    with pytest.warns(UserWarning, match=re.escape(str(bad))):
        runs = load_runs(tmp_path / "results", "exp")
    assert runs.runs.run_dir.tolist() == [str(good)]
    assert runs.skipped.run_dir.tolist() == [str(bad)] and runs.skipped.kind.tolist() == ["corrupt"]
    with pytest.raises(AssertionError, match="versions"):
        check_run_folder(bad)
    check_run_folder(good, "completed")
