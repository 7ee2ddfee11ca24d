"""Suite-wide settings, set in this one place.

**Threads.** torch's CPU thread count changes which kernels run and in what order they reduce, so
it changes float results in the last bits. The suite runs every test at ``REPRO_TEST_THREADS``
torch threads (default 1) whatever ``OMP_NUM_THREADS`` says, and exports the same count to the
processes tests start. Every exactness claim in the suite is stated for a reason that holds at
any thread count (each test says which); run ``REPRO_TEST_THREADS=2 python -m pytest`` (or 4) to
check that.
"""
from __future__ import annotations

import os

THREADS = int(os.environ.get("REPRO_TEST_THREADS", "1"))
# before torch is imported anywhere: OpenMP reads it once, and child processes inherit it
os.environ["OMP_NUM_THREADS"] = str(THREADS)
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A test (or code it calls) that changes the thread count must not change it for the next."""
    yield
    if torch.get_num_threads() != THREADS:
        torch.set_num_threads(THREADS)


def pytest_report_header(config):
    return f"torch {torch.__version__}, {THREADS} thread(s) (REPRO_TEST_THREADS), " \
           f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
