"""Staleness lab, uneven (step 7): Rennala's collection time by hand and met by the simulator,
the other closed forms of the time per server step, the experiment's grid, and a shrunk sweep
that trains, then draws its figure from the logs."""
import itertools
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from repro.analysis.lab.uneven import collection_time, method_of, predicted_step_time, segment_times
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.run import parse
from repro.sim.driver import simulate
from tests.helpers.configs import composed
from tests.helpers.grids import sweep_grid
from tests.helpers.paths import ROOT

METHODS = ["async", "ssp", "sync", "sync_backup", "staleness_scaled",
           *(f"rennala_s{s}" for s in (2, 4, 8, 16, 32)), *(f"ringmaster_r{r}" for r in (2, 4, 8, 16, 32))]


def brute_force_collection_time(taus, size):
    """min{t : sum_i floor(t / tau_i) >= S} over every candidate t = m * tau_i, straight from
    the definition (integer taus: exact)."""
    candidates = sorted({m * tau for tau in taus for m in range(1, size + 1)})
    return next(t for t in candidates if sum(math.floor(t / tau) for tau in taus) >= size)


def test_collection_time_by_hand():
    # clients of 1 s and 2 s: pushes at 1, 2, 2, 3, 4, 4, ...
    assert [collection_time([1.0, 2.0], s) for s in range(1, 7)] == [1, 2, 2, 3, 4, 4]
    # one client: S segments in a row; equal clients: ceil(S / N) segments
    assert collection_time([3.0], 4) == 12 and collection_time([1.0] * 4, 5) == 2
    for taus in ([1, 2, 3], [2, 3, 7, 11], [1, 5, 5, 40]):
        for s in range(1, 25):
            assert collection_time([float(t) for t in taus], s) == brute_force_collection_time(taus, s)


def _run(**kw) -> RunConfig:
    """Tiny: synthetic data, an MLP, 4 clients of the uneven law (tau_i = 1 + sqrt(i)) and a 10x
    straggler, no jitter, free communication: the closed forms are exact."""
    base = dict(num_clients=4, nsync=1, num_epochs=3.0, eval_every=1.0, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.0, server_rule="downpour"),
                cost=CostConfig(profile="uneven", compute_s=0.01, speed_law="sqrt",
                                straggler_client=4, straggler_factor=10.0))
    base.update(kw)
    return RunConfig(**base)


def _row(cfg: RunConfig) -> pd.Series:
    """The config columns the analysis reads, as load_runs flattens config.json."""
    from repro.analysis.load import flatten
    from repro.config.settings import to_dict
    return pd.Series(flatten(to_dict(cfg)))


def test_segment_times_read_per_client_speeds_from_their_json_cell():
    cfg = _run(cost=CostConfig(compute_s=0.01, speeds=(1.0, 2.0, 4.0, 8.0), straggler_client=2,
                               straggler_factor=3.0), nsync=2)
    assert segment_times(_row(cfg)) == pytest.approx([0.02, 0.12, 0.08, 0.16])


def _step_times(run_dir) -> pd.Series:
    up = pd.read_csv(run_dir / "updates.csv")
    return up["time_s"].diff().fillna(up["time_s"].iloc[0])


@pytest.mark.parametrize("size", [2, 3, 8])
def test_rennala_steps_take_the_collection_time_in_the_simulator(tmp_path, size):
    """The issue's test: each Rennala step lasts t(S) = min{t : sum floor(t/tau_i) >= S}, within
    5% (mean and every step), for S below, at and above the number of clients."""
    cfg = _run(protocol=ProtocolConfig(name="rennala", collection_size=size), num_epochs=1.5 * size)
    simulate(cfg, tmp_path)
    predicted, _ = predicted_step_time(_row(cfg))
    assert predicted == collection_time(segment_times(_row(cfg)), size)
    steps = _step_times(tmp_path)
    assert len(steps) >= 10
    assert steps.mean() == pytest.approx(predicted, rel=0.05)
    assert steps.min() >= 0.95 * predicted and steps.max() <= 1.05 * predicted


@pytest.mark.parametrize("protocol,backups", [("sync", 0), ("sync", 1), ("async", 0)])
def test_the_other_closed_forms_of_the_step_time(tmp_path, protocol, backups):
    """sync: the slowest segment, max tau_i; one backup worker: the (N-1)-th smallest; async:
    1/sum(1/tau_i), in the long run (the first pushes of a run come faster: 10%)."""
    cfg = _run(protocol=ProtocolConfig(name=protocol, backup_workers=backups), num_epochs=6.0)
    simulate(cfg, tmp_path)
    taus = segment_times(_row(cfg))
    assert taus == pytest.approx([0.01, 0.02, 0.01 * (1 + math.sqrt(2)), 0.1 * (1 + math.sqrt(3))])
    predicted, _ = predicted_step_time(_row(cfg))
    want = {("sync", 0): max(taus), ("sync", 1): sorted(taus)[2],
            ("async", 0): 1 / sum(1 / t for t in taus)}[(protocol, backups)]
    assert predicted == pytest.approx(want)
    up = pd.read_csv(tmp_path / "updates.csv")
    measured = up["time_s"].iloc[-1] / len(up)
    assert measured == pytest.approx(predicted, rel=0.1 if protocol == "async" else 1e-9)


def test_no_closed_form_is_claimed_with_jitter_or_for_ssp_and_ringmaster():
    jitter = _run(cost=CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.5))
    assert math.isnan(predicted_step_time(_row(jitter))[0])
    for proto in ("ssp", "ringmaster"):
        assert math.isnan(predicted_step_time(_row(_run(protocol=ProtocolConfig(name=proto))))[0])


def test_grid_expands_to_the_intended_runs_and_each_method_keeps_its_own_rule():
    expected = {"mitigation": METHODS, "seed": ["0", "1"]}
    grid = sweep_grid("uneven")
    want = [dict(zip(expected, v)) for v in itertools.product(*expected.values())]
    as_key = lambda d: tuple(sorted((k, str(v)) for k, v in d.items()))  # noqa: E731
    assert sorted(map(as_key, grid)) == sorted(map(as_key, want)) and len(grid) == 30
    names = set()
    for option in METHODS:
        cfg = parse(composed(["+exp=uneven", f"+mitigation={option}"]))
        # the experiment's cluster and step size, the method's own rule and protocol
        assert (cfg.num_clients, cfg.nsync, cfg.algo.lr, cfg.algo.momentum) == (8, 1, 0.1, 0.0)
        assert (cfg.cost.speed_law, cfg.cost.straggler_client, cfg.cost.straggler_factor,
                cfg.cost.jitter, cfg.cost.latency_s, cfg.cost.bandwidth_Bps) == ("sqrt", 8, 10.0, "none", 0.0, None)
        rule = "staleness_scaled" if option == "staleness_scaled" else "downpour"
        assert cfg.algo.server_rule == rule, option
        names.add(method_of(_row(cfg))[0])
    assert {"Rennala S=2", "Rennala S=32", "Ringmaster R=8", "sync + 1 backup", "ssp s=3"} <= names
    assert len(names) == len(METHODS)


@pytest.mark.slow
def test_shrunk_sweep_draws_its_figure_and_redraws_from_logs(tmp_path):
    cmd = [sys.executable, "-m", "repro.run", "+exp=uneven", f"results_dir={tmp_path / 'r'}",
           f"figures_dir={tmp_path / 'f'}", "num_epochs=1", "progress=false",
           "hydra.sweeper.params={+mitigation:'async,sync,rennala_s4,ringmaster_r8',seed:'0'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "f" / "uneven.png").stat().st_size > 20_000
    frame = pd.read_csv(tmp_path / "f" / "uneven.csv")
    steps = frame[frame["quantity"] == "step_time_s"].set_index(["method", "kind"])["value"]
    taus = frame[frame["quantity"] == "tau_s"]["value"].tolist()
    assert len(taus) == 8 and taus[-1] == pytest.approx(0.1 * (1 + math.sqrt(7)))
    assert steps[("Rennala S=4", "predicted")] == pytest.approx(collection_time(taus, 4))
    assert steps[("Rennala S=4", "measured")] == pytest.approx(steps[("Rennala S=4", "predicted")], rel=0.05)
    assert steps[("sync", "measured")] == pytest.approx(max(taus))
    assert ("Ringmaster R=8", "predicted") not in steps.index

    from repro.analysis import figure_frame  # from the logs alone: the same numbers
    figure_frame("uneven", tmp_path / "r").to_csv(tmp_path / "again.csv", index=False)
    pd.testing.assert_frame_equal(frame, pd.read_csv(tmp_path / "again.csv"))


@pytest.mark.parametrize("figure, groups", [("uneven", {}),
                                             ("own_data", {"data": {"partition": "by_class"},
                                                           "cost": {"straggler_client": 1}})])
def test_runs_of_two_learning_rates_are_never_pooled(tmp_path, capsys, figure, groups):
    """`+exp=uneven +mitigation=async algo.lr=0.02,0.2` drew one 'async' of 2 runs: the two
    learning rates' mean as if over seeds, titled with the first's lr (own_data's table: 'runs
    2' of seed 0); now one lr at a time."""
    from repro.analysis.__main__ import main
    from tests.helpers import fake_runs as fr

    for lr in (0.02, 0.2):
        fr.write_lab_run(tmp_path / "r", figure, f"lr={lr}", 4, {
            **groups, "algo": {"lr": lr, "server_rule": "downpour"}, "protocol": {"name": "async"}})
    out = tmp_path / "f"
    assert main([figure, "--results", str(tmp_path / "r"), "--out", str(out)]) == 2
    assert "choose one with --config algo.lr=0.02" in capsys.readouterr().err
    assert main([figure, "--results", str(tmp_path / "r"), "--out", str(out),
                 "--config", "algo.lr=0.2", "--name", "one"]) == 0
    frame = pd.read_csv(out / "one.csv")
    assert set(frame["algo.lr"]) == {0.2} and frame["run_dir"].dropna().nunique() == 1


def test_uneven_target_is_a_training_loss_on_the_command_line(tmp_path, capsys):
    """uneven's --target is a loss in nats (default 0.5), but the CLI refused any above 1 as 'a
    training error as a fraction' and --help said it was fig4's training error."""
    from repro.analysis.__main__ import main
    from tests.helpers import fake_runs as fr

    run = fr.write_lab_run(tmp_path / "r", "uneven", "async", 4, {
        "algo": {"server_rule": "downpour"}, "protocol": {"name": "async"}})
    assert main(["uneven", "--results", str(tmp_path / "r"), "--out", str(tmp_path / "f"),
                 "--target", "1.5"]) == 0
    frame = pd.read_csv(tmp_path / "f" / "uneven.csv")
    evals = pd.read_csv(run / "evals.csv")
    by_hand = evals.loc[evals.train_loss <= 1.5, "time_s"].iloc[0]
    assert frame.loc[frame.quantity == "time_to_target_s", "value"].tolist() == [by_hand]
    assert main(["uneven", "--results", str(tmp_path / "r"), "--target", "-1"]) == 2
    assert "a training loss >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "uneven's is a training loss" in " ".join(capsys.readouterr().out.split())
