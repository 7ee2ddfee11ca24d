"""The real driver's message format: a frame (header + payload), the header's slots, the kinds, the HELLOs.

This module owns what one message looks like in memory and on the wire (:mod:`repro.real.transport` moves it):
:data:`HEADER_SLOTS` float64 slots (ints below 2**53 are exact), then ``length`` float32 values, as ONE gloo
message. Why one frame, and the HELLOs before any payload: docs/real.md, "One node" and "How messages move".
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar

import torch
from torch import Tensor

from repro.asgd.algorithm import Push, push_fields
from repro.config.settings import RunConfig, to_dict

# kind, client, version, length, position (2 + present), device, sent_at, compute_s, to_client_s
ENVELOPE_SLOTS = 11
IN_ENVELOPE = ("client", "read_version")   # a push's fields the envelope's client and version carry
PUSH_SLOTS = sum(f.width for f in push_fields() if f.name not in IN_ENVELOPE)
HEADER_SLOTS = -(-(ENVELOPE_SLOTS + PUSH_SLOTS) // 8) * 8   # rounded up to 64 bytes
HEADER_BYTES = HEADER_SLOTS * 8


class Kind(IntEnum):
    PARAMS = 1   # server -> client: parameters and their version (Downpour's fetch)
    PUSH = 2     # client -> server: an update and its metadata
    STOP = 3     # server -> client: the run is over (no payload)
    HELLO = 4    # both ways, first: "my frames carry `length` parameters" (no payload)
    HEARTBEAT = 5   # "alive" (no payload): from a client computing a long push, to one whose reply is held


class Frame:
    """One message buffer: a header, then room for ``capacity`` float32 values (its views made once)."""

    def __init__(self, capacity: int, pin: bool = False):
        self.capacity = capacity
        self.buf = torch.zeros(HEADER_BYTES + 4 * capacity, dtype=torch.uint8, pin_memory=pin)
        self.header = self.buf[:HEADER_BYTES].view(torch.float64).numpy()   # shares memory
        self.payload = self.buf[HEADER_BYTES:].view(torch.float32)
        self._whole, self._head = [self.buf], [self.buf[:HEADER_BYTES]]

    def message(self, payload_length: int) -> list[Tensor]:
        """What gloo sends: the whole frame, or the header alone (HELLO, STOP, HEARTBEAT)."""
        return self._whole if payload_length == self.capacity else self._head


class LinkLost(RuntimeError):
    """The peer closed the connection, crashed, or stayed silent past the timeout."""


_KINDS = {int(kind): kind for kind in Kind}   # a dict lookup: Kind(value) costs a microsecond
_ENVELOPE = struct.Struct(f"={ENVELOPE_SLOTS}d")   # native float64, as the frame's numpy view


@dataclass(slots=True)   # three are made and read per round trip: slots make both cheaper
class Header:
    """A message's header. A PUSH carries a push: ``client`` and ``version`` its client and read_version, the payload
    its update, ``push`` its other fields (the slots follow :func:`~repro.asgd.algorithm.push_fields`: no edit here)."""

    kind: Kind
    client: int
    version: int                        # PARAMS: version of the payload; PUSH: the read_version
    length: int                         # payload elements (float32); 0: no payload
    push: dict = field(default_factory=dict)   # PUSH: the push's other fields, by name
    position: tuple[int, int] | None = None    # PARAMS: the client's stream resumes here
    device: int = -1                    # PUSH: the client's CUDA device index, -1 for the CPU
    # timings.csv, on time.monotonic() (one clock per kernel); PARAMS: when the server sent it; PUSH: when
    # the client sent it, its compute time, and the transit of the PARAMS it was computed from
    sent_at: float = 0.0
    compute_s: float = 0.0
    to_client_s: float = 0.0
    received_at: float = 0.0            # set by the receiver, not sent

    push_type: ClassVar[type] = Push    # whose fields a PUSH carries

    @classmethod
    def pack_push(cls, push: Push, frame: Frame, length: int, device: int = -1, sent_at: float = 0.0,
                  compute_s: float = 0.0, to_client_s: float = 0.0) -> Frame:
        """Write ``push`` as a PUSH header into ``frame``, from its fields; ``length``: its update's values."""
        coded = codec(cls.push_type)
        coded.slots.pack_into(frame.header, 0, Kind.PUSH, push.client, push.read_version, length, 0, 0, False,
                              device, sent_at, compute_s, to_client_s, *coded.values_of(push))
        return frame

    def to_push(self, update: Tensor) -> Push:
        """The push this PUSH header and its payload ``update`` carry."""
        return self.push_type(client=self.client, read_version=self.version, update=update, **self.push)

    @property
    def payload_length(self) -> int:
        """Values that follow the header in the frame (HELLO's length is a count, not a payload)."""
        return self.length if self.kind is Kind.PUSH or self.kind is Kind.PARAMS else 0

    def pack(self, frame: Frame) -> Frame:
        """Write the header's slots into ``frame``, one struct call; a PUSH is :meth:`pack_push`'s."""
        if self.kind is Kind.PUSH:
            raise ValueError("a PUSH header is written from its push: Header.pack_push")
        pos = self.position
        _ENVELOPE.pack_into(frame.header, 0, self.kind, self.client, self.version, self.length,
                            *(pos or (0, 0)), pos is not None, self.device, self.sent_at, self.compute_s,
                            self.to_client_s)
        return frame

    @classmethod
    def unpack(cls, frame: Frame) -> "Header":
        v = frame.header.tolist()
        kind = _KINDS.get(v[0])   # a float key finds its int: 2.0 == 2, one hash
        if kind is None:
            raise LinkLost(f"protocol error: unknown message kind {v[0]!r}")
        return cls(kind, int(v[1]), int(v[2]), int(v[3]),
                   codec(cls.push_type).fields(v) if kind is Kind.PUSH else {},
                   (int(v[4]), int(v[5])) if v[6] else None, int(v[7]), v[8], v[9], v[10])


class Codec:
    """A push type's slots in the header, compiled once per type from its fields (less the envelope's two): ``slots``,
    the struct of the envelope's and the push's slots; ``values_of(push)``, its slot values in order; ``fields(slots)``,
    its carried fields back, cast. Both are generated source for speed, like :mod:`dataclasses` (docs/benchmarks.md)."""

    def __init__(self, push_type: type):
        carried = tuple(f for f in push_fields(push_type) if f.name not in IN_ENVELOPE)
        width = sum(f.width for f in carried)
        if ENVELOPE_SLOTS + width > HEADER_SLOTS:
            raise ValueError(f"{push_type.__name__}'s fields need more than the header's {HEADER_SLOTS} slots")
        self.slots = struct.Struct(f"={ENVELOPE_SLOTS + width}d")
        spread = "".join(f"{'*' if f.many else ''}p.{f.name}, " for f in carried)   # "p.a, *p.b, "
        self.values_of = _compiled("p", f"({spread})")
        casts, read, at = {}, [], ENVELOPE_SLOTS
        for i, f in enumerate(carried):
            if f.many:   # push_fields admits tuples of ints only: each slot cast alone, no generator
                read.append(f"{f.name!r}: ({''.join(f'int(v[{at + j}]), ' for j in range(f.width))})")
            else:
                casts[f"cast{i}"] = f.cast
                read.append(f"{f.name!r}: cast{i}(v[{at}])")
            at += f.width
        self.fields = _compiled("v", "{" + ", ".join(read) + "}", casts)


def _compiled(arg: str, expression: str, names: dict | None = None):
    """``lambda arg: expression``, made from source (of field names and fixed text); ``names``: its globals."""
    return eval(f"lambda {arg}: {expression}", dict(names or {}))


codec = functools.cache(Codec)   # the Codec of a push type (Push or an extension of it), made once


def trained(cfg: RunConfig) -> dict:
    """What every rank and joiner must share with the run, by key (``algo.lr``): what is trained, and how."""
    d = to_dict(cfg)
    shared = {k: d[k] for k in ("seed", "nsync", "num_clients")}
    return shared | {f"{group}.{k}": v for group in ("data", "model", "algo", "protocol") for k, v in d[group].items()
                     if f"{group}.{k}" != "data.root"}


def fingerprint(cfg: RunConfig) -> str:
    """A hash of :func:`trained`."""
    return hashlib.sha256(json.dumps(trained(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


def hello(frame: Frame, cfg: RunConfig) -> Header:
    """Each end's first message: its frames' parameter count, and in its version slot 48 bits of its config's
    :func:`fingerprint` (exact in a float64 slot)."""
    return Header(Kind.HELLO, 0, int(fingerprint(cfg)[:12], 16), frame.capacity)


def check_hello(theirs: Header, frame: Frame, peer: int, cfg: RunConfig) -> None:
    """Both ends must agree on the parameter count, then on the config; LinkLost if not."""
    if theirs.kind != Kind.HELLO or theirs.length != frame.capacity:
        raise LinkLost(f"rank {peer}: protocol error: its frames carry {theirs.length} parameters "
                       f"({theirs.kind.name}), this rank's {frame.capacity} (do all ranks run the "
                       f"same model and data?)")
    if theirs.version != hello(frame, cfg).version:
        raise LinkLost(f"rank {peer}: protocol error: its config differs from this rank's in what is trained "
                       "(data, model, algo, protocol, seed, nsync or num_clients): give every rank the same overrides")
