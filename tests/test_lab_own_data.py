"""Staleness lab, own_data (step 8): the per-class test error a finished run records, by hand and
in the summary; a method that drops stale work drops every push of a slow client, whose classes
then show it; the experiment's grid; a shrunk sweep that trains, then draws its figures (slow)."""
import itertools
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn

from repro.analysis.lab.own_data import own_data_frame
from repro.analysis.load import load_runs
from repro.asgd.flatnet import FlatNet
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.workload.build import EvalSets, class_errors
from repro.run import compose, parse
from repro.sim.driver import simulate
from tests.helpers.configs import composed
from tests.helpers.grids import sweep_grid
from tests.helpers.paths import ROOT

METHODS = {"async": ("downpour", "async"), "ssp": ("downpour", "ssp"), "sync": ("downpour", "sync"),
           "sync_backup": ("downpour", "sync"), "staleness_scaled": ("staleness_scaled", "async"),
           "easgd": ("easgd", "async"), "ringmaster": ("downpour", "ringmaster"), "rennala": ("downpour", "rennala")}
PARTITIONS = {"by_class": ("by_class", 0.5), "dirichlet_0.1": ("dirichlet", 0.1), "dirichlet_1": ("dirichlet", 1.0),
              "dirichlet_100": ("dirichlet", 100.0)}


def test_class_errors_by_hand():
    """Inputs one-hot in 4 features, a linear layer that maps feature j to class p[j]: the
    predictions are known, so is each class's error; class 3 has no test sample (None)."""
    layer = nn.Linear(4, 4, bias=False)
    perm = [0, 2, 1, 3]    # feature 1 -> class 2, feature 2 -> class 1
    with torch.no_grad():
        layer.weight.copy_(torch.eye(4)[perm].T)
    net = FlatNet(layer)
    x = torch.eye(4)[[0, 0, 1, 1, 1, 2]]     # predicted: 0, 0, 2, 2, 2, 1
    y = torch.tensor([0, 0, 1, 2, 2, 2])     # true:      0, 0, 1, 2, 2, 2
    sets = EvalSets(x, y, x, y)
    assert class_errors(net, net.params.clone(), sets) == [0.0, 1.0, 1 / 3, None]
    quadratic = FlatNet(nn.Linear(4, 1), loss_fn=lambda out, y: out.pow(2).mean())
    assert class_errors(quadratic, quadratic.params.clone(), sets) is None   # not classification


def _run(**kw) -> RunConfig:
    """Tiny: synthetic data, an MLP, 3 clients, client 1 four times slower and alone holding
    classes 0 and 1 (the other classes dealt by class to clients 2 and 3)."""
    base = dict(num_clients=3, nsync=1, num_epochs=2.0, eval_every=1.0, progress=False,
                exp_name="own", data=DataConfig(name="synthetic", partition="by_class", slow_client_classes=(0, 1)),
                model=ModelConfig(name="mlp"), algo=AlgoConfig(lr=0.05, momentum=0.0, server_rule="downpour"),
                cost=CostConfig(profile="straggler", compute_s=0.01, straggler_client=1, straggler_factor=4.0))
    base.update(kw)
    return RunConfig(**base)


def test_dropping_stale_work_drops_the_slow_clients_classes_and_the_frame_says_so(tmp_path):
    """Ringmaster at R = N: the slow client's pushes are at least 2 x 4 versions stale, so every
    one is discarded and its classes are never trained on; async applies them. The summary's
    per-class errors average (by class count) to the final test error, and the figure's frame
    reads them back, the slow client's classes apart."""
    runs = {"async": _run(), "ringmaster": _run(protocol=ProtocolConfig(name="ringmaster"))}
    for name, cfg in runs.items():
        simulate(cfg, tmp_path / "r" / "own" / name)
    ring = json.loads((tmp_path / "r" / "own" / "ringmaster" / "summary.json").read_text())
    applied = pd.read_csv(tmp_path / "r" / "own" / "ringmaster" / "updates.csv")["client"]
    assert ring["discarded_pushes"] and {c for _, c in ring["discarded_pushes"]} == {1}
    assert 1 not in set(applied)
    assert 1 in set(pd.read_csv(tmp_path / "r" / "own" / "async" / "updates.csv")["client"])

    from repro.workload.build import load_data
    labels = load_data(runs["async"]).y_test
    counts = torch.bincount(labels).tolist()
    for name in runs:
        summary = json.loads((tmp_path / "r" / "own" / name / "summary.json").read_text())
        per_class = summary["final_class_test_error"]
        assert len(per_class) == len(counts)
        mean = sum(e * n for e, n in zip(per_class, counts)) / sum(counts)
        assert mean == pytest.approx(summary["final"]["test_error"], abs=1e-9)

    frame = own_data_frame(load_runs(tmp_path / "r", "own"))
    ring_classes = ring["final_class_test_error"]
    mine = frame[(frame["method"] == "Ringmaster R=3") & (frame["quantity"] == "slow_classes_error_pct")]
    assert mine["value"].tolist() == pytest.approx([100 * (ring_classes[0] + ring_classes[1]) / 2])
    slow = frame[(frame["quantity"] == "class_test_error_pct") & frame["slow_class"].astype(bool)]
    assert sorted(set(slow["class"])) == [0, 1]
    assert set(frame["partition"]) == {"by_class"}


def test_grid_expands_to_the_intended_runs_and_each_method_keeps_its_own_rule():
    expected = {"partition": list(PARTITIONS), "mitigation": list(METHODS), "seed": ["0", "1"]}
    grid = sweep_grid("own_data")
    want = [dict(zip(expected, v)) for v in itertools.product(*expected.values())]
    as_key = lambda d: tuple(sorted((k, str(v)) for k, v in d.items()))  # noqa: E731
    assert sorted(map(as_key, grid)) == sorted(map(as_key, want)) and len(grid) == 64
    for name, (rule, protocol) in METHODS.items():
        # the method's own algo group survives the experiment (no /problem default overrides it)
        cfg = parse(composed(["+exp=own_data", "+partition=dirichlet_1", f"+mitigation={name}"]))
        assert (cfg.algo.server_rule, cfg.protocol.name) == (rule, protocol), name
        assert (cfg.num_clients, cfg.algo.lr, cfg.algo.momentum, cfg.cost.straggler_client,
                cfg.cost.straggler_factor, cfg.data.slow_client_classes) == (4, 0.1, 0.0, 1, 4.0, (0, 1))
    assert parse(compose(["+exp=own_data", "+partition=dirichlet_1", "+mitigation=sync_backup"])
                 ).protocol.backup_workers == 1
    for name, (partition, alpha) in PARTITIONS.items():
        cfg = parse(composed(["+exp=own_data", f"+partition={name}", "+mitigation=async"]))
        assert (cfg.data.partition, cfg.data.alpha) == (partition, alpha)


@pytest.mark.slow
def test_shrunk_sweep_draws_its_figures_and_redraws_from_logs(tmp_path):
    cmd = [sys.executable, "-m", "repro.run", "+exp=own_data", f"results_dir={tmp_path / 'r'}",
           f"figures_dir={tmp_path / 'f'}", "num_epochs=1", "progress=false",
           "hydra.sweeper.params={+partition:'by_class,dirichlet_0.1',+mitigation:'async,ringmaster',seed:'0'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for stem in ("own_data", "partition"):
        assert (tmp_path / "f" / f"{stem}.png").stat().st_size > 20_000
    frame = pd.read_csv(tmp_path / "f" / "own_data.csv")
    assert set(frame["partition"]) == {"by_class", "dirichlet alpha=0.1"}
    assert set(frame["method"]) == {"async", "Ringmaster R=4"}
    per_class = frame[frame["quantity"] == "class_test_error_pct"]
    assert len(per_class) == 4 * 10 and per_class["value"].between(0, 100).all()

    from repro.analysis import figure_frame  # from the logs alone: the same numbers
    figure_frame("own_data", tmp_path / "r").to_csv(tmp_path / "again.csv", index=False)
    pd.testing.assert_frame_equal(frame, pd.read_csv(tmp_path / "again.csv"))
