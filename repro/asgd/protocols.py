"""When the server applies and when a client may fetch: asynchronous, synchronous, bounded staleness.

A protocol sits between a driver and the server rule (:mod:`repro.asgd.algorithm`): the run core hands
it every push and every lost client; it decides which pushes are applied (and merged), and which
clients get their reply now and which wait. The arithmetic of an apply stays the rule's. Both
drivers run every protocol, because both drivers only carry what :meth:`on_push` returns.

* ``async`` (Downpour, the paper): every push is applied as it arrives; its client fetches at
  once. Staleness is whatever the arrival order makes it.
* ``sync`` (bulk-synchronous rounds): every live client computes its nsync steps from the same
  parameters; the server waits for the round's pushes, applies their **mean** once (version + 1,
  staleness 0) and every client of the round fetches. With ``backup_workers`` b (Chen, Pan,
  Monga, Bengio, Jozefowicz 2016, "Revisiting Distributed Synchronous SGD") a round closes at the
  first N - b pushes; the b clients still computing are sent the new parameters at once
  (``Reply.preempt``): their segment is dropped and they start the next round with everyone
  else, so every round starts with all N and discards exactly b. (A push a preempted client sent
  before the parameters reached it is ignored.) A lost client leaves the barrier: the round
  needs N_live - b pushes.
* ``ssp`` (stale synchronous parallel, Ho et al., NIPS 2013): asynchronous applies, but a client
  that has pushed more than ``staleness_bound`` s times more than the slowest live client waits
  for its reply until the slowest catches up. s = 0 gives rounds in which every push is applied
  (the sum of a round's updates), so with lr_server scaled by 1/N it follows sync's trajectory;
  a large s is async.

The sync protocol logs one ``updates.csv`` row per round with ``client`` 0 (the round's merged
pushes), ``num_samples`` the round's total; discarded pushes are listed in the summary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.asgd.algorithm import Push
from repro.registry import Registry

PROTOCOLS: Registry[type] = Registry("protocol.name")


@dataclass(frozen=True)
class Reply:
    """What the driver carries back to a client: the server's parameters, or STOP.
    ``preempt``: the client is still computing a segment the protocol dropped (a sync round's
    backup worker); the parameters reach it now and it starts over from them."""

    client: int
    stop: bool = False
    preempt: bool = False


class _Protocol:
    """``core``: the run core (repro.runs.core.RunCore) whose apply, check_loss and diverge the
    protocol calls; it is handed in, not imported, so the core alone knows both."""

    def __init__(self, core, clients: list[int]):
        self.core = core
        self.live = set(clients)

    def reply(self, client: int, preempt: bool = False) -> Reply:
        return Reply(client, stop=self.core.state.stopping, preempt=preempt)

    def on_lost(self, client: int, time_s: float) -> list[Reply]:
        self.live.discard(client)
        return []

    def stopping(self) -> list[Reply]:
        """Replies owed to clients still waiting when the run stops (all STOP)."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@PROTOCOLS.register("async")
class Async(_Protocol):
    def on_push(self, push: Push, time_s: float) -> list[Reply]:
        self.core.apply(push, time_s)
        return [self.reply(push.client)]


@PROTOCOLS.register("ssp")
class SSP(_Protocol):
    def __init__(self, core, clients: list[int]):
        super().__init__(core, clients)
        self.bound = core.cfg.protocol.staleness_bound
        self.pushes = {k: 0 for k in clients}   # applied pushes per client (its clock)
        self.held: list[int] = []               # pushed, waiting for the slowest

    def slowest(self) -> int:
        return min((self.pushes[k] for k in self.live), default=0)

    def on_push(self, push: Push, time_s: float) -> list[Reply]:
        if self.core.apply(push, time_s) is not None:
            self.pushes[push.client] += 1
        if self.core.state.stopping:
            return [self.reply(push.client)] + self.stopping()
        self.held.append(push.client)
        return self.release()

    def release(self) -> list[Reply]:
        """Every held client within ``bound`` pushes of the slowest live one gets its reply."""
        floor, out, still = self.slowest(), [], []
        for k in self.held:
            (out if self.pushes[k] - floor <= self.bound or k not in self.live else still).append(k)
        self.held = still
        return [self.reply(k) for k in out]

    def on_lost(self, client: int, time_s: float) -> list[Reply]:
        super().on_lost(client, time_s)
        return self.release()

    def stopping(self) -> list[Reply]:
        held, self.held = self.held, []
        return [self.reply(k) for k in held]

    def state_dict(self) -> dict:
        return {"pushes": {str(k): v for k, v in self.pushes.items()}, "held": list(self.held)}

    def load_state_dict(self, state: dict) -> None:
        self.pushes = {int(k): int(v) for k, v in state["pushes"].items()}
        self.held = [int(k) for k in state["held"]]


@PROTOCOLS.register("sync")
class Sync(_Protocol):
    def __init__(self, core, clients: list[int]):
        super().__init__(core, clients)
        self.backups = core.cfg.protocol.backup_workers
        self.round_start = core.server.version
        self.sum: torch.Tensor | None = None
        self.waiting: list[int] = []
        self.loss = self.wrong = 0.0
        self.samples = 0
        self.discarded: list[list[int]] = []   # [read_version, client] of each discarded push

    def needed(self) -> int:
        return max(1, len(self.live) - self.backups)

    def on_push(self, push: Push, time_s: float) -> list[Reply]:
        core = self.core
        if core.state.stopping:
            return [self.reply(push.client)]
        if push.read_version < self.round_start:   # sent before its preemption reached it
            return []                              # (its new parameters are on their way)
        why = core.check_loss(push)
        if why:
            core.diverge(why)
            return [self.reply(push.client)] + self.stopping()
        if self.sum is None:
            self.sum = torch.zeros_like(core.server.params)
        self.sum.add_(push.update.to(self.sum.device))   # the frame is reused: add, keep nothing
        self.loss += push.train_loss * push.num_samples
        self.wrong += push.train_error * push.num_samples
        self.samples += push.num_samples
        self.waiting.append(push.client)
        return self.close(time_s) if len(self.waiting) >= self.needed() else []

    def close(self, time_s: float) -> list[Reply]:
        """Apply the round's mean update once; every client of the round fetches."""
        n = len(self.waiting)
        merged = Push(client=0, read_version=self.round_start, update=self.sum.div_(n),
                      num_steps=self.core.cfg.nsync, num_samples=self.samples,
                      train_loss=self.loss / self.samples, train_error=self.wrong / self.samples,
                      stream_position=(0, 0))
        self.core.apply(merged, time_s, check=False)
        waiting, late = self.waiting, sorted(self.live - set(self.waiting))
        self.discarded += [[self.round_start, k] for k in late]   # the b backup workers
        self.round_start, self.sum, self.waiting = self.core.server.version, None, []
        self.loss = self.wrong = 0.0
        self.samples = 0
        return [self.reply(k) for k in waiting] + [self.reply(k, preempt=True) for k in late]

    def on_lost(self, client: int, time_s: float) -> list[Reply]:
        super().on_lost(client, time_s)
        if self.waiting and len(self.waiting) >= self.needed() and not self.core.state.stopping:
            return self.close(time_s)
        return []

    def stopping(self) -> list[Reply]:
        waiting, self.waiting = self.waiting, []
        return [self.reply(k) for k in waiting]

    def state_dict(self) -> dict:
        return {"round_start": self.round_start, "sum": self.sum, "waiting": list(self.waiting),
                "loss": self.loss, "wrong": self.wrong, "samples": self.samples,
                "discarded": [list(d) for d in self.discarded]}

    def load_state_dict(self, state: dict) -> None:
        self.round_start, self.sum = int(state["round_start"]), state["sum"]
        self.waiting = [int(k) for k in state["waiting"]]
        self.loss, self.wrong = float(state["loss"]), float(state["wrong"])
        self.samples = int(state["samples"])
        self.discarded = [[int(a), int(b)] for a, b in state["discarded"]]


def make_protocol(core, clients: list[int]) -> _Protocol:
    return PROTOCOLS[core.cfg.protocol.name](core, clients)

