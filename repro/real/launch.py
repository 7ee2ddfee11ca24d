"""Process plumbing of the real driver: who is rank 0, how ranks start, stop and never outlive a run.

It also owns what rank 0 builds before any process starts (:func:`prepare`: data, network,
initial parameters exactly as the simulator builds them, the checkpoint on resume; then the run
log), so bad input is a ConfigError before anything is spawned.

Single node (``run_real`` outside torchrun): the calling process is rank 0, the server, so the
summary comes back as a return value and a Ctrl-C lands in the process that writes the run
folder. It creates the rendezvous store itself (``master_port: 0`` binds a free port; a busy port
is a :class:`~repro.errors.ConfigError` before anything starts), then starts the clients, ranks
1..N, with the ``spawn`` start method. Fork or spawn, and why spawn: a forked child inherits a
copy of a parent that may already have run torch with several threads (OpenMP pools, gloo's
threads, an evaluator thread), and such children hang on locks those threads held; spawn pays
one fresh interpreter and ``import torch`` per client (seconds, once per run). The config is
parsed once in the parent and handed to each child (``RunConfig`` is a frozen, picklable
dataclass). Each child builds its data and model first, then marks itself ready in the store;
the parent waits for all ready marks in a Python loop that also watches for children that died
and for Ctrl-C, so a bad peer is a clear error within ``backend.timeout_s`` and start-up can be
interrupted.

Many nodes (``torchrun``): every rank runs ``python -m repro.run``; rank 0 calls ``run_real``,
which joins torchrun's world from the environment instead of spawning; ranks > 0 call
:func:`run_torchrun_worker`. The world size decides the number of clients (world size - 1).

GPUs: spawned client ``k`` trains on ``cuda:(k-1) mod G``; under torchrun, on ``cuda:LOCAL_RANK
mod G`` (so on rank 0's node GPU 0 is left to rank 0, whose parameters stay on the CPU unless
``backend.server_device=cuda``). Without GPUs every client is a CPU process with
``num_threads`` (default 1) torch threads, as is the server.

Stopping. SIGINT/SIGTERM to rank 0 set a flag its main thread checks every 50 ms; from then on
no push is served (a second SIGINT forces). Spawned children ignore SIGINT (a terminal's Ctrl-C reaches the whole process group;
the parent alone decides), die at once on SIGTERM, and get SIGKILL from the kernel if the parent
dies (``PR_SET_PDEATHSIG``), so no client outlives its server. At the end the parent joins its
children, then terminates and finally kills any that remain. Under torchrun, ranks > 0 die
quietly on SIGINT/SIGTERM (torchrun's agent signals them).
"""
from __future__ import annotations

import contextlib
import ctypes
import datetime
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from repro import schema
from repro.algorithm import Server
from repro.config import RunConfig, to_dict
from repro.data import Dataset
from repro.environment import environment
from repro.errors import ConfigError
from repro.real.client import build_client, client_device, run_client
from repro.checkpoint import load_checkpoint
from repro.real.server import Evaluator, ServerLoop, log
from repro.real.transport import Channel, connect, disconnect, pin_gloo_to_loopback
from repro.runlog import RunLog, truncate_csv

READY_KEY = "repro_real/ready/{}"
HANDOVER_MAX_BYTES = 16 * 2**20   # hand a data set this small to spawned clients (see _handover)


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int


def torchrun_env() -> TorchrunEnv | None:
    """This process's place in a torchrun world, or None when not started by torchrun."""
    keys = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    if not all(k in os.environ for k in keys):
        return None
    return TorchrunEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))


# ---------------------------------------------------------------------------------------------
# Rank 0
# ---------------------------------------------------------------------------------------------

@dataclass
class Prepared:
    """Rank 0's state before any process starts: building it validates the config and data."""

    cfg: RunConfig
    server: Server
    evaluator: Evaluator
    dataset: Dataset   # on the server's device
    checkpoint: dict | None

    @property
    def num_train(self) -> int:
        return self.dataset.num_train


def server_device(cfg: RunConfig) -> torch.device:
    if cfg.backend.server_device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("backend.server_device", "cuda", "'cpu' (this machine has no CUDA device)")
    return torch.device(cfg.backend.server_device)


def prepare(cfg: RunConfig, run_dir: Path) -> Prepared:
    """Data, network, initial parameters (the simulator's: same seed, same warm start) and, on
    resume, the checkpoint's server state."""
    from repro.sim import build_problem  # one definition of "what is trained" for both drivers

    device = server_device(cfg)
    problem = build_problem(cfg, device)
    server = problem.make_server(cfg)   # warm start: parameters and the rule state
    checkpoint = load_checkpoint(run_dir, "real", device) if cfg.resume else None
    if checkpoint is not None:
        server.load_state_dict(checkpoint["server"])
    evaluator = Evaluator(problem.worker, problem.eval_sets, cfg.backend.eval_in_thread)
    return Prepared(cfg, server, evaluator, problem.dataset, checkpoint)


def open_runlog(prep: Prepared, run_dir: Path) -> RunLog:
    """On resume the tables are cut back to the checkpoint's version: no row duplicated or lost."""
    cfg = prep.cfg
    if prep.checkpoint is not None:
        # An evaluation still running when the checkpoint was taken may have written its row
        # since; the resumed run redoes it (eval_due() is true again), so drop that row first.
        truncate_csv(Path(run_dir) / schema.EVALS_FILE, int(prep.checkpoint["runlog"]["last_eval_version"]))
    recorded = {**to_dict(cfg), "environment": environment(prep.server.params.device)}
    return RunLog(run_dir, recorded, clock="wall", backend="real", num_train=prep.num_train,
                  eval_every=cfg.eval_every, target_error=cfg.target_error,
                  resume_from=prep.checkpoint["runlog"] if prep.checkpoint else None)


def run_real(cfg: RunConfig, run_dir: str | Path) -> dict:
    """Run the real driver into ``run_dir`` and return the summary dict (any status; ``failed``
    and ``interrupted`` come back too). Raises ConfigError on bad input, before any process."""
    run_dir, env = Path(run_dir), torchrun_env()
    if env is not None:
        cfg = _clients_from_world(cfg, env)
    master_addr = os.environ["MASTER_ADDR"] if env is not None else cfg.backend.master_addr
    with _server_process(cfg, master_addr) as stop_requested:
        prep = prepare(cfg, run_dir)                  # validates config and data first
        store = None if env is not None else _make_store(cfg)
        runlog = open_runlog(prep, run_dir)
        procs: dict = {}
        try:
            channels = _start_world(cfg, store, procs, stop_requested, _handover(prep.dataset))
        except (_StartupError, KeyboardInterrupt) as exc:   # KeyboardInterrupt: a second Ctrl-C
            _stop_children(procs, grace_s=0)
            disconnect()
            status = "interrupted" if stop_requested.is_set() else "failed"
            log(f"start-up {status}: {exc or 'interrupted'}")
            summary = runlog.write_summary(status, message=str(exc), num_clients=cfg.num_clients)
            runlog.close()
            return summary
        return _serve(ServerLoop(prep, runlog, channels, stop_requested, procs), procs)


def _start_world(cfg: RunConfig, store, procs: dict, stop_requested: threading.Event,
                 dataset: Dataset | None) -> dict:
    """Spawn the clients (single node) and connect every rank; {client: Channel}."""
    if store is not None:
        procs.update(_spawn_clients(cfg, store.port, dataset))
        _wait_ready(cfg, store, procs, stop_requested)
    try:
        groups = connect(0, cfg.num_clients + 1, cfg.backend.timeout_s, store)
    except Exception as exc:   # a rendezvous timeout: some rank never came
        raise _StartupError(f"not every client joined within backend.timeout_s="
                            f"{cfg.backend.timeout_s:g} s: {str(exc).splitlines()[0]}") from exc
    return {k: Channel(g, k, cfg.backend.client_timeout_s) for k, g in groups.items()}


def _serve(loop: ServerLoop, procs: dict) -> dict:
    """Run the loop, then stop every rank whatever happened, then write the summary."""
    status = "failed"
    try:
        status = loop.run()
    except BaseException as exc:   # a bug, or a forced second Ctrl-C: still clean up below
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        loop.message = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        _stop_children(procs, grace_s=10 if status.startswith("completed") else 0)
        loop.join_receivers(timeout_s=2 if procs or status == "interrupted" else 10)
        disconnect()
    summary = loop.runlog.write_summary(status, message=loop.message, num_clients=loop.cfg.num_clients,
                                        lost_clients=sorted(loop.lost),
                                        client_devices={str(k): d for k, d in sorted(loop.devices.items())})
    loop.runlog.close()
    log(f"{status}: version {summary['version']} epoch {summary['epoch']:.2f}"
        + (f" ({loop.message})" if loop.message else ""))
    return summary


class _StartupError(RuntimeError):
    pass


def _clients_from_world(cfg: RunConfig, env: TorchrunEnv) -> RunConfig:
    if env.rank != 0:
        raise RuntimeError("run_real is rank 0's entry point; ranks > 0 call run_torchrun_worker")
    if env.world_size < 2:
        raise ConfigError("WORLD_SIZE", env.world_size, "at least 2 under torchrun (rank 0 serves, "
                          "ranks 1.. are clients)")
    if cfg.num_clients != env.world_size - 1:
        log(f"torchrun world size {env.world_size}: num_clients = {env.world_size - 1} "
            f"(config said {cfg.num_clients})")
    return cfg.replace(num_clients=env.world_size - 1)


@contextlib.contextmanager
def _server_process(cfg: RunConfig, master_addr: str):
    """Rank 0's process-wide settings for the run, restored afterwards (the caller may be a test
    or a sweep that goes on): CPU threads, gloo on loopback, and SIGINT/SIGTERM -> a stop flag."""
    threads, ifname = torch.get_num_threads(), os.environ.get("GLOO_SOCKET_IFNAME")
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    pin_gloo_to_loopback(master_addr)
    stop_requested = threading.Event()
    previous = _install_stop_handlers(stop_requested)
    try:
        yield stop_requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        torch.set_num_threads(threads)
        if ifname is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)


def _install_stop_handlers(stop_requested: threading.Event) -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}   # signals are delivered to the main thread only; its owner handles them

    def handler(signum, frame):
        if stop_requested.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt   # second Ctrl-C: stop waiting for a clean end
        stop_requested.set()
        log(f"{signal.Signals(signum).name}: stopping every rank (Ctrl-C again to force)")

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


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
    return dist.TCPStore(addr, bound, cfg.num_clients + 1, True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=cfg.backend.timeout_s),
                         master_listen_fd=sock.detach())   # the store owns the socket now


def _handover(ds: Dataset) -> Dataset | None:
    """The data set to hand to spawned clients, when small: each child then skips loading it
    (importing scikit-learn alone takes seconds per process on a small machine). Large data
    sets are loaded by each child instead of being pickled through a pipe per client."""
    size = sum(t.numel() * t.element_size() for t in (ds.x_train, ds.y_train))
    return ds.to("cpu") if size <= HANDOVER_MAX_BYTES else None


def _spawn_clients(cfg: RunConfig, port: int, dataset: Dataset | None) -> dict:
    ctx = mp.get_context("spawn")
    procs = {}
    for k in range(1, cfg.num_clients + 1):
        proc = ctx.Process(target=_client_process, args=(cfg, k, port, os.getpid(), dataset),
                           name=f"repro-client-{k}", daemon=True)
        proc.start()
        procs[k] = proc
    return procs


def _wait_ready(cfg: RunConfig, store, procs: dict, stop_requested: threading.Event) -> None:
    """Until every client has built its data and model (then the gloo rendezvous is quick)."""
    deadline = time.monotonic() + cfg.backend.timeout_s
    keys = [READY_KEY.format(k) for k in procs]
    while not store.check(keys):
        if stop_requested.is_set():
            raise _StartupError("interrupted while the clients were starting")
        dead = {k: p.exitcode for k, p in procs.items() if p.exitcode is not None}
        if dead:
            raise _StartupError(f"client process(es) exited before connecting (exit codes {dead}); "
                                f"see their errors above")
        if time.monotonic() > deadline:
            missing = [k for k in procs if not store.check([READY_KEY.format(k)])]
            raise _StartupError(f"clients {missing} did not connect within backend.timeout_s="
                                f"{cfg.backend.timeout_s:g} s")
        time.sleep(0.05)


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


# ---------------------------------------------------------------------------------------------
# Ranks 1..N
# ---------------------------------------------------------------------------------------------

def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux), so a SIGKILLed
    server leaves no client behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:   # the parent died before prctl took effect
        os._exit(1)


def _client_process(cfg: RunConfig, rank: int, port: int, parent_pid: int,
                    dataset: Dataset | None) -> None:
    """A spawned client (spawn mode): set up, mark ready, connect, train, exit with its code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # the parent coordinates a Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent(parent_pid)
    setup = build_client(cfg, rank, client_device(rank - 1), dataset)
    timeout = datetime.timedelta(seconds=cfg.backend.timeout_s)
    store = dist.TCPStore(cfg.backend.master_addr, port, cfg.num_clients + 1, False, timeout=timeout)
    store.set(READY_KEY.format(rank), "1")
    sys.exit(_serve_as_client(cfg, rank, setup, store))


def run_torchrun_worker(cfg: RunConfig) -> int:
    """Rank > 0 under torchrun: be client ``rank`` until STOP; return the process exit code."""
    env = torchrun_env()
    if env is None or env.rank == 0:
        raise RuntimeError("run_torchrun_worker is for ranks > 0 of a torchrun world")
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)   # die quietly when torchrun (or a terminal) says so
    cfg = cfg.replace(num_clients=env.world_size - 1)
    pin_gloo_to_loopback(os.environ["MASTER_ADDR"])
    setup = build_client(cfg, env.rank, client_device(env.local_rank))
    return _serve_as_client(cfg, env.rank, setup, store=None)


def _serve_as_client(cfg: RunConfig, rank: int, setup, store) -> int:
    try:
        groups = connect(rank, cfg.num_clients + 1, cfg.backend.timeout_s, store)
    except Exception as exc:
        print(f"[real client {rank}] could not join the run within backend.timeout_s="
              f"{cfg.backend.timeout_s:g} s: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        return 1
    try:
        return run_client(cfg, rank, Channel(groups[rank], 0, cfg.backend.timeout_s), setup)
    finally:
        disconnect()
