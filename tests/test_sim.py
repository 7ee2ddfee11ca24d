"""The delay simulator: determinism, staleness, the virtual clock, divergence, resume, replay."""
import json
import shutil

import pandas as pd
import pytest

from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.sim.cost import CostModel
from repro.sim.driver import simulate
from tests.helpers.tables import table_bytes

UNIFORM = CostConfig(profile="uniform", compute_s=0.01)


def cfg_for(**kw) -> RunConfig:
    base = dict(num_clients=3, nsync=2, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5), cost=UNIFORM)
    base.update(kw)
    return RunConfig(**base)


def test_same_seed_gives_byte_identical_tables_other_seed_differs(tmp_path):
    jitter = CostConfig(profile="lan", compute_s=0.01, jitter="lognormal", jitter_sigma=0.3,
                        latency_s=1e-4, bandwidth_Bps=1e8, server_apply_s=1e-4)
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        summary = simulate(cfg_for(seed=seed, cost=jitter), tmp_path / name)
        assert summary["status"] == "completed"
        runs[name] = table_bytes(tmp_path / name)
    assert runs["a"] == runs["b"]
    assert runs["a"][0] != runs["c"][0] and runs["a"][1] != runs["c"][1]


@pytest.mark.parametrize("num_clients", [1, 2, 4])
def test_equal_constant_compute_gives_staleness_n_minus_1(tmp_path, num_clients):
    simulate(cfg_for(num_clients=num_clients, nsync=1, num_epochs=1.0), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    after_warmup = up[up.version > num_clients]
    assert len(after_warmup) > 10
    assert (after_warmup.staleness == num_clients - 1).all()
    assert list(up.version) == list(range(1, len(up) + 1))


def test_jitter_changes_the_logged_staleness_distribution(tmp_path):
    simulate(cfg_for(num_clients=4, nsync=1, num_epochs=8.0, eval_every=8.0), tmp_path / "even")
    jitter = CostConfig(profile="j", compute_s=0.01, jitter="exponential", jitter_sigma=1.0)
    simulate(cfg_for(num_clients=4, nsync=1, num_epochs=8.0, eval_every=8.0, cost=jitter), tmp_path / "jit")
    even = pd.read_csv(tmp_path / "even" / "updates.csv").staleness.iloc[4:]   # after warm-up
    jit = pd.read_csv(tmp_path / "jit" / "updates.csv").staleness.iloc[4:]
    assert len(jit) > 100
    assert even.nunique() == 1
    assert jit.nunique() > 2 and (jit >= 0).all()
    assert jit.mean() == pytest.approx(3, abs=0.6)   # N-1 on average: all clients equally fast


def _pushes_per_virtual_second(run_dir):
    up = pd.read_csv(run_dir / "updates.csv")
    return len(up) / up.time_s.iloc[-1]        # every client started at virtual time 0


@pytest.mark.parametrize("num_clients", [2, 4])
def test_n_clients_deliver_n_times_the_pushes_per_virtual_second(tmp_path, num_clients):
    simulate(cfg_for(num_clients=1, nsync=1, num_epochs=8.0, eval_every=8.0), tmp_path / "one")
    simulate(cfg_for(num_clients=num_clients, nsync=1, num_epochs=8.0, eval_every=8.0), tmp_path / "n")
    ratio = _pushes_per_virtual_second(tmp_path / "n") / _pushes_per_virtual_second(tmp_path / "one")
    assert ratio == pytest.approx(num_clients, rel=0.05)


def test_server_apply_time_caps_throughput(tmp_path):
    # Each client computes a push in 0.01 s; a server needing 0.005 s per push serves at most
    # 200 pushes/s whatever the number of clients (8 clients would otherwise deliver 800/s).
    capped = CostConfig(profile="capped", compute_s=0.01, server_apply_s=0.005)
    simulate(cfg_for(num_clients=8, nsync=1, num_epochs=8.0, eval_every=8.0, cost=capped), tmp_path)
    assert _pushes_per_virtual_second(tmp_path) == pytest.approx(200, rel=0.02)


def test_communication_costs_are_charged_on_parameter_bytes():
    cost = CostConfig(latency_s=0.001, bandwidth_Bps=1e6)
    assert CostModel(cost, 0, param_bytes=4000, step_s=0.01).transfer_s == pytest.approx(0.005)
    as_if = CostConfig(latency_s=0.0, bandwidth_Bps=1e9, comm_params=61e6)
    assert CostModel(as_if, 0, param_bytes=4000, step_s=0.01).transfer_s == pytest.approx(0.244)


def test_straggler_is_slower_and_sees_more_staleness(tmp_path):
    slow = CostConfig(profile="s", compute_s=0.01, straggler_client=1, straggler_factor=4.0)
    simulate(cfg_for(num_clients=3, nsync=1, num_epochs=1.0, cost=slow), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    counts = up.client.value_counts()
    assert counts[1] < counts[2] / 3
    assert up[up.client == 1].staleness.mean() > up[up.client == 2].staleness.mean()


def test_huge_learning_rate_ends_diverged(tmp_path):
    summary = simulate(cfg_for(algo=AlgoConfig(lr=1e6, momentum=0.0)), tmp_path)
    assert summary["status"] == "diverged"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"
    assert any(e["type"] == "diverged" for e in summary["events"])


def test_a_diverging_push_costs_the_server_no_apply_time(tmp_path):
    """Client 1's first push (2 steps of 1 s) diverges: the server refuses it (no apply), so
    its timings row is taken at 2.0 with no apply, where the clock charged it cost.server_apply_s
    (2.25, apply_s 0.25)."""
    cost = CostConfig(profile="u", compute_s=1.0, server_apply_s=0.25)
    summary = simulate(cfg_for(algo=AlgoConfig(lr=1e6, momentum=0.0), cost=cost), tmp_path)
    assert summary["status"] == "diverged" and "client 1 pushed" in summary["message"]
    timings = pd.read_csv(tmp_path / "timings.csv")
    assert list(zip(timings.client, timings.time_s, timings.apply_s)) == [(1, 2.0, 0.0)]


def test_interrupt_then_resume_is_bitwise_identical(tmp_path):
    cfg = cfg_for(num_clients=3, nsync=2, num_epochs=6.0, checkpoint_every=7,   # 48 versions
                  cost=CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.3))
    simulate(cfg, tmp_path / "whole")
    interrupted = simulate(cfg, tmp_path / "cut", stop_at_version=25)
    assert interrupted["status"] == "interrupted"
    resumed = simulate(cfg.replace(resume=True), tmp_path / "cut")
    assert resumed["status"] == "completed"
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
    assert any(e["type"] == "resumed" for e in resumed["events"])


def test_resume_without_checkpoint_is_a_config_error(tmp_path):
    from repro.errors import ConfigError
    with pytest.raises(ConfigError, match="checkpoint"):
        simulate(cfg_for(resume=True), tmp_path)


def test_replaying_a_sim_run_reproduces_it(tmp_path):
    jitter = CostConfig(profile="j", compute_s=0.01, jitter="exponential", jitter_sigma=0.8)
    simulate(cfg_for(num_clients=3, nsync=2, cost=jitter), tmp_path / "rec")
    shutil.copytree(tmp_path / "rec", tmp_path / "rec_copy")
    replay = CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "rec_copy"))
    summary = simulate(cfg_for(num_clients=1, cost=replay), tmp_path / "rep")   # settings come from the record
    assert summary["status"] == "completed"
    a = pd.read_csv(tmp_path / "rec" / "updates.csv")
    b = pd.read_csv(tmp_path / "rep" / "updates.csv")
    cols = ["version", "time_s", "client", "read_version", "staleness", "train_loss", "train_error"]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_warm_start_is_cached_and_reused(tmp_path):
    cfg = cfg_for(start="warm", warm_start_epochs=1.0, num_epochs=1.0, results_dir=str(tmp_path / "res"))
    simulate(cfg, tmp_path / "a")
    cached = list((tmp_path / "res" / "_warmstart").glob("*/server.pt"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    simulate(cfg.replace(seed=5), tmp_path / "b")
    assert cached[0].stat().st_mtime_ns == mtime          # reused, not retrained
    first = pd.read_csv(tmp_path / "a" / "evals.csv").test_error.iloc[0]
    cold = simulate(cfg.replace(start="cold"), tmp_path / "c")
    assert cold["status"] == "completed"
    assert first < pd.read_csv(tmp_path / "c" / "evals.csv").test_error.iloc[0]


def test_a_diverged_simulation_is_drawn_as_diverged(tmp_path):
    from repro.analysis import fig2_frame, load_runs
    from repro.analysis.figures import fig2

    results = tmp_path / "results" / "fig2"
    simulate(cfg_for(exp_name="fig2", num_clients=1), results / "ok")
    assert simulate(cfg_for(exp_name="fig2", num_clients=2, algo=AlgoConfig(lr=1e6, momentum=0.0)),
                    results / "boom")["status"] == "diverged"
    # two configurations (lr): drawn together only by the pure frame function, as
    # figure_frame refuses to pool them (tests/test_figure_grids.py)
    frame = fig2_frame(load_runs(tmp_path / "results", "fig2"))
    assert frame[frame.num_clients == 2].diverged.all() and not frame[frame.num_clients == 1].diverged.any()
    labels = [line.get_label() for ax in fig2(frame).axes for line in ax.get_lines()]
    assert any("diverged" in label for label in labels), labels


def test_warm_start_carries_the_server_rule_state(tmp_path):
    """DistBelief's warm-start replica trains through the server, so Adagrad's accumulators
    survive into the asynchronous phase; fresh ones would jolt every weight by lr_server."""
    import torch

    from repro.workload.start import build_problem

    cfg = cfg_for(start="warm", warm_start_epochs=1.0, results_dir=str(tmp_path),
                  algo=AlgoConfig(server_rule="adagrad", lr_server=0.01))
    problem = build_problem(cfg, torch.device("cpu"))
    server = problem.make_server(cfg)
    assert server.version == 0
    assert server.rule.sum_sq is not None and float(server.rule.sum_sq.min()) > 0
    cold = build_problem(cfg.replace(start="cold"), torch.device("cpu"))
    assert cold.init_rule_state is None and not torch.equal(cold.init_params, problem.init_params)


def test_calibrated_compute_time_is_measured_and_recorded(tmp_path):
    cfg = cfg_for(cost=CostConfig(profile="local", compute_s="calibrate"))
    assert simulate(cfg, tmp_path)["status"] == "completed"
    recorded = json.loads((tmp_path / "config.json").read_text())["cost"]["compute_s"]
    assert isinstance(recorded, float) and 0 < recorded < 1.0     # seconds per real mlp step
    first = pd.read_csv(tmp_path / "updates.csv").time_s.iloc[0]
    assert first == pytest.approx(cfg.nsync * recorded)           # the clock runs on the measurement


def test_config_json_records_what_bitwise_identity_depends_on(tmp_path):
    import torch
    simulate(cfg_for(num_threads=1), tmp_path)
    env = json.loads((tmp_path / "config.json").read_text())["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["num_threads"] == 1
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu_model"]
