"""Disks that refuse writes. :class:`FullDisk`, a fake full disk: the run's own writes (update
rows, checkpoints, JSON files) start failing with ENOSPC at a chosen point (a checkpoint: the
write of its file, as a real disk fails it), patched in with pytest's ``monkeypatch``
(``monkeypatch.undo()`` makes room again). :func:`run_read_only`: a command that sees a folder
read-only (a real read-only mount, in namespaces of its own)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import repro.files.storage
import repro.runs.runlog


class FullDisk:
    """The disk fills up at the ``at``-th update row or checkpoint write: from then on, writes of
    the kinds in ``fails`` raise ENOSPC (a checkpoint after writing part of its temp file),
    except a JSON write once a file was deleted (the run folder's .reserve frees room)."""

    def __init__(self, monkeypatch, at: tuple[str, int], fails: set[str]):
        self.kind, self.at = at
        self.fails, self.full, self.count = fails, False, {"row": 0, "checkpoint": 0}
        write, atomic = repro.runs.runlog.CsvWriter.write, repro.files.storage.atomic_write_text
        atomic_file = repro.files.storage.atomic_write
        disk = self

        def csv_write(writer, row):
            if writer.path.name == "updates.csv":
                disk.tick("row")
            if disk.full and "rows" in disk.fails:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return write(writer, row)

        def half_a_checkpoint(f):
            f.write(b"PK\x03\x04 half a checkpoint")   # into the temp file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def atomic_write(path, write):
            if Path(path).suffix == ".pt":
                disk.tick("checkpoint")
                if disk.full and "checkpoints" in disk.fails:
                    write = half_a_checkpoint
            return atomic_file(path, write)

        def atomic_write_text(path, text):
            reserve = Path(path).parent / repro.runs.runlog.RESERVE_FILE
            if disk.full and "json" in disk.fails and reserve.exists():
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return atomic(path, text)

        monkeypatch.setattr(repro.runs.runlog.CsvWriter, "write", csv_write)
        monkeypatch.setattr(repro.files.storage, "atomic_write_text", atomic_write_text)
        monkeypatch.setattr(repro.files.storage, "atomic_write", atomic_write)

    def tick(self, kind: str) -> None:
        self.count[kind] += 1
        if kind == self.kind and self.count[kind] >= self.at:
            self.full = True



def dev_full_temp(monkeypatch, name: str) -> None:
    """The temporary file through which :func:`repro.files.storage.atomic_write` writes ``name`` is
    /dev/full: its write meets the kernel's own ENOSPC (the temp file is made too, and removed)."""
    def opened(file, mode="r", *args, **kwargs):
        if Path(file).name.startswith(f"{name}.") and Path(file).suffix == ".tmp":
            open(file, mode, *args, **kwargs).close()
            return open("/dev/full", "wb")
        return open(file, mode, *args, **kwargs)
    monkeypatch.setattr(repro.files.storage, "open", opened, raising=False)   # the module's name, before the builtin


# The folder ($1) becomes read-only for the command after it, in a mount namespace of its own
# (a user namespace: no privilege needed, and root's writes are refused too, as on a real one).
_READ_ONLY = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 97; shift; exec "$@"'


def run_read_only(folder: Path, *command: str, **kwargs) -> subprocess.CompletedProcess:
    """``command`` run with ``folder`` read-only (returncode 97: it could not be made so)."""
    return subprocess.run(["unshare", "-rm", "sh", "-c", _READ_ONLY, "sh", str(folder), *command],
                          capture_output=True, text=True, **kwargs)


def read_only_possible(tmp_path: Path) -> bool:
    """Whether this machine lets a test make a folder read-only (unshare, user namespaces)."""
    return shutil.which("unshare") is not None and run_read_only(tmp_path, "true").returncode == 0
