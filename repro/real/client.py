"""Ranks 1..N of the real driver: one Downpour client per process.

This module owns the client's side of the conversation, and nothing of process plumbing
(:mod:`repro.real.launch`): receive parameters (or STOP), ``client.fetch`` them, run
``client.compute_push(worker, nsync)`` exactly as the simulator does, send the push, repeat.
Client ``k`` is built by the same :mod:`repro.components` as simulator client ``k``, so its data
order is the one seeded by ``(seed, k)``. On a GPU the client trains on ``cuda:i`` and its
messages go through pinned CPU buffers (gloo moves CPU tensors only).

A resumed run sends each client the stream position it last reported, so it continues its data
order; its momentum buffer restarts at zero (the server checkpoints parameters, not client
optimiser state).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from repro.algorithm import Client, Worker
from repro.components import build_worker, load_data, make_clients
from repro.config import RunConfig
from repro.data import Dataset
from repro.real.transport import Channel, Frame, Header, Kind, LinkLost, check_hello, hello


def log(rank: int, msg: str) -> None:
    print(f"[real client {rank}] {msg}", file=sys.stderr, flush=True)


def client_device(local_index: int) -> torch.device:
    """``cuda:i`` round robin over the visible GPUs by local index, else the CPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return torch.device(f"cuda:{local_index % count}") if count else torch.device("cpu")


@dataclass
class ClientSetup:
    """Everything a client process builds before it connects (so a bad config or missing data
    fails before the server waits on it)."""

    client: Client
    worker: Worker
    device: torch.device
    inbox: Frame     # the parameters land here, every fetch
    outbox: Frame    # each push leaves from here (pinned on a GPU: the staging buffer)


def build_client(cfg: RunConfig, rank: int, device: torch.device, ds: Dataset | None = None) -> ClientSetup:
    """``ds``: the data set when the launcher hands it over (spawn mode, small data), else it is
    loaded here (torchrun ranks on other nodes)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)   # 1 by default: N clients + server share the cores
    ds = ds.to(device) if ds is not None else load_data(cfg, device)
    worker = build_worker(cfg, ds, device)
    client = make_clients(cfg, ds, client_ids=[rank])[0]
    numel, pin = worker.params.numel(), device.type == "cuda"
    return ClientSetup(client, worker, device, Frame(numel, pin), Frame(numel, pin))


def run_client(cfg: RunConfig, rank: int, channel: Channel, setup: ClientSetup) -> int:
    """Train until the server says STOP (exit code 0) or is lost or silent (1)."""
    try:
        if not _hello(cfg, rank, channel, setup):
            return 0
        return _loop(cfg, rank, channel, setup)
    except LinkLost as exc:
        log(rank, f"lost the server: {exc} (backend.timeout_s={cfg.backend.timeout_s:g}); exiting")
        return 1


def _hello(cfg: RunConfig, rank: int, channel: Channel, setup: ClientSetup) -> bool:
    """Answer the server's HELLO with ours (both carry the parameter count; no payload moves
    before they agree). False if the server says STOP instead (a finished run resumed)."""
    theirs = channel.recv(setup.inbox, cfg.backend.timeout_s)
    if theirs.kind == Kind.STOP:
        return False
    channel.send(hello(setup.outbox), setup.outbox)   # even on a mismatch: the server reports it
    try:
        check_hello(theirs, setup.inbox, 0)
    except LinkLost:
        # wait for the server's STOP (header-only), so it has read our HELLO before we hang up
        channel.recv(setup.inbox, cfg.backend.timeout_s)
        raise
    return True


def _loop(cfg: RunConfig, rank: int, channel: Channel, setup: ClientSetup) -> int:
    client, inbox, outbox = setup.client, setup.inbox, setup.outbox
    on_gpu = setup.device.type == "cuda"
    device_index = setup.device.index if on_gpu else -1
    params_in, update_out = inbox.payload, outbox.payload
    while True:
        header = channel.recv(inbox, cfg.backend.timeout_s)
        if header.kind == Kind.STOP:
            return 0
        if header.kind != Kind.PARAMS or header.client != rank:
            raise LinkLost(f"protocol error: got {header.kind.name} for client {header.client}")
        if header.position is not None:
            client.stream.set_position(header.position)   # resumed: continue the data order
        client.fetch(params_in.to(setup.device, non_blocking=True), header.version)   # copies
        if on_gpu:
            push = client.compute_push(setup.worker, cfg.nsync)   # its .item() calls sync the GPU
            update_out.copy_(push.update)   # D2H into the pinned frame, synchronous
        else:
            push = client.compute_push(setup.worker, cfg.nsync, out=update_out)   # straight into the frame
        channel.post(inbox)   # post the reply's receive before the push leaves
        channel.send(Header(Kind.PUSH, rank, push.read_version, update_out.numel(), push.num_steps,
                            push.num_samples, push.train_loss, push.train_error,
                            tuple(push.stream_position), device_index), outbox)
