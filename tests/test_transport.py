"""The real driver's channel (repro.real.transport), against a stand-in for a gloo group: which
works it keeps alive, and how long. No processes, no sockets."""
from __future__ import annotations

import datetime

import pytest

import torch

from repro.asgd.algorithm import Push
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
        self.sent: list[bytes] = []

    def send(self, tensors, peer, tag):
        self.sends += 1
        self.sent.append(b"".join(t.numpy().tobytes() for t in tensors))
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
        channel.send_push(Push(client=1, read_version=0, update=outbox.payload, **PUSHED), outbox)
        assert channel.recv(inbox).kind == Kind.PARAMS

    round_trip()
    assert group.released == []   # both completed, both still held
    round_trip()
    assert sorted(group.released) == ["recv1", "send1"]   # replaced by the second round trip's


def test_a_push_is_sent_as_one_message_its_header_and_its_whole_update():
    """The client's hot path (send_push: no header built) puts on the wire one message: the
    push's header slots and the whole payload, which read back as the push."""
    outbox = Frame(4)
    outbox.payload.copy_(torch.arange(4.0))
    push = Push(client=1, read_version=7, update=outbox.payload, num_steps=4, num_samples=128, train_loss=0.5,
                train_error=0.1, stream_position=(2, 96))
    group = _Group(Frame(4))
    Channel(group, 0, 5.0, peer_in_group=0).send_push(push, outbox, device=-1, sent_at=12.5)
    (message,) = group.sent
    received = Frame(4)
    received.buf.copy_(torch.frombuffer(bytearray(message), dtype=torch.uint8))
    header = Header.unpack(received)
    assert (header.kind, header.length, header.sent_at) == (Kind.PUSH, 4, 12.5)
    back = header.to_push(received.payload)
    assert vars(back) == {**vars(push), "update": back.update} and torch.equal(back.update, torch.arange(4.0))


def test_a_receive_woken_past_its_timeout_takes_what_arrived_meanwhile():
    """A client suspended (SIGSTOP) for longer than backend.timeout_s while it waited for its
    held reply woke with the wait over before gloo's thread had read the server's HEARTBEATs that
    came meanwhile, and left the run 'silent for more than 4 s' (test_real's sync-barrier test,
    2 of 5 runs). The message that lands a moment after the timeout is taken; silence is not."""
    import threading

    from repro.real.transport import _Arrival

    channel = Channel(None, 0, 0.2, peer_in_group=0)
    late = _Arrival()
    threading.Timer(0.3, late.set).start()   # 0.1 s past the timeout, as a woken thread reads it
    channel._await(None, late)
    with pytest.raises(Exception, match="silent for more than 0.2 s"):
        channel._await(None, _Arrival())


def test_a_long_loss_reason_is_cut_between_two_words():
    """gloo's first line of a lost link, over 160 characters, was cut at character 160, mid-word
    (a reason ending 'Connection res' misleads); now between two words, marked '...'."""
    text = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:45678: " + \
           "Connection reset by peer while reading the header of a message from another side of this pair"
    why = str(Channel(None, 3, 1.0, peer_in_group=0)._lost("receive", RuntimeError(text + "\nmore")))
    reason = why.split("connection lost (", 1)[1].rstrip(")")
    assert reason.endswith(" ...") and text.startswith(reason[:-4]) and text[len(reason) - 4] == " ", why
    short = "[pair.cc:534] Read error: Connection reset by peer"
    assert str(Channel(None, 3, 1.0, peer_in_group=0)._lost("receive", RuntimeError(short))).endswith(f"({short})")


def test_a_servers_receive_outlasts_the_timeout_until_the_server_drops_it(monkeypatch):
    """A real gloo pair, both ranks in this process. The server's receive ended after gloo's own
    bound, which counts time the process was suspended: a whole run continued after a Ctrl-Z lost
    every client, none of which had failed. A receiver's wait is now judged by the server
    (Silence): it outlasts the timeout, and ends at once when the server drops it."""
    import threading
    import time

    import torch.distributed as dist

    from repro.real.groups import loopback_ifname
    from repro.real.transport import Receiver

    if loopback_ifname():
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", loopback_ifname())   # as a single-node run's pairs
    store, groups = dist.HashStore(), {}
    makers = [threading.Thread(target=lambda r=r: groups.__setitem__(r, dist.ProcessGroupGloo(
        store, r, 2, datetime.timedelta(seconds=10)))) for r in (0, 1)]
    [t.start() for t in makers]
    [t.join() for t in makers]
    server, client = Channel(groups[0], 1, 0.2, peer_in_group=1), Channel(groups[1], 0, 0.2, peer_in_group=0)
    lost, heard = [], []
    receiver = Receiver(1, server, Frame(4), lambda *a: heard.append(a) or True, lambda k, why: lost.append(why))
    receiver.start()
    time.sleep(0.6)   # three times its timeout
    client.send(Header(Kind.HEARTBEAT, 1, 0, 0), Frame(4))   # (a HEARTBEAT is not handed on)
    time.sleep(0.2)
    assert receiver.is_alive() and not lost and server.receiving_s() < 0.5
    assert server.drop() == "rank 1: waiting for a message: silent for more than 0.2 s"
    receiver.join(5)
    assert not receiver.is_alive() and len(lost) == 1 and not heard
    with pytest.raises(Exception):   # the link is closed at both ends
        client.send(Header(Kind.HEARTBEAT, 1, 0, 0), Frame(4))


def test_the_server_counts_no_silence_across_its_own_suspension():
    """The server judges its receivers' waits (Silence) in time it ran: right after a gap between
    two of its rounds longer than half backend.client_timeout_s (the process was suspended, a
    Ctrl-Z), a client whose receive has waited longer than that timeout is kept; one silent that
    long since is dropped, its link closed, the reason naming the silence."""
    import time

    from repro.real.transport import Silence

    class Silent:
        dropped = 0

        def receiving_s(self):
            return 100.0

        def drop(self):
            self.dropped += 1
            return "rank 1: waiting for a message: silent for more than 2 s"

    silence, channel = Silence(2.0), Silent()
    silence.judged -= 100.0   # continued after 100 s: its clients were suspended with it
    assert silence.judge({1: channel}) == {} and channel.dropped == 0
    silence.since = silence.judged = time.monotonic() - 2.5   # 2.5 s since, its rounds 0.05 s apart
    silence.judged += 2.45
    assert silence.judge({1: channel}) == {1: "rank 1: waiting for a message: silent for more than 2 s"}
    assert channel.dropped == 1


def test_a_tiny_client_timeout_still_drops_a_silent_client():
    """backend.client_timeout_s=0.1: half of it, 0.05 s, is a server round's own period, so
    every round looked like a suspension and a silent client was never dropped. A gap counts
    as one only above a second as well."""
    import time

    from repro.real.transport import Silence

    class Silent:
        def receiving_s(self):
            return 100.0

        def drop(self):
            return "silent"

    silence = Silence(0.1)
    silence.since = silence.judged = time.monotonic() - 0.5   # its rounds 0.06 s apart
    silence.judged += 0.44
    assert silence.judge({1: Silent()}) == {1: "silent"}
