"""How many pytest-xdist workers the suite starts (tests/conftest.py's hook under pyproject's
``-n auto``): the default suite on every core, at most 8; a run naming files or tests, or
selecting the slow or the gpu tests, in the process that was started."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from tests.conftest import pytest_xdist_auto_num_workers as workers

WHOLE = pytest.Config.ArgsSource.TESTPATHS
DEFAULT = "not slow and not gpu"  # pyproject's addopts


def config(marks: str = DEFAULT, source=WHOLE):
    return SimpleNamespace(args_source=source, option=SimpleNamespace(markexpr=marks))


@pytest.fixture
def cores(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)

    def set_cores(n: int):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)), raising=False)
    return set_cores


@pytest.mark.parametrize("n, expected", [(1, 0), (2, 2), (4, 4), (64, 8)])
def test_the_default_suite_gets_a_worker_per_core_up_to_8_and_none_on_one_core(cores, n, expected):
    cores(n)
    assert workers(config()) == expected


@pytest.mark.parametrize("source", [pytest.Config.ArgsSource.ARGS, pytest.Config.ArgsSource.INVOCATION_DIR])
def test_a_run_that_names_its_tests_runs_in_this_process(cores, source):
    cores(4)
    assert workers(config(source=source)) == 0


@pytest.mark.parametrize("marks, expected", [("slow", 0), ("gpu", 0), ("slow and not gpu", 0),
                                             ("not slow", 4), ("not gpu and not slow", 4)])
def test_the_slow_and_the_gpu_tests_run_in_this_process(cores, marks, expected):
    cores(4)
    assert workers(config(marks)) == expected


def test_the_variable_xdist_reads_is_left_to_xdist(cores, monkeypatch):
    cores(4)
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "3")
    assert workers(config()) is None
