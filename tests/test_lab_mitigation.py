"""Staleness lab, mitigation: the experiment's grid, the expected staleness it draws against
exact simulations, and a shrunk sweep that trains, then draws its figure from the logs."""
import itertools

import pandas as pd
import pytest

from repro.analysis.lab.mitigation import expected_mean_staleness, mitigation_of, ssp_staleness_bound
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.run import compose, parse
from repro.sim.driver import simulate
from tests.helpers.grids import IN_PROCESS, cli_in_process, sweep_grid

RULES = {"async": ("downpour", "async"), "staleness_scaled": ("staleness_scaled", "async"),
         "dcasgd": ("dcasgd", "async"), "ssp": ("downpour", "ssp"), "sync": ("downpour", "sync")}


def test_grid_expands_to_the_intended_runs_and_each_option_sets_rule_and_protocol():
    expected = {"mitigation": list(RULES), "nsync": ["1", "4", "16"], "seed": ["0", "1"]}
    grid = sweep_grid("mitigation")
    want = [dict(zip(expected, v)) for v in itertools.product(*expected.values())]
    as_key = lambda d: tuple(sorted((k, str(v)) for k, v in d.items()))  # noqa: E731
    assert sorted(map(as_key, grid)) == sorted(map(as_key, want)) and len(grid) == 30
    for name, (rule, protocol) in RULES.items():
        cfg = parse(compose(["+exp=mitigation", f"+mitigation={name}", "nsync=16", "seed=1"]))
        assert (cfg.algo.server_rule, cfg.protocol.name) == (rule, protocol)
        # the experiment's settings win over the mitigation's algo defaults
        assert (cfg.num_clients, cfg.algo.lr, cfg.algo.momentum, cfg.cost.profile, cfg.target_error) == \
            (8, 0.1, 0.0, "jitter_lognormal", 0.1)
        assert mitigation_of(rule, protocol) in (
            "async", "staleness-scaled", "DC-ASGD-c", "ssp", "sync")


def _cfg(**kw) -> RunConfig:
    base = dict(num_clients=4, nsync=1, num_epochs=2.0, eval_every=1.0, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.0, server_rule="downpour"),
                cost=CostConfig(profile="uniform", compute_s=0.01))
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.parametrize("n,nsync", [(4, 1), (3, 2)])
def test_expected_mean_staleness_is_exact_for_equal_speeds(tmp_path, n, nsync):
    """Uniform costs: the first round's pushes see 0, 1, .., N-1 updates, every later one N-1,
    so P pushes average (N-1)(1 - N/2P) -- exactly (integers)."""
    simulate(_cfg(num_clients=n, nsync=nsync), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    assert up["staleness"].mean() == pytest.approx(expected_mean_staleness(n, len(up)), abs=1e-12)
    assert up["staleness"].tolist()[:n] == list(range(n))
    assert expected_mean_staleness(n, 2) == 0.5   # fewer pushes than clients: 0, 1


def test_ssp_never_exceeds_its_staleness_bound(tmp_path):
    """Exponential step times spread the clients; async's worst push passes (2s+1)(N-1) for
    s = 1, ssp's never does (Ho et al. 2013's clock rule, counted in server versions)."""
    cost = CostConfig(profile="jitter_exponential", compute_s=0.01, jitter="exponential", jitter_sigma=1.0)
    worst = {}
    for name in ("async", "ssp"):
        cfg = _cfg(num_clients=4, num_epochs=6.0, cost=cost, seed=3,
                   protocol=ProtocolConfig(name=name, staleness_bound=1))
        simulate(cfg, tmp_path / name)
        worst[name] = pd.read_csv(tmp_path / name / "updates.csv")["staleness"].max()
    assert worst["ssp"] <= ssp_staleness_bound(4, 1) == 9 < worst["async"]


def test_shrunk_sweep_draws_its_figure_and_redraws_from_logs(tmp_path, monkeypatch):
    # 0.75 epochs: one sync round of 8 clients x nsync 4 (32 minibatches, 0.71 epochs) must fit
    assert cli_in_process(monkeypatch, "+exp=mitigation", f"results_dir={tmp_path / 'r'}",
                          f"figures_dir={tmp_path / 'f'}", "num_epochs=0.75", "progress=false", *IN_PROCESS,
                          # '+mitigation' cannot be a dotted key on the command line: replace the whole dict
                          "hydra.sweeper.params={+mitigation:'async,sync',nsync:'4',seed:'0'}") == 0
    assert (tmp_path / "f" / "mitigation.png").stat().st_size > 20_000
    assert (tmp_path / "f" / "mitigation.pdf").exists()
    frame = pd.read_csv(tmp_path / "f" / "mitigation.csv")
    meas = frame[frame["kind"] == "measured"].set_index(["mitigation", "quantity"])["value"]
    assert meas[("sync", "mean_staleness_versions")] == 0
    assert 0 < meas[("async", "mean_staleness_versions")] <= 7
    assert 0 < meas[("async", "final_test_error_pct")] <= 100
    pred = frame[frame["kind"] == "predicted"].set_index(["mitigation", "quantity"])["value"]
    assert pred[("sync", "mean_staleness_steps")] == 0
    pushes = len(pd.read_csv(next((tmp_path / "r").glob("*/mitigation=async*/updates.csv"))))
    assert pred[("async", "mean_staleness_steps")] == pytest.approx(4 * expected_mean_staleness(8, pushes))
    assert "final_test_error_pct" not in set(frame.loc[frame["kind"] == "predicted", "quantity"])

    from repro.analysis import figure_frame  # from the logs alone: the same numbers
    figure_frame("mitigation", tmp_path / "r").to_csv(tmp_path / "again.csv", index=False)
    pd.testing.assert_frame_equal(frame, pd.read_csv(tmp_path / "again.csv"))


def test_the_frame_names_each_mitigation_on_one_line_and_only_the_tick_breaks_it(tmp_path):
    """The frame took the tick label "staleness-\\nscaled" (two lines, to fit the axis) as the
    mitigation's name: figures/mitigation.csv said it in 36 rows, where the printed table, the
    legend and the other lab tables say staleness-scaled."""
    import matplotlib.pyplot as plt

    from repro.analysis import figure_frame
    from repro.analysis.lab.mitigation import draw_mitigation, table
    from tests.helpers import fake_runs as fr

    for name, (rule, protocol) in RULES.items():
        fr.write_lab_run(tmp_path, "mitigation", f"mitigation={name}", 8, {
            "algo": {"server_rule": rule}, "protocol": {"name": protocol, "staleness_bound": 3}})
    frame = figure_frame("mitigation", tmp_path)
    names = ["async", "staleness-scaled", "DC-ASGD-c", "ssp", "sync"]
    assert list(frame["mitigation"].unique()) == names
    assert table(frame)["mitigation"].tolist() == names
    fig = draw_mitigation(frame)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    plt.close(fig)
    assert ticks == ["async", "staleness-\nscaled", "DC-ASGD-c", "ssp", "sync"]
