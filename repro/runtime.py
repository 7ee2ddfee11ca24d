"""The process a run lives in: torch threads, the device, deterministic kernels, the fork server,
signals (:class:`StopRequest`), a torchrun world, and what bit-for-bit identity depends on
(:func:`environment`, recorded in config.json; docs/paper.md, "Bit for bit").
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import platform
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from repro.errors import EXIT_INTERRUPTED, ConfigError
from repro.logs import get_logger

if TYPE_CHECKING:   # torch is imported where a function uses it: the command line's answers load none
    import torch

log = get_logger("repro.stop")
SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s)
# What a real run's fork server imports before it forks any client: the launcher, and with it
# torch and the package (repro.real.processes.client_context).
CLIENT_PRELOAD = "repro.real.launch"
FORK_SERVER_DIED = 255   # multiprocessing's exit code for a client whose fork server, its parent, ended
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36   # prctl(2)'s options (Linux)
_exiting = False   # exit_on_signal was called: this process only exits
abandoned: list[threading.Thread] = []   # threads a run stopped waiting for (a hung evaluation)
ABANDONED_S = 5.0   # the most the exit waits for one of them to end


@contextlib.contextmanager
def torch_threads(n: int):
    """torch uses ``n`` CPU threads inside the block (0: leave it), and the caller's count after
    (a test or a sweep that goes on keeps its own)."""
    import torch   # here, not at import: the command line answers without it
    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def seeded(seed: int):
    """Dropout draws from torch's global generator: seed it, so that the same arguments give the
    same tables, and give the caller's back as it was (the CUDA ones are seeded, not restored)."""
    import torch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def cuda_missing() -> str:
    """Why CUDA cannot be used here, in words a user can act on."""
    import torch
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU build"
    return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)"


def resolve_device(name: str) -> torch.device:
    import torch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", name, f"'cpu' or 'auto': {cuda_missing()}")
    return torch.device(name)


@contextlib.contextmanager
def deterministic(device: torch.device):
    """On CUDA, bit-for-bit reproducible kernels for the block: cuDNN deterministic, not autotuning by
    timing; deterministic algorithms (cuBLAS needs a fixed workspace); TF32 off, so float32 is float32
    on every device (a Hopper's TF32 matmuls round to 10-bit mantissas). On the CPU nothing changes."""
    import torch
    if device.type != "cuda":
        yield
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled())
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) = saved[:4]
        torch.use_deterministic_algorithms(saved[4])


def fork_server_context(start: bool = False):
    """multiprocessing's fork server context, preloaded with :data:`CLIENT_PRELOAD`; ``start``:
    start the server now (it imports in the background, and a later client finds it running)."""
    import multiprocessing as mp
    import multiprocessing.forkserver
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([CLIENT_PRELOAD])
    if start:
        # the fork server ignores Ctrl-C only once it has imported torch: one before killed it (a
        # traceback). It is born ignoring SIGINT (which stays ignored across exec); ours is blocked
        # meanwhile, so a Ctrl-C then waits for our handler, not lost.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        main = threading.current_thread() is threading.main_thread()
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            mp.forkserver.ensure_running()
        finally:
            if handler is not None:
                signal.signal(signal.SIGINT, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return ctx


def naming_fork_server(proc, reason: str) -> str:
    """Why a client was lost, naming the clients' fork server when it died: every client dies
    with it (:func:`repro.real.processes._die_with_parent`), and each loss, by its link or its
    exit code 255, would otherwise look like a client's own fault."""
    if proc is None or proc.exitcode != FORK_SERVER_DIED:
        return reason
    return f"the clients' fork server died, and every client with it ({reason})"


def prctl(option: int, value: int) -> None:
    """prctl(2) on Linux (a signal when the parent dies, a subreaper of orphans); nothing
    elsewhere, which has no such call."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value)


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (what joblib's n_jobs=-1 counts, near enough)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1   # pragma: no cover - not Linux


def memory_bytes() -> int:
    """This machine's physical memory, in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device: torch.device | str = "cpu") -> dict:
    """torch build, CPU kernel family, threads and device: what bitwise identity depends on."""
    import torch
    device = torch.device(device)
    env = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,           # None for a CPU build
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),   # the kernel family used
        "cpu_model": cpu_model(),
        "num_threads": torch.get_num_threads(),
        "device": str(device),
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        env["gpu"] = torch.cuda.get_device_name(index)
        env["cudnn"] = torch.backends.cudnn.version()
    return env


class StopRequest(threading.Event):
    """``with StopRequest() as stop:`` ... ``if stop.is_set(): ...``: an event set once SIGINT, SIGTERM
    or SIGHUP asks the process to stop; a second signal since the outermost was entered forces, raising
    ``force(name)`` (default KeyboardInterrupt). ``on_signal(name)`` replaces the first signal's log line.
    Handlers are installed from the main thread only, restored on exit (docs/architecture.md, "Signals")."""

    _active: list["StopRequest"] = []   # entered in this process, innermost last
    _signals: list[str] = []            # received since the outermost was entered
    _pending = ""                       # asked for: a StopRequest entered later starts set

    def __init__(self, on_signal: Callable[[str], None] | None = None,
                 force: Callable[[str], BaseException] | None = None) -> None:
        super().__init__()
        self.reason = ""
        self.on_signal, self.force = on_signal, force
        self._previous: dict = {}

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        super().set()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        StopRequest._signals.append(name)
        if len(StopRequest._signals) > 1:
            raise self.force(name) if self.force else KeyboardInterrupt(f"second {name}: stopping now")
        request_stop(name)
        if self.on_signal is not None:
            self.on_signal(name)
        else:
            log.info(f"{name}: stopping after the current local step (again to force)")

    def __enter__(self) -> "StopRequest":
        if StopRequest._pending:
            self.set(StopRequest._pending)
        StopRequest._active.append(self)
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        if self in StopRequest._active:
            StopRequest._active.remove(self)
        if not StopRequest._active:   # the outermost has ended: a later run starts afresh
            StopRequest._signals.clear()
            StopRequest._pending = ""


def runs_active() -> bool:
    """Whether a StopRequest (a run, the command line) is entered in this process."""
    return bool(StopRequest._active)


def stop_asked() -> bool:
    """Whether a stop was asked of this process's runs (a first signal, :func:`request_stop`)."""
    return bool(StopRequest._pending)


def exit_on_signal() -> None:
    """From here on a signal ends the process at once with :data:`EXIT_INTERRUPTED` (not a finaliser's
    traceback), and is ignored once Python finalises its modules."""
    global _exiting
    if threading.current_thread() is threading.main_thread():
        _exiting = True
        for sig in SIGNALS:
            signal.signal(sig, lambda signum, frame: os._exit(EXIT_INTERRUPTED))


@atexit.register   # at import: it runs after the exit calls registered later (torch's, multiprocessing's)
def _ignore_signals_while_finalising() -> None:
    # After the exit calls, Python resets every handler written in Python to the default before
    # it finalises the modules (CPython's _PySignal_Fini): a Ctrl-C landing then killed the
    # process by the signal (status -2, not 130). Ignoring survives finalisation.
    if _exiting:
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def abandon(thread: threading.Thread) -> None:
    """Leave ``thread`` (a hung evaluation) running until the process exits, and end it first then: the
    interpreter's shutdown ended it inside torch's C++, which aborted the process ('terminate called
    without an active exception', exit 134) after the run folder was final."""
    if not abandoned:
        atexit.register(_end_abandoned)   # after the others registered so far: it runs before them
    abandoned.append(thread)


def _end_abandoned() -> None:
    # SystemExit raised in the thread at its next Python line (between two torch calls) ends it
    # while the interpreter is whole; the process keeps its own exit code, which no exit call
    # knows (one C++ call longer than ABANDONED_S still meets the shutdown, as before)
    for thread in abandoned:
        if thread.is_alive():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
            thread.join(ABANDONED_S)


def request_stop(reason: str) -> None:
    """Ask every StopRequest of this process to stop (and any entered later), as a first signal
    would, without counting as one: safe from any thread."""
    StopRequest._pending = StopRequest._pending or reason
    for request in list(StopRequest._active):
        request.set(reason)


@dataclass(frozen=True)
class TorchrunEnv:
    rank: int
    world_size: int
    local_rank: int


def torchrun_env() -> TorchrunEnv | None:
    """This process's place in a torchrun world, or None when not started by torchrun; a
    ConfigError for a variable that is not a count (left exported by hand: int() raised)."""
    if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    for key in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"):
        if not os.environ.get(key, "0").isdigit():
            raise ConfigError(key, os.environ[key], "a count, as torchrun sets it (outside torchrun, unset "
                              "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")
    return TorchrunEnv(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                       int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))


def named_by_world(argv: list[str], configured: int, num_clients: int) -> list[str]:
    """Under torchrun the world decides ``num_clients`` (:func:`repro.run.resolve`), so rank 0's command
    line says the world's where it differs from the ``configured`` one: the run folder is named by the
    overrides, as the plain run of the resolved config is."""
    said = [a for a in argv if a.lstrip("+").startswith("num_clients=")]   # the resolve step logs the change
    if not said and configured != num_clients:
        return [*argv, f"num_clients={num_clients}"]
    return [a.partition("=")[0] + f"={num_clients}" if a in said else a for a in argv]
