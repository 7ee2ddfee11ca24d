"""What is trained, built from a config the same way for both drivers (so they start from exactly
the same state): the data, the network, the server, its clients, and what an evaluation measures."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from repro.asgd.algorithm import Client, ParameterServer, make_client
from repro.asgd.flatnet import LOSSES, FlatNet
from repro.asgd.rules import ServerRule, make_rule
from repro.config.settings import RunConfig, client_slot, slow_client
from repro.errors import ConfigError
from repro.workload.data import DATASETS, ClientStream, Dataset, check_batch_size, load_dataset
from repro.workload.models import build_model, check_fits
from repro.workload.partition import class_counts, split

TRAIN_SUBSET = 1000  # training-error evaluations use this many fixed training samples


def check_components(cfg: RunConfig) -> None:
    """The data set's files, a model made for its inputs, a minibatch no larger than its training
    set: checked from the data set's declaration (nothing loaded); then the clients' own data against
    the training labels (loaded, not for iid): every client holds a minibatch, every slow-client class
    exists. Once per process for each choice."""
    data = cfg.data
    _check_components(data.name, data.root, data.num_train, cfg.model.name, cfg.algo.batch_size)
    if data.partition == "iid" and data.slow_client_classes is None:
        return
    key = (dataclasses.astuple(data), cfg.num_clients, cfg.seed, cfg.algo.batch_size, slow_client(cfg))
    if key in _PARTITIONS_CHECKED:
        return
    ds = load_dataset(data.name, root=data.root, num_train=data.num_train, num_test=data.num_test)
    if wrong := sorted(set(data.slow_client_classes or ()) - set(range(ds.num_classes))):
        raise ConfigError("data.slow_client_classes", list(data.slow_client_classes), f"class labels of "
                          f"data '{data.name}': integers in 0..{ds.num_classes - 1} ({wrong[0]} is not one)")
    split(cfg, ds.y_train.numpy())
    _PARTITIONS_CHECKED.add(key)


_PARTITIONS_CHECKED: set[tuple] = set()


@lru_cache(maxsize=64)
def _check_components(data: str, root, num_train, model: str, batch_size: int) -> None:
    spec = DATASETS[data]
    if spec.check_source is not None:
        spec.check_source(root)
    check_fits(model, spec.input_shape, spec.num_classes, data)
    if (size := num_train if num_train is not None else spec.num_train) is not None:
        check_batch_size(batch_size, size)


def load_data(cfg: RunConfig, device: torch.device | str = "cpu") -> Dataset:
    """The configured data set on ``device``."""
    ds = load_dataset(cfg.data.name, root=cfg.data.root, num_train=cfg.data.num_train, num_test=cfg.data.num_test)
    if (counts := class_counts(cfg, ds.y_train.numpy(), ds.num_classes)) is not None:   # recorded for the analysis
        ds = dataclasses.replace(ds, facts={**ds.facts, "client_class_counts": counts})
    return ds.to(device)


def build_net(cfg: RunConfig, ds: Dataset, device: torch.device | str = "cpu") -> FlatNet:
    """The network with parameters initialised from ``seed`` (identical in every process)."""
    torch.manual_seed(cfg.seed)
    return FlatNet(build_model(cfg.model.name, ds.input_shape, ds.num_classes).to(device), LOSSES[ds.task])


def make_server_rule(cfg: RunConfig) -> ServerRule:
    algo = cfg.algo
    return make_rule(algo.server_rule, algo.resolved_lr_server(), eps=algo.adagrad_eps, dc_lambda=algo.dc_lambda,
                     elastic_alpha=algo.resolved_elastic_alpha(cfg.num_clients), outer_lr=algo.outer_lr,
                     outer_momentum=algo.outer_momentum, outer_delay=algo.outer_delay)


def make_server(cfg: RunConfig, params: Tensor) -> ParameterServer:
    return ParameterServer(params.detach().clone(), make_server_rule(cfg))


def make_clients(cfg: RunConfig, ds: Dataset, client_ids: list[int] | None = None) -> list[Client]:
    """Clients 1..num_clients, each with its own seeded stream over the training samples it holds."""
    rule = make_server_rule(cfg)   # clients push what the server's rule consumes
    ids = client_ids if client_ids is not None else range(1, cfg.num_clients + 1)
    parts = split(cfg, ds.y_train.cpu().numpy())   # None: every client reads the whole set
    return [make_client(k, ClientStream(*client_data(ds, parts, k), cfg.algo.batch_size, cfg.seed, k),
                        cfg.algo.lr, cfg.algo.momentum, cfg.algo.weight_decay, rule) for k in ids]


def client_data(ds: Dataset, parts: list | None, client: int) -> tuple[Tensor, Tensor]:
    """The training inputs and labels ``client`` holds (``parts``: the partition's indices)."""
    if parts is None:
        return ds.x_train, ds.y_train
    idx = torch.from_numpy(parts[client_slot(len(parts), client) - 1]).to(ds.x_train.device)   # a joiner's slot
    return ds.x_train[idx], ds.y_train[idx]


def param_bytes(params: Tensor) -> int:
    return params.numel() * params.element_size()


@dataclass
class EvalSets:
    """What an evaluation measures: the test set and a fixed subset of the training set."""
    x_test: Tensor
    y_test: Tensor
    x_train: Tensor
    y_train: Tensor

    @classmethod
    def of(cls, ds: Dataset) -> "EvalSets":
        """From a data set: its test set, a fixed training subset."""
        n = min(TRAIN_SUBSET, ds.num_train)
        idx = torch.randperm(ds.num_train, generator=torch.Generator().manual_seed(0))[:n].to(ds.x_train.device)
        return cls(ds.x_test, ds.y_test, ds.x_train[idx], ds.y_train[idx])


def evaluate(net: FlatNet, params: Tensor, sets: EvalSets) -> dict:
    """Test and train-subset loss and error of ``params`` (evals.csv's metric columns)."""
    test_loss, test_error = net.evaluate(params, sets.x_test, sets.y_test)
    train_loss, train_error = net.evaluate(params, sets.x_train, sets.y_train)
    return {"test_loss": test_loss, "test_error": test_error, "train_loss": train_loss, "train_error": train_error}


@torch.no_grad()
def class_errors(net: FlatNet, params: Tensor, sets: EvalSets, batch_size: int = 1024) -> list | None:
    """summary.json's ``final_class_test_error``: the test error on each class; None if not classification."""
    if net.loss_fn is not torch.nn.functional.cross_entropy or not len(sets.y_test):
        return None
    net.load(params)
    outputs = [net.module(sets.x_test[i:i + batch_size]) for i in range(0, len(sets.x_test), batch_size)]
    # counted on the CPU: CUDA's bincount may refuse to run under deterministic algorithms
    predictions, labels = torch.cat([o.argmax(1) for o in outputs]).cpu(), sets.y_test.cpu()
    num_classes = outputs[0].shape[1]   # every class the network tells apart
    held = torch.bincount(labels, minlength=num_classes)[:num_classes].tolist()
    wrong = torch.bincount(labels[predictions != labels], minlength=num_classes)[:num_classes].tolist()
    return [None if n == 0 else w / n for w, n in zip(wrong, held)]


@dataclass
class Problem:
    """What is trained: data, the network and the server's initial state."""
    dataset: Dataset
    net: FlatNet
    init_params: Tensor
    eval_sets: EvalSets
    init_rule_state: dict | None = None   # the server rule's state (warm start), None: fresh

    def recorded(self) -> dict:
        """What config.json records of what is trained (so the analysis need not build it)."""
        out = {"network": {"num_params": self.init_params.numel(), "param_bytes": param_bytes(self.init_params)}}
        if self.dataset.facts:
            out["dataset"] = dict(self.dataset.facts)
        return out

    def make_server(self, cfg: RunConfig) -> ParameterServer:
        server = make_server(cfg, self.init_params)
        if self.init_rule_state is not None:
            server.rule.load_state_dict(self.init_rule_state)
        return server
