"""One logger for the whole package, so a run's messages reach the terminal and its run.log.

Under ``python -m repro.run`` Hydra configures logging (``conf/hydra/job_logging/repro.yaml``):
plain lines on stderr and time-stamped lines in the run folder's ``run.log``. Anywhere else (the
Python API, a spawned client process, a test) nothing is configured, and a fallback handler on
the package's logger prints plain lines on stderr so progress and warnings are still seen.
"""
from __future__ import annotations

import logging
import sys

NAME = "repro"


class _Fallback(logging.StreamHandler):
    """Prints only while nobody has configured logging (the root logger has no handler); decided
    per message, because Hydra configures logging after our modules are imported."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def _install() -> None:
    logger = logging.getLogger(NAME)
    if not any(isinstance(h, _Fallback) for h in logger.handlers):
        handler = _Fallback(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def get_logger(name: str = NAME) -> logging.Logger:
    _install()
    return logging.getLogger(name)


class _Prefixed(logging.LoggerAdapter):
    def process(self, msg, kwargs):
        return f"{self.extra['prefix']} {msg}", kwargs


def prefixed(name: str, prefix: str) -> logging.LoggerAdapter:
    """A logger whose messages start with ``prefix`` (``[real server]``, ``[real client 3]``): a
    real run's processes share one terminal, so each line says which process wrote it."""
    return _Prefixed(get_logger(name), {"prefix": prefix})


def detach_files_in(folder) -> None:
    """Stop logging into files inside ``folder`` (a read-only run folder: the run.log handler
    would print a logging error for every line instead of the line)."""
    from pathlib import Path

    folder = Path(folder).resolve()
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and folder in Path(handler.baseFilename).resolve().parents:
            root.removeHandler(handler)
            handler.close()
