"""Asynchronous SGD with optimal time complexity: Ringmaster ASGD and Rennala SGD, as policies.

Tyurin & Richtarik (NeurIPS 2023) proved a lower bound on the wall-clock time of any method
whose workers compute at fixed, different speeds, and found that plain asynchronous SGD (the
paper's Downpour) misses it: its slowest clients push gradients so stale that they hurt more
than they help. Two ways to meet the bound, both registered in
:data:`repro.asgd.protocols.PROTOCOLS` (declared in :data:`repro.registry.DECLARED`, which says this
module registers them: a lookup of either name imports it) and run by both drivers like every
protocol (:mod:`repro.asgd.protocols` says what a policy is). What each does for a user, its
keys and the summary's ``discarded_pushes`` and ``collected_pushes``: docs/lab.md.

* ``ringmaster`` (Maranjyan, Tyurin, Richtarik, ICML 2025, "Ringmaster ASGD", Algorithms 4 and
  5): a push whose staleness (their delay) reaches R is discarded and its client fetches; with
  ``cancel_stale`` (Algorithm 5, *the paper's variant*) a computing client is stopped
  (preempted) whenever an apply makes its segment R applies old, as often as that happens.
* ``rennala`` (Tyurin & Richtarik, NeurIPS 2023, "Rennala SGD"; Algorithm 2 of the Ringmaster
  paper): the mean of S pushes computed from the current parameters, by whoever finishes first;
  every other client is then preempted. Each step takes t(S) = min{t : sum_i floor(t / tau_i) >= S}
  for clients of fixed segment times tau_i.

**One preemption at a time** (rennala always; ringmaster with ``protocol.stop_once``, a departure
from the paper's Algorithm 5). A client sent parameters by a preemption is not preempted again
before a push of its computed from them has arrived; a later step that makes its segment stale
leaves it computing, and its push is discarded when it arrives (it then fetches the current
parameters: the same as a preemption, later), so the schedule changes (docs/lab.md has an
example). On the real driver it is what keeps the server from sending a client a message it
cannot receive yet: a client blocked sending its push while its receiver waits for the server's
lock has room for one unread message (a second send would wait, under that lock, for a receive
that never comes), so the real driver runs ringmaster's stops only with ``stop_once``
(repro.config.checks).
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
        self.settings = cfg.protocol
        self.cancel = cfg.protocol.cancel_stale
        self.stop_once = cfg.protocol.stop_once
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
        """R for the segment ``client`` computes: as set, else the most clients live at its
        fetch or now. Equally fast clients each apply about once in another's segment, so none
        loses a push as clients join (the start's count would discard every push of one of
        them) or leave (the count now would discard the segments a leave catches in flight)."""
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
        """The computing clients whose push, arriving at ``version`` or later, would be discarded:
        their segment started R applies ago (Algorithm 5's stop; with ``stop_once`` not those
        already stopped and not heard from since: see the module docstring)."""
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
    """The collection is summed per client (each client's pushes in its own order), then over
    clients in id order: as sync's rounds, its numbers do not depend on the arrival order of
    the pushes it holds. A collected client is replied to before the step, so its update is
    added into a buffer of ours at once (the real driver reuses its receive frame)."""

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
        stats[0] += 1
        stats[1] += push.num_samples
        stats[2] += push.train_loss * push.num_samples
        stats[3] += push.train_error * push.num_samples
        stats[4] = max(stats[4], push.num_steps)

    def step(self, pusher: int, view: View) -> Decision:
        """Apply the collection's mean; the pusher fetches, every other live client (computing
        from the old parameters) is sent the new ones and starts over."""
        merged = self.merge()
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

    def merge(self) -> Push:
        parts = [(self.sums[k], *self.stats[k]) for k in sorted(self.stats)]
        self.total, merged = mean_push(self.total, parts, self.step_start)
        return merged

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
