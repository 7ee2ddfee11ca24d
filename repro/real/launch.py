"""Process plumbing of the real driver: who is rank 0, how ranks start, stop and never outlive a run.

Rank 0 first builds everything that can fail on bad input (the run folder's decision, data,
network, initial parameters: the simulator's, via :mod:`repro.workload.build`, and the run core), so
bad input is a ConfigError before any process starts.

Single node (``run_real`` outside torchrun): the calling process is rank 0, the server, so the
summary comes back as a return value and a Ctrl-C lands in the process that writes the run
folder. It creates the rendezvous store itself (``master_port: 0`` binds a free port; a busy port
is a :class:`~repro.errors.ConfigError`), then starts the clients with the ``spawn`` start
method. Fork or spawn, and why spawn: a forked child inherits a copy of a parent that may
already have run torch with several threads (OpenMP pools, gloo's threads, an evaluator thread),
and such children hang on locks those threads held; spawn pays one fresh interpreter and
``import torch`` per client (seconds, once per run). The config is parsed once in the parent and
handed to each child (``RunConfig`` is a frozen, picklable dataclass). Each child builds its data
and model, marks itself ready in the store, and waits for the world's membership: rank 0 waits
for every client to be ready or dead (a deadline of ``backend.timeout_s`` per core's worth of
processes, since start-up is CPU-bound), then forms the gloo world of the live ones. A client
that dies during start-up is lost, not fatal: the run degrades.

Many nodes (``torchrun``): every rank runs ``python -m repro.run``; rank 0 calls ``run_real``,
which joins torchrun's world from the environment instead of spawning; ranks > 0 call
:func:`run_torchrun_worker`. The world size decides the number of clients (world size - 1). A run
folder that already holds a finished run is skipped by rank 0, which still joins the world to
tell every client STOP. Under ``torchrun --max-restarts=K`` with ``resume=auto``, a restarted job
continues from the last checkpoint.

Stopping: see :mod:`repro.runtime` (SIGINT, SIGTERM, SIGHUP). Spawned children ignore SIGINT (a
terminal's Ctrl-C reaches the whole process group; the parent alone decides), die at once on
SIGTERM, and get SIGKILL from the kernel if the parent dies (``PR_SET_PDEATHSIG``), so no client
outlives its server. At the end the parent joins its children, then terminates and finally
kills any that remain. Under torchrun, ranks > 0 die quietly on SIGINT/SIGTERM.
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import math
import multiprocessing as mp
import multiprocessing.forkserver
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from repro.config.checks import validated
from repro.config.settings import RunConfig
from repro.errors import ConfigError
from repro.logs import mark
from repro.workload.data import Dataset
from repro.workload.start import build_problem
from repro.real.client import build_client, client_device, run_client
from repro.real.elastic import Acceptor
from repro.real.frames import Header, Kind
from repro.real.server import Dispatcher, log, server_device
from repro.real.transport import Channel, connect, disconnect, pin_gloo_to_loopback, pin_gloo_towards
from repro.runs.core import RunCore
from repro.runs.folder import run_folder
from repro.runtime import (StopRequest, TorchrunEnv, deterministic, fork_server_context, torch_threads,
                           torchrun_env, usable_cores)

READY_KEY = "repro_real/ready/{}"
WORLD_KEY = "repro_real/world"
HANDOVER_MAX_BYTES = 16 * 2**20   # hand a data set this small to spawned clients (see _handover)


def startup_deadline_s(cfg: RunConfig) -> float:
    """Start-up is CPU-bound (a fresh interpreter importing torch per process): allow
    ``backend.timeout_s`` per core's worth of processes."""
    cores = os.cpu_count() or 1
    return cfg.backend.timeout_s * max(1.0, math.ceil((cfg.num_clients + 1) / cores))


# ---------------------------------------------------------------------------------------------
# Rank 0
# ---------------------------------------------------------------------------------------------

def run_real(cfg: RunConfig, run_dir: str | Path) -> dict:
    """Run the real driver into ``run_dir`` and return the summary dict (any status; ``failed``
    and ``interrupted`` come back too). Raises ConfigError on bad input, before any process."""
    run_dir, env = Path(run_dir), torchrun_env()
    if env is not None and env.rank != 0:
        raise RuntimeError("run_real is rank 0's entry point; ranks > 0 call run_torchrun_worker")
    master_addr = os.environ["MASTER_ADDR"] if env is not None else cfg.backend.master_addr
    device = server_device(cfg)
    client_device(cfg, 0)   # a bad backend.client_device is a ConfigError before any process
    validated(cfg)   # before the store: a timeout must not overflow it
    store = None if env is not None else _make_store(cfg)   # a busy port: before the folder is touched
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
        run.core = core = RunCore(cfg, problem, run.run_dir, clock="wall", backend="real", resume=resume,
                                  eval_in_thread=cfg.backend.eval_in_thread, measured={"host": host_record(cfg, env)})
        procs: dict = {}
        try:
            channels = _start_world(cfg, core, store, procs, run.stop, _handover(problem.dataset))
        except _StartupError as exc:
            _stop_children(procs, grace_s=0)
            disconnect()
            status = "interrupted" if run.stop.is_set() else "failed"
            log.info(f"start-up {status}: {exc}")
            # nothing was served, so no checkpoint of it: it would lack the clients' state (not
            # made yet) and no resume could read it; a resumed run keeps its last good one, and a
            # fresh one has none, so resume=auto starts it over (a two-host point stopped early)
            return core.finish(status, str(exc), clean=False)
        loop = Dispatcher(cfg, core, channels, run.stop, procs, resume)
        if store is not None:   # single node: the store stays open for joins (repro.real.elastic)
            address = f"{cfg.backend.master_addr}:{store.port}"
            loop.acceptor = Acceptor(loop, store, address)
            loop.acceptor.start()
            log.info(f"accepting joins at {address} (up to backend.max_clients={loop.max_clients} at once): "
                     f"python -m repro.run backend=real <this run's overrides> backend.join={address}")
        return _serve(loop, procs)
    return run.summary


def host_record(cfg: RunConfig, env: TorchrunEnv | None) -> dict:
    """The server's host, as cost=fit needs it (config.json's ``host``): the cores this process
    may run on, torch threads per process, and how many of the run's clients share the host (all
    when spawned on one node; under torchrun the other ranks of rank 0's node)."""
    local = cfg.num_clients if env is None else int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1
    return {"cpu_cores": usable_cores(), "torch_threads": torch.get_num_threads(), "clients_on_host": local}


def _serve(loop: Dispatcher, procs: dict) -> dict:
    """Run the loop, stop every rank whatever happened, then end the run."""
    status = "failed"
    try:
        status, message = loop.run()
    finally:
        mark("server", "served")
        _stop_children(procs, grace_s=10 if status.startswith("completed") else 0)
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


class _StartupError(RuntimeError):
    pass


def world_config(cfg: RunConfig, env: TorchrunEnv) -> RunConfig:
    """Under torchrun the world decides the clients: ranks 1.. of it. The entry point's resolve
    step (:func:`repro.run.resolve`) applies it on every rank before the driver runs."""
    if env.world_size < 2:
        raise ConfigError("WORLD_SIZE", env.world_size, "at least 2 under torchrun (rank 0 serves, "
                          "ranks 1.. are clients)")
    if cfg.num_clients != env.world_size - 1 and env.rank == 0:
        log.info(f"torchrun world size {env.world_size}: num_clients = {env.world_size - 1} "
            f"(config said {cfg.num_clients})")
    return cfg.replace(num_clients=env.world_size - 1)


@contextlib.contextmanager
def _loopback(master_addr: str, single_node: bool):
    """gloo on loopback for a single-node run (see pin_gloo_to_loopback), on the interface towards
    the master under torchrun (see pin_gloo_towards), restored afterwards."""
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    pin_gloo_to_loopback(master_addr, single_node)
    if not single_node:
        pin_gloo_towards(master_addr)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before


def _start_world(cfg: RunConfig, core: RunCore, store, procs: dict, stop: StopRequest,
                 dataset: Dataset | None) -> dict:
    """Spawn the clients (single node) and connect every live rank; {client: Channel}."""
    timeout = cfg.backend.timeout_s
    if store is None:   # torchrun: the world is torchrun's, client k is rank k
        members = {k: k for k in range(1, cfg.num_clients + 1)}
    else:
        procs.update(_spawn_clients(cfg, store.port, dataset))
        mark("server", "clients started")
        ready = _wait_ready(cfg, core, store, procs, stop)
        mark("server", "clients ready")
        members = {k: r for r, k in enumerate(ready, start=1)}
        store.set(WORLD_KEY, json.dumps({"size": len(members) + 1, "ranks": members}))
        timeout = startup_deadline_s(cfg)
    try:
        groups = _connect_watching(len(members) + 1, timeout, store, stop)
    except _StartupError:
        raise
    except Exception as exc:   # a rendezvous timeout: some rank never came
        raise _StartupError(f"not every client joined within {timeout:g} s (backend.timeout_s="
                            f"{cfg.backend.timeout_s:g}): {str(exc).splitlines()[0]}") from exc
    mark("server", "rendezvous done")
    return {k: Channel(groups[r], r, cfg.backend.client_timeout_s) for k, r in members.items()}


def _connect_watching(world_size: int, timeout_s: float, store, stop: StopRequest) -> dict:
    """Rank 0's rendezvous in a thread, so a stop request (torchrun's SIGTERM, a Ctrl-C) is
    heard at once, not after the rendezvous timeout (torchrun SIGKILLs a worker 30 s after its
    SIGTERM, which would leave the summary saying running)."""
    result: dict = {}

    def join() -> None:
        try:
            result["groups"] = connect(0, world_size, timeout_s, store)
        except BaseException as exc:   # handed to the waiting thread
            result["error"] = exc

    thread = threading.Thread(target=join, name="rendezvous", daemon=True)
    thread.start()
    while thread.is_alive():
        if stop.wait(0.1):
            raise _StartupError("interrupted while the clients were joining")
    if "error" in result:
        raise result["error"]
    return result["groups"]


def _make_store(cfg: RunConfig) -> dist.TCPStore:
    """The rendezvous store, listening on ``master_addr`` only (a TCPStore left to itself listens
    on every interface). We bind the socket ourselves: port 0 gets a free port with no race, and
    a busy port is a clear error before anything starts."""
    addr, port = cfg.backend.master_addr, cfg.backend.master_port
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # still fails on a live listener
        sock.bind(sockaddr)
    except OSError as exc:
        raise ConfigError("backend.master_port", port, f"a free port on {addr} (0 picks one): {exc}")
    bound = sock.getsockname()[1]
    # world size None: joiners connect for the whole run, beyond the clients started with it
    return dist.TCPStore(addr, bound, None, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=startup_deadline_s(cfg)),
                         master_listen_fd=sock.detach())   # the store owns the socket now


def _handover(ds: Dataset) -> Dataset | None:
    """The data set to hand to spawned clients, when small: each child then skips loading it
    (importing scikit-learn alone takes seconds per process on a small machine). Large data
    sets are loaded by each child instead of being pickled through a pipe per client."""
    size = sum(t.numel() * t.element_size() for t in (ds.x_train, ds.y_train))
    return ds.to("cpu") if size <= HANDOVER_MAX_BYTES else None


def spawn_context():
    """multiprocessing's spawn context, safe inside a grid's joblib worker: a spawned child first
    re-applies its parent's *process-wide* start method (multiprocessing.spawn.prepare), and in a
    joblib (loky) worker that is 'loky', which a plain child cannot find, so every client would
    die at start-up. There the process-wide method becomes spawn too."""
    if mp.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        mp.set_start_method("spawn", force=True)
    return mp.get_context("spawn")


def client_context(start: bool = False):
    """multiprocessing's fork server, preloaded with this module (``runtime.CLIENT_PRELOAD``;
    ``start``: start it now): the first client of a process starts one fresh interpreter that
    imports torch and the package once, and every client is a fork of it (milliseconds) instead of an interpreter importing everything afresh (seconds of
    CPU each, all at once on a small machine). Safe where plain ``fork`` is not: the fork server
    forks before any torch thread exists in it. A forked child still re-applies the parent's
    process-wide start method, hence the joblib fix of :func:`spawn_context`."""
    spawn_context()
    return fork_server_context(start)


def _spawn_clients(cfg: RunConfig, port: int, dataset: Dataset | None) -> dict:
    ctx = client_context()
    procs = {}
    for k in range(1, cfg.num_clients + 1):
        # the parent's environment now, not the fork server's from its first run (GLOO_SOCKET_IFNAME)
        proc = ctx.Process(target=_client_process, args=(cfg, k, port, os.getpid(), dataset, dict(os.environ)),
                           name=f"repro-client-{k}", daemon=True)
        proc.start()
        procs[k] = proc
    return procs


def _wait_ready(cfg: RunConfig, core: RunCore, store, procs: dict, stop: StopRequest) -> list[int]:
    """Until every client has built its data and model, or died doing so (it is lost, and the
    run goes on with the rest); the ready clients, in order."""
    deadline = time.monotonic() + startup_deadline_s(cfg)
    dead: dict[int, int] = {}
    while True:
        if stop.is_set():
            raise _StartupError("interrupted while the clients were starting")
        ready = [k for k in procs if k not in dead and store.check([READY_KEY.format(k)])]
        for k, p in procs.items():
            if k not in dead and k not in ready and p.exitcode is not None:
                dead[k] = p.exitcode
                core.lose(k, f"process exited with code {p.exitcode} during start-up")
                log.info(f"client {k} exited during start-up (code {p.exitcode}); going on without it")
        if len(ready) + len(dead) == len(procs):
            break
        if time.monotonic() > deadline:
            missing = [k for k in procs if k not in ready and k not in dead]
            raise _StartupError(f"clients {missing} did not start within {startup_deadline_s(cfg):g} s "
                                f"(backend.timeout_s={cfg.backend.timeout_s:g} per core's worth of processes)")
        time.sleep(0.05)
    if not ready:
        raise _StartupError(f"every client exited during start-up (exit codes {dead}); see their errors above")
    return sorted(ready)


def _stop_children(procs: dict, grace_s: float) -> None:
    """Join, then SIGTERM, then SIGKILL (a stopped process only dies of SIGKILL): no orphans."""
    deadline = time.monotonic() + grace_s
    for proc in procs.values():
        proc.join(max(0.0, deadline - time.monotonic()))
    for step in (lambda p: p.terminate(), lambda p: p.kill()):
        alive = [p for p in procs.values() if p.is_alive()]
        for proc in alive:
            step(proc)
        for proc in alive:
            proc.join(2)


def _dismiss_clients(cfg: RunConfig) -> None:
    """Under torchrun, a skipped run still has clients waiting: join the world and tell each STOP."""
    from repro.real.frames import Frame

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


# ---------------------------------------------------------------------------------------------
# Ranks 1..N
# ---------------------------------------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """Die with the run's process, so a SIGKILLed server leaves no client behind, not even a
    stopped one. A client's parent is the fork server; the kernel SIGKILLs the client when the
    fork server dies (``PR_SET_PDEATHSIG``, Linux), and the fork server exits when the last
    holder of its "alive" pipe closes it: the run's process, and every forked child, which
    inherits a copy. So each client closes its copy (multiprocessing keeps it in a private
    attribute, the one private name this module uses), and the fork server then dies with the
    run's process, taking every client along."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
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
    """A client forked by the fork server: set up, mark ready, learn its world rank, connect,
    train, exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent coordinates a Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    os.environ.clear()
    os.environ.update(environ)
    mark("client", "started")
    pin_gloo_to_loopback(cfg.backend.master_addr, single_node=True)
    setup = build_client(cfg, client_id, client_device(cfg, client_id), dataset)
    mark("client", "built")
    timeout = datetime.timedelta(seconds=startup_deadline_s(cfg))
    store = dist.TCPStore(cfg.backend.master_addr, port, cfg.num_clients + 1, False, timeout=timeout)
    store.set(READY_KEY.format(client_id), "1")
    world = json.loads(store.get(WORLD_KEY))
    rank = world["ranks"].get(str(client_id))
    if rank is None:
        sys.exit(0)   # the server went on without this client
    sys.exit(_serve_as_client(cfg, client_id, rank, world["size"], setup, store))


def run_torchrun_worker(cfg: RunConfig) -> int:
    """Rank > 0 under torchrun: be client ``rank`` until STOP; return the process exit code."""
    env = torchrun_env()
    if env is None or env.rank == 0:
        raise RuntimeError("run_torchrun_worker is for ranks > 0 of a torchrun world")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)   # die quietly when torchrun (or a terminal) says so
    pin_gloo_to_loopback(os.environ["MASTER_ADDR"], single_node=False)
    pin_gloo_towards(os.environ["MASTER_ADDR"])
    setup = build_client(cfg, env.rank, client_device(cfg, env.local_rank))
    return _serve_as_client(cfg, env.rank, env.rank, env.world_size, setup, store=None)


def _serve_as_client(cfg: RunConfig, client_id: int, rank: int, world_size: int, setup, store) -> int:
    try:
        groups = connect(rank, world_size, startup_deadline_s(cfg), store)
        mark("client", "rendezvous done")
    except Exception as exc:
        print(f"[real client {client_id}] could not join the run within backend.timeout_s="
              f"{cfg.backend.timeout_s:g} s: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        return 1
    try:
        # watched: the client asks between two local steps whether the server has spoken
        channel = Channel(groups[rank], 0, cfg.backend.timeout_s, watched=True)
        return run_client(cfg, client_id, channel, setup)
    finally:
        disconnect()
