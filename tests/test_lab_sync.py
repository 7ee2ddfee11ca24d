"""Staleness lab, sync_vs_async: the barrier theory against exact values and Monte Carlo, the
experiment's grid, and a shrunk sweep that trains, then draws its figure from the logs."""
import itertools
import math

import numpy as np
import pandas as pd
import pytest

from repro.analysis.lab.sync import (
    Timing,
    _segments,
    async_segments_per_s,
    harmonic,
    segment_order_time,
    ssp_clock,
    sync_round_s,
    timing_of,
)
from repro.analysis.lab.mitigation import expected_mean_staleness
from repro.run import compose, parse
from tests.helpers.grids import IN_PROCESS, cli_in_process, sweep_grid


# ---------------------------------------------------------------------------------------------
# theory
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_exponential_barrier_is_the_harmonic_number(n):
    """Exponential steps, nsync 1: E[max of N Exp(1)] = H_N and, for one backup worker,
    E[(N-1)-th of N] = H_N - 1 (Renyi: the k-th spacing is Exp with rate N - k + 1).
    Tolerance: quadrature on a 2^15-point grid, ~1e-6 relative."""
    tm = Timing(1.0, "exponential", 1.0, 1, n)
    assert segment_order_time(tm, n) == pytest.approx(harmonic(n), rel=1e-5)
    assert segment_order_time(tm, n - 1) == pytest.approx(harmonic(n) - 1, rel=1e-5)
    assert segment_order_time(tm, 1) == pytest.approx(1 / n, rel=1e-4)   # the min: Exp(N)


@pytest.mark.parametrize("jitter,sigma,nsync,factor", [
    ("lognormal", 0.5, 1, 1.0), ("lognormal", 0.5, 2, 1.0), ("exponential", 1.0, 2, 1.0),
    ("exponential", 0.5, 3, 1.0), ("lognormal", 0.1, 1, 4.0), ("exponential", 1.0, 1, 2.0)])
def test_order_statistics_match_a_large_seeded_monte_carlo(jitter, sigma, nsync, factor):
    """The quadrature (Poisson-binomial count over the clients' CDFs; the lognormal sum by FFT
    convolution) against 200 000 seeded draws of the same segments, for the max (sync) and the
    (N-1)-th (one backup worker), straggler included. Tolerance: 5 Monte Carlo standard errors."""
    n = 6
    tm = Timing(1.0, jitter, sigma, nsync, n, slowdowns=(factor,) + (1.0,) * (n - 1))
    rng = np.random.default_rng(12345)
    draws = _segments(rng, tm, (200_000, n)) * np.asarray(tm.factors())
    draws.sort(axis=1)
    for m in (n, n - 1):
        mc = draws[:, m - 1]
        se = mc.std() / math.sqrt(len(mc))
        assert abs(segment_order_time(tm, m) - mc.mean()) < 5 * se, (m, mc.mean())


@pytest.mark.parametrize("n,k", [(2, 4.0), (4, 4.0), (8, 4.0), (8, 2.0)])
def test_straggler_ratio_is_n_over_k_times_n_minus_1_plus_1(n, k):
    """No jitter, one client k times slower: a round lasts k steps and applies N segments;
    async completes (N - 1) + 1/k segments per step time: ratio N / (k (N - 1) + 1). One backup
    worker drops the straggler: N - 1 segments per step, ratio (N - 1) / ((N - 1) + 1/k)."""
    tm = Timing(0.01, "none", 0.0, 1, n, slowdowns=(k,) + (1.0,) * (n - 1))
    ratio = (n / sync_round_s(tm)) / async_segments_per_s(tm)
    assert ratio == pytest.approx(n / (k * (n - 1) + 1), rel=1e-3)
    backup = ((n - 1) / sync_round_s(tm, 1)) / async_segments_per_s(tm)
    assert backup == pytest.approx((n - 1) / ((n - 1) + 1 / k), rel=1e-3)


def test_ssp_recurrence_spans_sync_to_async():
    """Ho et al.'s clock rule with s = 0 is a barrier every push; with s beyond the run, async.
    Tolerance: Monte Carlo over 256 replicas of a few hundred pushes, ~2%."""
    tm = Timing(0.01, "exponential", 1.0, 1, 8)
    pushes = 400
    (sync_s, sync_stale), (async_s, async_stale), (mid_s, mid_stale) = (ssp_clock(tm, s, pushes) for s in (0, 10**6, 3))
    sync_rate, async_rate, mid = pushes / sync_s, pushes / async_s, pushes / mid_s
    assert sync_rate == pytest.approx(8 / sync_round_s(tm), rel=0.03)
    assert async_rate == pytest.approx(async_segments_per_s(tm), rel=0.03)
    assert sync_rate < mid < async_rate
    assert ssp_clock(tm, 3, pushes) == (mid_s, mid_stale)   # seeded: a frame repeats
    # staleness: rounds at s = 0 (the k-th push of a round is k - 1 stale, whatever the jitter);
    # async's (N - 1)(1 - N / 2P) beyond the run; between them at s = 3
    assert sync_stale == pytest.approx(float(np.mean(np.arange(pushes) % 8)))
    assert async_stale == pytest.approx(expected_mean_staleness(8, pushes), rel=0.02)
    assert sync_stale < mid_stale < async_stale


def test_ssp_staleness_of_equal_clients_is_asyncs_at_a_bound_they_never_reach():
    """No jitter: every client pushes at the same instants; the server takes them one at a time,
    so each push is N - 1 stale after the first round, exactly as async's."""
    pushes = 300
    assert ssp_clock(Timing(0.01, "none", 0.0, 1, 4), 3, pushes)[1] == pytest.approx(expected_mean_staleness(4, pushes))


# ---------------------------------------------------------------------------------------------
# the experiment
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topology, link", [("dedicated", {"cost.bandwidth_Bps": 1e6}),
                                             ("shared", {"cost.shared.server_bandwidth_Bps": 1e6})])
def test_the_theory_charges_a_transfer_what_the_simulator_charges(topology, link):
    """o = 2 * (latency + bytes / bandwidth) + apply, with the bandwidth the simulator's cost model
    gives one transfer on its path: on shared links with only the server's link limited too (the
    theory once charged that path no transfer at all)."""
    run = pd.Series({"cost.compute_s": 0.01, "cost.jitter": "lognormal", "cost.jitter_sigma": 0.1,
                     "cost.latency_s": 0.001, "cost.server_apply_s": 0.002, "cost.topology": topology,
                     "nsync": 4, "num_clients": 2, "network.param_bytes": 4000, "run_dir": "r", **link})
    assert timing_of(run).overhead_s == pytest.approx(2 * (0.001 + 4000 / 1e6) + 0.002)
    free = run.drop(list(link)).drop("network.param_bytes")   # free links: latency alone, no bytes read
    assert timing_of(free).overhead_s == pytest.approx(2 * 0.001 + 0.002)


def test_the_theory_paces_each_client_as_the_simulator_does():
    """f_i is the client's relative step time times the straggler's factor, wherever the
    straggler is (the theory once put it at client 1 and ignored cost.speed_law)."""
    run = pd.Series({"cost.compute_s": 0.01, "cost.speed_law": "sqrt", "cost.straggler_client": 3,
                     "cost.straggler_factor": 4.0, "nsync": 1, "num_clients": 4})
    assert timing_of(run).factors() == pytest.approx([1.0, 2.0, 4 * (1 + math.sqrt(2)), 1 + math.sqrt(3)])


def test_grid_expands_to_the_intended_runs():
    expected = {"protocol": ["async", "sync", "sync_backup", "ssp"], "num_clients": ["2", "4", "8"],
                "cost": ["jitter_lognormal", "jitter_exponential", "straggler"], "seed": ["0", "1"]}
    grid = sweep_grid("sync_vs_async")
    want = [dict(zip(expected, v)) for v in itertools.product(*expected.values())]
    as_key = lambda d: tuple(sorted((k, str(v)) for k, v in d.items()))  # noqa: E731
    assert sorted(map(as_key, grid)) == sorted(map(as_key, want)) and len(grid) == 72
    for point in (grid[0], grid[-1], {"protocol": "sync_backup", "num_clients": 2, "cost": "straggler"}):
        cfg = parse(compose(["+exp=sync_vs_async"] + [f"{k}={v}" for k, v in point.items()]))
        assert (cfg.nsync, cfg.algo.server_rule, cfg.exp_name) == (1, "adagrad", "sync_vs_async")
    cfg = parse(compose(["+exp=sync_vs_async", "protocol=sync_backup", "cost=straggler"]))
    assert (cfg.protocol.name, cfg.protocol.backup_workers, cfg.cost.straggler_factor) == ("sync", 1, 4.0)


def _sweep(tmp_path, monkeypatch, *params, num_epochs=0.5):
    # num_epochs once: a key set twice on the command line is refused (issue 22)
    assert cli_in_process(monkeypatch, "+exp=sync_vs_async", f"results_dir={tmp_path / 'r'}",
                          f"figures_dir={tmp_path / 'f'}", f"num_epochs={num_epochs}", "progress=false",
                          *IN_PROCESS, *params) == 0
    return pd.read_csv(tmp_path / "f" / "sync_vs_async.csv")


def test_shrunk_sweep_draws_measured_beside_predicted_and_redraws_from_logs(tmp_path, monkeypatch):
    frame = _sweep(tmp_path, monkeypatch, "hydra.sweeper.params.protocol='async,sync'",
                   "hydra.sweeper.params.num_clients='2'", "hydra.sweeper.params.seed='0'",
                   "hydra.sweeper.params.cost='jitter_exponential'")
    assert (tmp_path / "f" / "sync_vs_async.png").stat().st_size > 20_000
    assert (tmp_path / "f" / "sync_vs_async.pdf").exists()
    assert len(list((tmp_path / "r" / "sync_vs_async").glob("*/summary.json"))) == 2
    pred = frame[(frame["kind"] == "predicted") & (frame["quantity"] == "throughput_ratio")]
    assert pred.set_index("protocol")["value"].to_dict() == pytest.approx({"async": 1.0, "sync": 1 / 1.5})
    meas = frame[(frame["kind"] == "measured") & (frame["quantity"] == "throughput_ratio")]
    assert meas.set_index("protocol")["value"]["async"] == 1.0
    assert 0.4 < meas.set_index("protocol")["value"]["sync"] < 0.9   # ~20 rounds: noisy 2/3
    assert set(frame["quantity"]) >= {"samples_per_s", "updates_per_s", "time_to_target_s", "mean_round_s"}

    from repro.analysis import figure_frame  # from the logs alone: the same numbers
    figure_frame("sync_vs_async", tmp_path / "r").to_csv(tmp_path / "again.csv", index=False)
    pd.testing.assert_frame_equal(frame, pd.read_csv(tmp_path / "again.csv"))


@pytest.mark.slow
def test_straggler_throughput_of_every_protocol_matches_theory(tmp_path, monkeypatch):
    """Nearly deterministic (sigma 0.1): every protocol's measured throughput ratio within 5%
    of its prediction, backup workers recovering most of async's throughput."""
    frame = _sweep(tmp_path, monkeypatch, "hydra.sweeper.params.num_clients='4'",
                   "hydra.sweeper.params.seed='0'", "hydra.sweeper.params.cost='straggler'", num_epochs=3)
    ratio = (frame[frame["quantity"] == "throughput_ratio"]
             .groupby(["protocol", "kind"])["value"].mean().unstack())
    assert len(ratio) == 4
    for protocol, row in ratio.iterrows():
        assert row["measured"] == pytest.approx(row["predicted"], rel=0.05), protocol
    assert ratio.loc["sync + 1 backup", "measured"] > 2 * ratio.loc["sync", "measured"]


def test_runs_of_one_profile_at_two_jitters_are_refused_in_one_line(tmp_path, capsys):
    """`+exp=sync_vs_async cost=jitter_lognormal cost.jitter_sigma=0.2,0.8` ended in pandas'
    'cannot handle a non-unique multi-index!' (a traceback; the grid drew no figure): the frame
    knows a run by its profile's name, so the two jitters are refused, naming the key."""
    from repro.analysis.__main__ import main
    from tests.helpers import fake_runs as fr

    for sigma in (0.2, 0.8):
        fr.write_lab_run(tmp_path / "r", "sync_vs_async", f"sigma={sigma}", 2, {
            "protocol": {"name": "async"}, "cost": {"jitter_sigma": sigma}})
    assert main(["sync_vs_async", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "f")]) == 2
    assert "differ in cost.jitter_sigma: choose with --config cost.jitter_sigma=0.2" in capsys.readouterr().err
