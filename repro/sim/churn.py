"""Simulated churn (``cost.churn.*``): when clients are lost, back and join, in virtual time
(docs/simulator.md, "Churn and determinism"); :mod:`repro.sim.driver` carries each change out.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

CHURN_STREAM = 0xC4   # keeps these draws apart from the jitter's [seed, client, ...] streams
LEAVE, PREEMPT, BACK, JOIN = "leave", "preempt", "back", "join"


class Churn:
    """The pending membership events of one simulated run, earliest first."""

    def __init__(self, cost, seed: int, clients: list[int]):
        self.rate, self.down_s, self.seed = cost.churn.preempt_rate, cost.churn.preempt_down_s, seed
        self.events: list[tuple[float, int, str, int]] = []   # (time, seq, kind, client)
        self.seq = 0
        self.draws: dict[int, int] = {}
        self.life: dict[int, int] = {}   # a preemption drawn for an earlier life of a client is void
        self.next_id = max(clients) + 1
        leave = list(cost.churn.leave or ())
        for k, t1, t2 in zip(leave[::3], leave[1::3], leave[2::3]):   # triples (client, leave, back or 0)
            self._push(float(t1), LEAVE, int(k))
            if t2 > 0:
                self._push(float(t2), BACK, int(k))
        for t in cost.churn.join or ():
            self._push(float(t), JOIN, 0)   # its id is given when it joins: ids in time order
        for k in clients:
            self.arm(k, 0.0)

    def _push(self, t: float, kind: str, client: int) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, client))
        self.seq += 1

    def _draw(self, client: int, mean: float) -> float:
        i = self.draws.get(client, 0)
        self.draws[client] = i + 1
        return float(np.random.default_rng([self.seed, CHURN_STREAM, client, i]).exponential(mean))

    def arm(self, client: int, now: float) -> None:
        """``client`` is live from ``now``: draw its next preemption (none at rate 0)."""
        self.life[client] = self.life.get(client, 0) + 1
        if self.rate > 0:
            self._push(now + self._draw(client, 1.0 / self.rate), f"{PREEMPT}:{self.life[client]}", client)

    def lost(self, client: int, now: float, preempted: bool) -> None:
        """``client`` left at ``now``: a preempted one is back after a seeded delay."""
        if preempted:
            self._push(now + self._draw(client, self.down_s), BACK, client)

    def due_back(self) -> frozenset[int]:
        """The clients away whom a pending event brings back (preempted, or left with a return)."""
        return frozenset(k for _, _, kind, k in self.events if kind == BACK)

    def next_time(self) -> float:
        while self.events and self._void(self.events[0]):
            heapq.heappop(self.events)
        return self.events[0][0] if self.events else math.inf

    def _void(self, event) -> bool:
        kind, client = event[2], event[3]
        return kind.startswith(PREEMPT) and int(kind.split(":")[1]) != self.life.get(client)

    def pop(self) -> tuple[float, str, int]:
        self.next_time()   # drop void events first
        t, _, kind, client = heapq.heappop(self.events)
        if kind == JOIN:
            client, self.next_id = self.next_id, self.next_id + 1
        return t, kind.split(":")[0], client

    def state_dict(self) -> dict:
        return {"events": [list(e) for e in self.events], "seq": self.seq, "next_id": self.next_id,
                "draws": [[k, v] for k, v in self.draws.items()],
                "life": [[k, v] for k, v in self.life.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.events = [(float(t), int(s), str(kind), int(k)) for t, s, kind, k in state["events"]]
        heapq.heapify(self.events)
        self.seq, self.next_id = int(state["seq"]), int(state["next_id"])
        self.draws = {int(k): int(v) for k, v in state["draws"]}
        self.life = {int(k): int(v) for k, v in state["life"]}
