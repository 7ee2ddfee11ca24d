"""Where training starts: :func:`build_problem` (seeded random weights, cold, or the warm start)
and the warm start itself (REPRODUCE.md, "warm start"; its cache: docs/failures.md, "Caches")."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import torch
from torch import Tensor

from repro.config.renames import legacy_keys
from repro.config.settings import BackendConfig, CostConfig, DataConfig, RunConfig, shaping_values
from repro.errors import ConfigError
from repro.files.locks import FileLock
from repro.files.storage import read_checkpoint, save_checkpoint, to_cpu, write_json
from repro.logs import get_logger
from repro.workload.build import EvalSets, Problem, build_net, check_components, load_data, make_clients

log = get_logger("repro.workload.start")

WARM_SEED = 0   # every grid point of an experiment starts from the same baseline, whatever its seed


def baseline_config(cfg: RunConfig) -> RunConfig:
    """The single-client run whose final server state is the warm start: ``cfg``'s data, model,
    algo, threads and device; its one client reads the whole training set."""
    whole = dataclasses.replace(cfg.data, partition="iid", alpha=DataConfig.alpha, slow_client_classes=None)
    return cfg.replace(start="cold", num_clients=1, nsync=1, num_epochs=cfg.warm_start_epochs, data=whole,
                       eval_every=cfg.warm_start_epochs, seed=WARM_SEED, exp_name="_warmstart", cost=CostConfig(),
                       backend=BackendConfig(), checkpoint_every=0, target_error=0.0, resume=False, force=False)


def _baseline_record(cfg: RunConfig) -> dict:
    """The cache's key: the baseline's training-shaping values, moved keys spelt as before cost.churn.*."""
    return legacy_keys(shaping_values(baseline_config(cfg)))


def cache_dir(cfg: RunConfig) -> Path:
    key = json.dumps(_baseline_record(cfg), sort_keys=True)
    return Path(cfg.results_dir) / "_warmstart" / hashlib.sha1(key.encode()).hexdigest()[:12]


def warm_start_state(cfg: RunConfig, device: torch.device, like: Tensor | None = None) -> tuple[Tensor, dict]:
    """The cached warm start (parameters, rule state), trained if needed; ``like``: parameters it must match."""
    folder = cache_dir(cfg)
    path = folder / "server.pt"
    with FileLock(folder / ".lock", wait=True):   # concurrent grid jobs: one trains, the rest wait
        state = _read(path, device, like)
        if state is None:
            params, rule = train_baseline(cfg, device)
            folder.mkdir(parents=True, exist_ok=True)   # the cache may have been deleted meanwhile
            save_checkpoint(to_cpu({"params": params, "rule": rule}), path)
            write_json(folder / "config.json", _baseline_record(cfg))
            state = _read(path, device, like)
            if state is None:
                raise RuntimeError(f"warm start: the baseline just trained is unusable ({path}); see the "
                                   "warning above (lower algo.lr or warm_start_epochs if it diverged)")
    return state["params"], state["rule"]


def _read(path: Path, device, like: Tensor | None = None) -> dict | None:
    """The cached state, or None when absent or unusable (a warning says why)."""
    if not path.exists():
        return None
    try:
        state = read_checkpoint(path, device, key="start")
        if not (why := _unusable(state, like)):
            return state
        log.warning(f"warm start: {path} {why}; training it again")
    except ConfigError as e:
        log.warning(f"warm start: {e}; training it again")
    return None


def _unusable(state: dict, like: Tensor | None) -> str:
    """Why a cached state cannot start this run, or ""."""
    params, rule = state.get("params"), state.get("rule")
    if not isinstance(params, Tensor) or not isinstance(rule, dict):
        return "lacks params or rule state"
    if not params.dtype.is_floating_point or (like is not None and params.dtype != like.dtype):
        return f"holds {params.dtype} parameters"
    if like is not None and params.shape != like.shape:
        return f"holds {tuple(params.shape)} parameters; the network has {tuple(like.shape)}"
    tensors = [params, *_tensors(rule)]
    if any(t.numel() != params.numel() or not t.dtype.is_floating_point for t in tensors[1:]):
        return "holds a rule state that does not fit its parameters"
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        return "holds non-finite values (nan or inf)"
    return ""


def _tensors(obj) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    return []


def train_baseline(cfg: RunConfig, device: torch.device) -> tuple[Tensor, dict]:
    """The warm start of ``cfg``: the server state after its one-client baseline (:func:`baseline_config`), run
    with the simulator's calls in its order (bitwise, tests/test_house.py) without clock, tables and evaluations;
    a non-finite loss stops it (nothing could start from there)."""
    cfg = baseline_config(cfg)
    log.info(f"warm start: training the single-client baseline for {cfg.num_epochs:g} epochs")
    problem = build_problem(cfg, device)
    server = problem.make_server(cfg)
    (client,) = make_clients(cfg, problem.dataset, client_ids=[1])
    budget, seen = cfg.num_epochs * problem.dataset.num_train, 0
    while seen < budget:
        client.fetch(server.params, server.version)
        server.fetched(client.client_id)   # delay-compensating rules remember what it holds
        push = client.compute_push(problem.net, cfg.nsync)
        if not math.isfinite(push.train_loss):
            raise RuntimeError(f"the warm-start baseline diverged at version {server.version} "
                               "(non-finite training loss); lower algo.lr or warm_start_epochs")
        server.apply(push)
        seen += push.num_samples
    return server.params, server.rule.state_dict()


def build_problem(cfg: RunConfig, device: torch.device) -> Problem:
    """Data and network on ``device``; initial parameters from ``seed`` (cold) or the warm start."""
    check_components(cfg)
    ds = load_data(cfg, device)
    net = build_net(cfg, ds, device)
    params, rule_state = net.params.detach().clone(), None
    if cfg.start == "warm":
        params, rule_state = warm_start_state(cfg, device, like=net.params)
    return Problem(ds, net, params.to(device), EvalSets.of(ds), rule_state)
