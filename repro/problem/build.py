"""What is trained, built from a :class:`~repro.config.settings.RunConfig` the same way below both
drivers: the data, the network (as a :class:`~repro.asgd.flatnet.FlatNet`), the server's initial
state (random, or the warm start), its clients and the sets every evaluation measures.

One place decides how a config becomes these objects, so the simulator and the real driver start
from exactly the same state: model init seeded by ``seed``, client ``k``'s data order seeded by
``(seed, k)``. Neither driver imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from repro.asgd.algorithm import Client, Server, make_client
from repro.asgd.flatnet import LOSSES, Worker
from repro.asgd.rules import ServerRule, make_rule
from repro.config.settings import RunConfig
from repro.errors import ConfigError
from repro.problem.data import DATASETS, ClientStream, Dataset, load_dataset
from repro.problem.evaluation import EvalSets
from repro.problem.models import build_model, check_fits


def check_components(cfg: RunConfig, input_shape: tuple | None = None,
                     num_classes: int | None = None) -> None:
    """The model must be made for the data's inputs: checked from the data set's declared shape
    before any work (with the data set's files, where it reads any), and again on the loaded
    data when ``input_shape`` is given."""
    if input_shape is None:
        spec = DATASETS[cfg.data.name]
        input_shape, num_classes = spec.input_shape, spec.num_classes
        if spec.check_source is not None:
            spec.check_source(cfg.data.root)
    check_fits(cfg.model.name, input_shape, num_classes, cfg.data.name)


def load_data(cfg: RunConfig, device: torch.device | str = "cpu") -> Dataset:
    """The configured data set on ``device``, after checking the model accepts its shape."""
    ds = load_dataset(cfg.data.name, root=cfg.data.root, seed=cfg.seed,
                      num_train=cfg.data.num_train, num_test=cfg.data.num_test)
    check_components(cfg, ds.input_shape, ds.num_classes)
    if ds.num_train < cfg.algo.batch_size:
        raise ConfigError("algo.batch_size", cfg.algo.batch_size,
                          f"at most the training-set size ({ds.num_train})")
    return ds.to(device)


def build_worker(cfg: RunConfig, ds: Dataset, device: torch.device | str = "cpu") -> Worker:
    """The network with parameters initialised from ``seed`` (identical in every process)."""
    torch.manual_seed(cfg.seed)
    module = build_model(cfg.model.name, ds.input_shape, ds.num_classes).to(device)
    return Worker(module, LOSSES[ds.task])


def make_server_rule(cfg: RunConfig) -> ServerRule:
    return make_rule(cfg.algo.server_rule, cfg.algo.resolved_lr_server(), eps=cfg.algo.adagrad_eps,
                     dc_lambda=cfg.algo.dc_lambda)


def make_server(cfg: RunConfig, params: Tensor) -> Server:
    return Server(params.detach().clone(), make_server_rule(cfg))


def make_clients(cfg: RunConfig, ds: Dataset, client_ids: list[int] | None = None) -> list[Client]:
    """Clients 1..num_clients, each with its own seeded stream over the training set."""
    rule = make_server_rule(cfg)   # clients push what the server's rule consumes
    ids = client_ids if client_ids is not None else range(1, cfg.num_clients + 1)
    return [make_client(k, ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, k),
                        cfg.algo.lr, cfg.algo.momentum, cfg.algo.weight_decay, rule) for k in ids]


def param_bytes(params: Tensor) -> int:
    return params.numel() * params.element_size()


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
