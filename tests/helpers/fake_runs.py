"""A small synthetic results tree for the analysis tests, written with :mod:`repro.files.schema`.

:func:`make_results` writes ``fig1`` .. ``fig4`` experiments whose curves follow a simple law
(more clients -> more samples per second, staleness costs a little progress per sample), plus
the bad folders the reader must cope with: in ``fig3`` two partial runs (no ``summary.json``;
status ``running``), three corrupt ones (truncated CSV, a non-numeric value, no ``config.json``)
and, in ``fig3`` and ``fig4``, one diverged run (4 clients, nsync 8, seed 1).

``error_shift`` and ``time_scale`` write the same tree as if regenerated elsewhere: every error
raised by ``error_shift`` (a fraction, capped at 1) and every time stretched by ``time_scale``.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from repro.files import schema

TRAIN_SIZE = 1000
BATCH_SIZE = 32
TARGET = 0.1
DIVERGED = {"num_clients": 4, "nsync": 8, "seed": 1}
BAD_FOLDERS = {"partial_nosummary": "partial", "partial_running": "partial",
               "corrupt_truncated": "corrupt", "corrupt_nonnumeric": "corrupt",
               "corrupt_noconfig": "corrupt"}


def config(exp_name: str, num_clients: int, nsync: int, seed: int, start: str) -> dict[str, Any]:
    """A resolved config as the drivers write it: only keys this version knows (a calibrated
    compute time would be recorded as the measured ``cost.compute_s``; there is no other key)."""
    return {"exp_name": exp_name, "seed": seed, "num_clients": num_clients, "nsync": nsync,
            "num_epochs": 6.0, "eval_every": 0.5, "start": start, "target_error": TARGET,
            "device": "cpu",
            "data": {"name": "digits", "root": None, "num_train": TRAIN_SIZE, "num_test": None},
            "model": {"name": "digits_cnn"},
            "algo": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0, "batch_size": BATCH_SIZE,
                     "server_rule": "delta", "lr_server": 1.0},
            "cost": {"profile": "paper2013", "compute_s": 0.03, "jitter": "lognormal",
                     "jitter_sigma": 0.1, "straggler_client": None, "straggler_factor": 1.0,
                     "latency_s": 0.001, "bandwidth_Bps": 1e8, "server_apply_s": 0.001,
                     "path": None},
            "backend": {"name": "sim"}}


def curves(num_clients: int, nsync: int, seed: int, start: str, diverge_at: float | None = None,
           num_epochs: float = 6.0, error_shift: float = 0.0,
           time_scale: float = 1.0) -> tuple[list[dict], list[dict]]:
    """(evals rows, updates rows) of one synthetic run."""
    rng = np.random.default_rng(1000 * seed + 10 * num_clients + nsync)
    s_per_epoch = 20.0 / num_clients * (1 + 0.05 * rng.random())  # throughput ~ clients
    s_per_epoch *= time_scale
    scale = 1.2 * (1 + 0.03 * (num_clients - 1) * math.log2(nsync + 1))  # staleness cost
    e0 = 0.9 if start == "cold" else 0.3

    def error(epoch: float) -> float:
        if diverge_at is not None and epoch > diverge_at:
            return math.nan
        noisy = e0 * math.exp(-epoch / scale) * (1 + 0.03 * rng.standard_normal())
        return min(1.0, noisy + error_shift)

    push = BATCH_SIZE * nsync
    evals, updates, version, seen = [], [], 0, 0
    for i in range(int(num_epochs / 0.5) + 1):
        epoch = 0.5 * i
        while seen + push <= epoch * TRAIN_SIZE:
            version, seen = version + 1, seen + push
            err = error(seen / TRAIN_SIZE)
            stale = 0 if num_clients == 1 else max(0, num_clients - 1 + int(rng.integers(-1, 2)))
            updates.append({"version": version, "time_s": seen / TRAIN_SIZE * s_per_epoch,
                            "clock": "virtual", "client": 1 + version % num_clients,
                            "read_version": version - 1 - stale, "staleness": stale,
                            "num_steps": nsync, "num_samples": push, "samples_seen": seen,
                            "epoch": seen / TRAIN_SIZE, "train_loss": 3 * err,
                            "train_error": err})
        err = error(epoch)
        evals.append({"version": version, "time_s": epoch * s_per_epoch, "clock": "virtual",
                      "epoch": epoch, "samples_seen": int(epoch * TRAIN_SIZE),
                      "test_loss": 3 * err + 0.1, "test_error": err + 0.03,
                      "train_loss": 3 * err, "train_error": err})
    return evals, updates


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _json_safe(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def summary(evals: list[dict], status: str, message: str = "") -> dict[str, Any]:
    last = evals[-1]
    hit = next((e["time_s"] for e in evals if e["train_error"] <= TARGET), None)
    return {"status": status, "backend": "sim", "clock": "virtual", "version": last["version"],
            "samples_seen": last["samples_seen"], "epoch": last["epoch"],
            "time_s": last["time_s"], "wall_time_s": 1.5,
            "final": {k: _json_safe(last[k]) for k in
                      ("test_loss", "test_error", "train_loss", "train_error")},
            "time_to_target": {str(TARGET): hit},
            "events": [{"type": "diverged", "time_s": last["time_s"],
                        "version": last["version"]}] if status == "diverged" else [],
            "message": message}


def write_run(run_dir: Path, cfg: dict | None, evals: list[dict], updates: list[dict],
              summ: dict | None) -> Path:
    """One run folder; ``cfg=None`` / ``summ=None`` leave that file out."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        (run_dir / schema.CONFIG_FILE).write_text(json.dumps(cfg, indent=1))
    write_csv(run_dir / schema.EVALS_FILE, schema.EVAL_COLUMNS, evals)
    write_csv(run_dir / schema.UPDATES_FILE, schema.UPDATE_COLUMNS, updates)
    if summ is not None:
        (run_dir / schema.SUMMARY_FILE).write_text(json.dumps(summ, indent=1))
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("[]\n")
    return run_dir


def job_name(num_clients: int, nsync: int, seed: int) -> str:
    return f"num_clients={num_clients},nsync={nsync},seed={seed}"


def write_experiment(root: Path, exp_name: str, clients, nsyncs, seeds, start: str,
                     diverged: bool = False, **shift: float) -> list[Path]:
    """A grid of completed runs (one of them diverged when ``diverged``); ``shift``:
    ``error_shift`` / ``time_scale`` of :func:`curves`."""
    paths = []
    for n in clients:
        for k in nsyncs:
            for s in seeds:
                is_div = diverged and (n, k, s) == tuple(DIVERGED.values())
                ev, up = curves(n, k, s, start, diverge_at=1.0 if is_div else None, **shift)
                summ = summary(ev, "diverged" if is_div else "completed",
                               "loss became NaN" if is_div else "")
                paths.append(write_run(root / exp_name / job_name(n, k, s),
                                       config(exp_name, n, k, s, start), ev, up, summ))
    return paths


def write_lab_run(root: Path, exp_name: str, job: str, num_clients: int, groups: dict) -> Path:
    """One completed 1-seed run of a lab experiment, ``groups`` merged into its config's groups
    (``{"protocol": {"name": "async"}}``)."""
    evals, updates = curves(num_clients, 1, 0, "cold")
    cfg = config(exp_name, num_clients, 1, 0, "cold")
    for group, values in groups.items():
        cfg[group] = {**cfg.get(group, {}), **values}
    return write_run(root / exp_name / job, cfg, evals, updates, summary(evals, "completed"))


def write_bad_runs(exp_dir: Path) -> dict[str, Path]:
    """The partial and corrupt folders of :data:`BAD_FOLDERS`."""
    name = exp_dir.name
    ev, up = curves(2, 1, 5, "warm")
    cfg = config(name, 2, 1, 5, "warm")
    paths = {
        "partial_nosummary": write_run(exp_dir / "partial_nosummary", cfg, ev[:3], up[:5], None),
        "partial_running": write_run(exp_dir / "partial_running", cfg, ev[:3], up[:5],
                                     {**summary(ev[:3], "running")}),
        "corrupt_truncated": write_run(exp_dir / "corrupt_truncated", cfg, ev, up,
                                       summary(ev, "completed")),
        "corrupt_nonnumeric": write_run(exp_dir / "corrupt_nonnumeric", cfg, ev, up,
                                        summary(ev, "completed")),
        "corrupt_noconfig": write_run(exp_dir / "corrupt_noconfig", None, ev, up,
                                      summary(ev, "completed")),
    }
    truncated = paths["corrupt_truncated"] / schema.EVALS_FILE
    text = truncated.read_text()
    truncated.write_text(text[: text.rindex(",", 0, len(text) - 40)])  # cut inside a row
    bad = paths["corrupt_nonnumeric"] / schema.EVALS_FILE
    lines = bad.read_text().splitlines()
    fields = lines[2].split(",")
    fields[schema.EVAL_COLUMNS.index("test_error")] = "abc"
    lines[2] = ",".join(fields)
    bad.write_text("\n".join(lines) + "\n")
    return paths


def make_results(root: Path, error_shift: float = 0.0, time_scale: float = 1.0) -> Path:
    """The whole fake tree under ``root`` (returned): fig1, fig2, fig3 (with bad runs), fig4.

    ``error_shift``, ``time_scale``: see the module docstring (the bad runs are never shifted).
    """
    root = Path(root)
    shift = {"error_shift": error_shift, "time_scale": time_scale}
    write_experiment(root, "fig1", [1], [1], [0, 1, 2], "cold", **shift)
    write_experiment(root, "fig2", [1, 2, 4], [4], [0, 1], "cold", **shift)
    write_experiment(root, "fig3", [1, 2, 4], [1, 8], [0, 1], "warm", diverged=True, **shift)
    write_bad_runs(root / "fig3")
    write_experiment(root, "fig4", [1, 2, 4], [1, 8], [0, 1], "warm", diverged=True, **shift)
    return root
