"""The real driver's entry points and rank 0's orchestration: who is rank 0, how the world forms, how a run ends.

Rank 0 first builds everything that can fail on bad input (the run folder's decision, data, network, initial
parameters, the run core): a ConfigError before any process starts. On one node it makes the rendezvous store (kept
open for joins), starts the clients (:mod:`repro.real.processes`) and forms the world of the live ones; under
torchrun (docs/real.md, "Across nodes with torchrun") it joins torchrun's world, and ranks > 0 call
:func:`run_torchrun_worker`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
from pathlib import Path

import torch

from repro.config.checks import validated
from repro.config.settings import BackendConfig, RunConfig
from repro.errors import ConfigError
from repro.logs import mark
from repro.workload.data import Dataset
from repro.workload.start import build_problem
from repro.real.client import build_client, device_for
from repro.real.elastic import Acceptor
from repro.real.frames import Frame, Header, Kind
from repro.real.processes import (WORLD_KEY, StartupError, client_context, handover, make_store, serve_as_client,
                                  spawn_clients, startup_deadline_s, stop_children, wait_ready)
from repro.real.server import Dispatcher, log
from repro.real.transport import Channel
from repro.real.groups import bounded, connect, disconnect, first_line, pin_gloo
from repro.runs.core import RunCore
from repro.runs.folder import resume_hint, run_folder
from repro.runtime import StopRequest, TorchrunEnv, deterministic, torch_threads, torchrun_env, usable_cores


def run_real(cfg: RunConfig, run_dir: str | Path) -> dict:
    """Run the real driver into ``run_dir``: its summary (any status); ConfigError on bad input, before any process."""
    run_dir, env = Path(run_dir), torchrun_env()
    if env is not None and env.rank != 0:
        raise RuntimeError("run_real is rank 0's entry point; ranks > 0 call run_torchrun_worker")
    master_addr = os.environ["MASTER_ADDR"] if env is not None else cfg.backend.master_addr
    device = device_for(cfg, "server_device")
    device_for(cfg, "client_device")   # a bad backend.client_device is a ConfigError before any process
    validated(cfg)   # before the store: a timeout must not overflow it
    store = None if env is not None else make_store(cfg)   # a busy port: before the folder is touched
    if store is not None:   # the fork server imports while this process builds the problem
        client_context(start=True)
    mark("server", "store made")
    with torch_threads(cfg.num_threads), deterministic(device), _loopback(master_addr, env is None), \
            run_folder(cfg, run_dir) as run:
        if run.skip:
            if env is not None:
                _dismiss_clients(cfg)
            return run.summary
        resume = run.checkpoint("real", device)
        problem = build_problem(cfg, device)
        mark("server", "problem built")
        # the server's host, as cost=fit needs it: its cores, torch threads, and the run's clients sharing it
        local = cfg.num_clients if env is None else int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1
        host = {"cpu_cores": usable_cores(), "torch_threads": torch.get_num_threads(), "clients_on_host": local}
        run.core = core = RunCore(cfg, problem, run.run_dir, clock="wall", backend="real", resume=resume,
                                  eval_in_thread=True, measured={"host": host})
        procs: dict = {}
        try:
            channels = _start_world(cfg, core, store, procs, run.stop, handover(problem.dataset))
        except StartupError as exc:
            stop_children(procs, grace_s=0)
            disconnect()
            status = "interrupted" if run.stop.is_set() else "failed"
            message = f"{exc}; {resume_hint(run.run_dir)}"   # no checkpoint: it would lack the clients' state
            log.info(f"start-up {status}: {message}")
            return core.finish(status, message, clean=False)
        loop = Dispatcher(cfg, core, channels, run.stop, procs, resume)
        if store is not None:   # single node: the store stays open for joins (repro.real.elastic)
            address = f"{cfg.backend.master_addr}:{store.port}"
            loop.acceptor = Acceptor(loop, store)
            loop.acceptor.start()
            log.info(f"accepting joins at {address} (up to backend.max_clients={loop.max_clients} at once): "
                     f"python -m repro.run backend=real <this run's overrides> backend.join={address}")
        return _serve(loop, procs)
    return run.summary


def _serve(loop: Dispatcher, procs: dict) -> dict:
    """Run the loop, stop every rank whatever happened, then end the run."""
    status = "failed"
    try:
        status, message = loop.run()
    finally:
        mark("server", "served")
        stop_children(procs, grace_s=10 if status.startswith("completed") else 0)
        loop.join_receivers(timeout_s=2 if procs or status == "interrupted" else 10)
        disconnect()
        mark("server", "clients stopped")
    summary = loop.core.finish(status, message, num_clients=loop.cfg.num_clients,
                               client_devices={str(k): d for k, d in sorted(loop.devices.items())},
                               server_device=str(loop.server.params.device))
    mark("server", "summary written")
    log.info(f"{summary['status']}: version {summary['version']} epoch {summary['epoch']:.2f}"
        + (f" ({summary['message']})" if summary["message"] else ""))
    return summary


def world_config(cfg: RunConfig, env: TorchrunEnv) -> RunConfig:
    """Under torchrun the world decides the clients (ranks 1..) and where they meet (MASTER_ADDR:MASTER_PORT: a
    backend.master_addr/port naming another place is refused); :func:`repro.run.resolve` applies it on every rank."""
    if env.world_size < 2:
        raise ConfigError("WORLD_SIZE", env.world_size, "at least 2 under torchrun (rank 0 serves, "
                          "ranks 1.. are clients)")
    addr, port, default = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), BackendConfig()
    if cfg.backend.master_port not in (default.master_port, port):
        raise ConfigError("backend.master_port", cfg.backend.master_port, f"torchrun's MASTER_PORT {port}, or "
                          "left out: under torchrun the world meets at torchrun's --master-port")

    def addresses(host: str) -> set[str]:
        with contextlib.suppress(OSError):
            return {info[4][0] for info in socket.getaddrinfo(host, None)}
        return {host}

    if cfg.backend.master_addr != default.master_addr and not addresses(cfg.backend.master_addr) & addresses(addr):
        raise ConfigError("backend.master_addr", cfg.backend.master_addr, f"torchrun's MASTER_ADDR {addr!r}, or "
                          "left out: under torchrun the world meets at torchrun's --master-addr")
    if cfg.num_clients != env.world_size - 1 and env.rank == 0:
        log.info(f"torchrun world size {env.world_size}: num_clients = {env.world_size - 1} "
            f"(config said {cfg.num_clients})")
    backend = dataclasses.replace(cfg.backend, master_addr=addr, master_port=port)
    return cfg.replace(num_clients=env.world_size - 1, backend=backend)


@contextlib.contextmanager
def _loopback(master_addr: str, single_node: bool):
    """gloo's interface pinned (see :func:`~repro.real.groups.pin_gloo`), restored afterwards."""
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    pin_gloo(master_addr, single_node)
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
        if before is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = before


def _start_world(cfg: RunConfig, core: RunCore, store, procs: dict, stop: StopRequest, dataset: Dataset | None) -> dict:
    """Spawn the clients (single node) and connect every live rank; {client: Channel}."""
    timeout = cfg.backend.timeout_s
    if store is None:   # torchrun: the world is torchrun's, client k is rank k
        members = {k: k for k in range(1, cfg.num_clients + 1)}
    else:
        procs.update(spawn_clients(cfg, store.port, dataset))
        mark("server", "clients started")
        ready = wait_ready(cfg, core, store, procs, stop)
        mark("server", "clients ready")
        members = {k: r for r, k in enumerate(ready, start=1)}
        store.set(WORLD_KEY, json.dumps({"size": len(members) + 1, "ranks": members}))
        timeout = startup_deadline_s(cfg)
    try:   # in a thread, so a stop is heard at once (torchrun SIGKILLs a worker 30 s after its SIGTERM)
        groups = bounded(lambda: connect(0, len(members) + 1, timeout, store), math.inf, "rendezvous", stop)
    except InterruptedError:
        raise StartupError("interrupted while the clients were joining") from None
    except Exception as exc:   # a rendezvous timeout: some rank never came
        raise StartupError(f"not every client joined within {timeout:g} s (backend.timeout_s="
                            f"{cfg.backend.timeout_s:g}): {first_line(exc)}") from exc
    mark("server", "rendezvous done")
    return {k: Channel(groups[r], r, cfg.backend.client_timeout_s) for k, r in members.items()}


def _dismiss_clients(cfg: RunConfig) -> None:
    """Under torchrun, a skipped run still has clients waiting: join the world and tell each STOP."""
    try:
        groups = connect(0, cfg.num_clients + 1, cfg.backend.timeout_s)
        frame = Frame(0)
        for k, group in groups.items():
            with contextlib.suppress(Exception):
                Channel(group, k, cfg.backend.timeout_s).send(Header(Kind.STOP, k, 0, 0), frame)
    except Exception as exc:
        log.info(f"could not tell the clients that the run is already finished: {exc}")
    finally:
        disconnect()


def run_torchrun_worker(cfg: RunConfig) -> int:
    """Rank > 0 under torchrun: be client ``rank`` until STOP; return the process exit code."""
    env = torchrun_env()
    if env is None or env.rank == 0:
        raise RuntimeError("run_torchrun_worker is for ranks > 0 of a torchrun world")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)   # die quietly when torchrun (or a terminal) says so
    pin_gloo(os.environ["MASTER_ADDR"], single_node=False)
    setup = build_client(cfg, env.rank, device_for(cfg, "client_device", env.local_rank))
    return serve_as_client(cfg, env.rank, env.rank, env.world_size, setup, store=None)

