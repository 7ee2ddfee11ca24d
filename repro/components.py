"""Builds the algorithm's objects from a :class:`~repro.config.RunConfig`, for either driver.

One place decides how a config becomes a data set, a worker (network + loss), initial
parameters, a server and its clients, so the simulator and the real driver start from exactly
the same state: model init seeded by ``seed``, client ``k``'s data order seeded by ``(seed, k)``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import Tensor

from repro.algorithm import Client, Server, ServerRule, make_client, make_rule
from repro.worker import LOSSES, Worker
from repro.config import RunConfig, check_components
from repro.data import ClientStream, Dataset, load_dataset
from repro.errors import ConfigError
from repro.models import build_model

TRAIN_SUBSET = 1000  # training-error evaluations use this many fixed training samples


@contextlib.contextmanager
def torch_threads(n: int):
    """torch uses ``n`` CPU threads inside the block (0: leave it), and the caller's count after
    (a test or a sweep that goes on keeps its own)."""
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def cuda_missing() -> str:
    """Why CUDA cannot be used here, in words a user can act on."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU build"
    return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, f"'cpu' or 'auto': {cuda_missing()}")
    return torch.device(name)


@contextlib.contextmanager
def deterministic(device: torch.device):
    """On CUDA, bit-for-bit reproducible kernels for the block: cuDNN deterministic and not
    benchmarking (its autotuner picks kernels by timing), deterministic algorithms everywhere
    (an op without one raises instead of silently varying; cuBLAS needs a fixed workspace), and
    TF32 off: float32 means float32 on every device, so GPU and CPU numbers differ only by
    reduction order, and a Hopper's TF32 matmuls would round to 10-bit mantissas. On the CPU
    nothing changes (its kernels are deterministic for a fixed thread count)."""
    if device.type != "cuda":
        yield
        return
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled())
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = saved[:4]
        torch.use_deterministic_algorithms(saved[4])


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


@dataclass
class EvalSets:
    """What an evaluation measures: the test set and a fixed subset of the training set."""

    x_test: Tensor
    y_test: Tensor
    x_train: Tensor
    y_train: Tensor

    @classmethod
    def of(cls, ds: Dataset) -> "EvalSets":
        n = min(TRAIN_SUBSET, ds.num_train)
        idx = torch.randperm(ds.num_train, generator=torch.Generator().manual_seed(0))[:n]
        idx = idx.to(ds.x_train.device)
        return cls(ds.x_test, ds.y_test, ds.x_train[idx], ds.y_train[idx])


def evaluate(worker: Worker, params: Tensor, sets: EvalSets) -> dict:
    """Test and train-subset loss and error of ``params`` (evals.csv's metric columns)."""
    test_loss, test_error = worker.evaluate(params, sets.x_test, sets.y_test)
    train_loss, train_error = worker.evaluate(params, sets.x_train, sets.y_train)
    return {"test_loss": test_loss, "test_error": test_error,
            "train_loss": train_loss, "train_error": train_error}


def param_bytes(params: Tensor) -> int:
    return params.numel() * params.element_size()
