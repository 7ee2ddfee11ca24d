"""When the server applies and when a client may fetch: asynchronous, synchronous, bounded staleness.

A protocol is a **policy**: it holds no reference to the run core. The core
(:mod:`repro.runs.core`) checks each push for divergence, then tells the protocol the push and
where the server stands (:class:`View`: its version, which clients are live); the protocol answers
with a :class:`Decision`: what to apply (the push, a merged push, or nothing), who fetches now,
who is preempted, what it discarded. The core applies, logs and delivers; the server rule
(:mod:`repro.asgd.rules`) does the arithmetic of an apply. Both drivers run every protocol,
because both only carry the replies the core makes of a decision.

* ``async`` (Downpour, the paper): every push is applied as it arrives; its client fetches at
  once. Staleness is whatever the arrival order makes it.
* ``sync`` (bulk-synchronous rounds): every live client computes its nsync steps from the same
  parameters; the server waits for the round's pushes, applies their **mean** once (version + 1,
  staleness 0) and every client of the round fetches. The mean is summed in client-id order,
  whatever order the pushes arrived in, so a round's numbers do not depend on timing and a real
  sync run is reproducible from its seed like the simulator. With ``backup_workers`` b (Chen,
  Pan, Monga, Bengio, Jozefowicz 2016, "Revisiting Distributed Synchronous SGD") a round closes at
  the first N - b pushes; the b clients still computing are sent the new parameters at once
  (preempted): their segment is dropped and they start the next round with everyone else, so
  every round starts with all N and discards exactly b. (A push a preempted client sent before
  the parameters reached it is ignored.) A lost client leaves the barrier: the round needs
  N_live - b pushes; one back before the round closes is a joiner, its earlier push dropped (discarded).
* ``ringmaster`` and ``rennala``, the optimal-time descendants of asynchronous SGD (Tyurin,
  Richtarik and co-authors): :mod:`repro.asgd.optimal`.
* ``ssp`` (stale synchronous parallel, Ho et al., NIPS 2013): asynchronous applies, but a client
  that has pushed more than ``staleness_bound`` s times more than the slowest live client waits
  for its reply until the slowest catches up. s = 0 gives rounds in which every push is applied
  (the sum of a round's updates), so with lr_server scaled by 1/N it follows sync's trajectory;
  a large s is async.

The sync protocol logs one ``updates.csv`` row per round with ``client`` 0 (the round's merged
pushes), ``num_samples`` the round's total; discarded pushes are listed in the summary.

**Held pushes.** A protocol may keep a push until it decides (sync keeps a round's pushes until
the round closes). Its ``update`` stays valid until the protocol's decision replies to its
client: the real driver receives each client's pushes into one reused frame and
posts the next receive into it only after that client's reply. A protocol therefore never keeps
an update past its client's reply: one that replies before it merges (a client that fetches
and computes on while its push waits for others) copies the update, or adds it into a buffer of
its own, in a fixed order if its result must not depend on timing.

Adding a protocol: one class here registered in :data:`PROTOCOLS` (its name declared in
:data:`repro.registry.DECLARED`), its ``conf/protocol/*.yaml``
and its keys in :class:`repro.config.settings.ProtocolConfig`; the core and the drivers stay as
they are. (A protocol that discards stale pushes, e.g. one that drops a push whose staleness
``view.version - push.read_version`` reaches a bound, answers ``Decision(reply=(client,),
discarded=((read_version, client),))``: the client fetches and goes on.)
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
    """A protocol's answer to a push (or a lost client). The core applies ``apply`` (one apply,
    version + 1), then the clients in ``reply`` fetch the new parameters and those in ``preempt``
    (still computing a segment the protocol dropped) are sent them at once and start over.
    ``discarded``: (read_version, client) of each segment dropped, listed in the summary;
    ``collected``: (read_version, client) of each push merged into ``apply``, listed in the
    summary by protocols that declare ``collects`` (rennala's collections).
    A client neither replied to nor preempted waits: its reply comes with a later decision, or
    STOP when the run ends (:meth:`Policy.on_stop`)."""

    apply: Push | None = None
    reply: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()
    discarded: tuple[tuple[int, int], ...] = ()
    collected: tuple[tuple[int, int], ...] = ()


NOTHING = Decision()


class Policy:
    """The interface of a protocol. ``cfg``: the run's :class:`~repro.config.settings.RunConfig`
    (read when built, never kept as a way back); ``clients``: who fetched version ``version``."""

    #: True when the protocol may drop segments (the summary then lists ``discarded_pushes``)
    discards = False
    #: True when the summary lists the pushes each apply merged (``collected_pushes``)
    collects = False

    def __init__(self, cfg, clients: list[int], version: int):
        pass

    @classmethod
    def preempts(cls, cfg) -> bool:
        """Whether a client may receive parameters while it computes (and must then drop its
        segment and start over): the real client polls for them between local steps."""
        return False

    def on_push(self, push: Push, view: View) -> Decision:
        raise NotImplementedError

    def on_lost(self, client: int, view: View) -> Decision:
        """``client`` is gone (``view.live`` no longer holds it): replies it was holding up."""
        return NOTHING

    def on_join(self, client: int, view: View) -> tuple[tuple[int, int], ...] | None:
        """``client`` joined (or rejoined) and fetches version ``view.version`` now; ``view.live``
        does not hold it yet. Nobody waits on a joiner, so there is no reply to give; returned:
        (read_version, client) of a held push of its that the protocol drops, listed in the summary."""

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
        out, still = [], []
        for k in self.held:
            (out if self.pushes[k] - floor <= self.bound or k not in live else still).append(k)
        self.held = still
        return tuple(out)

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
        self.pushes: dict[int, Push] = {}       # this round's, by client (held: see the docstring)
        self.total: Tensor | None = None        # the merge buffer, reused round after round
        self.joining: set[int] = set()          # joined during this round: not counted until the next

    @classmethod
    def preempts(cls, cfg) -> bool:
        return cfg.protocol.backup_workers > 0

    def needed(self, live: AbstractSet[int]) -> int:
        """A round waits for the clients live at its start (a joiner counts from the next)."""
        return max(1, len(set(live) - self.joining) - self.backups)

    def full(self, view: View) -> bool:
        """The round has its pushes: a joiner's is merged but takes no one's place (it counts
        only when no client live at the round's start is left). With joiners beyond num_clients
        live, also once they reach the budget: a run may pass it by less than one apply of
        num_clients - b pushes (the budget check's), which their extra pushes would pass (the
        late clients are dropped, as backup workers); without, every sync run stays as it was."""
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
        """Apply the round's mean update once; every client of the round fetches, the late
        ones (backup workers) are preempted."""
        merged = self.merge()
        waiting = tuple(sorted(self.pushes))
        late = tuple(sorted(set(view.live) - set(waiting)))
        discarded = tuple((self.round_start, k) for k in late)
        self.round_start, self.pushes = view.version + 1, {}   # the apply makes version + 1
        self.joining = set()   # everyone live now fetches this round's result: all count next round
        return Decision(apply=merged, reply=waiting, preempt=late, discarded=discarded)

    def merge(self) -> Push:
        """The mean of the round's pushes, summed in client-id order: float addition is not
        associative, so summing in arrival order would make a round depend on timing."""
        pushes = [self.pushes[k] for k in sorted(self.pushes)]
        parts = [(p.update, 1, p.num_samples, p.train_loss * p.num_samples,
                  p.train_error * p.num_samples, p.num_steps) for p in pushes]
        self.total, merged = mean_push(self.total, parts, self.round_start)
        return merged

    def on_lost(self, client: int, view: View) -> Decision:
        if self.pushes and self.full(view):
            return self.close(view)
        return NOTHING

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
    """The mean of merged pushes as one push (client 0, which read ``read_version``): each part is
    (an update or a sum of updates, pushes, samples, loss x samples, errors x samples, steps),
    summed in the order given into ``buffer`` (reused when it fits). Returns (buffer, push)."""
    first = parts[0][0]
    if buffer is None or buffer.shape != first.shape or buffer.device != first.device:
        buffer = torch.zeros_like(first)
    total = buffer.zero_()
    pushes = samples = steps = 0
    loss = wrong = 0.0
    for update, k_pushes, n, k_loss, k_wrong, k_steps in parts:
        total.add_(update.to(total.device))
        pushes, samples, steps = pushes + k_pushes, samples + n, max(steps, k_steps)
        loss, wrong = loss + k_loss, wrong + k_wrong
    merged = Push(client=0, read_version=read_version, update=total.div_(pushes), num_steps=steps,
                  num_samples=samples, train_loss=loss / samples, train_error=wrong / samples,
                  stream_position=(0, 0))
    return buffer, merged


def _push_state(p: Push) -> dict:
    """A held push as a checkpoint keeps it: its type (:func:`push_type_name`) and every field
    (:func:`push_fields`), tuples as lists."""
    state = {f.name: getattr(p, f.name) for f in push_fields(type(p))}
    return {**{k: list(v) if isinstance(v, tuple) else v for k, v in state.items()}, "update": p.update,
            "type": push_type_name(type(p))}


def _push_from_state(s: dict) -> Push:
    """The held push of that type (a checkpoint written before types were recorded held plain
    pushes); a field the checkpoint lacks (one added since it was written) takes its default.
    LookupError (:func:`push_type`) when the type cannot be rebuilt: never a silent plain Push."""
    kind = push_type(s["type"]) if "type" in s else Push
    return kind(update=s["update"], **{f.name: f.cast(s[f.name]) for f in push_fields(kind) if f.name in s})


def make_protocol(cfg, clients: list[int], version: int) -> Policy:
    return PROTOCOLS[cfg.protocol.name](cfg, clients, version)


