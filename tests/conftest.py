"""Suite-wide settings, set in this one place.

**Threads.** torch's CPU thread count changes which kernels run and in what order they reduce, so
it changes float results in the last bits. The suite runs every test at ``REPRO_TEST_THREADS``
torch threads (default 1) whatever ``OMP_NUM_THREADS`` says, and exports the same count to the
processes tests start. Every exactness claim in the suite is stated for a reason that holds at
any thread count (each test says which); run ``REPRO_TEST_THREADS=2 python -m pytest`` (or 4) to
check that.

**Fixtures** shared by several test modules live here; helpers (plain functions and constants)
in :mod:`tests.helpers`.
"""
from __future__ import annotations

import os

THREADS = int(os.environ.get("REPRO_TEST_THREADS", "1"))
# before torch is imported anywhere: OpenMP reads it once, and child processes inherit it
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("MPLBACKEND", "Agg")

import multiprocessing  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)

from repro.sim.driver import simulate  # noqa: E402
from tests.helpers.invariants import check_run_folder  # noqa: E402
from tests.helpers.runs import SIM, STOP_AT  # noqa: E402
from tests.helpers.tables import table_bytes  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A test (or code it calls) that changes the thread count must not change it for the next."""
    yield
    if torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """A test (or an in-process command it runs) that leaves a signal handler behind must not pass
    it on: the processes the next tests start inherit an ignored SIGINT, or get the default in
    place of a handler, and which tests share a process depends on the order the workers draw."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in before.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)


def pytest_xdist_auto_num_workers(config):
    """How many workers pyproject's ``-n auto`` starts (pytest-xdist). The default suite runs on
    every core, at most 8 (each worker imports torch, and many tests start processes of their
    own). A run that names files or tests runs in this process instead, where it starts at once;
    so does one that selects the slow tests (each loads every core itself, with deadlines to
    meet) or the gpu tests (they share one card). ``-n N`` on the command line overrides this."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own reading of the variable
    marks = config.option.markexpr
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or any(
            mark in marks and f"not {mark}" not in marks for mark in ("slow", "gpu")):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, 8) if cores > 1 else 0


def pytest_report_header(config):
    return f"torch {torch.__version__}, {THREADS} thread(s) (REPRO_TEST_THREADS), " \
           f"CPU capability {torch.backends.cpu.get_cpu_capability()}"


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[bytes, bytes]:
    """The tables of SIM run without interruption: what every resumed simulator run must equal."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    assert simulate(SIM, run_dir)["status"] == "completed"
    check_run_folder(run_dir, "completed")
    return table_bytes(run_dir)


@pytest.fixture
def interrupted(tmp_path) -> Path:
    """A simulator run stopped (as by Ctrl-C) at version STOP_AT, checkpointed there."""
    run_dir = tmp_path / "run"
    summary = simulate(SIM, run_dir, stop_at_version=STOP_AT)
    assert summary["status"] == "interrupted" and summary["version"] == STOP_AT
    assert "resume=true" in summary["message"]
    return run_dir


@pytest.fixture
def no_children():
    """The test leaves no child process of this one alive (e.g. a real run's spawned clients)."""
    yield
    assert multiprocessing.active_children() == []


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process and reaches its children, as in a
    terminal, for a test that sends itself a Ctrl-C: pytest started as a background job of a
    non-interactive shell inherits SIGINT ignored (POSIX), and so would every child it starts.
    The handler before it comes back with every test's (_restore_signal_handlers)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
