"""The deterministic delay simulator (``backend=sim``): N clients, one server, one device, a virtual clock.

A schedule (:mod:`repro.sim.cost`) says whose push the server applies next and when; the client
computes it then and the run core (:mod:`repro.runs.core`) applies it (docs/simulator.md).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from repro.asgd.algorithm import Client, Push
from repro.config.settings import Resolved, RunConfig
from repro.workload.build import Problem, make_clients, param_bytes
from repro.workload.start import build_problem
from repro.runs.core import STALL_PUSHES, Outcome, RunCore
from repro.runs.folder import run_folder
from repro.runtime import StopRequest, deterministic, resolve_device, torch_threads
from repro.sim.churn import BACK, LEAVE, PREEMPT, Churn
from repro.sim.cost import CostModel, CostScheduler, Schedule, calibrate_compute_s
from repro.sim.fit import fit_config
from repro.sim.replay import ReplayScheduler, replay_config
from repro.sim.resources import ContendedScheduler


def resolve_compute_s(cfg: RunConfig, problem: Problem, resume: dict | None) -> float:
    """The configured compute time, or a measured one ('calibrate'; reused on resume)."""
    if not isinstance(cfg.cost.compute_s, str):
        return cfg.cost.compute_s
    if resume is not None:
        return float(resume["driver"]["compute_s"])
    client = make_clients(cfg, problem.dataset, client_ids=[1])[0]   # its stream and optimiser, on the net
    net = problem.net
    sync = torch.cuda.synchronize if net.params.is_cuda else (lambda: None)

    def step():
        x, y = client.stream.next_batch()
        net.backward(x, y)
        client.optimiser.step(net.params, net.grad)
        sync()
    net.load(problem.init_params)
    return calibrate_compute_s(step)


class Simulation:
    """The simulator's side of one run: clients, the scheduler and the loop around the core."""

    def __init__(self, cfg: RunConfig, problem: Problem, core: RunCore, compute_s: float,
                 stop: StopRequest, resume: dict | None = None):
        self.cfg, self.problem, self.core, self.stop = cfg, problem, core, stop
        self.net, self.server = problem.net, core.server
        self.clients = {c.client_id: c for c in make_clients(cfg, problem.dataset)}
        for c in self.clients.values():
            c.fetch(self.server.params, 0)
        if cfg.cost.schedule == "replay":   # a recorded run's order (the recording's cfg: replay_config)
            self.scheduler: Schedule = ReplayScheduler(cfg.cost.path, cfg.num_clients)
        else:   # the cost model's clock
            model = CostModel(cfg.cost, cfg.seed, param_bytes(self.server.params), compute_s, cfg.num_clients)
            self.scheduler = (ContendedScheduler if cfg.cost.topology == "shared" else CostScheduler)(
                model, sorted(self.clients), cfg.nsync)
        self.compute_s = compute_s
        self.resume_protocol = resume.get("protocol") if resume is not None else None
        self.pending: tuple | None = None   # a push taken from the schedule, abandoned by a stop
        self.resumed = resume is not None    # the clients hold what they fetched before
        self.churn = Churn(cfg.cost, cfg.seed, sorted(self.clients)) if cfg.cost.churn.churns else None
        self.down: set[int] = set()          # clients away (churn), who may come back
        self.stopping = False                # what the core's last Outcome said
        if resume is not None:
            driver = resume["driver"]
            joiners = [int(k) for k in driver["clients"] if int(k) not in self.clients]   # (churn)
            self.clients.update((c.client_id, c) for c in make_clients(cfg, problem.dataset, client_ids=joiners))
            if self.churn is not None:
                self.churn.load_state_dict(driver["churn"])
                self.down = {int(k) for k in driver["down"]}
            for k, c in self.clients.items():
                c.load_state_dict(driver["clients"][str(k)])
            self.scheduler.load_state_dict(driver["scheduler"])
            pending = driver.get("pending")
            if pending is not None:   # with its timings.csv parts, which next() gave when it chose it
                self.pending = (int(pending[0]), int(pending[1]), float(pending[2]))
                self.scheduler.last_timing = driver.get("pending_timing")

    def run(self, stop_at_version: int | None = None) -> tuple[str, str]:
        """Simulate to the end of the budget: (status, message); ``stop_at_version``: stop there, as Ctrl-C."""
        core, stop = self.core, self.stop
        self.carry(core.begin(sorted(set(self.clients) - self.down), protocol_state=self.resume_protocol,
                              fetching=not self.resumed, driver_state=self.state_dict), 0.0)
        while not self.stopping and not stop.is_set():
            if self.pending is None and self.churn is not None:
                events = 0   # since the last push: churn that loses every push before it arrives
                while self.churn.next_time() <= self.scheduler.peek() and self.churn.next_time() < math.inf:
                    self.membership(*self.churn.pop())
                    events += 1
                    if events > STALL_PUSHES * len(self.clients):
                        core.fail(f"no push arrived in {events} churn events ({STALL_PUSHES} per client): each "
                                  "client is lost before its segment ends; lower cost.churn.preempt_rate or nsync")
                        self.stopping = True
                    if self.stopping or stop.is_set():
                        break
                if self.stopping or stop.is_set() or self.scheduler.peek() == math.inf:
                    break   # (or nobody computes and nobody comes back)
            if self.pending is None:   # a replayed run's recorded joins and losses (repro.sim.replay)
                for kind, k, t in self.scheduler.membership_due(self.server.version):
                    if kind != "client_lost":
                        self.join(k, t)
                    elif k in self.clients:
                        self.settle(self.core.lose(k, "lost in the recorded run", t), t)
            nxt, self.pending = self.pending or self.scheduler.next(), None
            if nxt is None:   # a replay past its recorded run's last push: all of it was replayed
                core.stop()
                return "completed", self.scheduler.end_message
            k, num_steps, t = nxt
            client = self.clients[k]
            self.scheduler.check(k, client.read_version)
            push = self.compute(client, num_steps)
            if push is None:   # stopped between two steps: computed again by a resumed run
                self.pending = nxt
                break
            outcome = core.on_push(push, t)
            t = self.scheduler.handled(t, outcome.discarded)   # a discard: when the server took it
            core.record_timing(t, k, push.read_version, **self.scheduler.timing())
            self.settle(outcome, t)
            if stop_at_version is not None and self.server.version >= stop_at_version:
                stop.set("stop_at_version")
        return core.final_status(interrupted=stop.is_set(), away=self.churn.due_back() if self.churn else frozenset())

    def carry(self, outcome: Outcome, t: float) -> None:
        """Carry the replies of what the core did; note whether the run is stopping."""
        self.stopping = outcome.stopping
        for reply in outcome.replies:
            if reply.client in self.down:   # away (churn): it fetches when it is back
                continue
            if reply.preempt:
                self.scheduler.cancel(reply.client)   # its segment is dropped, never computed
            if not reply.stop:
                self.clients[reply.client].fetch(self.server.params, self.server.version)
                self.scheduler.served(reply.client, t)

    def settle(self, outcome: Outcome, t: float) -> None:
        """Carry what the core did at ``t``, then the evaluation or checkpoint due at its version."""
        self.carry(outcome, t)
        # an evaluation that takes the machine's time, charged before a checkpoint is written
        self.carry(self.core.settle(t, evaluated=self.scheduler.evaluated), t)

    def membership(self, t: float, kind: str, k: int) -> None:
        """A churn event at virtual time ``t``, carried out through the core as the real driver
        does; the server takes it once free (``at``), as the real one takes it under its lock."""
        at = max(t, self.scheduler.server_free)
        if kind in (LEAVE, PREEMPT):
            if k in self.down or k not in self.clients:
                return
            self.down.add(k)
            self.scheduler.cancel(k)   # the push it was computing is lost with it
            why = "preempted (cost.churn.preempt_rate)" if kind == PREEMPT else "left (cost.churn.leave)"
            version, end = self.server.version, at + self.scheduler.model.server_apply_s
            outcome = self.core.lose(k, why, t, applied_at=end)
            if self.server.version != version:   # it closed a round: an apply like any other
                at = self.scheduler.handled(end, discarded=False)
            self.churn.lost(k, t, preempted=kind == PREEMPT)   # before a checkpoint the settle may write
            self.settle(outcome, at)
            return
        if kind == BACK and k not in self.down:
            return
        self.down.discard(k)   # (a joiner's new id is not there)
        if self.stopping:
            return
        self.join(k, t)   # a joiner: a new id, its slot's settings (client_slot)
        self.scheduler.served(k, at)
        self.churn.arm(k, t)

    def join(self, k: int, t: float) -> None:
        """Client ``k`` joins, or is back, at ``t``: a fresh client (a real joiner is a new process) that fetches."""
        self.clients[k] = make_clients(self.cfg, self.problem.dataset, client_ids=[k])[0]
        self.core.join(k, t)
        self.clients[k].fetch(self.server.params, self.server.version)

    def compute(self, client: Client, num_steps: int) -> Push | None:
        """The client's push, or None (the client rewound) when a stop came between two steps."""
        if num_steps < 2:
            return client.compute_push(self.net, num_steps)
        mark = client.mark()
        try:
            return client.compute_push(self.net, num_steps, on_step=self._stop_between_steps)
        except _Stopped:
            client.rewind(mark)
            return None

    def _stop_between_steps(self) -> None:
        if self.stop.is_set():
            raise _Stopped

    def state_dict(self) -> dict:
        return {"clients": {str(k): c.state_dict() for k, c in self.clients.items()},
                "scheduler": self.scheduler.state_dict(), "compute_s": self.compute_s,
                "pending": list(self.pending) if self.pending is not None else None,
                "pending_timing": self.scheduler.last_timing if self.pending is not None else None,
                **({"churn": self.churn.state_dict(), "down": sorted(self.down)} if self.churn else {})}


class _Stopped(Exception):
    """A stop request, raised between two local steps of a push."""


def resolve(cfg: RunConfig | Resolved, run_dir: str | Path | None = None) -> Resolved:
    """The simulator's part of :func:`repro.run.resolve`, before any folder is touched: ``cost=replay``
    becomes what the recording trained, ``cost=fit`` the fitted cost model; a Resolved one is kept."""
    if isinstance(cfg, Resolved):
        return cfg
    if cfg.cost.schedule == "replay":
        return Resolved(replay_config(cfg, run_dir))
    return Resolved(*fit_config(cfg)) if cfg.cost.path else Resolved(cfg)   # cost.path under events: cost=fit


def simulate(cfg: RunConfig | Resolved, run_dir: str | Path, problem: Problem | None = None,
             stop_at_version: int | None = None) -> dict:
    """Run the simulator for ``cfg`` (resolved first unless a Resolved one) into ``run_dir``: the summary."""
    plan = resolve(cfg, run_dir)   # before the folder: config.json records the fitted values
    cfg, fit = plan.cfg, plan.fit
    device = resolve_device(cfg.device)
    with torch_threads(cfg.num_threads), deterministic(device), run_folder(cfg, run_dir) as run:
        if run.skip:
            return run.summary
        resume = run.checkpoint("sim", device)
        problem = problem or build_problem(cfg, device)
        compute_s = resolve_compute_s(cfg, problem, resume)
        fitted = {"fit": fit} if fit else {}
        run.core = core = RunCore(cfg, problem, run.run_dir, clock="virtual", backend="sim", resume=resume,
                                  measured={"cost.compute_s": compute_s, **fitted})
        status, message = Simulation(cfg, problem, core, compute_s, run.stop, resume).run(stop_at_version)
        return core.finish(status, message, **fitted)
    return run.summary
