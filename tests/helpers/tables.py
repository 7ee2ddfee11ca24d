"""A run folder's files as tests read and damage them.

Reading: :func:`table_bytes` (the two tables as bytes: what "byte-identical" compares),
:func:`table_frames` (the tables as DataFrames and the summary), :func:`summary_of`,
:func:`lines`, :func:`row_count`; :func:`check_same_evaluations` (a real run's against the simulator's); :func:`snapshot` and :func:`changed` (did anything in the folder
change, bytes or mtime). Damage: each ``*_line`` / ``edit_*`` / :func:`append_bytes` returns an edit,
a function of the run folder that changes one file the way a crash, a disk or a hand would.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def table_bytes(run_dir: Path) -> tuple[bytes, bytes]:
    return (run_dir / "updates.csv").read_bytes(), (run_dir / "evals.csv").read_bytes()


def table_frames(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    return (pd.read_csv(run_dir / "updates.csv"), pd.read_csv(run_dir / "evals.csv"),
            json.loads((run_dir / "summary.json").read_text()))


def check_same_evaluations(real: pd.DataFrame, sim: pd.DataFrame) -> None:
    """A real run's evaluations equal the simulator's where they saw the same version. The real
    server evaluates in a thread: one that fell behind (a loaded machine) snapshots a version or
    two later than the simulator's inline evaluation; the first and the final evaluations are
    inline in both, so they always meet."""
    both = real.merge(sim, on="version", suffixes=("", "_sim"))
    assert {real.version.iloc[0], real.version.iloc[-1]} <= set(both.version)
    pd.testing.assert_series_equal(both.test_error, both.test_error_sim, check_names=False)


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def row_count(run_dir: Path) -> int:
    """Rows of updates.csv so far (0 before it exists)."""
    return max(len(lines(run_dir / "updates.csv")) - 1, 0)


def snapshot(run_dir: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, except the lock file (every attempt to open the folder
    takes it, which writes the would-be holder into it and truncates it again)."""
    return {str(p.relative_to(run_dir)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".lock"}


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def replace_line(name: str, lineno: int, how):
    def edit(run_dir: Path) -> None:
        rows = lines(run_dir / name)
        rows[lineno - 1] = how(rows[lineno - 1])
        (run_dir / name).write_bytes(b"".join(rows))
    return edit


def duplicate_line(name: str, lineno: int):
    def edit(run_dir: Path) -> None:
        rows = lines(run_dir / name)
        rows.insert(lineno, rows[lineno - 1])
        (run_dir / name).write_bytes(b"".join(rows))
    return edit


def drop_line(name: str, lineno: int):
    def edit(run_dir: Path) -> None:
        rows = lines(run_dir / name)
        del rows[lineno - 1]
        (run_dir / name).write_bytes(b"".join(rows))
    return edit


def edit_cell(name: str, lineno: int, column: int, value: str):
    def edit(run_dir: Path) -> None:
        rows = lines(run_dir / name)
        fields = rows[lineno - 1].decode().rstrip("\n").split(",")
        fields[column] = value
        rows[lineno - 1] = (",".join(fields) + "\n").encode()
        (run_dir / name).write_bytes(b"".join(rows))
    return edit


def edit_json(name: str, **changes):
    def edit(run_dir: Path) -> None:
        data = json.loads((run_dir / name).read_text())
        data.update(changes)
        (run_dir / name).write_text(json.dumps(data))
    return edit


def append_bytes(name: str, data: bytes):
    def edit(run_dir: Path) -> None:
        with open(run_dir / name, "ab") as f:
            f.write(data)
    return edit
