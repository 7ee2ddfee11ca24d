"""The processes of a real run's clients: how they start, get ready, serve and never outlive a run.

This module owns the client processes' plumbing: the single-node rendezvous store, the fork server the clients start
from (why: docs/real.md, "One node"), a client process's life, waiting until each is ready or dead (one dead in
start-up is lost, not fatal), and stopping them; also a torchrun rank's connect-and-serve.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import ipaddress
import json
import math
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING

import torch.distributed as dist

from repro.config.settings import RunConfig
from repro.errors import ConfigError
from repro.gridpoint import proc_stat
from repro.logs import mark
from repro.workload.data import Dataset
from repro.real.client import build_client, device_for, run_client
from repro.real.elastic import BUSY_KEY, COUNT_KEY
from repro.real.transport import Channel, log
from repro.real.groups import connect, disconnect, first_line, pin_gloo
from repro.runtime import PR_SET_PDEATHSIG, StopRequest, fork_server_context, naming_fork_server, prctl

if TYPE_CHECKING:
    from repro.runs.core import RunCore

READY_KEY = "repro_real/ready/{}"
WORLD_KEY = "repro_real/world"
HANDOVER_MAX_BYTES = 16 * 2**20   # hand a data set this small to spawned clients (see handover)


def startup_deadline_s(cfg: RunConfig) -> float:
    """``backend.timeout_s`` per core's worth of processes (start-up is CPU-bound)."""
    cores = os.cpu_count() or 1
    return cfg.backend.timeout_s * max(1.0, math.ceil((cfg.num_clients + 1) / cores))


class StartupError(RuntimeError):
    """Start-up ended without a world to serve (a deadline, every client dead, a stop); the message says which."""


def make_store(cfg: RunConfig) -> dist.TCPStore:
    """The rendezvous store, on a socket bound here to ``master_addr`` only (TCPStore's own listens on every
    interface): port 0 gets a free port with no race, a busy port is a clear error before anything starts."""
    addr, port = cfg.backend.master_addr, cfg.backend.master_port
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        if ipaddress.ip_address(sockaddr[0]).is_unspecified:   # 0.0.0.0, ::: every interface, no peer's address
            raise ConfigError("backend.master_addr", addr, "one address of this machine (127.0.0.1, the default: "
                              "loopback only); 0.0.0.0 and :: listen on every interface, and clients cannot "
                              "connect to them")
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # still fails on a live listener
        sock.bind(sockaddr)
    except OSError as exc:
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:   # the address is at fault
            raise ConfigError("backend.master_addr", addr, f"an address of this machine to listen on "
                              f"(127.0.0.1, the default: loopback only): {exc.strerror or exc}") from None
        raise ConfigError("backend.master_port", port, f"a free port on {addr} (0 picks one): {exc}")
    bound = sock.getsockname()[1]
    store = dist.TCPStore(addr, bound, None, True, wait_for_workers=False,   # world size None: joiners too
                          timeout=datetime.timedelta(seconds=startup_deadline_s(cfg)),
                          master_listen_fd=sock.detach())   # the store owns the socket now
    store.add(COUNT_KEY, 0)   # the mark of a run's store: a joiner at any other (torchrun's) is refused
    store.add(BUSY_KEY, 0)   # what a joiner waiting for its answer watches (repro.real.elastic._read_answer)
    return store


def handover(ds: Dataset) -> Dataset | None:
    """The data set to hand to spawned clients when small (none then loads it), else None (each child loads it)."""
    size = sum(t.numel() * t.element_size() for t in (ds.x_train, ds.y_train))
    return ds.to("cpu") if size <= HANDOVER_MAX_BYTES else None


def spawn_context():
    """multiprocessing's spawn context, safe inside a grid's joblib worker: a child re-applies its parent's
    process-wide start method, and a loky worker's 'loky' no plain child can find, so it becomes spawn too."""
    if mp.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        mp.set_start_method("spawn", force=True)
    return mp.get_context("spawn")


def client_context(start: bool = False):
    """multiprocessing's fork server, preloaded with the launcher (``runtime.CLIENT_PRELOAD``; ``start``: start
    it now); with :func:`spawn_context`'s fix, as a forked child re-applies the start method too."""
    spawn_context()
    return fork_server_context(start)


def spawn_clients(cfg: RunConfig, port: int, dataset: Dataset | None) -> dict:
    ctx = client_context()
    procs = {}
    for k in range(1, cfg.num_clients + 1):
        # the parent's environment now, not the fork server's from its first run (GLOO_SOCKET_IFNAME)
        proc = ctx.Process(target=_client_process, args=(cfg, k, port, os.getpid(), dataset, dict(os.environ)),
                           name=f"repro-client-{k}", daemon=True)
        try:
            proc.start()
        except (EOFError, OSError) as exc:   # e.g. a SIGTERM to the process group while it imported torch
            stop_children(procs, grace_s=0)
            raise StartupError(f"the clients' fork server ended before client {k} started "
                               f"({type(exc).__name__}: {exc})") from None
        procs[k] = proc
    return procs


def wait_ready(cfg: RunConfig, core: RunCore, store, procs: dict, stop: StopRequest) -> list[int]:
    """Until every client has built its data and model, or died doing so (lost); the ready ones, in order."""
    deadline = time.monotonic() + startup_deadline_s(cfg)
    dead: dict[int, int] = {}
    while True:
        if stop.is_set():
            raise StartupError("interrupted while the clients were starting")
        ready = [k for k in procs if k not in dead and store.check([READY_KEY.format(k)])]
        for k, p in procs.items():
            if k not in dead and k not in ready and p.exitcode is not None:
                dead[k] = p.exitcode
                why = naming_fork_server(p, f"process exited with code {p.exitcode} during start-up")
                core.lose(k, why)
                log.info(f"client {k} lost: {why}; going on without it")
        if len(ready) + len(dead) == len(procs):
            break
        if time.monotonic() > deadline:
            missing = [k for k in procs if k not in ready and k not in dead]
            raise StartupError(f"clients {missing} did not start within {startup_deadline_s(cfg):g} s "
                                f"(backend.timeout_s={cfg.backend.timeout_s:g} per core's worth of processes)")
        time.sleep(0.05)
    if not ready:
        raise StartupError(f"every client exited during start-up (exit codes {dead}); see their errors above")
    return sorted(ready)


def stop_children(procs: dict, grace_s: float) -> None:
    """Join ({client: process}, each told STOP) for up to ``grace_s`` in all, then SIGTERM, then SIGKILL (at
    once for a suspended one: SIGTERM waits for a SIGCONT); one still there after a second is named once."""
    deadline = time.monotonic() + grace_s
    for until in (min(deadline, time.monotonic() + 1.0), deadline):
        for proc in procs.values():
            proc.join(max(0.0, until - time.monotonic()))
        if (left := deadline - time.monotonic()) > 0 and (late := [k for k, p in procs.items() if p.is_alive()]):
            whys = [f"client {k} (pid {procs[k].pid}) " + ("is suspended (SIGSTOP)" if suspended(procs[k])
                                                           else "is still running") for k in late]
            log.info(f"clients told STOP have not exited: {'; '.join(whys)}; waiting up to {math.ceil(left)} s, "
                     "then they are killed")
    for step in (lambda p: p.kill() if suspended(p) else p.terminate(), lambda p: p.kill()):
        alive = [p for p in procs.values() if p.is_alive()]
        for proc in alive:
            step(proc)
        for proc in alive:
            proc.join(2)


def suspended(proc) -> bool:
    """Whether ``proc`` is stopped (SIGSTOP, Ctrl-Z of its own): it exits on nothing but SIGKILL or a SIGCONT."""
    fields = proc_stat(proc.pid)   # (None: no /proc, or it has exited)
    return fields is not None and fields[0] in "Tt"


def _die_with_parent(parent_pid: int) -> None:
    """Die with the run's process: the kernel SIGKILLs a client when the fork server dies (``PR_SET_PDEATHSIG``), which
    exits once the last holder of its "alive" pipe closes it; so each client closes the copy it inherited."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    server = mp.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:   # the run's process died before the above took effect
        os._exit(1)


def _client_process(cfg: RunConfig, client_id: int, port: int, parent_pid: int,
                    dataset: Dataset | None, environ: dict) -> None:
    """A client forked by the fork server: set up, mark ready, learn its world rank, connect, train, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole group: the parent decides
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    os.environ.clear()
    os.environ.update(environ)
    mark("client", "started")
    pin_gloo(cfg.backend.master_addr, single_node=True)
    setup = build_client(cfg, client_id, device_for(cfg, "client_device", client_id), dataset)
    mark("client", "built")
    timeout = datetime.timedelta(seconds=startup_deadline_s(cfg))
    store = dist.TCPStore(cfg.backend.master_addr, port, cfg.num_clients + 1, False, timeout=timeout)
    store.set(READY_KEY.format(client_id), "1")
    world = json.loads(store.get(WORLD_KEY))
    rank = world["ranks"].get(str(client_id))
    if rank is None:
        sys.exit(0)   # the server went on without this client
    sys.exit(serve_as_client(cfg, client_id, rank, world["size"], setup, store))


def serve_as_client(cfg: RunConfig, client_id: int, rank: int, world_size: int, setup, store) -> int:
    try:
        groups = connect(rank, world_size, startup_deadline_s(cfg), store)
        mark("client", "rendezvous done")
    except Exception as exc:
        print(f"[real client {client_id}] could not join the run within backend.timeout_s="
              f"{cfg.backend.timeout_s:g} s: {first_line(exc)}", file=sys.stderr, flush=True)
        return 1
    try:
        channel = Channel(groups[rank], 0, cfg.backend.timeout_s, watched=True)   # (see Channel.arrived)
        return run_client(cfg, client_id, channel, setup)
    finally:
        disconnect()

