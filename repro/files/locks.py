"""Advisory file locks that name their holder and never outlive it.

A run folder has one writer, and a warm-start baseline is trained once even when grid jobs start
together: both take a :class:`FileLock`. It is an ``flock`` on a small file that also records the
holder (pid, host, start time). The kernel drops an ``flock`` when its process dies, however it
dies (SIGKILL included), so a dead holder's lock never blocks anyone: the next run takes it over.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import time
from pathlib import Path


class LockHeld(RuntimeError):
    """Another live process holds the lock; ``holder`` says who (pid, host, started)."""

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
        super().__init__(f"{path.parent} is being written by another run ({who})")


class FileLock:
    """``with FileLock(path):`` exclusive; ``wait=False`` raises :class:`LockHeld` at once."""

    def __init__(self, path: str | Path, wait: bool = False, poll_s: float = 0.2):
        self.path, self.wait, self.poll_s = Path(path), wait, poll_s
        self._fd: int | None = None

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise LockHeld(self.path, holder) from None
                time.sleep(self.poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_info()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds")}


def _read_holder(fd: int) -> dict:
    try:
        return _parse_holder(os.pread(fd, 4096, 0))
    except OSError:
        return {}


def _parse_holder(data: bytes) -> dict:
    """The holder record a lock file holds ({} when released: release() empties it)."""
    try:
        holder = json.loads(data.decode() or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def read_holder(path: str | Path) -> dict | None:
    """Who holds the lock at ``path``, read without taking it (an observer, e.g. a grid's progress
    line, must not write the file): the holder record while held; None when free, or when the
    holder on this host is dead (the kernel has dropped its lock, the record is only stale)."""
    try:
        holder = _parse_holder(Path(path).read_bytes())
    except OSError:
        return None
    if not holder:
        return None
    if holder.get("host") == socket.gethostname():
        try:
            os.kill(int(holder.get("pid", -1)), 0)
        except (ProcessLookupError, ValueError, OverflowError):
            return None
        except PermissionError:
            pass   # alive, someone else's
    return holder


def is_locked(path: str | Path) -> bool:
    """True while a live process holds the lock at ``path`` (a dead holder's does not count)."""
    try:
        with FileLock(path):
            return False
    except LockHeld:
        return True
    except OSError:
        return False
