"""Ranks 1..N of the real driver: one Downpour client per process.

This module owns the client's side of the conversation: receive parameters (or STOP), ``client.fetch`` them, run
``client.compute_push(net, nsync)`` exactly as the simulator does, send the push, repeat. Its heartbeats, devices,
and what it reads between two local steps: docs/real.md, "One node".
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from repro.asgd.algorithm import Client
from repro.asgd.flatnet import FlatNet
from repro.asgd.protocols import PROTOCOLS
from repro.config.settings import RunConfig, client_slot
from repro.errors import ConfigError
from repro.logs import prefixed
from repro.workload.build import build_net, load_data, make_clients
from repro.workload.data import ClientStream, Dataset
from repro.real.frames import Frame, Header, Kind, LinkLost, check_hello, hello
from repro.real.transport import Channel
from repro.runtime import cuda_missing, deterministic


def device_for(cfg: RunConfig, key: str, local_rank: int = 0) -> torch.device:
    """Where ``backend.<key>`` puts local rank ``local_rank``: ``cuda:(local_rank mod G)``, or the CPU (the server is
    local rank 0: ``cuda:0`` with ``backend.server_device=cuda``)."""
    choice = getattr(cfg.backend, key)
    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        others = "'cpu' or 'auto'" if key == "client_device" else "'cpu'"
        raise ConfigError(f"backend.{key}", "cuda", f"{others}: {cuda_missing()}")
    if choice == "cpu" or not available:
        return torch.device("cpu")
    return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")


@dataclass
class ClientSetup:
    """Everything a client process builds before it connects (a bad config fails before the server waits)."""

    client: Client
    net: FlatNet
    device: torch.device
    inbox: Frame     # the parameters land here, every fetch
    outbox: Frame    # each push leaves from here (pinned on a GPU: the staging buffer)


def build_client(cfg: RunConfig, client_id: int, device: torch.device, ds: Dataset | None = None) -> ClientSetup:
    """``ds``: the data set the launcher hands over (small data), else it is loaded here."""
    if device.type == "cuda":
        torch.cuda.set_device(device)   # before anything allocates: the context goes on this GPU
        deterministic(device).__enter__()   # for the process's life: the same kernels as the simulator
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)   # also on a GPU: data loading and Python run on cores
    ds = ds.to(device) if ds is not None else load_data(cfg, device)
    net = build_net(cfg, ds, device)
    client = make_clients(cfg, ds, client_ids=[client_id])[0]
    client.params = torch.zeros_like(net.params)   # fetches copy into this: no tensor per round trip
    numel, pin = net.params.numel(), device.type == "cuda"
    setup = ClientSetup(client, net, device, Frame(numel, pin), Frame(numel, pin))
    if pin:   # a step on a throw-away batch (a fresh stream's): cuDNN and cuBLAS load now, not in the first timed push
        stream = client.stream
        probe = ClientStream(stream.x, stream.y, stream.batch_size, stream.seed, stream.client)
        net.backward(*probe.next_batch())
        net.zero_grad()
        torch.cuda.synchronize(device)
    return setup


def run_client(cfg: RunConfig, client_id: int, channel: Channel, setup: ClientSetup, rejoin: str = "") -> int:
    """Train until STOP (exit code 0) or the server is lost or silent (1); ``rejoin``: how to come back, said then."""
    try:
        if not _hello(channel, setup, cfg):
            return 0
        return _loop(cfg, client_id, channel, setup)
    except LinkLost as exc:
        log = prefixed("repro.real.client", f"[real client {client_id}]")
        log.info(f"lost the server: {exc} (backend.timeout_s={cfg.backend.timeout_s:g}); exiting"
                 + (f"; {rejoin}" if rejoin else ""))
        return 1


def _hello(channel: Channel, setup: ClientSetup, cfg: RunConfig) -> bool:
    """Answer the server's HELLO with ours; False if the server says STOP instead (a finished run)."""
    while (theirs := channel.recv(setup.inbox)).kind == Kind.HEARTBEAT:
        continue   # the server evaluates version 0 before its HELLO: it is alive, the wait starts over
    if theirs.kind == Kind.STOP:
        return False
    channel.send(hello(setup.outbox, cfg), setup.outbox)   # even on a mismatch: the server reports it
    try:
        check_hello(theirs, setup.inbox, 0, cfg)
    except LinkLost:
        channel.recv(setup.inbox)   # the server's STOP: it has read our HELLO before we hang up
        raise
    return True


CLOSE_NEWS_S = 0.5   # ample for a runnable thread to read a closed socket, even on 2 busy cores


class ServerSpoke(Exception):
    """A message arrived while this client computed (STOP, or a preemption's parameters)."""


class Heartbeat:
    """After each step: :meth:`listen`, then a HEARTBEAT if the server heard nothing for a quarter of its timeout."""

    def __init__(self, channel: Channel, frame: Frame, client_id: int, timeout_s: float):
        self.channel, self.frame, self.client_id = channel, frame, client_id
        self.timeout_s, self.every_s, self.last = timeout_s, timeout_s / 4, time.monotonic()

    def sent(self) -> None:
        self.last = time.monotonic()

    def __call__(self) -> None:
        if self.listen() >= self.every_s:
            self.channel.send(Header(Kind.HEARTBEAT, self.client_id, 0, 0), self.frame)
            self.sent()

    def listen(self) -> float:
        """Raises :class:`ServerSpoke` when the server's next message has arrived; else the seconds since it last
        heard from this client (past its timeout: first up to :data:`CLOSE_NEWS_S` for a close's news, docs/real.md)."""
        silent_s = time.monotonic() - self.last
        if self.channel.arrived(CLOSE_NEWS_S if silent_s > self.timeout_s else 0.0):
            raise ServerSpoke
        return silent_s


class Pace:
    """An uneven cluster on one machine (``cost.speeds``, ``cost.speed_law``): after each local step the
    client sleeps ``f - 1`` times the step's measured time, ``f`` its step time over the fastest client's."""

    def __init__(self, factor: float, on_step):
        self.extra, self.on_step = factor - 1.0, on_step
        self.start()

    def start(self) -> None:
        self.began = time.perf_counter()

    def __call__(self) -> None:
        now = time.perf_counter()
        until = now + self.extra * (now - self.began)
        while (left := until - time.perf_counter()) > 0:
            time.sleep(min(left, 0.05))
            self.on_step()   # in slices: a STOP or new parameters end the wait, heartbeats go on
        self.on_step()
        self.began = time.perf_counter()


def pace_factor(cfg: RunConfig, client_id: int) -> float:
    """Client ``client_id``'s step time over the fastest client's (1: not slowed)."""
    times = [cfg.cost.speed(k) for k in range(1, cfg.num_clients + 1)]
    return times[client_slot(cfg.num_clients, client_id) - 1] / min(times)


def _loop(cfg: RunConfig, client_id: int, channel: Channel, setup: ClientSetup) -> int:
    client, inbox, outbox = setup.client, setup.inbox, setup.outbox
    on_gpu = setup.device.type == "cuda"
    device_index = setup.device.index if on_gpu else -1
    params_in, update_out = inbox.payload, outbox.payload
    preemptible = PROTOCOLS[cfg.protocol.name].preempts(cfg)
    heartbeat = Heartbeat(channel, outbox, client_id, cfg.backend.client_timeout_s)
    factor = pace_factor(cfg, client_id)
    on_step = Pace(factor, heartbeat) if factor > 1.0 else heartbeat
    while True:
        header = channel.recv(inbox)
        if header.kind == Kind.STOP:
            return 0
        if header.kind == Kind.HEARTBEAT:   # its reply is held (a sync round, an ssp bound): the
            continue                          # server is alive; the wait starts over
        if header.kind != Kind.PARAMS or header.client != client_id:
            raise LinkLost(f"protocol error: got {header.kind.name} for client {header.client}")
        to_client_s = time.monotonic() - header.sent_at   # one clock on one kernel (frames.Header)
        if header.position is not None:
            client.stream.set_position(header.position)   # resumed: continue the data order
        client.fetch(params_in, header.version)   # copy_ into the client's own tensor (H2D on a GPU)
        channel.post(inbox)   # the next parameters (the reply, or a preemption) land here
        heartbeat.sent()
        if on_step is not heartbeat:
            on_step.start()
        segment = client.mark() if preemptible else None
        began = time.monotonic()
        try:
            if on_gpu:
                push = client.compute_push(setup.net, cfg.nsync, on_step=on_step)   # .item() syncs
                update_out.copy_(push.update)   # D2H into the pinned frame, synchronous
            else:
                push = client.compute_push(setup.net, cfg.nsync, out=update_out, on_step=on_step)
            heartbeat.listen()   # also after the last step: suspended there, it may have been dropped
        except ServerSpoke:   # STOP ends the loop; preempted, as the simulator does: the dropped
            if segment is not None:   # segment consumed nothing
                client.rewind(segment)
            continue
        computed = time.monotonic()
        channel.send_push(push, outbox, device=device_index, sent_at=time.monotonic(),   # the update fills
                          compute_s=computed - began, to_client_s=to_client_s)   # outbox's payload
