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
