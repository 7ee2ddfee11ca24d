"""A figure's grid as its Hydra sweep declares it, expanded into the runs it launches; the
launcher override that runs a shrunk grid's points inside its command's own process; and the
command itself run inside the test's process (:func:`cli_in_process`, :func:`cli_run`)."""
from __future__ import annotations

import itertools
import logging
import signal
import subprocess
import sys

from hydra.core.override_parser.overrides_parser import OverridesParser


# A shrunk grid whose test checks its figure, not its launcher, runs its points one after another
# in the command's process (Hydra's basic launcher), sparing the two worker processes (each
# importing torch) of the experiments' default joblib launcher. The numbers are the same:
# tests/test_grids.py holds joblib workers' tables and figure byte-equal to the basic launcher's.
IN_PROCESS = ("hydra/launcher=basic",)


def cli_in_process(monkeypatch, *args: str) -> int:
    """``python -m repro.run ARGS`` in the test's process: its exit status (0 when it returns).
    For a test of what a command writes (runs, figures), not of its process: it spares a fresh
    interpreter's imports (torch, Hydra, matplotlib: about two seconds on the suite's 2 cores).
    The command's signal handlers, its exit-only mode, its mark of the launching process and
    Hydra's logging are for its own process, not pytest's: put back afterwards, as are the grid's
    points it could not run."""
    from repro import errors, runtime
    from repro import run as cli_module

    monkeypatch.setattr(sys, "argv", ["repro.run", *args])
    monkeypatch.setattr(runtime, "_exiting", runtime._exiting)   # exit_on_signal sets it
    monkeypatch.setattr(cli_module, "_launcher_pid", cli_module._launcher_pid)   # a grid sets it
    handlers = {s: signal.getsignal(s) for s in runtime.SIGNALS}
    root = logging.getLogger()
    logging_state = (root.level, list(root.handlers))
    levels = {name: logging.getLogger(name).level for name in ("repro", "hydra")}   # hydra.verbose sets them
    bad_points = list(errors.BAD_POINTS)
    try:
        cli_module.cli()
    except SystemExit as exc:   # sys.exit(None) is 0; a message, 1 (as the interpreter exits)
        return exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        errors.BAD_POINTS[:] = bad_points
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for handler in set(root.handlers) - set(logging_state[1]):
            handler.close()
        root.setLevel(logging_state[0])
        root.handlers[:] = logging_state[1]
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return 0


def cli_run(monkeypatch, capture, *args: str) -> subprocess.CompletedProcess:
    """:func:`cli_in_process` answered as ``subprocess.run(..., capture_output=True, text=True)``
    answers: its exit status and what it printed (``capture``: pytest's capsys or capfd; what
    the test printed before is left out). For a test of what a refusal says and leaves, not of
    the exit status a fresh interpreter gives (tests/test_startup_imports.py tests that)."""
    capture.readouterr()
    code = cli_in_process(monkeypatch, *args)
    out = capture.readouterr()
    return subprocess.CompletedProcess(["repro.run", *args], code, out.out, out.err)


def sweep_grid(exp: str) -> list[dict]:
    """The runs a figure's sweep launches, expanded as Hydra's basic sweeper does."""
    from tests.helpers.configs import composed

    full = composed([f"+exp={exp}"], hydra=True)
    params = full.hydra.sweeper.params
    assert full.hydra.mode.name == "MULTIRUN"
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[(o.key_or_group, v) for v in o.sweep_iterator()] for o in parsed]
    return [dict(point) for point in itertools.product(*axes)]
