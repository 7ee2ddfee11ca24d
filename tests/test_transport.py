"""The real driver's channel (repro.real.transport), against a stand-in for a gloo group: which
works it keeps alive, and how long. No processes, no sockets."""
from __future__ import annotations

import datetime

import pytest

from repro.real.frames import Frame, Header, Kind
from repro.real.transport import Channel

PUSHED = dict(num_steps=4, num_samples=128, train_loss=0.5, train_error=0.1, stream_position=(0, 0))


class _Work:
    """A work that completes when waited on (a receive: the reply lands in its frame then), and
    records its release: gloo's device thread may still hold a work's buffer right after its
    wait returns, and releasing it then makes gloo spin (see the transport's docstring)."""

    def __init__(self, name: str, released: list[str], frame: Frame | None = None):
        self.name, self.released, self.frame = name, released, frame

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        assert isinstance(timeout, datetime.timedelta)   # every wait is bounded
        if self.frame is not None:
            Header(Kind.PARAMS, 1, 0, self.frame.capacity).pack(self.frame)
        return True

    def __del__(self):
        self.released.append(self.name)


class _Group:
    """Hands out numbered works; the frame a receive lands in is the one posted with it."""

    def __init__(self, frame: Frame):
        self.frame, self.released, self.sends, self.recvs = frame, [], 0, 0

    def send(self, tensors, peer, tag):
        self.sends += 1
        return _Work(f"send{self.sends}", self.released)

    def recv(self, tensors, peer, tag):
        self.recvs += 1
        return _Work(f"recv{self.recvs}", self.released, self.frame)


@pytest.mark.parametrize("watched", [False, True])
def test_a_completed_work_is_released_only_when_the_next_one_completes(watched):
    inbox, outbox = Frame(4), Frame(4)
    group = _Group(inbox)
    channel = Channel(group, 0, 5.0, watched=watched, peer_in_group=0)

    def round_trip() -> None:   # the client's calls: receive posted first, push, reply
        channel.post(inbox)
        channel.send(Header(Kind.PUSH, 1, 0, 4, PUSHED), outbox)
        assert channel.recv(inbox).kind == Kind.PARAMS

    round_trip()
    assert group.released == []   # both completed, both still held
    round_trip()
    assert sorted(group.released) == ["recv1", "send1"]   # replaced by the second round trip's
