"""Uneven clusters (issue 19, part 1): each client's relative step time (cost.speeds, or the law
cost.speed_law=sqrt: 1 + sqrt(k - 1)) in the simulator's clock, composed with the straggler and
the jitter; deterministic and resumable bit for bit; the predicted ceiling counts it; the real
driver paces a slowed client; bad input refused before any work.

Step times below are dyadic fractions (1, 2, 0.5, sqrt(4) = 2), exact in binary floating point,
so the comparisons of virtual times are exact at any thread count and on any machine.
"""
import dataclasses
import math

import pandas as pd
import pytest

from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.errors import ConfigError
from repro.run import compose, parse
from repro.sim.ceiling import CLIENTS, ceiling
from repro.sim.cost import CostModel, CostScheduler
from repro.sim.driver import simulate
from tests.helpers.grids import cli_run

UNIFORM = CostConfig(profile="t", compute_s=1.0)


def model(cost: CostConfig) -> CostModel:
    return CostModel(cost, 0, param_bytes=4, step_s=cost.compute_s)


def order(cost: CostConfig, clients: int, pushes: int) -> list[tuple[int, float]]:
    s = CostScheduler(model(cost), list(range(1, clients + 1)), nsync=1)
    out = []
    for _ in range(pushes):
        k, _, t = s.next()
        t = s.handled(t, False)
        out.append((k, t))
        s.served(k, t)
    return out


def run_cfg(**kw) -> RunConfig:
    base = dict(num_clients=4, nsync=2, num_epochs=4.0, eval_every=1.0, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5), cost=UNIFORM)
    base.update(kw)
    return RunConfig(**base)


def tables(run_dir) -> tuple[bytes, bytes]:
    return (run_dir / "updates.csv").read_bytes(), (run_dir / "evals.csv").read_bytes()


def test_a_clients_step_takes_its_relative_step_time():
    m = model(dataclasses.replace(UNIFORM, speeds=(1.0, 2.0, 0.5)))
    assert [m.segment_s(k, 0, 4) for k in (1, 2, 3)] == [4.0, 8.0, 2.0]
    law = model(dataclasses.replace(UNIFORM, speed_law="sqrt"))
    # tau_i = 1 + sqrt(i), i = k - 1 from 0: client 1 the fastest at exactly compute_s
    assert [law.segment_s(k, 0, 1) for k in (1, 2, 5, 10)] == [1.0, 2.0, 3.0, 4.0]
    assert law.segment_s(3, 0, 1) == 1.0 + math.sqrt(2)


def test_speeds_compose_with_the_straggler_and_the_jitter():
    slow = model(dataclasses.replace(UNIFORM, speeds=(1.0, 2.0), straggler_client=2, straggler_factor=4.0))
    assert slow.segment_s(2, 0, 1) == 8.0 and slow.segment_s(1, 0, 1) == 1.0
    jitter = dict(jitter="lognormal", jitter_sigma=0.5)
    plain = model(dataclasses.replace(UNIFORM, **jitter))
    uneven = model(dataclasses.replace(UNIFORM, speed_law="sqrt", **jitter))
    for k, seg in ((1, 0), (2, 3), (5, 300)):   # the same draws, scaled by the client's time
        assert uneven.segment_s(k, seg, 4) == pytest.approx((1 + math.sqrt(k - 1)) * plain.segment_s(k, seg, 4),
                                                            rel=1e-12)


def test_the_clock_serves_a_slower_client_less_often():
    # client 1 a step of 1 s, client 2 of 2 s; ties go to the push scheduled first
    assert order(dataclasses.replace(UNIFORM, speeds=(1.0, 2.0)), 2, 6) == \
        [(1, 1.0), (2, 2.0), (1, 2.0), (1, 3.0), (2, 4.0), (1, 4.0)]
    assert order(dataclasses.replace(UNIFORM, speeds=(1.0, 1.0)), 2, 4) == order(UNIFORM, 2, 4)


def test_without_speeds_every_time_is_bit_for_bit_the_same():
    """Relative step time 1 multiplies by exactly 1.0: default runs keep their bits (the golden
    tables check it end to end)."""
    for cost in (UNIFORM, dataclasses.replace(UNIFORM, jitter="lognormal", jitter_sigma=0.3, compute_s=0.0123)):
        ones = dataclasses.replace(cost, speeds=(1.0,) * 3)
        assert [model(cost).segment_s(k, s, 3) for k in (1, 2, 3) for s in (0, 7)] == \
            [model(ones).segment_s(k, s, 3) for k in (1, 2, 3) for s in (0, 7)]


def test_pushes_per_client_follow_the_sqrt_law(tmp_path):
    """Over a run, client k pushes about T / (nsync tau_k) times: counts proportional to 1/tau_k."""
    simulate(run_cfg(cost=dataclasses.replace(UNIFORM, speed_law="sqrt")), tmp_path / "r")
    counts = pd.read_csv(tmp_path / "r" / "updates.csv").client.value_counts().sort_index()
    tau = pd.Series({k: 1 + math.sqrt(k - 1) for k in counts.index})
    share = counts / counts.sum()
    assert (share - (1 / tau) / (1 / tau).sum()).abs().max() < 0.02
    assert counts.is_monotonic_decreasing


def test_uneven_runs_are_deterministic_and_resume_bit_for_bit(tmp_path):
    cost = dataclasses.replace(UNIFORM, speeds=(1.0, 3.0, 1.5, 0.5), jitter="lognormal", jitter_sigma=0.4,
                               straggler_client=2, straggler_factor=2.0)
    cfg = run_cfg(cost=cost, checkpoint_every=7)
    simulate(cfg, tmp_path / "whole")
    simulate(cfg, tmp_path / "again")
    assert tables(tmp_path / "whole") == tables(tmp_path / "again")
    assert simulate(cfg, tmp_path / "cut", stop_at_version=20)["status"] == "interrupted"
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    assert tables(tmp_path / "cut") == tables(tmp_path / "whole")
    simulate(run_cfg(cost=dataclasses.replace(cost, speeds=None)), tmp_path / "even")
    assert tables(tmp_path / "even")[0] != tables(tmp_path / "whole")[0]


def test_the_predicted_ceiling_counts_each_clients_step_time():
    cost = dataclasses.replace(UNIFORM, speeds=(1.0, 2.0, 4.0))
    got = ceiling(cost, 3, nsync=2, param_bytes=4).bounds[CLIENTS]
    assert got == pytest.approx(1 / 2 + 1 / 4 + 1 / 8)


@pytest.mark.parametrize("overrides,key,expected", [
    (["num_clients=3", "cost.speeds=[1,2]"], "cost.speeds", "num_clients=3"),
    (["num_clients=2", "cost.speeds=[1,0]"], "cost.speeds", "(0, 1e+06]"),
    (["num_clients=2", "cost.speeds=[1,-2]"], "cost.speeds", "(0, 1e+06]"),
    (["num_clients=2", "cost.speeds=[1,true]"], "cost.speeds", "a number"),
    (["num_clients=2", "cost.speeds=[1,2]", "cost.speed_law=sqrt"], "cost.speed_law", "none when cost.speeds"),
    (["cost.speed_law=cubic"], "cost.speed_law", "sqrt"),
])
def test_bad_speeds_name_the_key(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        parse(compose(overrides))
    assert f"'{key}'" in str(err.value) and expected in str(err.value)


def test_a_bad_speed_list_exits_2_on_the_command_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "num_clients=3", "cost.speeds=[1,2]", f"results_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'cost.speeds'" in proc.stderr and "num_clients=3" in proc.stderr
    assert not any(tmp_path.iterdir())


def test_the_real_driver_paces_a_slowed_client(monkeypatch):
    """A client of relative step time f sleeps (f - 1) x its measured step after each step (in
    slices, so a STOP ends the wait); a fake clock stands in for the wall clock."""
    from repro.real import client as real_client

    clock = {"t": 0.0}
    slept, calls = [], []
    monkeypatch.setattr(real_client.time, "perf_counter", lambda: clock["t"])

    def sleep(s):
        slept.append(s)
        clock["t"] += s
    monkeypatch.setattr(real_client.time, "sleep", sleep)
    pace = real_client.Pace(4.0, lambda: calls.append(clock["t"]))
    clock["t"] += 0.01            # one step of 10 ms
    pace()
    assert sum(slept) == pytest.approx(0.03) and max(slept) <= 0.05
    assert calls[-1] == pytest.approx(0.04)   # the step ends after 4 x 10 ms
    cfg = parse(compose(["num_clients=3", "cost.speeds=[2,4,2]"]))
    assert [real_client.pace_factor(cfg, k) for k in (1, 2, 3)] == [1.0, 2.0, 1.0]   # over the fastest
