"""The public notebook API: any torch module, tensors in, DataFrames out, CLI semantics."""
import pytest
import torch
from torch import nn

from repro import api, schema
from repro.errors import ConfigError


def _problem(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return x, y


def test_simulate_returns_the_run_tables(tmp_path):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    x, y = _problem()
    result = api.simulate(module, (x[:200], y[:200]), (x[200:], y[200:]), num_clients=3, nsync=2,
                          num_epochs=20, eval_every=5, lr=0.1, momentum=0.0, cost="uniform",
                          run_dir=tmp_path)
    assert list(result.updates.columns) == list(schema.UPDATE_COLUMNS)
    assert list(result.evals.columns) == list(schema.EVAL_COLUMNS)
    assert result.summary["status"] == "completed"
    assert result.evals.test_error.iloc[-1] < 0.15 < result.evals.test_error.iloc[0]
    assert set(result.updates.client) == {1, 2, 3}
    assert (result.run_dir / "summary.json").exists()


def test_simulate_is_deterministic_and_matches_seed_semantics(tmp_path):
    x, y = _problem()
    torch.manual_seed(0)
    module = nn.Linear(6, 2)
    kw = dict(num_clients=2, nsync=3, num_epochs=2, cost="lan", seed=4)
    a = api.simulate(module, (x, y), (x, y), run_dir=tmp_path / "a", **kw)
    b = api.simulate(module, (x, y), (x, y), run_dir=tmp_path / "b", **kw)
    assert a.updates.equals(b.updates) and a.evals.equals(b.evals)


def test_cost_profiles_by_name_dict_and_errors():
    assert api.cost_profile("paper2013").comm_params == 6.1e7
    assert api.cost_profile("straggler").straggler_factor == 4.0      # inherits lan's other fields
    assert api.cost_profile("straggler").latency_s == api.cost_profile("lan").latency_s
    assert api.cost_profile({"compute_s": 0.2}).compute_s == 0.2
    with pytest.raises(ConfigError, match="'cost': 'fast'"):
        api.cost_profile("fast")


def test_bad_api_input_is_a_clear_error():
    x, y = _problem()
    with pytest.raises(ConfigError, match="num_clients"):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=0)
    with pytest.raises(ConfigError, match="int64 class labels"):
        api.simulate(nn.Linear(6, 2), (x, y.float()), (x, y))
