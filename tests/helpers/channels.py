"""A stand-in for a real client's channel (:class:`repro.real.transport.Channel`): no peer, no
sockets; the messages it hands out are scripted."""
from __future__ import annotations

from repro.real.frames import Header, Kind


class ScriptedChannel:
    """A channel to no one: hands out scripted messages; the next one 'arrives' after
    ``arrive_after`` polls (local steps); records what is sent."""

    def __init__(self, script: list[Header], arrive_after: int):
        self.script, self.arrive_after = list(script), arrive_after
        self.polls, self.sent = 0, []

    def recv(self, frame) -> Header:
        header = self.script.pop(0)
        header.pack(frame)
        return header

    def post(self, frame) -> None:
        pass

    def arrived(self, wait_s: float = 0.0) -> bool:
        self.polls += 1
        return self.polls >= self.arrive_after

    def send(self, header: Header, frame) -> None:
        self.sent.append(header.kind)

    def send_push(self, push, frame, **envelope) -> None:   # what the real client pushes with
        self.sent.append(Kind.PUSH)


def watching_client(port: int, watched: bool) -> None:
    """Rank 1 of a 2-rank gloo world on the store at ``port``, as a client computing: it posts
    its receive, then takes 10 ms "local steps" until the message has arrived (20 s at most);
    exits 0 if that message is seen between two steps and is a STOP, else 3. Run as a fork of
    the clients' fork server (``client_context().Process``), a process with torch loaded."""
    import sys
    import time

    import torch.distributed as dist

    from repro.real.frames import Frame
    from repro.real.groups import connect, disconnect
    from repro.real.transport import Channel

    store = dist.TCPStore("127.0.0.1", port, 2, False)
    groups = connect(1, 2, 30.0, store)
    channel, frame = Channel(groups[1], 0, 30.0, watched=watched), Frame(16)
    channel.post(frame)                          # as a client does before it computes
    deadline = time.monotonic() + 20
    while not channel.arrived() and time.monotonic() < deadline:
        time.sleep(0.01)                         # a local step
    seen = channel.arrived()
    kind = channel.recv(frame).kind              # read it either way, so the server's send ends
    disconnect()
    sys.exit(0 if seen and kind == Kind.STOP else 3)
