"""Staleness lab, churn: the experiment's grid, and a shrunk sweep that trains under
preemption, then draws its figure (measured throughput beside the live-client prediction)."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from repro.run import compose, parse
from tests.helpers.grids import sweep_grid
from tests.helpers.paths import ROOT


def test_grid_expands_to_the_intended_runs():
    grid = sweep_grid("churn")
    assert len(grid) == 24
    assert {str(p["cost.churn.preempt_rate"]) for p in grid} == {"0", "0.5", "1", "3"}
    cfg = parse(compose(["+exp=churn", "protocol=ssp", "cost.churn.preempt_rate=3"]))
    churn = cfg.cost.churn
    assert (cfg.num_clients, churn.preempt_down_s, churn.preempt_rate, cfg.exp_name) == (4, 0.1, 3.0, "churn")
    assert parse(compose(["+exp=churn", "protocol=ssp", "cost.preempt_rate=3"])) == cfg   # the old spelling


@pytest.mark.slow
def test_shrunk_sweep_draws_measured_beside_predicted(tmp_path):
    cmd = [sys.executable, "-m", "repro.run", "+exp=churn", f"results_dir={tmp_path / 'r'}",
           f"figures_dir={tmp_path / 'f'}", "num_epochs=0.5", "progress=false",
           "protocol=async", "cost.preempt_rate=0,3",
           "seed=0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    frame = pd.read_csv(tmp_path / "f" / "churn.csv")
    assert (tmp_path / "f" / "churn.png").stat().st_size > 10_000
    assert sorted(frame.preempt_rate) == [0.0, 3.0]
    calm = frame[frame.preempt_rate == 0].iloc[0]
    assert calm.predicted_samples_per_s == pytest.approx(calm.samples_per_s)
    churned = frame[frame.preempt_rate == 3].iloc[0]
    assert churned.live_fraction == pytest.approx(1 / 1.3)
    assert churned.samples_per_s < calm.samples_per_s


def test_time_to_target_is_the_column_of_the_key_the_run_wrote():
    """summary.json keys time_to_target by the target's repr (1.0 -> "1.0"), so the runs table's
    column is time_to_target.1.0; the frame looked for time_to_target.1 and found no time."""
    from repro.analysis.lab.churn import churn_frame
    from repro.analysis.load import Runs

    runs = pd.DataFrame({"protocol.name": ["async"], "cost.churn.preempt_rate": [0.0], "seed": [0],
                         "final_samples_seen": [100], "final_time_s": [2.0], "target_error": [1.0],
                         "cost.churn.preempt_down_s": [0.1], "time_to_target.1.0": [1.5],
                         "num_clients": [4]})
    frame = churn_frame(Runs(runs, pd.DataFrame(), pd.DataFrame(), pd.DataFrame()))
    assert frame.time_to_target_s.tolist() == [1.5]


def test_runs_of_two_client_counts_are_never_pooled(tmp_path, capsys):
    """`+exp=churn num_clients=2,4` drew one point per rate with the mean of a 2- and a 4-client
    run, and predicted each from their pooled no-churn mean (9,235 samples/s beside 6,195 and
    12,275 measured): the frame has no client count, so it is refused, naming it."""
    from repro.analysis.__main__ import main
    from tests.helpers import fake_runs as fr

    for n in (2, 4):
        for rate in (0.0, 1.0):
            fr.write_lab_run(tmp_path / "r", "churn", f"n={n},rate={rate}", n, {
                "protocol": {"name": "async"},
                "cost": {"churn": {"preempt_rate": rate, "preempt_down_s": 0.1}}})
    out = tmp_path / "f"
    assert main(["churn", "--results", str(tmp_path / "r"), "--out", str(out)]) == 2
    assert "they differ in num_clients: choose with --config num_clients=2" in capsys.readouterr().err
    assert main(["churn", "--results", str(tmp_path / "r"), "--out", str(out),
                 "--config", "num_clients=2", "--name", "two"]) == 0
    frame = pd.read_csv(out / "two.csv")
    by_hand = (frame.samples_per_s[frame.preempt_rate == 0].mean()   # 2 clients' no-churn runs alone
               * frame.live_fraction)
    assert frame.predicted_samples_per_s.tolist() == pytest.approx(by_hand.tolist())


def test_a_target_the_summaries_do_not_key_is_timed_from_the_evaluations(tmp_path):
    """`python -m repro.analysis churn --target 0.9` left time_to_target_s empty for runs that
    reached 55% error in 0.03 s: the summaries key only their own target_error."""
    from repro.analysis import figure_frame
    from tests.helpers import fake_runs as fr

    run = fr.write_lab_run(tmp_path, "churn", "calm", 4, {
        "protocol": {"name": "async"}, "cost": {"churn": {"preempt_rate": 0.0, "preempt_down_s": 0.1}}})
    evals = pd.read_csv(run / "evals.csv")
    for target in (0.5, fr.TARGET):   # another target, and the one the summary keys: one rule
        frame = figure_frame("churn", tmp_path, target=target)
        by_hand = evals.loc[evals.train_error <= target, "time_s"].iloc[0]
        assert frame.time_to_target_s.tolist() == [by_hand]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_the_title_names_the_client_count_of_the_runs(tmp_path, n):
    """The title was written out as "4 clients": `+exp=churn num_clients=8` drew 8-client runs
    under it. For 4 it is the committed figures/churn.png's title, word for word."""
    import matplotlib.pyplot as plt

    from repro.analysis import figure_frame
    from repro.analysis.lab.churn import draw_churn
    from tests.helpers import fake_runs as fr

    for rate in (0.0, 1.0):
        fr.write_lab_run(tmp_path, "churn", f"rate={rate}", n, {
            "protocol": {"name": "async"}, "cost": {"churn": {"preempt_rate": rate, "preempt_down_s": 0.1}}})
    fig = draw_churn(figure_frame("churn", tmp_path))
    title = fig._suptitle.get_text()
    plt.close(fig)
    clients = "1 client," if n == 1 else f"{n} clients,"
    assert title == f"What churn costs: {clients} preempted clients back after cost.churn.preempt_down_s"
