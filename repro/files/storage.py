"""Files that are never half written (atomic writes of text, JSON and checkpoints), a safe reader of
checkpoints, and a failed write said in words naming the folder. torch is imported only where a
checkpoint is touched, so that text, JSON and the command line's answers never load it.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import pickle
import secrets
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from repro.errors import ConfigError

if TYPE_CHECKING:   # for the annotations only: torch is imported where a checkpoint is touched
    import torch

# a write's errno said plainly (the raw "[Errno 28] No space left on device" names no folder nor file)
DISK_FAULTS = {errno.ENOSPC: "no space left on the device holding {folder}",
               errno.EDQUOT: "the disk quota is used up on the device holding {folder}",
               errno.EROFS: "{folder} is on a read-only file system"}


def write_denied(exc: OSError) -> bool:
    """Whether what a write raised says nobody may write there (read-only, or not this user's)."""
    return exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def is_read_only(folder: Path) -> bool:
    """Whether this user may not write ``folder``, asked before writing it."""
    return not os.access(folder, os.W_OK)


def nearest_existing(folder: Path) -> Path | None:
    """``folder`` itself or its nearest parent that exists (None: none does); a link to nothing
    (broken, or a loop) exists: mkdir of it is a FileExistsError."""
    return next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)


def unmakeable(folder: Path) -> str | None:
    """Why ``folder`` cannot be made (asked before Hydra's mkdir would raise), or None. A probe folder
    is made and removed in its nearest existing parent: /proc and some mounts refuse one that access() allows."""
    folder = Path(folder).absolute()
    existing = nearest_existing(folder)   # "/" at the latest
    if existing == folder:   # hydra.run.dir=FILE: Hydra's mkdir raised FileExistsError
        what = "a broken link" if folder.is_symlink() else "a file"   # a link to nothing, or a loop
        return None if folder.is_dir() else f"{folder} is {what}, not a folder"
    if is_read_only(existing):
        return f"{existing} is read-only or not writable"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".repro-probe-", dir=existing))
    except OSError as exc:
        return f"{existing} refuses a new folder ({exc.strerror})"
    return None


def disk_error(exc: OSError, path: Path | str | None) -> OSError:
    """``exc`` as a message naming the cause (:data:`DISK_FAULTS`), the folder and the file; else ``exc``."""
    what = DISK_FAULTS.get(exc.errno)
    if what is None or path is None:
        return exc
    return OSError(exc.errno, what.format(folder=Path(path).parent) + f" while writing {Path(path).name}")


# the longest file name atomic_write can write: its temporary NAME.RANDOM.tmp must fit in 255 bytes too
LONGEST_NAME = 255 - len(".0123456789abcdef.tmp")
PREFIX_BYTES = 100    # the readable start a shortened name keeps


def shortened(name: str, limit: int) -> str:
    """``name`` if it fits in ``limit`` bytes; else its first :data:`PREFIX_BYTES` up to a comma (whole
    settings) and a hash of it all, so that two long names never meet."""
    raw = name.encode()
    if len(raw) <= limit:
        return name
    prefix = raw[:PREFIX_BYTES].decode(errors="ignore")
    prefix = prefix[:prefix.rindex(",")] if "," in prefix else prefix
    return f"{prefix}-{hashlib.sha256(raw).hexdigest()[:16]}"


def atomic_write(path: Path, write: Callable[[IO[bytes]], Any]) -> None:
    """``write(f)`` to a temp file, then rename: a reader never sees half a file, a failed write leaves the
    old file and no temp file (a SIGKILL's stays, ``NAME.RANDOM.tmp``); errors as :func:`disk_error`."""
    path = Path(path)
    # a name and a file of this write's own ("x": made new, as mkstemp does, but with the umask's
    # mode): a shared NAME.tmp was truncated by a second writer, and followed where it was a link
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):   # a read-only file system refuses even this: its first error is told
            tmp.unlink(missing_ok=True)
        interrupt = exc   # the interrupt (not an Exception) that exc is or was raised while handling
        while isinstance(interrupt, Exception):
            interrupt = interrupt.__context__
        if interrupt is not None and interrupt is not exc:
            # a second Ctrl-C inside torch.save makes its zip writer's clean-up fail too; the
            # interrupt, not that follow-on error, is what happened (and is handled upstream)
            raise interrupt from None
        error = disk_error(exc, path) if isinstance(exc, OSError) else exc
        if error is not exc:
            raise error from exc
        raise


class NotRegular(ValueError):
    """A file there but not a regular file: a folder, or a FIFO, whose read would wait for good."""


def read_regular(path: Path, newline: str | None = None) -> str:
    """``path``'s text (``newline``: :func:`open`'s); :class:`NotRegular`, unopened, naming it."""
    if path.exists() and not path.is_file():
        raise NotRegular(f"{path.name} is not a regular file")
    with open(path, newline=newline) as f:
        return f.read()


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(Path(path), json.dumps(obj, indent=2, sort_keys=True, allow_nan=True) + "\n")


def save_checkpoint(state: dict, path: Path) -> None:
    """``state`` to ``path`` whole or not at all. Serialised in memory first: torch's zip writer,
    given a file on a full disk, reports "unexpected pos ..." instead of the disk's error."""
    import torch

    def write(f: IO[bytes]) -> None:   # inside atomic_write: an interrupt in torch.save stays one
        buffer = io.BytesIO()
        torch.save(state, buffer)
        f.write(buffer.getbuffer())

    atomic_write(path, write)


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts) detached and copied to the CPU, so a checkpoint
    loads on any device. A copy, also on the CPU: torch.save writes a view's whole storage."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    return obj


def read_checkpoint(path: Path, device: torch.device | str = "cpu", key: str = "resume") -> dict:
    """The dict in ``path``, loaded ``weights_only``; a ConfigError (for ``key``) saying what is wrong
    with a file that is missing, empty, truncated or carries code: never a hint to load it unsafely."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(key, str(path), "an existing checkpoint file")
    if path.stat().st_size == 0:
        raise ConfigError(key, str(path), "a checkpoint, not an empty file")
    import torch
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(key, str(path), "a checkpoint of tensors and numbers only: this file "
                          "holds other objects, and loading it could run code, so it is refused") from None
    except Exception as e:   # torch's readers raise many kinds on bytes they do not expect
        # torch's first sentence says what broke; the rest is advice for torch's developers
        first = (str(e).splitlines() or [type(e).__name__])[0].split(". ")[0].rstrip(".")
        raise ConfigError(key, str(path), f"a complete checkpoint: this file is damaged, truncated "
                          f"or not a torch checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict):
        raise ConfigError(key, str(path), "a checkpoint holding a dict")
    return state
