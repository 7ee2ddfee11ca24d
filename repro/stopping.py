"""How a run is asked to stop: signals become a flag the run checks at its next clean point.

SIGINT (Ctrl-C), SIGTERM (a scheduler, ``kill``) and SIGHUP (a closed terminal) all ask for the
same thing: stop after the push being served, write a checkpoint of that clean state and end
``interrupted``. A second signal forces: it raises :class:`KeyboardInterrupt` wherever the main
thread is, and the run still ends ``interrupted`` (keeping the last good checkpoint). Handlers
are installed only from the main thread (Python delivers signals there) and restored on exit, so
a test or a sweep that goes on is left as it was.
"""
from __future__ import annotations

import signal
import threading

from repro.logs import get_logger

log = get_logger("repro.stop")
SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s)


class StopRequest:
    """``with StopRequest() as stop:`` ... ``if stop.is_set(): ...``."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""
        self._previous: dict = {}

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self, reason: str) -> None:
        self.reason = self.reason or reason
        self.event.set()

    def wait(self, timeout_s: float) -> bool:
        return self.event.wait(timeout_s)

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.event.is_set():
            raise KeyboardInterrupt(f"second {name}: stopping now")
        self.set(name)
        log.info(f"{name}: stopping after the current push (again to force)")

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
