"""cost=fit: a cost model fitted to recorded runs' timings.csv (repro/sim/fit.py).

Recordings are simulator runs with known costs (two message sizes, so latency and bandwidth
separate): the fit must recover step time, latency, bandwidth and apply time within 10%.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from repro.config.settings import CostConfig
from repro.errors import ConfigError
from repro.sim.driver import simulate
from tests.helpers.runs import sim_cfg

KNOWN = CostConfig(profile="known", compute_s=0.01, jitter="lognormal", jitter_sigma=0.2,
                   latency_s=0.002, bandwidth_Bps=2e6, server_apply_s=0.001)


def record(tmp_path, name: str, comm_params: float | None, epochs: float = 12.0):
    cost = dataclasses.replace(KNOWN, comm_params=comm_params)
    run_dir = tmp_path / name
    simulate(sim_cfg(cost=cost, num_epochs=epochs, checkpoint_every=0), run_dir)
    return run_dir


def test_fit_recovers_known_costs(tmp_path):
    small, large = record(tmp_path, "small", None), record(tmp_path, "large", 40000.0)
    cfg = sim_cfg(cost=CostConfig(profile="fit", path=f"{small}:{large}"), checkpoint_every=0)
    summary = simulate(cfg, tmp_path / "fitted")
    fit = summary["fit"]
    assert fit["pushes"] >= 2 * 80
    for key in ("compute_s", "latency_s", "bandwidth_Bps", "server_apply_s"):
        assert fit[key] == pytest.approx(getattr(KNOWN, key), rel=0.10), key
    assert fit["jitter_sigma"] == pytest.approx(KNOWN.jitter_sigma, rel=0.3)
    recorded = json.loads((tmp_path / "fitted" / "config.json").read_text())
    assert recorded["fit"] == fit   # where the values came from, beside the values simulated
    assert recorded["cost"]["compute_s"] == fit["compute_s"]
    assert recorded["cost"]["bandwidth_Bps"] == fit["bandwidth_Bps"]


def test_fit_refuses_too_few_pushes(tmp_path):
    short = record(tmp_path, "short", None, epochs=0.5)
    cfg = sim_cfg(cost=CostConfig(profile="fit", path=str(short)))
    with pytest.raises(ConfigError, match="at least 20 pushes") as err:
        simulate(cfg, tmp_path / "fitted")
    assert err.value.key == "cost.path" and not (tmp_path / "fitted").exists()
