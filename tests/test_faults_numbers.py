"""Guarantee 7: no number hangs a run. The command line is covered by tests/test_config.py
(BAD_INPUTS holds eval_every=1e-12, num_epochs=inf, backend.timeout_s=1e300; the CLI table checks
exit 2), so here: the Python entry points, the notebook API and the drivers given a RunConfig.

Part of the fault-injection suite (tests/test_faults_*.py; the map of guarantees to files is
in :mod:`tests.helpers.invariants`): each case states its fault and guarantee and ends with
:func:`~tests.helpers.invariants.check_run_folder`.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import repro.api
from repro.config.settings import BackendConfig, RunConfig
from repro.errors import ConfigError
from repro.real import run_real
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.runs import SIM, real_cfg


def _api(**kw):
    def run(run_dir: Path):
        x, y = torch.randn(64, 4), torch.arange(64) % 3
        net = torch.nn.Sequential(torch.nn.Linear(4, 3))
        return repro.api.simulate(net, (x, y), (x, y), num_clients=2, run_dir=run_dir, **kw)
    return run


def _driver(cfg: RunConfig):
    def run(run_dir: Path):
        if cfg.backend.name == "real":
            return run_real(cfg, run_dir)
        return simulate(cfg, run_dir)
    return run


# The drivers once validated nothing themselves (only the CLI and the API did); run_folder does.
HANGING_NUMBERS = [
    pytest.param(_api(num_epochs=float("inf")), "num_epochs", id="api-num_epochs=inf"),
    pytest.param(_api(eval_every=1e-12), "eval_every", id="api-eval_every=1e-12"),
    pytest.param(_driver(SIM.replace(num_epochs=float("inf"))), "num_epochs", id="sim-num_epochs=inf"),
    pytest.param(_driver(SIM.replace(eval_every=1e-12)), "eval_every", id="sim-eval_every=1e-12"),
    pytest.param(_driver(real_cfg(backend=BackendConfig(name="real", client_device="cpu", timeout_s=1e300))), "backend.timeout_s",
                 id="real-timeout_s=1e300"),
]


@pytest.mark.timeout(4, method="signal")   # a check before any work takes milliseconds
@pytest.mark.parametrize("run,key", HANGING_NUMBERS)
def test_7_numbers_that_would_hang_are_refused_at_once(tmp_path, run, key):
    """Fault: num_epochs=inf (an endless budget), eval_every=1e-12 (endless evaluations),
    backend.timeout_s=1e300 (an overflowing wait) given to repro.api.simulate or to a driver as
    a RunConfig. Guarantee 7: ConfigError naming the key, at once (the test times out after
    4 s), and nothing in the run folder that looks like a run."""
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"'{re.escape(key)}'"):
        run(run_dir)
    assert not (run_dir / "summary.json").exists() and not (run_dir / "config.json").exists()


@pytest.mark.parametrize("timeout_s", [1e-9, 0.001])
def test_a_timeout_too_short_to_connect_is_refused_naming_it_not_a_traceback(tmp_path, timeout_s):
    """Fault: backend.timeout_s=1e-9 or 0.001 (in its range then, above 0): the server's own
    connect to its rendezvous store timed out, a DistNetworkError traceback with c10d's C++ frames
    (exit 1). Guarantee: ConfigError naming the key, before the store, nothing in the folder."""
    cfg = real_cfg(backend=BackendConfig(name="real", client_device="cpu", timeout_s=timeout_s))
    with pytest.raises(ConfigError, match=r"'backend.timeout_s'.*\[0.1, 604800\]"):
        run_real(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_bandwidth_whose_transfer_time_overflows_is_refused(tmp_path):
    """Fault: cost.bandwidth_Bps=1e-320 (in its range, above 0): a message's bytes / bandwidth is
    inf, and the run 'completed' with every time_s inf (the push order then arbitrary ties).
    Guarantee: ConfigError naming the key, the run folder marked failed, no row written."""
    import dataclasses

    cfg = SIM.replace(cost=dataclasses.replace(SIM.cost, bandwidth_Bps=1e-320))
    with pytest.raises(ConfigError, match="'cost.bandwidth_Bps'"):
        simulate(cfg, tmp_path / "run")
    assert check_run_folder(tmp_path / "run", "failed")["version"] == 0   # no row written


def test_the_progress_line_before_the_first_push_says_no_eta_not_nan(caplog):
    """Fault: a run that ends before its first push (a failed start-up) forces its progress line
    at epoch 0, where no rate exists. Guarantee: its eta reads '?' ('eta    nans' before)."""
    from types import SimpleNamespace

    from repro.runs.runlog import Progress

    with caplog.at_level("INFO", logger="repro.progress"):
        Progress("real x", 5.0).update(SimpleNamespace(epoch=0.0, version=0, final={}), force=True)
        Progress("real x", 5.0).update(SimpleNamespace(epoch=1.0, version=3, final={}), force=True)
    first, later = [r.getMessage() for r in caplog.records]
    assert "nan" not in first and first.endswith("eta      ?"), first
    assert re.search(r"eta +\d+\.\ds$", later), later


def test_a_driver_that_returns_without_a_status_leaves_the_folder_failed_not_running(tmp_path, monkeypatch):
    """Guard: a driver (a new one, or an edit to one) that returns without ending its run left
    summary.json 'running' for good; run_folder ends it ``failed``, saying so."""
    from repro.runs.core import RunCore

    finish, calls = RunCore.finish, []

    def forgotten_once(self, *args, **kwargs):   # the driver's own call does nothing
        calls.append(args)
        return finish(self, *args, **kwargs) if len(calls) > 1 else {}

    monkeypatch.setattr(RunCore, "finish", forgotten_once)
    simulate(SIM, tmp_path / "run")
    summary = check_run_folder(tmp_path / "run", "failed")
    assert "the driver ended without a status" in summary["message"], summary
