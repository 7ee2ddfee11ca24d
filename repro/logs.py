"""One logger for the whole package, so a run's messages reach the terminal and its run.log: Hydra
configures logging under ``python -m repro.run`` (``conf/hydra/job_logging/repro.yaml``); anywhere else
(the API, a client process, a test) a fallback handler prints plain lines on stderr.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

NAME = "repro"
TRACE_ENV = "REPRO_STARTUP_TRACE"   # a file: where each process appends its start-up marks


class _Fallback(logging.StreamHandler):
    """Prints only while nobody has configured logging (the root logger has no handler); decided
    per message, because Hydra configures logging after our modules are imported."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def follow_verbose(verbose) -> None:
    """``hydra.verbose=true`` puts every logger at DEBUG (Hydra sets the root's): ours too, whose
    INFO :func:`get_logger` pins for its fallback. Called once Hydra has configured a job's logging."""
    if verbose is True:
        logging.getLogger(NAME).setLevel(logging.DEBUG)


def get_logger(name: str = NAME) -> logging.Logger:
    logger = logging.getLogger(NAME)
    if not any(isinstance(h, _Fallback) for h in logger.handlers):
        handler = _Fallback(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return logging.getLogger(name)


class _Prefixed(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return f"{self.extra['prefix']} {msg}", kwargs


def prefixed(name: str, prefix: str) -> logging.LoggerAdapter:
    """A logger whose messages start with ``prefix`` (``[real server]``, ``[real client 3]``): a
    real run's processes share one terminal, so each line says which process wrote it."""
    return _Prefixed(get_logger(name), {"prefix": prefix})


def mark(role: str, phase: str) -> None:
    """Append ``wall-time role pid phase`` to the file ``$REPRO_STARTUP_TRACE`` names, if set (for
    ``python -m repro.bench startup``): one short O_APPEND write per line, so processes never interleave."""
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as trace:
            trace.write(f"{time.time():.6f}\t{role}\t{os.getpid()}\t{phase}\n")


def detach_files_in(folder) -> None:
    """Stop logging into files inside ``folder`` (a read-only run folder: the run.log handler
    would print a logging error for every line instead of the line)."""
    folder = Path(folder).resolve()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and folder in Path(handler.baseFilename).resolve().parents:
            root.removeHandler(handler)
            handler.close()
