"""The GPU A-SGD algorithm (Paine et al., arXiv 1312.6186): Downpour SGD (Dean et al., NIPS 2012)
with ``nfetch = npush = nsync``, the paper's one knob. A client runs ``nsync`` local SGD steps from
the parameters it last fetched, pushes and fetches; the server applies each push with a rule
(:mod:`repro.asgd.rules`) and reports its staleness. No processes, clocks or files.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, fields
from typing import Any, Callable, Protocol, get_args, get_origin, get_type_hints

import torch
from torch import Tensor

from repro.asgd.flatnet import FlatNet
from repro.asgd.rules import ServerRule
from repro.errors import ConfigError


@dataclass
class Push:
    """What a client sends the server after ``num_steps`` local steps; its fields are the one list
    of what a push carries (docs/architecture.md, "The seam"): ints, floats, bools, int tuples."""
    client: int
    read_version: int          # the server version whose parameters the client started from
    update: Tensor             # parameter delta (delta rule), accrued gradient (downpour, adagrad)
                               # or the client's own parameters (easgd)
    num_steps: int
    num_samples: int
    train_loss: float          # mean minibatch loss over the segment
    train_error: float         # fraction of the segment's samples misclassified
    stream_position: tuple[int, int]  # the client's data-stream position after the segment


@dataclass(frozen=True)
class PushField:
    """One field of a push besides its update: its name, a cast to its type and its wire width."""
    name: str
    cast: Callable[[Any], Any]
    width: int
    many: bool = False         # a tuple: cast takes its values, not one value


@functools.cache   # asked for every applied push and every header: a type's fields never change
def push_fields(push_type: type = Push) -> tuple[PushField, ...]:
    """The fields of ``push_type`` (Push or an extension of it) but ``update``, in order."""
    hints, out = get_type_hints(push_type), []
    for name in [f.name for f in fields(push_type) if f.name != "update"]:
        hint = hints[name]
        if hint in (int, float, bool):
            out.append(PushField(name, hint, 1))
        elif get_origin(hint) is tuple and get_args(hint) and set(get_args(hint)) == {int}:
            out.append(PushField(name, lambda values: tuple(int(v) for v in values), len(get_args(hint)), many=True))
        else:
            raise TypeError(f"push field {name!r} is a {hint}: a push carries ints, floats, bools "
                            "and fixed-length tuples of ints besides its update")
    return tuple(out)


def push_type_name(push_type: type) -> str:
    """How a checkpoint names the type of a push it holds (``module:qualname``)."""
    return f"{push_type.__module__}:{push_type.__qualname__}"


def push_type(name: str) -> type:
    """The push type :func:`push_type_name` named; LookupError saying why when it cannot be
    imported or is no Push (only installed code is imported: a checkpoint holds the name)."""
    module, _, qualname = name.partition(":")
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError, ValueError) as exc:
        raise LookupError(f"push type {name!r} cannot be imported ({exc})") from exc
    if not (isinstance(found, type) and issubclass(found, Push)):
        raise LookupError(f"push type {name!r} is not a Push")
    return found


@dataclass(frozen=True)
class Applied:
    """The server's receipt for a push."""
    version: int               # server version after the apply
    staleness: int             # updates applied between the client's fetch and this push


class LocalSGD:
    """SGD with momentum and weight decay on a flat vector: ``torch.optim.SGD``'s arithmetic, so one
    client is a plain training loop; cuda-convnet's update is the same trajectory at a constant lr."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffer: Tensor | None = None

    def step(self, params: Tensor, grad: Tensor) -> Tensor:
        """Update ``params`` in place; return the regularised gradient (what Downpour accrues)."""
        if self.weight_decay != 0:
            grad = grad.add(params, alpha=self.weight_decay)
        if self.momentum != 0:   # the first step's buffer is the gradient itself, as torch's
            self.buffer = grad.detach().clone() if self.buffer is None else self.buffer.mul_(self.momentum).add_(grad)
        params.add_(grad if self.momentum == 0 else self.buffer, alpha=-self.lr)
        return grad

    def state_dict(self) -> dict:
        return {"buffer": self.buffer}

    def load_state_dict(self, state: dict) -> None:
        self.buffer = state["buffer"]


class Stream(Protocol):
    """A client's minibatch source (see :class:`repro.workload.data.ClientStream`)."""

    def next_batch(self) -> tuple[Tensor, Tensor]: ...
    @property
    def position(self) -> tuple[int, int]: ...
    def set_position(self, position: tuple[int, int]) -> None: ...


class Exchange(Protocol):
    """What a client that keeps its own parameters does with those it receives."""

    def receive(self, own: Tensor, received: Tensor) -> None: ...


class Client:
    """One Downpour client: its fetched (with an ``exchange``, own) parameters, momentum and data stream."""

    def __init__(self, client_id: int, stream: Stream, optimiser: LocalSGD, push_kind: str,
                 exchange: Exchange | None = None):
        if push_kind not in ("delta", "gradient", "params"):
            raise ValueError(f"push_kind must be 'delta', 'gradient' or 'params', not {push_kind!r}")
        self.client_id, self.stream, self.optimiser, self.push_kind = client_id, stream, optimiser, push_kind
        self.exchange = exchange
        self.params: Tensor | None = None
        self.read_version = 0
        self.joined = False        # fetched once: later fetches are exchanges

    def fetch(self, params: Tensor, version: int) -> None:
        """Take the server's parameters (with an exchange, after the first: move toward them)."""
        if self.params is None:
            self.params = params.detach().clone()
        elif self.exchange is not None and self.joined:
            self.exchange.receive(self.params, params)
        else:
            self.params.copy_(params)
        self.joined = True
        self.read_version = version

    def compute_push(self, net: FlatNet, num_steps: int, out: Tensor | None = None,
                     on_step: Callable[[], None] | None = None) -> Push:
        """Run ``num_steps`` local steps from the fetched parameters and return the push, its update
        in ``out`` if given; ``on_step`` runs after each step (it may raise to stop; then :meth:`rewind`)."""
        assert self.params is not None, "fetch() before compute_push()"
        net.load(self.params)
        w = net.params
        accrued = None
        if self.push_kind == "gradient":
            accrued = out.zero_() if out is not None else torch.zeros_like(w)
        loss_sum = torch.zeros((), device=w.device)
        errors = torch.zeros((), dtype=torch.long, device=w.device)
        num_samples = 0
        for _ in range(num_steps):
            x, y = self.stream.next_batch()
            loss, wrong = net.backward(x, y)
            g = self.optimiser.step(w, net.grad)      # the client keeps training locally
            if accrued is not None:
                accrued.add_(g)                          # Downpour: accrued <- accrued + g
            loss_sum += loss
            errors += wrong
            num_samples += len(y)
            if on_step is not None:
                on_step()
        if accrued is not None:
            update = accrued
        elif self.push_kind == "delta":   # w_local - w_fetched
            update = torch.sub(w, self.params, out=out) if out is not None else w - self.params
        else:   # params: the client's own, which it keeps (the net is shared in the simulator)
            self.params.copy_(w)
            update = out.copy_(w) if out is not None else w.clone()
        return Push(client=self.client_id, read_version=self.read_version, update=update, num_steps=num_steps,
                    num_samples=num_samples, train_loss=loss_sum.item() / num_steps,
                    train_error=errors.item() / max(num_samples, 1), stream_position=tuple(self.stream.position))

    def mark(self) -> tuple:
        """What a segment changes besides its push (momentum buffer, stream position), taken before
        it so that :meth:`rewind` can drop it: a preempted or abandoned segment consumes nothing."""
        buffer = self.optimiser.buffer
        return (None if buffer is None else buffer.clone(), tuple(self.stream.position))

    def rewind(self, mark: tuple) -> None:
        self.optimiser.buffer, position = mark
        self.stream.set_position(position)

    def state_dict(self) -> dict:
        return {"params": self.params, "read_version": self.read_version,
                "optimiser": self.optimiser.state_dict(), "stream_position": list(self.stream.position)}

    def load_state_dict(self, state: dict) -> None:
        self.params, self.read_version, self.joined = state["params"], int(state["read_version"]), True
        self.optimiser.load_state_dict(state["optimiser"])
        self.stream.set_position(tuple(int(p) for p in state["stream_position"]))


class ParameterServer:
    """The parameter server: one parameter vector, a version counter and an update rule."""

    def __init__(self, params: Tensor, rule: ServerRule, version: int = 0):
        self.params, self.rule, self.version = params, rule, version

    def apply(self, push: Push) -> Applied:
        staleness = self.version - push.read_version   # updates the client did not see
        if staleness < 0:
            raise ValueError(f"push from client {push.client} read version {push.read_version} "
                             f"which the server (version {self.version}) never had")
        self.rule.apply(self.params, push.update.to(self.params.device, non_blocking=True),
                        staleness=staleness, client=push.client)
        self.version += 1
        return Applied(version=self.version, staleness=staleness)

    def keep_in(self, home: Tensor) -> None:
        """Keep the parameters in ``home`` from now on (their values copied there)."""
        self.params = home.copy_(self.params)

    def fetched(self, client: int) -> None:
        """Client ``client`` now holds these parameters (rules that compensate delay keep them)."""
        self.rule.fetched(client, self.params)

    def state_dict(self) -> dict:
        return {"params": self.params, "version": self.version, "rule": self.rule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if state["params"].shape != self.params.shape:   # another model's: its code (or torch's) changed since
            raise ConfigError("resume", "checkpoint.pt", f"a checkpoint of this model: it holds "
                              f"{state['params'].numel()} parameters, the model {self.params.numel()}; "
                              "force=true starts over")
        self.params.copy_(state["params"])
        self.version = int(state["version"])
        self.rule.load_state_dict(state["rule"])


def make_client(client_id: int, stream: Stream, lr: float, momentum: float, weight_decay: float,
                rule: ServerRule) -> Client:
    return Client(client_id, stream, LocalSGD(lr, momentum, weight_decay), rule.push_kind,
                  getattr(rule, "exchange", None))
