"""The real driver's message format (repro.real.frames): what a header writes into a frame and
reads back, through every path that writes one. No processes, no sockets.

The hot path packs a client's push straight from its fields (issue 34); it must write the very
bytes the general path (``Header.of_push(...).pack``) writes, for the push and for an extension
of it that declares new fields, so the one field list stays the only place a field is named.
"""
from dataclasses import dataclass

import pytest
import torch

from repro.asgd.algorithm import Push
from repro.real.frames import Frame, Header, Kind, LinkLost

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
def test_a_push_packed_from_its_fields_is_its_header_packed(header_type, push):
    general, lean = Frame(4), Frame(4)
    general.header[:] = lean.header[:] = -1.0   # stale slots of an earlier message
    header = header_type.of_push(push, 4, **ENVELOPE)
    header.pack(general)
    header_type.pack_push(push, lean, 4, **ENVELOPE)
    assert lean.header.tobytes() == general.header.tobytes()
    assert header_type.unpack(lean) == header


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
