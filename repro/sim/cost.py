"""The simulator's clock (docs/simulator.md, "The clock"): :class:`CostModel`'s durations, and
:class:`Schedule`, what the loop asks of a schedule: :class:`CostScheduler` under
``cost.topology=dedicated``, :mod:`repro.sim.resources` under ``shared``, :mod:`repro.sim.replay`.
"""
from __future__ import annotations

import heapq
import math
import time
from abc import ABC, abstractmethod

import numpy as np

from repro.config.settings import CostConfig, client_slot
from repro.errors import ConfigError
from repro.files.schema import TIMING_PARTS

JITTER_BLOCK = 256  # pushes per client whose jitter is drawn from one generator


def link_bandwidths(cost: CostConfig) -> tuple[float | None, float | None]:
    """(a host's link, the server's link) in bytes/s each way under ``shared``; None: unlimited."""
    host, server = cost.shared.host_bandwidth_Bps, cost.shared.server_bandwidth_Bps
    return (cost.bandwidth_Bps if host is None else host), (cost.bandwidth_Bps if server is None else server)


def path_bandwidth(cost: CostConfig) -> float | None:
    """Bytes/s of one transfer alone on its path (None: free); under ``shared`` the slower link."""
    if cost.topology != "shared":
        return cost.bandwidth_Bps
    limited = [b for b in link_bandwidths(cost) if b is not None]
    return min(limited) if limited else None


def step_time(cost: CostConfig, client: int, step_s: float) -> float:
    """``client``'s step (or segment) of ``step_s`` seconds without jitter: times its relative step
    time and the straggler's factor (the one place every model reads a client's pace)."""
    step_s = step_s * cost.speed(client)
    return step_s * cost.straggler_factor if cost.straggler_client == client else step_s


class CostModel:
    """Durations in virtual seconds; ``step_s``: one minibatch step. A joiner (an id beyond
    ``num_clients``) computes at its slot's pace (:func:`~repro.config.settings.client_slot`)."""

    def __init__(self, cost: CostConfig, seed: int, param_bytes: int, step_s: float, num_clients: int = 0):
        self.cost, self.seed, self.step_s, self.num_clients = cost, seed, step_s, num_clients
        nbytes = self.nbytes = cost.comm_params * 4 if cost.comm_params is not None else param_bytes
        bandwidth = path_bandwidth(cost)
        # one push or fetch on idle links; shared links stretch it (repro.sim.resources)
        self.transfer_s = cost.latency_s + (nbytes / bandwidth if bandwidth else 0.0)
        if not math.isfinite(self.transfer_s):   # else every time is inf, the order arbitrary
            raise ConfigError("cost.bandwidth_Bps", bandwidth, f"a bandwidth at which one message "
                              f"({nbytes:g} bytes) takes a finite time")
        self.server_apply_s = cost.server_apply_s
        self._blocks: dict[int, tuple[tuple, np.ndarray]] = {}   # per client: (its block's key, the block)

    def segment_s(self, client: int, segment: int, num_steps: int) -> float:
        """Virtual time of ``client``'s ``segment``-th push: ``num_steps`` minibatch steps."""
        # a relative step time of exactly 1.0 (no cost.speeds or cost.speed_law) changes no bit
        slot = client_slot(self.num_clients, client) if self.num_clients else client
        step_s = step_time(self.cost, slot, self.step_s)
        if self.cost.jitter == "none" or self.cost.jitter_sigma == 0:
            return step_s * num_steps
        return float(step_s * self._jitter(client, segment, num_steps).sum())

    def _jitter(self, client: int, segment: int, num_steps: int) -> np.ndarray:
        """Per-step time factors, a pure function of (seed, client, segment), drawn in blocks:
        seeding a generator costs more than a minibatch of digits_cnn."""
        block, row = divmod(segment, JITTER_BLOCK)
        key = (client, block, num_steps)
        if self._blocks.get(client, (None,))[0] != key:
            rng = np.random.default_rng([self.seed, client, block, num_steps])
            sigma, shape = self.cost.jitter_sigma, (JITTER_BLOCK, num_steps)
            if self.cost.jitter == "lognormal":   # mean-preserving: E[exp(s z - s^2/2)] = 1
                factors = np.exp(sigma * rng.standard_normal(shape) - sigma * sigma / 2)
            else:                                   # exponential tail of weight sigma, mean 1
                factors = (1 - sigma) + sigma * rng.exponential(1.0, shape)
            self._blocks[client] = key, factors
        return self._blocks[client][1][row]


class Schedule(ABC):
    """What the simulator asks of a schedule: the next push to apply, then that it was served."""
    #: what the run's summary says when :meth:`next` runs out before the budget (a replay)
    end_message = ""
    #: timings.csv's parts of the push :meth:`next` returned; None: the schedule models none
    last_timing: dict | None = None

    @abstractmethod
    def next(self) -> tuple[int, int, float] | None:
        """(client, num_steps, apply-finished time) of the next push; None: nothing is left."""

    def handled(self, t: float, discarded: bool) -> float:
        """When the one server is done with the push :meth:`next` returned (at ``t``): one discarded
        or refused costs no apply (the real server only replies); a held or collected one costs one."""
        if discarded:   # (a checkpoint left it there too)
            self.last_timing = self.last_timing and {**self.last_timing, "apply_s": 0.0}
        else:
            self.server_free = t
        return self.server_free

    @abstractmethod
    def served(self, client: int, applied_at: float) -> None:
        """The client's reply left the server at ``applied_at``: it fetches, then computes."""

    @abstractmethod
    def cancel(self, client: int) -> None:
        """Drop the client's push in flight (preempted, or the client left)."""

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state: dict) -> None: ...

    def check(self, client: int, read_version: int) -> None:
        """Refuse a push that the schedule did not foresee (a replay of another run)."""

    def membership_due(self, version: int) -> list[tuple[str, int, float]]:
        """Recorded joins and losses due at server version ``version``: (type, client, time_s)."""
        return []

    def evaluated(self, t: float) -> None:
        """The server evaluates its parameters from ``t`` on (a schedule where that takes time)."""

    def timing(self) -> dict[str, float]:
        """timings.csv's parts of the push :meth:`next` returned; nan where none are modelled."""
        return self.last_timing or dict.fromkeys(TIMING_PARTS, float("nan"))


class CostScheduler(Schedule):
    """Push arrivals in virtual time; the server applies them one at a time in arrival order."""

    def __init__(self, model: CostModel, client_ids: list[int], nsync: int):
        self.model, self.nsync = model, nsync
        self.queue: list[tuple[float, int, int]] = []
        self.seq, self.server_free = 0, 0.0
        self.segments = {k: 0 for k in client_ids}
        self.flight: dict[int, tuple[float, float]] = {}   # (to_client_s, compute_s) of the push in flight
        for k in client_ids:              # every client fetches version 0 at t = 0
            self._schedule(k, 0.0, 0.0)

    def peek(self) -> float:
        """When the next push arrives (inf: no client computes); churn's events interleave by it."""
        return self.queue[0][0] if self.queue else math.inf

    def _schedule(self, client: int, fetched_at: float, to_client_s: float) -> None:
        seg = self.segments.setdefault(client, 0)   # a joiner starts its segments at 0
        self.segments[client] = seg + 1
        compute_s = self.model.segment_s(client, seg, self.nsync)
        self.flight[client] = (to_client_s, compute_s)
        heapq.heappush(self.queue, (fetched_at + compute_s + self.model.transfer_s, self.seq, client))   # its arrival
        self.seq += 1

    def next(self) -> tuple[int, int, float] | None:
        arrive, _, client = heapq.heappop(self.queue)
        start = self.server_free = max(arrive, self.server_free)   # the server serves one push at a time
        to_client_s, compute_s = self.flight.get(client, (0.0, 0.0))
        self.last_timing = {"to_client_s": to_client_s, "compute_s": compute_s,
                            "to_server_s": self.model.transfer_s, "queue_s": start - arrive,
                            "apply_s": self.model.server_apply_s}
        return client, self.nsync, start + self.model.server_apply_s

    def served(self, client: int, applied_at: float) -> None:
        """The reply travels back, then the client computes; with cost.reply_holds_server replies
        go one after another (as the real Dispatcher's, under its lock), each waiting in to_client_s."""
        start = max(applied_at, self.server_free) if self.model.cost.reply_holds_server else applied_at
        sent = start + self.model.transfer_s
        if self.model.cost.reply_holds_server:
            self.server_free = sent
        self._schedule(client, sent, (start - applied_at) + self.model.transfer_s)

    def cancel(self, client: int) -> None:
        self.queue = [e for e in self.queue if e[2] != client]
        heapq.heapify(self.queue)

    def state_dict(self) -> dict:
        return {"queue": [list(e) for e in self.queue], "seq": self.seq, "server_free": self.server_free,
                "segments": [[k, v] for k, v in self.segments.items()],
                "flight": [[k, a, b] for k, (a, b) in self.flight.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.queue = [(float(t), int(s), int(c)) for t, s, c in state["queue"]]
        heapq.heapify(self.queue)
        self.seq, self.server_free = int(state["seq"]), float(state["server_free"])
        self.segments = {int(k): int(v) for k, v in state["segments"]}
        self.flight = {int(k): (float(a), float(b)) for k, a, b in state.get("flight", [])}


def calibrate_compute_s(step, warmup: int = 3, repeats: int = 20) -> float:
    """Seconds per call of ``step()`` on this device: the measured cost of one minibatch step."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats
