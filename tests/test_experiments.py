"""End to end (slow): the default run trains to its target, and a shrunk figure grid runs on the
real driver. The shrunk grid under the experiments' default launcher (figure drawn once, finished
points skipped on a re-run) and its byte-for-byte comparison with the other launchers are in
tests/test_grids.py."""
import json
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT


def _run(tmp_path, *extra):
    cmd = [sys.executable, "-m", "repro.run", "+exp=fig3", f"results_dir={tmp_path / 'results'}",
           f"figures_dir={tmp_path / 'figures'}", "num_epochs=0.5", "warm_start_epochs=0.5",
           "eval_every=0.25", "progress=false", "hydra.sweeper.params.num_clients='1,2'",
           "hydra.sweeper.params.nsync='1,4'", "hydra.sweeper.params.seed='0'", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


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
