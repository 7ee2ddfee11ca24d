"""Staleness lab, stability: the delay bound, the experiment's grid, its figure, and its physics."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from repro.analysis.lab.stability import critical_lr, measured_boundary, outcome
from repro.config.checks import validate
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.run import compose, parse
from tests.helpers.grids import IN_PROCESS, cli_in_process, sweep_grid

LADDER = [0.0682, 0.0964, 0.136, 0.193, 0.273, 0.386, 0.545, 0.771, 1.09, 1.54, 2.18]


def stable(a: float, tau: int, steps: int = 6000) -> bool:
    """Iterate w_{t+1} = w_t - a w_{t-tau} from a constant history: does it decay? The largest
    |w| over two late windows of 2 tau + 2 steps (longer than the period of any boundary mode) is
    compared, so the start-up transient does not count; the history is rescaled now and then
    (its log scale kept) so that neither decay nor growth leaves the floats."""
    window = 2 * tau + 2
    hist, log_scale, peaks = [1.0] * (tau + 1), 0.0, []
    for t in range(steps):
        hist.append(hist[-1] - a * hist[-1 - tau])
        if t % 50 == 0 or t in (steps // 2, steps - 1):
            del hist[:-window]
            peak = max(abs(v) for v in hist)
            if t in (steps // 2, steps - 1):
                peaks.append(math.log(peak) + log_scale)
            hist = [v / peak for v in hist]
            log_scale += math.log(peak)
    return peaks[1] < peaks[0]


def bisect_boundary(tau: int, lo: float = 0.0, hi: float = 2.5, tol: float = 1e-4) -> float:
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if stable(mid, tau) else (lo, mid)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("tau", [0, 1, 2, 3, 5, 7])
def test_delay_bound_matches_a_bisection_of_the_iterated_recursion(tau):
    # Levin & May (1976): stable iff a < 2 sin(pi / (4 tau + 2)); tau = 0 is a < 2
    assert bisect_boundary(tau) == pytest.approx(critical_lr(tau), rel=2e-3)


def test_bound_values_on_the_quadratic():
    assert critical_lr([0, 1, 3, 7]) == pytest.approx([2.0, 1.0, 0.4450419, 0.2090569], rel=1e-6)
    assert critical_lr(3, l_max=0.5) == pytest.approx(2 * 0.4450419, rel=1e-6)


def test_outcomes_and_the_measured_boundary():
    assert outcome("diverged", 1.0, 0.01) == "diverged"
    assert outcome("completed", 1.0, 0.05) == "converged"
    assert outcome("completed", 1.0, 0.3) == "slow"
    assert outcome("completed", 2.31, 2.30) == "stalled"
    assert outcome("completed", 1.0, float("nan")) == "diverged"
    lo, hi, est = measured_boundary([0.1, 0.2, 0.4, 0.8], ["slow", "converged", "stalled", "diverged"])
    assert (lo, hi) == (0.2, 0.4) and est == pytest.approx(math.sqrt(0.08))
    # a stable cell above the first unstable one does not move the bracket
    assert measured_boundary([0.1, 0.2, 0.4], ["converged", "diverged", "converged"])[:2] == (0.1, 0.2)
    assert np.isnan(measured_boundary([0.1, 0.2], ["converged", "converged"])[1])


def test_experiment_grid_is_problems_x_clients_x_lr_ladder():
    grid = sweep_grid("stability")
    want = {(p, n, lr) for p in ("quadratic", "digits") for n in (1, 2, 4, 8) for lr in LADDER}
    got = {(str(g["problem"]), int(g["num_clients"]), float(g["algo.lr"])) for g in grid}
    assert got == want and len(grid) == len(want)
    # the ladder is geometric (ratio sqrt 2) and brackets every quadratic boundary with margin
    assert np.allclose(np.diff(np.log(LADDER)), np.log(2) / 2, atol=0.01)
    for tau in (0, 1, 3, 7):
        assert min(abs(np.log(np.array(LADDER) / critical_lr(tau)))) > np.log(1.08)
    for problem in ("quadratic", "digits"):
        cfg = parse(compose(["+exp=stability", f"+problem={problem}", "num_clients=8", "algo.lr=0.193"]))
        assert (cfg.exp_name, cfg.cost.profile, cfg.nsync, cfg.seed) == ("stability", "uniform", 1, 0)
        assert (cfg.algo.server_rule, cfg.algo.momentum, cfg.algo.lr) == ("downpour", 0.0, 0.193)
        assert cfg.data.name == problem


def quadratic_run(tmp_path, num_clients: int, lr: float) -> tuple[dict, pd.DataFrame]:
    from repro.sim.driver import simulate

    cfg = RunConfig(num_clients=num_clients, nsync=1, num_epochs=300, eval_every=10, progress=False,
                    data=DataConfig(name="quadratic"), model=ModelConfig(name="quadratic"),
                    algo=AlgoConfig(lr=lr, momentum=0.0, batch_size=10, server_rule="downpour"),
                    cost=CostConfig(profile="uniform"), results_dir=str(tmp_path))
    validate(cfg)
    run_dir = tmp_path / f"n{num_clients}_lr{lr:g}"
    summary = simulate(cfg, run_dir)
    return summary, pd.read_csv(run_dir / "evals.csv")


def test_quadratic_with_4_clients_is_stable_below_the_bound_and_diverges_above(tmp_path):
    bound = critical_lr(3)   # l_max = 1; every push 3 versions stale
    below, ev = quadratic_run(tmp_path, 4, 0.8 * bound)
    assert outcome(below["status"], ev.train_loss.iloc[0], ev.train_loss.iloc[-1]) == "converged"
    above, ev = quadratic_run(tmp_path, 4, 1.25 * bound)
    assert above["status"] == "diverged" and above["version"] < 300
    updates = pd.read_csv(tmp_path / f"n4_lr{1.25 * bound:g}" / "updates.csv")
    assert set(updates[updates.version > 4].staleness) == {3}   # uniform costs: tau = N - 1


def test_shrunk_stability_experiment_draws_its_figure(tmp_path, monkeypatch):
    assert cli_in_process(monkeypatch, "+exp=stability", f"results_dir={tmp_path / 'results'}",
                          f"figures_dir={tmp_path / 'figures'}", "num_epochs=1", "eval_every=1", "progress=false",
                          *IN_PROCESS, "hydra.sweeper.params={num_clients:'1,4',algo.lr:'0.3,3.0'}") == 0
    runs = list((tmp_path / "results" / "stability").glob("*/summary.json"))
    assert len(runs) == 8
    assert {json.loads(p.read_text())["status"] for p in runs} <= {"completed", "diverged"}
    assert (tmp_path / "figures" / "stability.png").stat().st_size > 10_000
    assert (tmp_path / "figures" / "stability.pdf").exists()
    frame = pd.read_csv(tmp_path / "figures" / "stability.csv")
    cells = frame[frame.kind == "run"]
    assert len(cells) == 8 and set(cells.problem) == {"quadratic", "digits"}
    assert set(cells.outcome) <= {"converged", "slow", "stalled", "diverged"}
    assert (cells[cells.lr == 3.0].outcome.isin(["stalled", "diverged"])).all()
    theory = frame[(frame.kind == "boundary") & (frame.problem == "quadratic") & (frame.source != "measured")]
    assert sorted(theory.lr.round(4)) == [0.445, 2.0]


def test_runs_of_one_cell_at_two_batch_sizes_are_refused_in_one_line(tmp_path, capsys):
    """`+exp=stability +problem=quadratic algo.batch_size=5,10` (data. and algo.batch_size are
    axes: +problem sets them) measured one boundary from both: at 2 clients 'no stable lr'
    (batch 5 diverged at 0.9) where batch 10 converged at 0.9, drawn as batch 10's."""
    from repro.analysis.__main__ import main
    from tests.helpers import fake_runs as fr

    for batch in (5, 10):
        fr.write_lab_run(tmp_path / "r", "stability", f"batch={batch}", 2, {"algo": {"batch_size": batch}})
    assert main(["stability", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "f")]) == 2
    assert "differ in algo.batch_size: choose with --config algo.batch_size=10" in capsys.readouterr().err
