"""What is trained, built the same way below both drivers: the data, the network (as a
:class:`~repro.worker.Worker`), the server's initial state (random, or the warm start) and the
sets every evaluation measures. The simulator and the real server build their :class:`Problem`
here, so they start from exactly the same state; neither driver imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from repro.algorithm import Server
from repro.components import EvalSets, build_worker, load_data, make_server
from repro.config import RunConfig
from repro.data import Dataset
from repro.worker import Worker


@dataclass
class Problem:
    """What is trained: data, the network (as a worker) and the server's initial state."""

    dataset: Dataset
    worker: Worker
    init_params: Tensor
    eval_sets: EvalSets
    init_rule_state: dict | None = None   # the server rule's state (warm start), None: fresh

    def make_server(self, cfg: RunConfig) -> Server:
        server = make_server(cfg, self.init_params)
        if self.init_rule_state is not None:
            server.rule.load_state_dict(self.init_rule_state)
        return server


def build_problem(cfg: RunConfig, device: torch.device) -> Problem:
    """Data and network on ``device``; initial parameters from ``seed`` (cold) or the cached
    single-client baseline (warm, :mod:`repro.warmstart`)."""
    ds = load_data(cfg, device)
    worker = build_worker(cfg, ds, device)
    params, rule_state = worker.params.detach().clone(), None
    if cfg.start == "warm":
        from repro.warmstart import warm_start_state

        params, rule_state = warm_start_state(cfg, device)
    return Problem(ds, worker, params.to(device), EvalSets.of(ds), rule_state)
