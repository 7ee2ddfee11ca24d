"""When the server applies and when a client may fetch: ``async`` (Downpour), ``sync`` (rounds;
backup workers, Chen et al. 2016), ``ssp`` (Ho et al., NIPS 2013); ``ringmaster`` and ``rennala``:
:mod:`repro.asgd.optimal`. A protocol is a policy: told a push and a :class:`View`, it answers a
:class:`Decision` the run core carries out (docs/simulator.md, "Protocols"; for a user: docs/lab.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AbstractSet

import torch
from torch import Tensor

from repro.asgd.algorithm import Push, push_fields, push_type, push_type_name
from repro.errors import ConfigError
from repro.registry import Registry

PROTOCOLS: Registry[type] = Registry("protocol.name")


@dataclass(frozen=True)
class View:
    """Where the server stands when a protocol decides."""
    version: int                 # the server's version now (an apply makes it version + 1)
    live: AbstractSet[int]       # clients still in the run (not lost)
    left: float = math.inf       # samples left in the budget: the apply that reaches it is the last


@dataclass(frozen=True)
class Decision:
    """A protocol's answer to a push (or a lost client): what to apply, who fetches, who is
    preempted; ``discarded`` and ``collected``: (read_version, client) of each segment dropped or
    push merged, listed in the summary (``collected`` by protocols that declare ``collects``)."""
    apply: Push | None = None
    reply: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()
    discarded: tuple[tuple[int, int], ...] = ()
    collected: tuple[tuple[int, int], ...] = ()


NOTHING = Decision()


class Policy:
    """The interface of a protocol (``cfg`` read when built, never kept); ``clients`` fetched ``version``."""
    #: True when the protocol may drop segments (the summary then lists ``discarded_pushes``)
    discards = False
    #: True when the summary lists the pushes each apply merged (``collected_pushes``)
    collects = False

    def __init__(self, cfg, clients: list[int], version: int):
        pass

    @classmethod
    def preempts(cls, cfg) -> bool:
        """Whether a client may receive parameters while it computes (and drop its segment)."""
        return False

    def on_push(self, push: Push, view: View) -> Decision:
        raise NotImplementedError

    def on_lost(self, client: int, view: View) -> Decision:
        """``client`` is gone (``view.live`` no longer holds it): replies it was holding up."""
        return NOTHING

    def on_join(self, client: int, view: View) -> tuple[tuple[int, int], ...] | None:
        """``client`` (re)joined and fetches ``view.version`` now (``view.live`` does not hold it
        yet); returned: (read_version, client) of a held push of its that the protocol drops."""

    def waiting(self) -> tuple[int, ...]:
        """The clients that pushed and wait for a reply from a later decision."""
        return ()

    def on_stop(self) -> tuple[int, ...]:
        """The run is ending: the clients still waiting for a reply (they get STOP); forgotten."""
        return ()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@PROTOCOLS.register("async")
class Async(Policy):
    def on_push(self, push: Push, view: View) -> Decision:
        return Decision(apply=push, reply=(push.client,))


@PROTOCOLS.register("ssp")
class SSP(Policy):
    def __init__(self, cfg, clients: list[int], version: int):
        self.bound = cfg.protocol.staleness_bound
        self.pushes = {k: 0 for k in clients}   # applied pushes per client (its clock)
        self.held: list[int] = []               # pushed, waiting for the slowest

    def on_push(self, push: Push, view: View) -> Decision:
        self.pushes[push.client] += 1           # the core applies every push it hands us
        self.held.append(push.client)
        return Decision(apply=push, reply=self.release(view.live))

    def release(self, live: AbstractSet[int]) -> tuple[int, ...]:
        """Every held client within ``bound`` pushes of the slowest live one gets its reply."""
        floor = min((self.pushes[k] for k in live), default=0)
        out = tuple(k for k in self.held if self.pushes[k] - floor <= self.bound or k not in live)
        self.held = [k for k in self.held if k not in out]
        return out

    def on_lost(self, client: int, view: View) -> Decision:
        return Decision(reply=self.release(view.live))

    def on_join(self, client: int, view: View) -> None:
        # a joiner's clock starts at the slowest live client's: it neither holds the others
        # back for pushes it never made nor runs unbounded ahead of them
        self.pushes[client] = min((self.pushes[k] for k in view.live), default=0)

    def waiting(self) -> tuple[int, ...]:
        return tuple(self.held)

    def on_stop(self) -> tuple[int, ...]:
        held, self.held = tuple(self.held), []
        return held

    def state_dict(self) -> dict:
        return {"pushes": {str(k): v for k, v in self.pushes.items()}, "held": list(self.held)}

    def load_state_dict(self, state: dict) -> None:
        self.pushes = {int(k): int(v) for k, v in state["pushes"].items()}
        self.held = [int(k) for k in state["held"]]


@PROTOCOLS.register("sync")
class Sync(Policy):
    discards = True

    def __init__(self, cfg, clients: list[int], version: int):
        self.backups, self.clients = cfg.protocol.backup_workers, cfg.num_clients
        self.round_start = version
        self.pushes: dict[int, Push] = {}       # this round's, by client (held pushes: docs/simulator.md)
        self.total: Tensor | None = None        # the merge buffer, reused round after round
        self.joining: set[int] = set()          # joined during this round: not counted until the next

    @classmethod
    def preempts(cls, cfg) -> bool:
        return cfg.protocol.backup_workers > 0

    def needed(self, live: AbstractSet[int]) -> int:
        """A round waits for the clients live at its start (a joiner counts from the next)."""
        return max(1, len(set(live) - self.joining) - self.backups)

    def full(self, view: View) -> bool:
        """The round has its pushes: a joiner's is merged but takes no one's place (unless no client
        of the round's start is left). With joiners beyond num_clients live, also once the pushes
        reach the budget, which their extra pushes would pass by more than the one apply allowed."""
        live = view.live
        counted = set(self.pushes) - self.joining if set(live) - self.joining else set(self.pushes)
        return len(counted) >= self.needed(live) or \
            (len(live) > self.clients and sum(p.num_samples for p in self.pushes.values()) >= view.left)

    def on_join(self, client: int, view: View) -> tuple[tuple[int, int], ...]:
        self.joining.add(client)
        # back before its round closed: a new process computing from this fetch, so the reply its
        # lost self's held push was owed is not its (two segments of it would be in flight): dropped
        held = self.pushes.pop(client, None)
        return () if held is None else ((held.read_version, client),)

    def on_push(self, push: Push, view: View) -> Decision:
        if push.read_version < self.round_start:   # sent before its preemption reached it
            return NOTHING                         # (its new parameters are on their way)
        self.pushes[push.client] = push
        return self.close(view) if self.full(view) else NOTHING

    def close(self, view: View) -> Decision:
        """Apply the round's mean once; its clients fetch, the late ones (backup workers) are preempted."""
        waiting = self.waiting()   # client-id order, not timing's
        parts = [(p.update, 1, p.num_samples, p.train_loss * p.num_samples,
                  p.train_error * p.num_samples, p.num_steps) for p in map(self.pushes.get, waiting)]
        self.total, merged = mean_push(self.total, parts, self.round_start)
        late = tuple(sorted(set(view.live) - set(waiting)))
        discarded = tuple((self.round_start, k) for k in late)
        self.round_start, self.pushes = view.version + 1, {}   # the apply makes version + 1
        self.joining = set()   # everyone live now fetches this round's result: all count next round
        return Decision(apply=merged, reply=waiting, preempt=late, discarded=discarded)

    def on_lost(self, client: int, view: View) -> Decision:
        return self.close(view) if self.pushes and self.full(view) else NOTHING

    def waiting(self) -> tuple[int, ...]:
        return tuple(sorted(self.pushes))

    def on_stop(self) -> tuple[int, ...]:
        waiting, self.pushes = self.waiting(), {}
        return waiting

    def state_dict(self) -> dict:
        """A half-full round keeps each held push (a checkpoint copies the updates)."""
        return {"round_start": self.round_start, "joining": sorted(self.joining),
                "pushes": {str(k): _push_state(p) for k, p in self.pushes.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.round_start = int(state["round_start"])
        self.joining = {int(k) for k in state.get("joining", [])}
        if "pushes" not in state and state.get("waiting"):   # written before rounds kept pushes
            raise ConfigError("resume", True, "a checkpoint of this version (this one holds a half-full "
                              "sync round summed in arrival order, written by an older version); "
                              "force=true starts the run over")
        self.pushes = {int(k): _push_from_state(s) for k, s in state.get("pushes", {}).items()}


def mean_push(buffer: Tensor | None, parts: list[tuple], read_version: int) -> tuple[Tensor, Push]:
    """(buffer, the mean of merged pushes as one push of client 0): each part is (update or sum,
    pushes, samples, loss x samples, errors x samples, steps), summed in order into ``buffer``."""
    first = parts[0][0]
    if buffer is None or buffer.shape != first.shape or buffer.device != first.device:
        buffer = torch.zeros_like(first)
    total, columns = buffer.zero_(), list(zip(*parts))
    for update in columns[0]:
        total.add_(update.to(total.device))
    pushes, samples, loss, wrong = map(sum, columns[1:5])
    merged = Push(client=0, read_version=read_version, update=total.div_(pushes), num_steps=max(columns[5]),
                  num_samples=samples, train_loss=loss / samples, train_error=wrong / samples,
                  stream_position=(0, 0))
    return buffer, merged


def _push_state(p: Push) -> dict:
    """A held push as a checkpoint keeps it: its type and every field, tuples as lists."""
    state = {f.name: getattr(p, f.name) for f in push_fields(type(p))}
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in state.items()}, "update": p.update,
            "type": push_type_name(type(p))}


def _push_from_state(s: dict) -> Push:
    """The held push of its type (none recorded: a plain Push), a field it lacks at its default;
    LookupError when the type cannot be rebuilt, never a silent plain Push."""
    kind = push_type(s["type"]) if "type" in s else Push
    return kind(update=s["update"], **{f.name: f.cast(s[f.name]) for f in push_fields(kind) if f.name in s})


def make_protocol(cfg, clients: list[int], version: int) -> Policy:
    return PROTOCOLS[cfg.protocol.name](cfg, clients, version)


