"""Checkpoint files: written atomically, read back as plain tensors and numbers only.

Both drivers and the warm-start cache save through :func:`save_checkpoint` (temp file, fsync,
rename: a crash or a full disk mid-save leaves the previous file intact and no ``.tmp`` behind)
and read through :func:`read_checkpoint`, which never unpickles anything beyond tensors, numbers,
strings, lists and dicts (``torch.load(weights_only=True)``). A file that is empty, truncated,
carries code or lacks what a checkpoint holds is a :class:`ConfigError` (exit 2) naming the file
and what is wrong; we never suggest loading it unsafely.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from repro import schema
from repro.errors import ConfigError


def save_checkpoint(state: dict, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)   # a full disk or an interrupt: keep the last good file only
        raise


def read_checkpoint(path: Path, device: torch.device | str = "cpu", key: str = "resume") -> dict:
    """The dict in ``path``; ConfigError (for config key ``key``) saying what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(key, str(path), "an existing checkpoint file")
    if path.stat().st_size == 0:
        raise ConfigError(key, str(path), "a checkpoint, not an empty file")
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(key, str(path), "a checkpoint of tensors and numbers only: this file "
                          "holds other objects, and loading it could run code, so it is refused") from None
    except Exception as e:   # torch's readers raise many kinds on bytes they do not expect
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise ConfigError(key, str(path), f"a complete checkpoint: the file is truncated or not "
                          f"a torch checkpoint ({type(e).__name__}: {first})") from None
    if not isinstance(state, dict):
        raise ConfigError(key, str(path), "a checkpoint holding a dict")
    return state


def load_checkpoint(run_dir: Path, kind: str, device: torch.device | str) -> dict:
    """The run folder's checkpoint, which must have been written by the ``kind`` driver and
    hold the server, the run log and the driver's state."""
    path = Path(run_dir) / schema.CHECKPOINT_FILE
    if not path.exists():
        raise ConfigError("resume", True, f"a run folder holding {schema.CHECKPOINT_FILE} "
                          f"(none at {path}: nothing to resume; force=true starts over)")
    state = read_checkpoint(path, device)
    if state.get("kind") != kind:
        raise ConfigError("resume", True, f"a {kind!r} checkpoint ({path} was written by the "
                          f"{state.get('kind')!r} backend)")
    missing = _missing(state, REQUIRED) + _missing(state.get("driver"), DRIVER[kind], "driver.")
    if missing:
        raise ConfigError("resume", str(path), f"a complete checkpoint (it lacks {', '.join(missing)})")
    return state


# What a checkpoint must hold for a resume to read it (key: type), per part.
REQUIRED = {"server": dict, "server.params": torch.Tensor, "server.version": int, "server.rule": dict,
            "runlog": dict, "runlog.version": int, "runlog.samples_seen": int, "runlog.next_eval": float,
            "runlog.time_s": float, "runlog.last_eval_version": int, "runlog.events": list,
            "runlog.final": dict, "runlog.wall_time_s": float, "driver": dict}
DRIVER = {"sim": {"clients": dict, "scheduler": dict}, "real": {"clients": dict}}


def _missing(state, required: dict, prefix: str = "") -> list[str]:
    """The required keys (dotted) absent from ``state`` or of the wrong type."""
    out = []
    for key, kind in required.items():
        node = state
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        ok = isinstance(node, kind) or (kind is float and isinstance(node, int) and not isinstance(node, bool))
        if not ok:
            out.append(prefix + key)
    return out
