"""The run-folder invariant every fault-injection case ends with.

**The fault-injection suite**, one file per guarantee of docs/failures.md "Failures we survive"
and docs/getting-started.md "What a run leaves behind" (the number starts each test's name)::

    0    the checker below rejects every damage      tests/test_faults_checker.py
    1    one writer per run folder                   tests/test_faults_writer.py
    2    a finished run is never changed             tests/test_faults_resume.py
    3    resume checks the configuration             tests/test_faults_resume.py
    4    resume checks the tables                    tests/test_faults_tables.py
    5    every ending is terminal                    tests/test_faults_signals.py,
                                                     tests/test_faults_disk.py
    6    starting over is never silent               tests/test_faults_resume.py
    7    no number hangs a run                       tests/test_faults_numbers.py
    8    checkpoint errors are clear                 tests/test_faults_checkpoints.py
    9    loopback means loopback                     tests/test_faults_loopback.py
    10   liveness without false alarms               tests/test_faults_liveness.py
    11   server loss survived by a torchrun restart  tests/test_faults_torchrun.py
    12   the analysis rejects duplicated rows        tests/test_faults_tables.py

The simulator is used wherever the guarantee is not about processes (a 48-version run of the
``mlp`` on ``synthetic`` data takes a fraction of a second: :data:`tests.helpers.runs.SIM`); real
processes (:func:`tests.helpers.runs.launch_real`, in a session of their own) for signals,
liveness, lock contention and sockets. Every test states a guarantee and fails if it breaks. The
bugs this suite found (eight) are fixed; the tests that found them say so in a comment.

**The invariant.**

:func:`check_run_folder` reads a run folder the way a careful analyst would, with no help from
:mod:`repro` (plain ``csv``/``json``), so a bug in the writer cannot hide behind the same bug in a
reader. It asserts what README.md ("What a run leaves behind") promises of every folder a run has
ended in, whatever ended it:

* ``summary.json`` exists, is valid JSON, its status is terminal (not ``running``) and equals
  ``expect_status`` when given;
* every line of ``updates.csv`` and ``evals.csv`` ends with a newline, holds no NUL byte, has one
  field per column, and every field but ``clock`` is a number;
* ``updates.csv`` versions are exactly 1..V (contiguous, unique) with V the summary's version;
  ``samples_seen`` is the running sum of ``num_samples`` and the summary's ``samples_seen`` is the
  last row's; ``staleness == version - 1 - read_version``;
* ``evals.csv`` versions are unique and increasing;
* ``config.json`` exists and describes the rows: every client id is in 1..``num_clients`` (or
  a joiner's), or 0 in every row under a protocol that merges pushes (:data:`MERGING`), and for
  a simulator run ``nsync == num_steps`` in every row;
* no ``*.tmp`` file is left anywhere in the folder.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from repro.files import schema

NEWLINE = b"\n"
TERMINAL = tuple(s for s in schema.STATUSES if s != "running")
# the protocols whose every apply merges pushes, logged as client 0 (repro.asgd.protocols.mean_push)
MERGING = ("sync", "rennala")


def read_rows(path: Path, columns: tuple[str, ...]) -> list[dict]:
    """The rows of one run table as dicts of floats (``clock`` stays text), after checking every
    line byte by byte. Fails naming the file and line."""
    assert path.is_file(), f"{path} is missing"
    data = path.read_bytes()
    name = path.name
    nul = data.find(b"\x00")
    if nul >= 0:
        raise AssertionError(f"{name}: NUL byte on line {data.count(NEWLINE, 0, nul) + 1}")
    text = data.decode("utf-8")   # raises on bytes that are not text
    assert text.endswith("\n"), f"{name}: the last line is cut (no newline): {text[-60:]!r}"
    lines = text.split("\n")[:-1]
    header = ",".join(columns)
    assert lines and lines[0] == header, f"{name}: header {lines[:1]!r} != {header!r}"
    rows = []
    for lineno, line in enumerate(lines[1:], start=2):
        fields = line.split(",")
        assert len(fields) == len(columns), \
            f"{name} line {lineno}: {len(fields)} fields, {len(columns)} columns: {line[:80]!r}"
        row = {}
        for col, value in zip(columns, fields):
            if col == "clock":
                assert value in ("virtual", "wall"), f"{name} line {lineno}: clock {value!r}"
                row[col] = value
                continue
            try:
                row[col] = float(value)
            except ValueError:
                raise AssertionError(f"{name} line {lineno}: {col} = {value!r} is not a number") from None
        rows.append(row)
    return rows


def _whole(value: float, what: str) -> int:
    assert math.isfinite(value) and value == int(value), f"{what} = {value!r} is not a whole number"
    return int(value)


def check_run_folder(run_dir: str | Path, expect_status: str | None = None) -> dict:
    """Assert the run folder invariants (module docstring); return the summary."""
    run_dir = Path(run_dir)
    path = run_dir / schema.SUMMARY_FILE
    assert path.is_file(), f"no {schema.SUMMARY_FILE} in {run_dir}: {sorted(p.name for p in run_dir.iterdir())}"
    try:
        summary = json.loads(path.read_text())
    except ValueError as e:
        raise AssertionError(f"{path} is not valid JSON ({e})") from None
    assert isinstance(summary, dict), f"{path} holds {type(summary).__name__}, not an object"
    status = summary.get("status")
    assert status in TERMINAL, f"status {status!r} is not terminal (message: {summary.get('message')!r})"
    if expect_status is not None:
        assert status == expect_status, f"status {status!r} != {expect_status!r}: {summary.get('message')!r}"

    updates = read_rows(run_dir / schema.UPDATES_FILE, schema.UPDATE_COLUMNS)
    evals = read_rows(run_dir / schema.EVALS_FILE, schema.EVAL_COLUMNS)

    versions = [_whole(r["version"], f"updates.csv line {i + 2} version") for i, r in enumerate(updates)]
    assert versions == list(range(1, len(versions) + 1)), \
        f"updates.csv versions are not 1..{len(versions)}: first break at line " \
        f"{next(i + 2 for i, v in enumerate(versions) if v != i + 1)}"
    assert summary.get("version") == len(versions), \
        f"summary version {summary.get('version')} != {len(versions)} rows in updates.csv"
    total = 0
    for lineno, row in enumerate(updates, start=2):
        total += _whole(row["num_samples"], f"updates.csv line {lineno} num_samples")
        assert row["samples_seen"] == total, \
            f"updates.csv line {lineno}: samples_seen {row['samples_seen']} != running sum {total}"
        assert row["staleness"] == row["version"] - 1 - row["read_version"], \
            f"updates.csv line {lineno}: staleness {row['staleness']} != version - 1 - read_version"
    assert summary.get("samples_seen") == total, \
        f"summary samples_seen {summary.get('samples_seen')} != last row's {total}"

    eval_versions = [_whole(r["version"], f"evals.csv line {i + 2} version") for i, r in enumerate(evals)]
    assert all(b > a for a, b in zip(eval_versions, eval_versions[1:])), \
        f"evals.csv versions are not unique and increasing: {eval_versions}"

    cpath = run_dir / schema.CONFIG_FILE
    assert cpath.is_file(), f"no {schema.CONFIG_FILE} in {run_dir}"
    config = json.loads(cpath.read_text())
    clients = {_whole(r["client"], "client") for r in updates}
    joined = {int(e["client"]) for e in summary.get("events", []) if e.get("type") == "client_joined"}
    if config.get("protocol", {}).get("name") in MERGING:
        assert clients <= {0}, f"client ids {sorted(clients)} under {config['protocol']['name']}, " \
                               "whose merged applies are client 0"
    else:
        assert all(1 <= k <= config["num_clients"] or k in joined for k in clients), \
            f"client ids {sorted(clients)} outside 1..num_clients={config['num_clients']} and no joiner's"
    if config.get("backend", {}).get("name", "sim") == "sim":
        bad = [i + 2 for i, r in enumerate(updates) if r["num_steps"] != config["nsync"]]
        assert not bad, f"updates.csv num_steps != nsync={config['nsync']} on lines {bad[:5]}"

    left = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.tmp"))
    assert not left, f"temporary files left behind: {left}"
    return summary
