"""The public Python API: run the delay simulator on your own problem from a notebook.

>>> import torch, repro.api as asgd
>>> result = asgd.simulate(my_module, (x_train, y_train), (x_test, y_test),
...                        num_clients=4, nsync=4, num_epochs=5, cost="lan", seed=0)
>>> result.evals.plot(x="time_s", y="test_error")      # pandas DataFrames
>>> result.updates.staleness.describe()

Same semantics as ``python -m repro.run``: the same client/server objects, the same cost model,
the same run-folder tables (written to ``run_dir``, a temporary folder when none is given).
The module is the network for a classification problem (``loss_fn(outputs, labels)``, error =
argmax mismatch); its current weights are the initial weights; it must have no buffers.
"""
from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import yaml
from torch import Tensor, nn

from repro import schema
from repro.algorithm import Worker
from repro.components import EvalSets, resolve_device
from repro.config import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig, from_dict, validate
from repro.data import Dataset
from repro.errors import ConfigError
from repro.sim import Problem, Simulation, resolve_compute_s

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


@dataclass
class Result:
    """A finished simulation: its tables as DataFrames, its summary and where they were written."""

    updates: pd.DataFrame
    evals: pd.DataFrame
    summary: dict
    run_dir: Path


def cost_profile(cost: str | dict | CostConfig) -> CostConfig:
    """A cost model from a profile name in ``conf/cost`` (e.g. "lan", "paper2013"), a dict of
    :class:`CostConfig` fields, or a CostConfig."""
    if isinstance(cost, CostConfig):
        return cost
    if isinstance(cost, dict):
        return from_dict(cost, CostConfig, "cost.")
    path = CONF_DIR / "cost" / f"{cost}.yaml"
    if not path.exists():
        raise ConfigError("cost", cost, sorted(p.stem for p in (CONF_DIR / "cost").glob("*.yaml")))
    tree = yaml.safe_load(path.read_text())
    for parent in tree.pop("defaults", []):
        if parent != "_self_":
            tree = {**cost_profile(parent).__dict__, **tree}
    return from_dict(tree, CostConfig, "cost.")


def simulate(module: nn.Module, train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], *,
             num_clients: int = 4, nsync: int = 4, num_epochs: float = 10.0, eval_every: float = 1.0,
             lr: float = 0.05, momentum: float = 0.5, weight_decay: float = 0.0, batch_size: int = 32,
             server_rule: str = "delta", lr_server: float | None = None,
             cost: str | dict | CostConfig = "lan", seed: int = 0, target_error: float = 0.05,
             loss_fn=nn.functional.cross_entropy, device: str = "cpu",
             run_dir: str | Path | None = None, progress: bool = False) -> Result:
    """Simulate ``num_clients`` asynchronous clients training ``module`` through one server."""
    algo = AlgoConfig(lr=lr, momentum=momentum, weight_decay=weight_decay, batch_size=batch_size,
                      server_rule=server_rule, lr_server=lr_server)
    cfg = RunConfig(exp_name="api", seed=seed, num_clients=num_clients, nsync=nsync, num_epochs=num_epochs,
                    eval_every=eval_every, target_error=target_error, device=device, progress=progress,
                    num_threads=0, data=DataConfig(name="custom"), model=ModelConfig(name=type(module).__name__),
                    algo=algo, cost=cost_profile(cost))
    validate(cfg)
    if cfg.cost.profile == "replay":
        raise ConfigError("cost", "replay", "a cost model; replay a recorded run with python -m repro.run cost=replay")
    dev = resolve_device(device)
    ds = _dataset(train, test, dev)
    if ds.num_train < batch_size:
        raise ConfigError("batch_size", batch_size, f"at most the training-set size ({ds.num_train})")
    worker = Worker(copy.deepcopy(module).to(dev), loss_fn)
    problem = Problem(ds, worker, worker.params.detach().clone(), EvalSets.of(ds))
    run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="repro-"))
    summary = Simulation(cfg, problem, run_dir, resolve_compute_s(cfg, problem, run_dir)).run()
    return Result(pd.read_csv(run_dir / schema.UPDATES_FILE), pd.read_csv(run_dir / schema.EVALS_FILE),
                  summary, run_dir)


def _dataset(train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], device: torch.device) -> Dataset:
    for key, (x, y) in (("train", train), ("test", test)):
        if len(x) != len(y) or len(x) == 0:
            raise ConfigError(key, f"{len(x)} inputs, {len(y)} labels", "equally many (>0) inputs and labels")
        if y.dtype != torch.long:
            raise ConfigError(key, f"labels of dtype {y.dtype}", "int64 class labels")
    num_classes = int(max(train[1].max(), test[1].max())) + 1
    return Dataset("custom", train[0].float(), train[1], test[0].float(), test[1], num_classes).to(device)

