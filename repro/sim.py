"""The deterministic delay simulator (``backend=sim``): N clients, one server, one device, a virtual clock.

The simulator is a driver: a scheduler (:mod:`repro.cost`) says which client's push the server
applies next and when; the client computes that push *lazily* from the parameters it fetched (a
push depends only on them and on the client's own data stream, so computing it late changes
nothing); the run core (:mod:`repro.core`) applies it and says who fetches what; the client
fetches. Every client borrows one :class:`~repro.worker.Worker`, so simulating K minibatch steps
costs about what K steps of a plain training loop cost.

Bit-for-bit reproducible from the seed (on one torch build, CPU kernel family, thread count and
device): the only randomness is the model init (``seed``), each client's data order
(``seed, client``) and the jitter (``seed, client, segment``); no wall clock enters any table.
``cost=replay`` replays the update order recorded by a real run instead.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from repro import schema
from repro.components import deterministic, make_clients, param_bytes, resolve_device, torch_threads
from repro.config import BackendConfig, RunConfig, from_dict, with_operational
from repro.core import RunCore, run_folder
from repro.cost import CostModel, CostScheduler, ReplayScheduler, calibrate_compute_s
from repro.errors import ConfigError
from repro.problem import Problem, build_problem
from repro.stopping import StopRequest


def replay_config(cfg: RunConfig) -> RunConfig:
    """A replay trains exactly what the recorded run trained: every training-shaping setting
    comes from its config.json; the backend (sim), the cost (replay) and everything that does
    not shape training (where results go, progress, checkpoints) come from ``cfg``."""
    path = Path(cfg.cost.path) / schema.CONFIG_FILE
    try:
        recorded = from_dict(with_operational(json.loads(path.read_text()), cfg))
    except (OSError, ValueError) as e:
        raise ConfigError("cost.path", cfg.cost.path, f"a recorded run folder with a valid config.json ({e})")
    if recorded.protocol.name != "async":
        raise ConfigError("cost.path", cfg.cost.path, f"an async run (replay replays the order of "
                          f"asynchronous pushes; this one ran protocol={recorded.protocol.name})")
    # where the replay runs is ours to choose: the simulator, this device, this many threads
    return recorded.replace(cost=cfg.cost, backend=BackendConfig(name="sim"), device=cfg.device,
                            num_threads=cfg.num_threads)


def resolve_compute_s(cfg: RunConfig, problem: Problem, resume: dict | None) -> float:
    """The configured compute time, or a measured one ('calibrate'; reused on resume)."""
    if not isinstance(cfg.cost.compute_s, str):
        return cfg.cost.compute_s
    if resume is not None:
        return float(resume["driver"]["compute_s"])
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
    """The simulator's side of one run: clients, the scheduler and the loop around the core."""

    def __init__(self, cfg: RunConfig, problem: Problem, core: RunCore, compute_s: float,
                 stop: StopRequest, resume: dict | None = None):
        self.cfg, self.problem, self.core, self.stop = cfg, problem, core, stop
        self.worker, self.server = problem.worker, core.server
        self.clients = {c.client_id: c for c in make_clients(cfg, problem.dataset)}
        for c in self.clients.values():
            c.fetch(self.server.params, 0)
        self.replay = cfg.cost.profile == "replay"
        if self.replay:
            self.scheduler = ReplayScheduler(cfg.cost.path)
        else:
            model = CostModel(cfg.cost, cfg.seed, param_bytes(self.server.params), compute_s)
            self.scheduler = CostScheduler(model, sorted(self.clients), cfg.nsync)
        self.compute_s = compute_s
        self.resume_protocol = resume.get("protocol") if resume is not None else None
        if resume is not None:
            for k, c in self.clients.items():
                c.load_state_dict(resume["driver"]["clients"][str(k)])
            self.scheduler.load_state_dict(resume["driver"]["scheduler"])
        core.state.driver_state = self.state_dict

    def run(self, stop_at_version: int | None = None) -> tuple[str, str]:
        """Simulate to the end of the budget; (status, message). ``stop_at_version`` asks the run
        to stop there, as a Ctrl-C would (for testing resume)."""
        core, stop = self.core, self.stop
        core.begin(sorted(self.clients), protocol_state=self.resume_protocol)
        while core.accepting and not stop.is_set():
            nxt = self.scheduler.next()
            if nxt is None:   # a replay past its recorded run's last push: all of it was replayed
                core.state.stopping = True
                return "completed", ""
            k, num_steps, t = nxt
            client = self.clients[k]
            if self.replay and client.read_version != self.scheduler.expected_read_version():
                raise ConfigError("cost.path", self.cfg.cost.path, f"a consistent recorded run: at version "
                                  f"{self.server.version + 1} client {k} read version "
                                  f"{self.scheduler.expected_read_version()}, the replay has {client.read_version}")
            push = client.compute_push(self.worker, num_steps)
            for reply in core.on_push(push, t):
                if reply.preempt:
                    self.scheduler.cancel(reply.client)   # its segment is dropped, never computed
                if not reply.stop:
                    self.clients[reply.client].fetch(self.server.params, self.server.version)
                    self.scheduler.served(reply.client, t)
            core.settle(t)
            if stop_at_version is not None and self.server.version >= stop_at_version:
                stop.set("stop_at_version")
        return core.final_status(interrupted=stop.is_set())

    def state_dict(self) -> dict:
        return {"clients": {str(k): c.state_dict() for k, c in self.clients.items()},
                "scheduler": self.scheduler.state_dict(), "compute_s": self.compute_s}


def simulate(cfg: RunConfig, run_dir: str | Path, problem: Problem | None = None,
             stop_at_version: int | None = None) -> dict:
    """Run the simulator for ``cfg`` into ``run_dir``; return the summary dict."""
    if cfg.cost.profile == "replay":
        cfg = replay_config(cfg)
    device = resolve_device(cfg.device)
    with torch_threads(cfg.num_threads), deterministic(device), run_folder(cfg, run_dir) as run:
        if run.skip:
            return run.summary
        resume = run.checkpoint("sim", device)
        problem = problem or build_problem(cfg, device)
        compute_s = resolve_compute_s(cfg, problem, resume)
        run.core = core = RunCore(cfg, problem, run.run_dir, clock="virtual", backend="sim", resume=resume,
                                  measured={"cost.compute_s": compute_s})
        sim = Simulation(cfg, problem, core, compute_s, run.stop, resume)
        status, message = sim.run(stop_at_version)
        return core.finish(status, message)
    return run.summary
