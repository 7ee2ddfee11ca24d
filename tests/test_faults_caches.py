"""Caches that stayed poisoned (issue 16, section 4): a data cache or a warm-start cache whose
contents are not what the run needs (labels, signal length, parameter size, dtype, finiteness)
is rebuilt with a warning instead of failing every later run; a cache deleted while the baseline
trains is written again; and a run that fails before it starts training still leaves a terminal
summary in its folder."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch

import repro.workload.start as start
import repro.sim.driver as driver
from repro.config.settings import DataConfig, RunConfig
from repro.workload.datacache import mnist1d_arrays, mnist1d_cache_path
from repro.workload.start import build_problem, cache_dir
from repro.sim.driver import simulate

CPU = torch.device("cpu")
N = 200   # generated MNIST-1D samples: enough for the cache's shapes, a fraction of a second


def _poison_data(raw: dict, how: str) -> dict:
    raw = dict(raw)
    if how == "label_out_of_range":
        raw["y"] = raw["y"].copy()
        raw["y"][7] = 10
    elif how == "negative_label":
        raw["y_test"] = raw["y_test"].copy()
        raw["y_test"][0] = -1
    elif how == "other_signal_length":   # train and test alike, so only the generator's width tells
        raw["x"], raw["x_test"] = (np.pad(raw[k], ((0, 0), (0, 10))) for k in ("x", "x_test"))
    return raw


@pytest.mark.parametrize("how", ["label_out_of_range", "negative_label", "other_signal_length"])
def test_a_data_cache_that_does_not_fit_is_generated_again(tmp_path, caplog, how):
    good = mnist1d_arrays(N, tmp_path)
    path = mnist1d_cache_path(tmp_path, N)
    np.savez(path, **_poison_data(good, how))
    with caplog.at_level(logging.WARNING, logger="repro"):
        again = mnist1d_arrays(N, tmp_path)
    assert "is unusable" in caplog.text and "generating it again" in caplog.text
    for k, v in good.items():
        assert np.array_equal(again[k], v), k
    with np.load(path) as f:                      # the file itself is whole again
        assert all(np.array_equal(f[k], v) for k, v in good.items())


WARM = RunConfig(start="warm", warm_start_epochs=0.2, num_clients=2, progress=False,
                 data=DataConfig(num_train=256, num_test=64))


def _poison_params(params: torch.Tensor, how: str) -> torch.Tensor:
    if how == "wrong_size":
        return params[:-7].clone()
    if how == "integer":
        return params.round().to(torch.int64)
    bad = params.clone()
    bad[3] = float("nan") if how == "nan" else float("inf")
    return bad


@pytest.mark.parametrize("how", ["wrong_size", "integer", "nan", "inf"])
def test_a_warm_start_cache_that_does_not_fit_is_trained_again(tmp_path, caplog, how):
    cfg = WARM.replace(results_dir=str(tmp_path))
    good = build_problem(cfg, CPU).init_params.clone()
    path = cache_dir(cfg) / "server.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "params": _poison_params(state["params"], how)}, path)
    with caplog.at_level(logging.WARNING, logger="repro"):
        again = build_problem(cfg, CPU).init_params
    assert "training it again" in caplog.text, caplog.text
    assert torch.equal(again, good)               # the same baseline, trained again
    assert torch.equal(torch.load(path, weights_only=True)["params"], good)   # the cache is whole again


def test_deleting_the_warm_start_cache_while_the_baseline_trains(tmp_path, monkeypatch):
    """``rm -rf results/_warmstart`` while a grid job trains the baseline: the job still gets
    its warm start and writes the cache again (it used to fail writing into a deleted folder)."""
    cfg = WARM.replace(results_dir=str(tmp_path))
    train = start.train_baseline

    def deleted_meanwhile(*args, **kwargs):
        out = train(*args, **kwargs)
        shutil.rmtree(tmp_path / "_warmstart")
        return out

    monkeypatch.setattr(start, "train_baseline", deleted_meanwhile)
    params = build_problem(cfg, CPU).init_params
    assert torch.equal(torch.load(cache_dir(cfg) / "server.pt", weights_only=True)["params"], params)


def test_a_run_that_fails_before_training_leaves_a_failed_summary(tmp_path, monkeypatch):
    """A fresh run whose problem cannot be built (here: a RuntimeError while building it) used
    to leave a folder with no summary.json, which a grid reports as never started."""
    cfg = WARM.replace(start="cold", num_epochs=0.5, eval_every=0.5)
    build = driver.build_problem

    def broken(*args, **kwargs):
        raise RuntimeError("the warm-start cache vanished")

    monkeypatch.setattr(driver, "build_problem", broken)
    with pytest.raises(RuntimeError):
        simulate(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "the warm-start cache vanished" in summary["message"]
    assert "resume=auto" in summary["message"]
    monkeypatch.setattr(driver, "build_problem", build)
    assert simulate(cfg.replace(resume="auto"), tmp_path / "run")["status"] == "completed"
