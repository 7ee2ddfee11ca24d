"""The real driver's message format (repro.real.frames): what a header writes into a frame and
reads back, through every path that writes one. No processes, no sockets.

A client's push is packed straight from its fields (issue 34), the one writer of a PUSH header:
what it writes reads back as every field of the push, for the push and for an extension of it
that declares new fields (so the one field list stays the only place a field is named), and the
bytes of one push are pinned slot by slot.
"""
import struct
from dataclasses import dataclass

import pytest
import torch

from repro.asgd.algorithm import Push
from repro.real.frames import HEADER_SLOTS, Frame, Header, Kind, LinkLost

ENVELOPE = dict(device=2, sent_at=12.5, compute_s=0.25, to_client_s=0.125)


@dataclass
class FlaggedPush(Push):
    """An extension with one field of each kind a push may carry."""

    grad_norm: float = 0.0
    clipped: bool = False
    window: tuple[int, int, int] = (0, 0, 0)


class FlaggedHeader(Header):
    push_type = FlaggedPush


def _push(push_type=Push, **extra) -> Push:
    return push_type(client=3, read_version=41, update=torch.zeros(4), num_steps=4, num_samples=128,
                     train_loss=0.25, train_error=0.125, stream_position=(2, 96), **extra)


CASES = [(Header, _push()),
         (FlaggedHeader, _push(FlaggedPush, grad_norm=1.5, clipped=True, window=(3, 9, 27)))]


@pytest.mark.parametrize("header_type, push", CASES, ids=["Push", "extension"])
def test_a_packed_push_reads_back_as_its_header(header_type, push):
    frame = Frame(4)
    frame.header[:] = -1.0   # stale slots of an earlier message
    carried = {name: value for name, value in vars(push).items()
               if name not in ("client", "read_version", "update")}
    back = header_type.unpack(header_type.pack_push(push, frame, 4, **ENVELOPE))
    assert back == header_type(Kind.PUSH, 3, 41, 4, carried, **ENVELOPE)


def test_a_push_header_is_laid_out_slot_by_slot():
    """kind, client, version, length, position (two slots and a flag: none), device, sent_at,
    compute_s, to_client_s, then the push's fields in declared order; later slots untouched."""
    frame = Frame(4)
    frame.header[:] = -1.0
    Header.pack_push(_push(), frame, 4, **ENVELOPE)
    written = (2, 3, 41, 4, 0, 0, 0, 2, 12.5, 0.25, 0.125, 4, 128, 0.25, 0.125, 2, 96)
    assert frame.header.tobytes() == struct.pack(f"={HEADER_SLOTS}d", *written,
                                                 *[-1.0] * (HEADER_SLOTS - len(written)))


def test_a_push_header_is_never_packed_without_its_push():
    with pytest.raises(ValueError, match="pack_push"):
        Header(Kind.PUSH, 3, 41, 4, {"num_steps": 4}).pack(Frame(4))


@pytest.mark.parametrize("header_type, push", CASES, ids=["Push", "extension"])
def test_each_push_field_comes_back_as_its_declared_type(header_type, push):
    back = header_type.unpack(header_type.pack_push(push, Frame(4), 4)).to_push(torch.zeros(4))
    for name, value in vars(push).items():
        if name != "update":
            assert getattr(back, name) == value and type(getattr(back, name)) is type(value), name
    assert type(back.stream_position[0]) is int


def test_every_other_kind_reads_back_from_a_frame_that_carried_a_push():
    frame = Frame(4)
    Header.pack_push(_push(), frame, 4)
    for header in (Header(Kind.PARAMS, 3, 7, 4, position=(2, 96), sent_at=1.25), Header(Kind.STOP, 1, 7, 0),
                   Header(Kind.HEARTBEAT, 2, 0, 0), Header(Kind.HELLO, 0, 0, 4)):
        assert Header.unpack(header.pack(frame)) == header
        assert header.push == {} and header.payload_length == (4 if header.kind is Kind.PARAMS else 0)


def test_an_unknown_kind_is_a_protocol_error_not_a_crash():
    frame = Frame(4)
    frame.header[0] = 9.0
    with pytest.raises(LinkLost, match="unknown message kind 9.0"):
        Header.unpack(frame)
