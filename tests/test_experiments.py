"""End to end: a shrunk figure experiment trains its grid, then draws its figure from the logs.

The grid runs under the experiments' default launcher, ``hydra/launcher=parallel`` (joblib, one
job per core); tests/test_grids.py compares it, and submitit's local executor, with a sequential
launch byte for byte."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent

def _drawn(stdout: str) -> int:
    """How many times the figure was drawn (its callback prints one line each time; Hydra's log
    repeats it after a time stamp)."""
    return len(re.findall(r"^fig3: wrote", stdout, flags=re.M))


def _run(tmp_path, *extra):
    cmd = [sys.executable, "-m", "repro.run", "+exp=fig3", f"results_dir={tmp_path / 'results'}",
           f"figures_dir={tmp_path / 'figures'}", "num_epochs=0.5", "warm_start_epochs=0.5",
           "eval_every=0.25", "progress=false", "hydra.sweeper.params.num_clients='1,2'",
           "hydra.sweeper.params.nsync='1,4'", "hydra.sweeper.params.seed='0'", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_shrunk_fig3_produces_png_and_csv_and_skips_finished_runs(tmp_path):
    proc = _run(tmp_path)
    runs = sorted(p.parent for p in (tmp_path / "results" / "fig3").glob("*/summary.json"))
    configs = [json.loads((r / "config.json").read_text()) for r in runs]
    assert sorted((c["nsync"], c["num_clients"], c["seed"]) for c in configs) == [
        (1, 1, 0), (1, 2, 0), (4, 1, 0), (4, 2, 0)]
    assert all(c["start"] == "warm" and "nsync=" in r.name for c, r in zip(configs, runs))
    for r in runs:
        assert json.loads((r / "summary.json").read_text())["status"] == "completed"
    assert (tmp_path / "figures" / "fig3.png").stat().st_size > 10_000
    frame = pd.read_csv(tmp_path / "figures" / "fig3.csv")
    assert set(frame.num_clients) == {1, 2} and set(frame.nsync) == {1, 4}
    assert len(list((tmp_path / "results" / "_warmstart").glob("*/server.pt"))) == 1
    assert "Joblib.Parallel" in proc.stdout + proc.stderr and _drawn(proc.stdout) == 1

    before = {r: (r / "updates.csv").stat().st_mtime_ns for r in runs}
    proc = _run(tmp_path)                                   # re-running skips finished grid points
    assert (proc.stdout + proc.stderr).count("already completed") == 4
    assert "[grid fig3] finished: 4/4 done (4 skipped: already finished)" in proc.stderr
    assert all((r / "updates.csv").stat().st_mtime_ns == t for r, t in before.items())
    _run(tmp_path, "force=true")                            # force re-runs them
    assert all((r / "updates.csv").stat().st_mtime_ns != t for r, t in before.items())


@pytest.mark.slow
def test_default_run_trains_several_clients_below_5_percent(tmp_path):
    from repro.run import compose, parse, run

    cfg = parse(compose([f"results_dir={tmp_path}", "progress=false"]))
    assert cfg.num_clients > 1 and (cfg.data.name, cfg.model.name) == ("digits", "digits_cnn")
    summary = run(cfg, tmp_path / "default")
    assert summary["status"] == "completed"
    assert summary["final"]["test_error"] < 0.05


@pytest.mark.slow
def test_shrunk_fig3_grid_runs_on_the_real_driver(tmp_path):
    proc = _run(tmp_path, "backend=real", "backend.client_device=cpu", "hydra.sweeper.params.nsync='4'")
    runs = sorted((tmp_path / "results" / "fig3").glob("*/summary.json"))
    assert len(runs) == 2
    for path in runs:
        summary = json.loads(path.read_text())
        assert (summary["status"], summary["backend"], summary["clock"]) == ("completed", "real", "wall")
    assert (tmp_path / "figures" / "fig3.png").exists(), proc.stdout[-1000:]
