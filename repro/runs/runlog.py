"""The server's logbook: the only writer of a run folder's tables and summary, with the sample count,
the evaluation schedule (every ``eval_every`` epochs of applied samples), time to target and events."""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Sequence

from repro.files import schema
from repro.files.storage import disk_error, read_regular, write_denied, write_json
from repro.logs import get_logger

RESERVE_FILE = ".reserve"      # kept free for the final summary.json when the disk fills up
RESERVE_BYTES = 64 * 1024

_log = get_logger("repro.progress")


def worse_than_start(evals_path: Path) -> str:
    """A sentence when a run's last evaluation has a higher test loss than its first, else ""."""
    import csv
    try:
        with open(evals_path, newline="") as f:
            rows = list(csv.DictReader(f))
        first, last = (float(rows[i]["test_loss"]) for i in (0, -1))
    except (OSError, LookupError, ValueError):
        return ""
    if len(rows) < 2 or not last > first:
        return ""
    errors = [float(rows[i]["test_error"]) for i in (0, -1)]
    also = f", test error {100 * errors[0]:.1f}% -> {100 * errors[1]:.1f}%" if any(errors) else ""
    return (f"its last evaluation is worse than its first (test loss {first:.4g} -> {last:.4g}{also}): "
            "it did not train; try a smaller algo.lr, fewer clients or a smaller nsync")


def diverged_advice(lr: float, num_clients: int) -> str:
    """What to change when a run diverges (TEACHING.md, step 2)."""
    return (f"try a smaller algo.lr (now {lr:g}"
            + (f"; at {num_clients} clients staleness shrinks the step that stays stable)" if num_clients > 1 else ")"))


class CsvWriter:
    """Appends rows to a CSV whose columns are fixed at construction (dqn_zoo's CsvWriter)."""

    def __init__(self, path: Path, columns: Sequence[str], append: bool = False):
        self.path, self.columns = Path(path), tuple(columns)
        exists = append and self.path.exists() and self.path.stat().st_size > 0
        self._file = open(self.path, "a" if exists else "w", newline="")
        if not exists:
            self._file.write(",".join(self.columns) + "\n")

    def write(self, row: dict) -> None:
        if len(row) != len(self.columns) or any(c not in row for c in self.columns):
            raise ValueError(f"{self.path.name}: row keys {sorted(row)} != columns {list(self.columns)}")
        try:   # str of a float is its repr, the shortest string that round-trips: byte-identical runs
            self._file.write(",".join(str(row[c]) for c in self.columns) + "\n")
        except OSError as exc:   # a full disk: say so, naming the folder and the table
            raise disk_error(exc, self.path) from exc

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            raise disk_error(exc, self.path) from exc

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


class RunLog:
    """Writes one run folder. ``clock`` is "virtual" (sim) or "wall" (real)."""

    def __init__(self, run_dir: Path, config: dict, *, clock: str, backend: str, num_train: int,
                 eval_every: float, target_error: float, resume_from: dict | None = None):
        self.run_dir = Path(run_dir)
        # as config.json holds it, for the checkpoints: torch's version is a str subclass they may not hold
        self.config = json.loads(json.dumps(config))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.clock, self.backend, self.num_train = clock, backend, num_train
        self.eval_every_samples = eval_every * num_train
        self.target_error = target_error
        self.started = time.perf_counter()
        self.samples_seen, self.next_eval, self.version, self.time_s = 0, 0.0, 0, 0.0
        self.events: list[dict] = []
        self.final: dict = {}
        self.time_to_target: float | None = None
        self.last_eval_version = -1
        self.wall_before = 0.0
        self.lost_clients: dict[str, str] = {}   # client -> why, across resumes
        self.timing_rows = 0   # rows of timings.csv: what a resume keeps of it (versions repeat)
        if resume_from is not None:
            self.load_state_dict(resume_from)
        # a write a SIGKILL cut leaves its temp file (storage.atomic_write): this run, the folder's one writer, drops it
        for stray in [p for p in self.run_dir.glob("*.tmp") if p.name.startswith(schema.RUN_OWN)]:
            stray.unlink(missing_ok=True)
        self._reserve = self.run_dir / RESERVE_FILE
        self._reserve.write_bytes(b"\0" * RESERVE_BYTES)   # room for the last summary on a full disk
        write_json(self.run_dir / schema.CONFIG_FILE, config)
        self.tables = tuple(CsvWriter(self.run_dir / name, columns, resume_from is not None) for name, columns in (
            (schema.UPDATES_FILE, schema.UPDATE_COLUMNS), (schema.EVALS_FILE, schema.EVAL_COLUMNS),
            (schema.TIMINGS_FILE, schema.TIMING_COLUMNS)))
        self.updates, self.evals, self.timings = self.tables
        self.write_summary("running")

    def log_push(self, *, version: int, time_s: float, staleness: int, **pushed: Any) -> None:
        """One applied push's row; ``pushed``: the push's own fields that updates.csv has a column for."""
        samples = self.samples_seen + pushed["num_samples"]
        self.updates.write({   # the row first: a failed write (a full disk) changes no total
            "version": version, "time_s": time_s, "clock": self.clock, "staleness": staleness,
            "samples_seen": samples, "epoch": samples / self.num_train, **pushed})
        self.samples_seen, self.version, self.time_s = samples, version, time_s

    def log_timing(self, *, time_s: float, client: int, read_version: int, **parts: float) -> None:
        """Where one push's round trip went (``parts``: timings.csv's seconds columns)."""
        self.timings.write({"version": self.version, "time_s": time_s, "clock": self.clock, "client": client,
                            "read_version": read_version, **{k: float(v) for k, v in parts.items()}})
        self.timing_rows += 1

    @property
    def epoch(self) -> float:
        return self.samples_seen / self.num_train

    def log_eval(self, *, version: int, time_s: float, samples_seen: int | None = None,
                 test_loss: float, test_error: float, train_loss: float, train_error: float) -> None:
        """Record an evaluation of the parameters at ``version`` (``samples_seen``: at its snapshot)."""
        samples = self.samples_seen if samples_seen is None else samples_seen
        while self.next_eval <= samples:
            self.next_eval += self.eval_every_samples
        row = {"version": version, "time_s": time_s, "clock": self.clock, "epoch": samples / self.num_train,
               "samples_seen": samples, "test_loss": float(test_loss), "test_error": float(test_error),
               "train_loss": float(train_loss), "train_error": float(train_error)}
        self.evals.write(row)
        self.flush()
        self.last_eval_version = version
        self.final = {k: row[k] for k in ("test_loss", "test_error", "train_loss", "train_error")}
        if self.time_to_target is None and train_error <= self.target_error:
            self.time_to_target = time_s

    def add_event(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "time_s": self.time_s, "version": self.version, **fields})

    def wall_time_s(self) -> float:
        return self.wall_before + time.perf_counter() - self.started

    def write_summary(self, status: str, message: str = "", **extra: Any) -> dict:
        assert status in schema.STATUSES, status
        summary = {"status": status, "backend": self.backend, "clock": self.clock, "version": self.version,
                   "samples_seen": self.samples_seen, "epoch": self.epoch, "time_s": self.time_s,
                   "wall_time_s": self.wall_time_s(), "final": self.final,
                   "time_to_target": {schema.target_key(self.target_error): self.time_to_target},
                   "events": self.events, "message": message,
                   "lost_clients": sorted(int(k) for k in self.lost_clients), **extra}
        path = self.run_dir / schema.SUMMARY_FILE
        try:
            write_json(path, summary)
        except OSError as exc:
            if not self._reserve.exists() or write_denied(exc):   # (room is no help where nothing may be written)
                raise
            self._reserve.unlink()   # a full disk: give the last word the room kept for it
            write_json(path, summary)
        return summary

    def flush(self) -> None:
        for writer in self.tables:
            writer.flush()

    def close(self) -> None:
        for writer in self.tables:   # (a full disk: the summary says so; the checkpoint's rows are safe)
            with contextlib.suppress(OSError):
                writer.close()
        self._reserve.unlink(missing_ok=True)

    def state_dict(self) -> dict:
        self.flush()
        return {"samples_seen": self.samples_seen, "next_eval": self.next_eval, "version": self.version,
                "time_s": self.time_s, "time_to_target": self.time_to_target, "final": dict(self.final),
                "events": list(self.events), "wall_time_s": self.wall_time_s(),
                "last_eval_version": self.last_eval_version, "lost_clients": dict(self.lost_clients),
                "timing_rows": self.timing_rows, "config": self.config}   # config: whose checkpoint it is

    def load_state_dict(self, state: dict) -> None:
        self.samples_seen, self.version = int(state["samples_seen"]), int(state["version"])
        self.next_eval, self.time_s = float(state["next_eval"]), float(state["time_s"])
        self.time_to_target = state.get("time_to_target")
        self.final = dict(state["final"])
        self.last_eval_version = int(state["last_eval_version"])
        self.wall_before = float(state["wall_time_s"])
        self.lost_clients = dict(state.get("lost_clients", {}))
        self.timing_rows = int(state.get("timing_rows", 0))
        self.events = list(state["events"]) + [{"type": "resumed", "version": self.version, "time_s": self.time_s}]


def read_summary(run_dir: Path) -> dict | None:
    """``run_dir``'s summary.json; None: missing, unreadable, not a regular file, not a JSON object."""
    with contextlib.suppress(OSError, ValueError):
        summary = json.loads(read_regular(Path(run_dir) / schema.SUMMARY_FILE))
        return summary if isinstance(summary, dict) else None
    return None


class Progress:
    """Logs one line every ``every_s`` wall seconds on long runs (stderr and run.log)."""

    def __init__(self, label: str, total_epochs: float, enabled: bool = True, every_s: float = 2.0,
                 loss_only: bool = False):
        self.label, self.total, self.enabled, self.every_s = label, total_epochs, enabled, every_s
        self.loss_only = loss_only   # a problem without classes (the quadratic): its error means nothing
        self.started = self.last = time.perf_counter()

    def update(self, log: RunLog, force: bool = False) -> None:
        """Where ``log``'s run stands: epoch, version, its last evaluation's test error (or loss)."""
        now = time.perf_counter()
        if not self.enabled or (not force and now - self.last < self.every_s):
            return
        self.last = now
        elapsed, epoch, key = now - self.started, log.epoch, "test_loss" if self.loss_only else "test_error"
        # before the first push there is no rate: no eta (max(nan, 0) printed 'nans')
        eta = f"{max(elapsed * (self.total - epoch) / epoch, 0):6.1f}s" if epoch > 0 else "     ?"
        v = log.final.get(key)
        err = "" if v is None else f"  test loss {v:.4g}" if self.loss_only else f"  test error {100 * v:5.2f}%"
        _log.info(f"[{self.label}] epoch {epoch:6.2f}/{self.total:g}  version {log.version:6d}{err}"
                  f"  elapsed {elapsed:6.1f}s  eta {eta}")
