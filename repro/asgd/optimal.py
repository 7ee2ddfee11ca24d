"""Asynchronous SGD with optimal time complexity, as policies: ``ringmaster`` (Maranjyan, Tyurin,
Richtarik, ICML 2025, Algorithms 4 and 5) and ``rennala`` (Tyurin & Richtarik, NeurIPS 2023). What
each does: docs/lab.md; one preemption at a time: docs/simulator.md, "Protocols".
"""
from __future__ import annotations

from typing import AbstractSet

import torch

from repro.asgd.algorithm import Push
from repro.asgd.protocols import NOTHING, PROTOCOLS, Decision, Policy, View, mean_push


@PROTOCOLS.register("ringmaster")
class Ringmaster(Policy):
    discards = True

    def __init__(self, cfg, clients: list[int], version: int):
        self.settings, self.cancel, self.stop_once = cfg.protocol, cfg.protocol.cancel_stale, cfg.protocol.stop_once
        self.fetched = {k: version for k in clients}   # the version each client computes from
        self.width = {k: len(clients) for k in clients}   # the clients live at that fetch
        self.restarting: set[int] = set()             # preempted, not heard from since (stop_once)

    @classmethod
    def preempts(cls, cfg) -> bool:
        return cfg.protocol.cancel_stale

    def on_join(self, client: int, view: View) -> None:
        self.fetch(client, view.version, view.live | {client})
        self.restarting.discard(client)

    def fetch(self, client: int, version: int, live: AbstractSet[int]) -> None:
        self.fetched[client], self.width[client] = version, len(live)

    def threshold(self, client: int, live: AbstractSet[int]) -> int:
        """R for the segment ``client`` computes: as set, else the most clients live at its fetch or
        now, so equally fast clients lose no push as clients join or leave."""
        return self.settings.resolved_staleness_threshold(max(self.width.get(client, 0), len(live)))

    def on_push(self, push: Push, view: View) -> Decision:
        k = push.client
        if push.read_version < self.fetched.get(k, push.read_version):   # sent before its stop
            return NOTHING                                               # reached it: ignored
        self.restarting.discard(k)
        if view.version - push.read_version >= self.threshold(k, view.live):   # delay >= R: not applied
            self.fetch(k, view.version, view.live)
            return Decision(reply=(k,), discarded=((push.read_version, k),))
        version = view.version + 1                                # after this apply
        stopped = self.too_stale(version, view.live, k) if self.cancel else ()
        discarded = tuple((self.fetched[j], j) for j in stopped)
        for j in (k, *stopped):
            self.fetch(j, version, view.live)
        if self.stop_once:
            self.restarting.update(stopped)
        return Decision(apply=push, reply=(k,), preempt=stopped, discarded=discarded)

    def too_stale(self, version: int, live: AbstractSet[int], pusher: int) -> tuple[int, ...]:
        """The computing clients whose segment started R applies before ``version`` (Algorithm 5's
        stop; with ``stop_once`` not those stopped and not heard from since)."""
        return tuple(j for j in sorted(live) if j != pusher and j in self.fetched and j not in self.restarting
                     and version - self.fetched[j] >= self.threshold(j, live))

    def state_dict(self) -> dict:
        return {"fetched": {str(k): v for k, v in self.fetched.items()}, "restarting": sorted(self.restarting),
                "width": {str(k): v for k, v in self.width.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.fetched = {int(k): int(v) for k, v in state["fetched"].items()}
        self.restarting = {int(k) for k in state["restarting"]}
        self.width = {int(k): int(v) for k, v in state.get("width", {}).items()}   # none before R followed joins


@PROTOCOLS.register("rennala")
class Rennala(Policy):
    """The collection is summed per client, then over clients in id order, so its numbers do not
    depend on arrival order; each update is added into a buffer of ours at once (held pushes:
    docs/simulator.md, "Protocols")."""
    discards = True
    collects = True

    def __init__(self, cfg, clients: list[int], version: int):
        self.settings = cfg.protocol              # S unset: the clients live at each push
        self.step_start = version                 # the version every collected push read
        self.given = {k: version for k in clients}   # the version each client computes from
        self.restarting: set[int] = set()         # preempted, not heard from since
        self.sums: dict[int, torch.Tensor] = {}   # per client: its collected updates, summed
        self.stats: dict[int, list] = {}          # per client: [pushes, samples, loss, wrong, steps]
        self.total: torch.Tensor | None = None    # the merge buffer, reused step after step

    @classmethod
    def preempts(cls, cfg) -> bool:
        return True

    def on_join(self, client: int, view: View) -> None:
        self.given[client] = view.version
        self.restarting.discard(client)

    def collected(self) -> int:
        return sum(s[0] for s in self.stats.values())

    def on_push(self, push: Push, view: View) -> Decision:
        k = push.client
        if push.read_version < self.given.get(k, push.read_version):   # computed before its
            return NOTHING                        # restart reached it (the new parameters are on their way)
        self.restarting.discard(k)
        self.given[k] = view.version
        if push.read_version < self.step_start:   # stale, not preempted (one preemption at a time)
            return Decision(reply=(k,), discarded=((push.read_version, k),))
        self.add(push)
        # S as set, else one push per live client, as a sync round (joins and losses included)
        if self.collected() < self.settings.resolved_collection_size(len(view.live)):
            return Decision(reply=(k,))           # Rennala: it computes again at the same point
        return self.step(k, view)

    def add(self, push: Push) -> None:
        k, stats = push.client, self.stats.get(push.client)
        if stats is None:   # its first push of this step: into its buffer (kept from step to step)
            buffer = self.sums.get(k)
            if buffer is None or buffer.shape != push.update.shape or buffer.device != push.update.device:
                self.sums[k] = push.update.detach().clone()
            else:
                buffer.copy_(push.update)
            stats = self.stats[k] = [0, 0, 0.0, 0.0, 0]
        else:
            self.sums[k].add_(push.update)
        n = push.num_samples   # [pushes, samples, loss x samples, errors x samples] summed, steps the most
        stats[:4] = [total + part for total, part in zip(stats, (1, n, push.train_loss * n, push.train_error * n))]
        stats[4] = max(stats[4], push.num_steps)

    def step(self, pusher: int, view: View) -> Decision:
        """Apply the collection's mean; the pusher fetches, every other live client is preempted."""
        parts = [(self.sums[k], *self.stats[k]) for k in sorted(self.stats)]
        self.total, merged = mean_push(self.total, parts, self.step_start)
        collected = tuple((self.step_start, k) for k in sorted(self.stats) for _ in range(self.stats[k][0]))
        others = tuple(j for j in sorted(view.live)
                       if j != pusher and j in self.given and j not in self.restarting)
        discarded = tuple((self.given[j], j) for j in others)
        self.step_start, self.stats = view.version + 1, {}   # the apply makes version + 1
        for j in (pusher, *others):
            self.given[j] = self.step_start
        self.restarting.update(others)
        return Decision(apply=merged, reply=(pusher,), preempt=others, discarded=discarded,
                        collected=collected)

    def state_dict(self) -> dict:
        """A half-full collection keeps each client's sum (a checkpoint copies them)."""
        return {"step_start": self.step_start, "given": {str(k): v for k, v in self.given.items()},
                "restarting": sorted(self.restarting),
                "clients": {str(k): {"sum": self.sums[k], "stats": list(s)} for k, s in self.stats.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.step_start = int(state["step_start"])
        self.given = {int(k): int(v) for k, v in state["given"].items()}
        self.restarting = {int(k) for k in state["restarting"]}
        self.sums, self.stats = {}, {}
        for k, entry in state["clients"].items():
            pushes, n, loss, wrong, steps = entry["stats"]
            self.sums[int(k)] = entry["sum"]
            self.stats[int(k)] = [int(pushes), int(n), float(loss), float(wrong), int(steps)]
