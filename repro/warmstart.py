"""Warm start: the single-client baseline after a fixed number of epochs, computed once and cached.

DistBelief "warmstarts" by training one replica through the parameter server before releasing
the others; GPU A-SGD's Fig. 3 studies the same. Our reading (the paper does not say how long the
pre-training runs): the asynchronous phase starts from the *server state* (parameters and the
update rule's state, e.g. Adagrad's accumulators) of a 1-client, nsync=1 simulator run of
``warm_start_epochs`` epochs with seed 0, whatever the grid point's seed, so every grid point of
an experiment starts from the same state. Starting Adagrad from empty accumulators instead would
move every weight by a full ``lr_server`` on the first pushes and undo much of the warm start.
The state is cached under ``<results_dir>/_warmstart/<key>/server.pt``; the key hashes every
setting that shapes it. Server versions restart at 0 in the asynchronous phase.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from torch import Tensor

from repro.checkpoint import save_checkpoint
from repro.config import BackendConfig, CostConfig, RunConfig, to_dict

log = logging.getLogger(__name__)
WARM_SEED = 0


def baseline_config(cfg: RunConfig) -> RunConfig:
    """The single-client run whose final parameters are the warm start."""
    return cfg.replace(start="cold", num_clients=1, nsync=1, num_epochs=cfg.warm_start_epochs,
                       eval_every=cfg.warm_start_epochs, seed=WARM_SEED, exp_name="_warmstart",
                       cost=CostConfig(), backend=BackendConfig(), checkpoint_every=0,
                       resume=False, force=False)


def cache_dir(cfg: RunConfig) -> Path:
    base = to_dict(baseline_config(cfg))
    shaping = {k: base[k] for k in ("data", "model", "algo", "num_epochs", "seed")}
    key = hashlib.sha1(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cfg.results_dir) / "_warmstart" / key


def warm_start_state(cfg: RunConfig, device: torch.device) -> tuple[Tensor, dict]:
    """The cached warm-start (parameters, server-rule state), training the baseline if needed."""
    folder = cache_dir(cfg)
    path = folder / "server.pt"
    if not path.exists():
        _train_baseline(cfg, device, folder, path)
    state = torch.load(path, weights_only=True, map_location=device)
    return state["params"], state["rule"]


def _train_baseline(cfg: RunConfig, device: torch.device, folder: Path, path: Path) -> None:
    from repro.sim import Simulation, build_problem  # the baseline is a simulator run

    base = baseline_config(cfg)
    log.info("warm start: training the single-client baseline for %g epochs into %s",
             base.num_epochs, folder)
    problem = build_problem(base, device)
    sim = Simulation(base, problem, folder, compute_s=base.cost.compute_s)
    summary = sim.run()
    if summary["status"] != "completed":
        raise RuntimeError(f"warm-start baseline ended {summary['status']}: {summary['message']}")
    save_checkpoint({"params": sim.server.params.detach().cpu(), "rule": sim.server.rule.state_dict()}, path)
