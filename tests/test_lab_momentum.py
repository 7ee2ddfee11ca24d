"""Staleness lab, momentum: the estimator on synthetic curves, the theorem's form, the grid, the figure."""

import numpy as np
import pandas as pd
import pytest

from repro.analysis.lab.momentum import (
    direct_momentum,
    fit_mode_energies,
    implicit_momentum,
    momentum_response,
    refine_minimum,
    theorem_response,
)
from repro.workload.data import QUADRATIC_CURVATURES as L
from repro.run import compose, parse
from tests.helpers.grids import IN_PROCESS, cli_in_process, sweep_grid

LR, STEPS = 0.2, 100
W0 = np.random.default_rng(7).uniform(-0.3, 0.3, len(L))
ENERGY = 0.5 * np.asarray(L) * W0 ** 2          # c_i = l_i w_{0,i}^2 / 2
VERSIONS = np.arange(STEPS + 1)


def curve(response, m):
    """A synthetic loss curve as the quadratic logs it (float32)."""
    return (ENERGY @ response(L, LR, m, STEPS) ** 2).astype(np.float32).astype(float)


def test_mode_fit_recovers_the_energies_and_two_known_momenta():
    c, worst = fit_mode_energies(L, [(LR, m, VERSIONS, curve(momentum_response, m))
                                     for m in (0.0, 0.5, 0.875)])
    assert worst < 1e-4
    assert np.abs(c - ENERGY).sum() < 1e-3 * ENERGY.sum()
    for m in (0.3, 0.8):   # two 1-client runs at known momenta, off the fitted ladder
        got = implicit_momentum(L, c, LR, VERSIONS, curve(momentum_response, m),
                                response=momentum_response)
        assert got == pytest.approx(m, abs=0.005)


def test_theorem_form_curve_is_recovered():
    c, _ = fit_mode_energies(L, [(LR, 0.0, VERSIONS, curve(momentum_response, 0.0))])
    assert implicit_momentum(L, c, LR, VERSIONS, curve(theorem_response, 0.6)) == pytest.approx(0.6, abs=0.005)


def test_direct_match_against_a_ladder_of_runs():
    ladder = {m: (VERSIONS, curve(momentum_response, m)) for m in (0, 0.25, 0.5, 0.625, 0.75, 0.875)}
    # on a ladder point the parabola through it and its neighbours moves it only a little
    assert direct_momentum(VERSIONS, curve(momentum_response, 0.5), ladder) == pytest.approx(0.5, abs=0.01)
    assert direct_momentum(VERSIONS, curve(momentum_response, 0.7), ladder) == pytest.approx(0.7, abs=0.05)
    # on the time-constant scale x = -ln(1 - m) the parabola's vertex is found exactly
    ms = np.array([0.5, 0.75, 0.875])
    assert refine_minimum(ms, (-np.log1p(-ms) - np.log(3)) ** 2) == pytest.approx(2 / 3)
    assert refine_minimum([0.0, 0.5], [1.0, 2.0]) == 0.0 and np.isnan(refine_minimum([0.5], [np.nan]))


def test_theorem_form_is_the_mean_of_asynchronous_sgd_with_exponential_step_times():
    """Mitliagkas et al. 2016: N clients with exponential compute times, each reading the latest
    parameters when it pushes, average to momentum SGD with mu = 1 - 1/N, the buffer starting
    at the first full gradient. Simulated here directly, over many delay sequences."""
    n, reps, steps = 4, 4000, 40
    rng = np.random.default_rng(0)
    l = np.asarray(L)
    hist = np.empty((steps + 1, reps, len(l)))
    hist[0] = W0
    finish = rng.exponential(size=(reps, n))
    read = np.zeros((reps, n), int)
    rows = np.arange(reps)
    for t in range(steps):
        k = finish.argmin(1)   # the next push comes from the client that finishes first
        hist[t + 1] = hist[t] - LR * l * hist[read[rows, k], rows]
        read[rows, k] = t + 1
        finish[rows, k] += rng.exponential(size=reps)
    mean = hist.mean(1)
    theory = W0 * theorem_response(l, LR, 1 - 1 / n, steps).T
    torch_style = W0 * momentum_response(l, LR * (1 / n), 1 - 1 / n, steps).T
    err = np.abs(mean - theory).max() / np.abs(W0).max()
    assert err < 0.01
    assert np.abs(mean - torch_style).max() / np.abs(W0).max() > 5 * err   # the start matters


def test_experiment_grid_and_config():
    grid = sweep_grid("momentum")
    ladder = (0, 0.25, 0.5, 0.625, 0.75, 0.875, 0.9, 0.95)
    want = {(n, m, s) for n in (1, 2, 4, 8) for m in ladder for s in (0, 1, 2)}
    got = {(int(g["num_clients"]), float(g["algo.momentum"]), int(g["seed"])) for g in grid}
    assert got == want and len(grid) == len(want)
    cfg = parse(compose(["+exp=momentum", "num_clients=8", "algo.momentum=0.5", "seed=2"]))
    assert (cfg.data.name, cfg.model.name, cfg.algo.batch_size) == ("quadratic", "quadratic", 10)
    assert (cfg.algo.server_rule, cfg.algo.lr, cfg.nsync) == ("delta", 0.2, 1)
    assert (cfg.cost.jitter, cfg.cost.jitter_sigma) == ("exponential", 1.0)


def test_shrunk_momentum_experiment_draws_its_figure(tmp_path, monkeypatch):
    assert cli_in_process(monkeypatch, "+exp=momentum", f"results_dir={tmp_path / 'results'}",
                          f"figures_dir={tmp_path / 'figures'}", "progress=false", *IN_PROCESS,
                          "hydra.sweeper.params={num_clients:'1,2',algo.momentum:'0,0.5',seed:'0'}") == 0
    assert len(list((tmp_path / "results" / "momentum").glob("*/summary.json"))) == 4
    assert (tmp_path / "figures" / "momentum.png").stat().st_size > 10_000
    frame = pd.read_csv(tmp_path / "figures" / "momentum.csv")
    fit = frame[frame.kind == "fit"].value
    assert len(fit) == 1 and fit.iloc[0] < 1e-3
    measured = frame[(frame.kind == "implicit") & (frame.source == "measured")].set_index("num_clients").value
    assert measured[1] == pytest.approx(0.0, abs=0.01) and 0.25 < measured[2] < 0.75
    assert set(frame[frame.kind == "best"].source) == {"measured", "Mitliagkas et al. 2016"}
