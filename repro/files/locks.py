"""Advisory file locks that name their holder and never outlive it: an ``flock`` (which the kernel drops
when its process dies, SIGKILL included) on a small file recording the holder (pid, host, start time).
A run folder's writer and the warm-start baseline take one; watchers ask :func:`read_holder`.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path


PROBE_GRACE_S = 0.1   # how long a refused writer retries (see FileLock.acquire)


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
        # an observer's probe (read_holder) holds a shared lock for an instant: a lock still held
        # after PROBE_GRACE_S is a writer's
        refuse_at = time.monotonic() + PROBE_GRACE_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not self.wait and time.monotonic() >= refuse_at:
                    holder = _read_holder(fd)
                    os.close(fd)
                    raise LockHeld(self.path, holder) from None
                time.sleep(self.poll_s if self.wait else 0.005)
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

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds")}


def _read_holder(fd: int) -> dict:
    """The holder record a lock file holds ({} when released or unreadable)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def read_holder(path: str | Path) -> dict | None:
    """Who holds the lock at ``path``: the holder record while a live process holds it (``{}`` between its
    ``flock`` and its record), else None. The kernel's ``flock`` decides, not a killed holder's record; the
    probe writes nothing (a shared lock tried for an instant on a read-only descriptor)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as e:
        return _read_holder(fd) if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    finally:
        os.close(fd)
    return None


def lock_held(path: str | Path) -> bool:
    """True while a live process holds the lock at ``path`` (:func:`read_holder`)."""
    return read_holder(path) is not None
