"""Prove it, don't claim it: a real run, replayed in the simulator, gives the same numbers."""
import pandas as pd
import pytest

from repro.config.settings import AlgoConfig, BackendConfig, CostConfig, RunConfig
from repro.real import run_real
from repro.sim.driver import simulate


@pytest.mark.parametrize("rule,start", [("delta", "cold"), ("adagrad", "warm")])
def test_replaying_a_real_run_reproduces_its_per_push_numbers(tmp_path, rule, start):
    """Two real CPU clients; the simulator applies the recorded pushes in the recorded order.

    Tolerance: every process runs the same kernels on one CPU thread, and the parameters cross
    gloo as raw float32 bytes, so we expect bitwise equality. We allow 1e-6 relative on the
    losses (never needed here) in case a BLAS dispatches differently between two processes;
    an off-by-one in the order or a wrong read version changes them by far more. Staleness,
    clients and read versions must match exactly.
    """
    cfg = RunConfig(num_clients=2, nsync=2, num_epochs=1.0, eval_every=0.5, progress=False,
                    start=start, warm_start_epochs=0.5, results_dir=str(tmp_path),
                    backend=BackendConfig(name="real", client_device="cpu"),   # CPU even on a GPU box
                    algo=AlgoConfig(server_rule=rule, lr_server=0.01 if rule == "adagrad" else None))
    real = run_real(cfg, tmp_path / "real")
    assert real["status"] == "completed"
    replay = simulate(cfg.replace(cost=CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "real"))),
                      tmp_path / "replay")
    assert replay["status"] == "completed"
    a = pd.read_csv(tmp_path / "real" / "updates.csv")
    b = pd.read_csv(tmp_path / "replay" / "updates.csv")
    assert len(a) == len(b) > 20
    exact = ["version", "client", "read_version", "staleness", "num_steps", "num_samples", "time_s"]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    pd.testing.assert_series_equal(a.train_loss, b.train_loss, rtol=1e-6, atol=0)
    pd.testing.assert_series_equal(a.train_error, b.train_error)
    assert set(a.staleness) - {0} and set(a.client) == {1, 2}   # both clients pushed, asynchronously
    first = pd.read_csv(tmp_path / "real" / "evals.csv").test_error.iloc[0]
    assert (first < 0.5) == (start == "warm")        # the real driver starts from the warm start too
