"""Advisory file locks that name their holder and never outlive it.

A run folder has one writer, and a warm-start baseline is trained once even when grid jobs start
together: both take a :class:`FileLock`. It is an ``flock`` on a small file that also records the
holder (pid, host, start time). The kernel drops an ``flock`` when its process dies, however it
dies (SIGKILL included), so a dead holder's lock never blocks anyone: the next run takes it over.
Whoever only watches (the analysis, a grid's progress line) asks :func:`read_holder`, the one
probe, which writes nothing.
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
    """The holder record a lock file holds ({} when released, release() empties it, or unreadable)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def read_holder(path: str | Path) -> dict | None:
    """Who holds the lock at ``path``: the holder record while a live process holds it (``{}``
    in the instant between its ``flock`` and its record), None when nobody does. The one way to
    ask: a run folder's reader (:mod:`repro.analysis.load`) and a grid's progress line both call it.

    The kernel's ``flock`` is the truth, not the record: the kernel drops the lock when its holder
    dies, also on another host of a shared file system and when the pid is reused, while a killed
    holder's record stays behind. The probe writes nothing (no lock file is created in a tree an
    observer only reads, none is truncated): a shared lock tried for an instant on a read-only
    descriptor (a writer starting in that instant would be refused and told who holds it). A
    missing or unreadable file is not held."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return _read_holder(fd)
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def lock_held(path: str | Path) -> bool:
    """True while a live process holds the lock at ``path`` (:func:`read_holder`)."""
    return read_holder(path) is not None
