"""The simulator's clock: how long computing, communicating and applying take, and who goes next.

:class:`CostModel` turns a :class:`~repro.config.settings.CostConfig` into durations: compute
time per minibatch per client (its relative step time from ``cost.speeds`` or ``cost.speed_law``:
an uneven cluster; seeded jitter; an optional straggler, all multiplied), one-way transfer time of a
parameter vector (latency + bytes / bandwidth) and the server's apply time. A schedule decides
the order in which the server applies pushes; every schedule derives from :class:`Schedule`
(every verb the simulator's loop calls; what a schedule does not model has a default that does
nothing, so the loop never probes), and :func:`repro.sim.driver.make_schedule` picks one:

* :class:`CostScheduler` -- ``cost.topology=dedicated`` (the default): every client has a host, a
  device and a link of its own, so its push arrives at fetch + compute + transfer; an event queue
  of push arrivals ordered by (time, sequence number); the server serves one push at a time,
  first come first served (and, with ``cost.reply_holds_server``, sends its reply before the next);
* :class:`repro.sim.resources.ContendedScheduler` -- ``cost.topology=shared``: the same, with the
  devices and links that clients share as queues in virtual time (processor sharing);
* :class:`repro.sim.replay.ReplayScheduler` -- the exact order (and times) a real run recorded.

Each is stateless apart from plain numbers, so a checkpoint captures it exactly. Jitter for
(client, segment) is drawn from a generator seeded by (seed, client, segment), independent of the
order in which segments are simulated (drawn in blocks of pushes, see ``CostModel._jitter``).
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
    """(a host's link, the server's link) in bytes/s each way under ``cost.topology=shared``;
    None: unlimited."""
    host, server = cost.shared.host_bandwidth_Bps, cost.shared.server_bandwidth_Bps
    return (cost.bandwidth_Bps if host is None else host), (cost.bandwidth_Bps if server is None else server)


def path_bandwidth(cost: CostConfig) -> float | None:
    """Bytes/s of one transfer alone on its path (None: free): ``bandwidth_Bps`` for a dedicated
    link; under ``shared`` the slower of its host's link and the server's."""
    if cost.topology != "shared":
        return cost.bandwidth_Bps
    limited = [b for b in link_bandwidths(cost) if b is not None]
    return min(limited) if limited else None


def step_time(cost: CostConfig, client: int, step_s: float) -> float:
    """``client``'s step of ``step_s`` seconds (or its segment, given one) without jitter: times
    its relative step time (``cost.speeds`` or ``cost.speed_law``) and the straggler's factor.
    The one place the clock, the ceiling and the lab's theories read a client's pace."""
    step_s = step_s * cost.speed(client)
    return step_s * cost.straggler_factor if cost.straggler_client == client else step_s


class CostModel:
    """Durations in virtual seconds. ``step_s``: one minibatch step (``cost.compute_s``, or the
    measured value when it says ``calibrate``). ``num_clients``: a joiner (an id beyond it)
    computes at its slot's pace (:func:`~repro.config.settings.client_slot`), as the real one does."""

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
        self._blocks: dict[int, np.ndarray] = {}
        self._block_key: dict[int, tuple] = {}

    def segment_s(self, client: int, segment: int, num_steps: int) -> float:
        """Virtual time of ``client``'s ``segment``-th push: ``num_steps`` minibatch steps."""
        # a relative step time of exactly 1.0 (no cost.speeds or cost.speed_law) changes no bit
        slot = client_slot(self.num_clients, client) if self.num_clients else client
        step_s = step_time(self.cost, slot, self.step_s)
        if self.cost.jitter == "none" or self.cost.jitter_sigma == 0:
            return step_s * num_steps
        return float(step_s * self._jitter(client, segment, num_steps).sum())

    def _jitter(self, client: int, segment: int, num_steps: int) -> np.ndarray:
        """Per-step time factors, a pure function of (seed, client, segment). Drawn in blocks of
        JITTER_BLOCK pushes per generator: seeding a generator costs more than a minibatch of
        digits_cnn, so one per push would dominate the simulator's overhead."""
        block, row = divmod(segment, JITTER_BLOCK)
        key = (client, block, num_steps)
        if self._block_key.get(client) != key:
            rng = np.random.default_rng([self.seed, client, block, num_steps])
            sigma = self.cost.jitter_sigma
            shape = (JITTER_BLOCK, num_steps)
            if self.cost.jitter == "lognormal":   # mean-preserving: E[exp(s z - s^2/2)] = 1
                factors = np.exp(sigma * rng.standard_normal(shape) - sigma * sigma / 2)
            else:                                   # exponential tail of weight sigma, mean 1
                factors = (1 - sigma) + sigma * rng.exponential(1.0, shape)
            self._blocks[client], self._block_key[client] = factors, key
        return self._blocks[client][row]


class Schedule(ABC):
    """What the simulator asks of a schedule: the next push to apply, then that it was served."""

    #: what the run's summary says when :meth:`next` runs out before the budget (a replay)
    end_message = ""
    #: timings.csv's parts of the push :meth:`next` returned; None: the schedule models none
    last_timing: dict | None = None

    @abstractmethod
    def next(self) -> tuple[int, int, float] | None:
        """(client, num_steps, apply-finished time) of the next push; None: nothing is left.
        The server is busy with it only once :meth:`handled` says whether it applied it."""

    def handled(self, t: float, discarded: bool) -> float:
        """When the one server (free again at ``server_free``) is done with the push :meth:`next`
        returned (at ``t``): a push the protocol discarded or the server refused (diverging) costs it
        no apply time (the real server only replies), so it is done as it takes it, where
        :meth:`next` left ``server_free``. A push a sync round holds or Rennala collects costs one:
        the real server's work on a round or a step grows with its pushes (each is summed in)."""
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
        """timings.csv's parts of the push :meth:`next` returned (kept with one pending in a
        checkpoint); nan where the schedule has no model of them (a replay)."""
        return self.last_timing or dict.fromkeys(TIMING_PARTS, float("nan"))


class CostScheduler(Schedule):
    """Push arrivals in virtual time; the server applies them one at a time in arrival order."""

    def __init__(self, model: CostModel, client_ids: list[int], nsync: int):
        self.model, self.nsync = model, nsync
        self.queue: list[tuple[float, int, int]] = []
        self.seq, self.server_free = 0, 0.0
        self.segments = {k: 0 for k in client_ids}
        # per client (to_client_s, compute_s) of the push in flight: timings.csv's columns
        self.flight: dict[int, tuple[float, float]] = {}
        for k in client_ids:              # every client fetches version 0 at t = 0
            self._schedule(k, 0.0, 0.0)

    def peek(self) -> float:
        """When the next push arrives (inf: no client computes); churn's events interleave by it
        (churn runs on this schedule alone: validate refuses it with shared resources or a replay)."""
        return self.queue[0][0] if self.queue else math.inf

    def _schedule(self, client: int, fetched_at: float, to_client_s: float) -> None:
        seg = self.segments.setdefault(client, 0)   # a joiner starts its segments at 0
        self.segments[client] = seg + 1
        compute_s = self.model.segment_s(client, seg, self.nsync)
        self.flight[client] = (to_client_s, compute_s)
        arrive = fetched_at + compute_s + self.model.transfer_s
        heapq.heappush(self.queue, (arrive, self.seq, client))
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
        """The reply (the client's fetch) travels back, then the client computes its next push;
        with cost.reply_holds_server the server sends its replies one after another (a sync
        round's, as the real Dispatcher does under its lock) and serves no push before the last
        has arrived: a reply waits for those before it (its to_client_s counts the wait)."""
        start = max(applied_at, self.server_free) if self.model.cost.reply_holds_server else applied_at
        sent = start + self.model.transfer_s
        if self.model.cost.reply_holds_server:
            self.server_free = sent
        self._schedule(client, sent, (start - applied_at) + self.model.transfer_s)

    def cancel(self, client: int) -> None:
        """Drop the client's push in flight (a sync round's backup worker, preempted): it is
        never computed, and the client starts over when it is served."""
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
