"""The deterministic delay simulator (``backend=sim``): N clients, one server, one device, a virtual clock.

A scheduler (:mod:`repro.cost`) says which client's push the server applies next and when; the
client then computes that push *lazily* from the parameters it fetched (a push depends only on
them and on the client's own data stream, so computing it late changes nothing), the server
applies it, and the client fetches the new parameters. Every client borrows one :class:`Worker`,
so simulating K minibatch steps costs about what K steps of a plain training loop cost.

Bit-for-bit reproducible from the seed: the only randomness is the model init (``seed``), each
client's data order (``seed, client``) and the jitter (``seed, client, segment``); no wall clock
enters any table. ``cost=replay`` replays the update order recorded by a real run instead.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from repro import schema
from repro.algorithm import Server, Worker
from repro.checkpoint import load_checkpoint, save_checkpoint
from repro.components import (EvalSets, build_worker, evaluate, load_data, make_clients, make_server,
                              param_bytes, resolve_device)
from repro.config import BackendConfig, RunConfig, from_dict, to_dict
from repro.cost import CostModel, CostScheduler, ReplayScheduler, calibrate_compute_s
from repro.data import Dataset
from repro.environment import environment
from repro.errors import ConfigError
from repro.runlog import Progress, RunLog


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
    ds = load_data(cfg, device)
    worker = build_worker(cfg, ds, device)
    params, rule_state = worker.params.detach().clone(), None
    if cfg.start == "warm":
        from repro.warmstart import warm_start_state  # runs this simulator once, then caches
        params, rule_state = warm_start_state(cfg, device)
    return Problem(ds, worker, params.to(device), EvalSets.of(ds), rule_state)


def replay_config(cfg: RunConfig) -> RunConfig:
    """A replay trains exactly what the recorded run trained: every setting comes from its
    config.json; only the backend (sim), cost (replay) and where results go come from ``cfg``."""
    path = Path(cfg.cost.path) / schema.CONFIG_FILE
    try:
        recorded = json.loads(path.read_text())
        rec = from_dict(recorded)
    except (OSError, ValueError) as e:
        raise ConfigError("cost.path", cfg.cost.path, f"a recorded run folder with a valid config.json ({e})")
    return rec.replace(cost=cfg.cost, backend=BackendConfig(name="sim"), exp_name=cfg.exp_name,
                       results_dir=cfg.results_dir, progress=cfg.progress, resume=cfg.resume,
                       force=cfg.force, checkpoint_every=cfg.checkpoint_every, device=cfg.device)


def resolve_compute_s(cfg: RunConfig, problem: Problem, run_dir: Path) -> float:
    """The configured compute time, or a measured one ('calibrate'; reused on resume)."""
    if not isinstance(cfg.cost.compute_s, str):
        return cfg.cost.compute_s
    recorded = Path(run_dir) / schema.CONFIG_FILE
    if cfg.resume and recorded.exists():
        return float(json.loads(recorded.read_text())["cost"]["compute_s"])
    client = make_clients(cfg, problem.dataset, client_ids=[1])[0]
    client.fetch(problem.init_params, 0)
    worker = problem.worker
    sync = torch.cuda.synchronize if worker.params.is_cuda else (lambda: None)

    def step():
        x, y = client.stream.next_batch()
        worker.backward(x, y)
        client.optimiser.step(worker.params, worker.grad)
        sync()

    worker.load(problem.init_params)
    return calibrate_compute_s(step)


class Simulation:
    """One simulated run, writing its run folder."""

    def __init__(self, cfg: RunConfig, problem: Problem, run_dir: Path, compute_s: float):
        self.cfg, self.problem, self.run_dir = cfg, problem, Path(run_dir)
        self.worker = problem.worker
        self.server = problem.make_server(cfg)
        self.clients = {c.client_id: c for c in make_clients(cfg, problem.dataset)}
        for c in self.clients.values():
            c.fetch(self.server.params, 0)
        self.replay = cfg.cost.profile == "replay"
        if self.replay:
            self.scheduler = ReplayScheduler(cfg.cost.path)
        else:
            model = CostModel(cfg.cost, cfg.seed, param_bytes(self.server.params), compute_s)
            self.scheduler = CostScheduler(model, sorted(self.clients), cfg.nsync)
        self.budget = cfg.num_epochs * problem.dataset.num_train
        recorded = to_dict(cfg)
        recorded["cost"]["compute_s"] = compute_s
        recorded["environment"] = environment(self.server.params.device)
        resume_state = self._load_checkpoint() if cfg.resume else None
        self.log = RunLog(self.run_dir, recorded, clock="virtual", backend="sim",
                          num_train=problem.dataset.num_train, eval_every=cfg.eval_every,
                          target_error=cfg.target_error,
                          resume_from=resume_state["runlog"] if resume_state else None)
        self.progress = Progress(f"sim {cfg.exp_name}/{self.run_dir.name}", cfg.num_epochs, cfg.progress)

    # -- the loop -----------------------------------------------------------------------------
    def run(self, stop_at_version: int | None = None) -> dict:
        """Simulate to the end of the budget. ``stop_at_version`` interrupts the run there (as a
        Ctrl-C would), for testing resume."""
        try:
            if self.log.version == 0:
                self._evaluate()
            status, message = self._loop(stop_at_version)
            if status == "completed" and self.log.last_eval_version != self.log.version:
                self._evaluate()
            if status == "completed" and not self.server.params_finite():
                status, message = "diverged", "non-finite parameters at the end of the run"
        except KeyboardInterrupt:
            status, message = "interrupted", "interrupted by the user (resume=true continues from the last checkpoint)"
        except BaseException as e:
            self.log.write_summary("failed", message=f"{type(e).__name__}: {e}")
            self.log.close()
            raise
        summary = self.log.write_summary(status, message=message)
        self.log.close()
        self.progress.update(self.log.epoch, self.log.version, self.log.final.get("test_error"), force=True)
        return summary

    def _loop(self, stop_at_version: int | None) -> tuple[str, str]:
        cfg, log, server = self.cfg, self.log, self.server
        while self.replay or log.samples_seen < self.budget:
            nxt = self.scheduler.next()
            if nxt is None:
                break
            k, num_steps, t = nxt
            client = self.clients[k]
            if self.replay and client.read_version != self.scheduler.expected_read_version():
                raise ConfigError("cost.path", cfg.cost.path, f"a consistent recorded run: at version "
                                  f"{server.version + 1} client {k} read version "
                                  f"{self.scheduler.expected_read_version()}, the replay has {client.read_version}")
            push = client.compute_push(self.worker, num_steps)
            if not math.isfinite(push.train_loss):
                log.add_event("diverged", client=k)
                return "diverged", f"non-finite training loss in a push of client {k}"
            applied = server.apply(push)
            client.fetch(server.params, server.version)
            log.log_push(version=applied.version, time_s=t, client=k, read_version=push.read_version,
                         staleness=applied.staleness, num_steps=push.num_steps, num_samples=push.num_samples,
                         train_loss=push.train_loss, train_error=push.train_error)
            self.scheduler.served(k, t)
            if log.eval_due() and not self._evaluate():
                log.add_event("diverged")
                return "diverged", "non-finite parameters on the server"
            if cfg.checkpoint_every and applied.version % cfg.checkpoint_every == 0:
                self._save_checkpoint()
            if stop_at_version is not None and applied.version >= stop_at_version:
                raise KeyboardInterrupt
            self.progress.update(log.epoch, applied.version, log.final.get("test_error"))
        return "completed", ""

    def _evaluate(self) -> bool:
        """Evaluate the server's parameters (free in virtual time); False if they are not finite."""
        if not self.server.params_finite():
            return False
        metrics = evaluate(self.worker, self.server.params, self.problem.eval_sets)
        self.log.log_eval(version=self.server.version, time_s=self.log.time_s, **metrics)
        return True

    # -- checkpoints --------------------------------------------------------------------------
    def _save_checkpoint(self) -> None:
        state = {"kind": "sim", "server": self.server.state_dict(),
                 "clients": {str(k): c.state_dict() for k, c in self.clients.items()},
                 "scheduler": self.scheduler.state_dict(), "runlog": self.log.state_dict()}
        save_checkpoint(state, self.run_dir / schema.CHECKPOINT_FILE)

    def _load_checkpoint(self) -> dict:
        state = load_checkpoint(self.run_dir, "sim", self.server.params.device)
        self.server.load_state_dict(state["server"])
        for k, c in self.clients.items():
            c.load_state_dict(state["clients"][str(k)])
        self.scheduler.load_state_dict(state["scheduler"])
        return state


def simulate(cfg: RunConfig, run_dir: str | Path, problem: Problem | None = None,
             stop_at_version: int | None = None) -> dict:
    """Run the simulator for ``cfg`` into ``run_dir``; return the summary dict."""
    if cfg.cost.profile == "replay":
        cfg = replay_config(cfg)
    device = resolve_device(cfg.device)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    problem = problem or build_problem(cfg, device)
    compute_s = resolve_compute_s(cfg, problem, Path(run_dir))
    return Simulation(cfg, problem, Path(run_dir), compute_s).run(stop_at_version)
