"""Checkpoint files: written atomically, read back as plain tensors and numbers only.

Both drivers and the warm-start cache save through :func:`save_checkpoint` (temp file + rename,
so a crash mid-save leaves the previous file intact) and resume through :func:`load_checkpoint`,
which refuses a missing file or one written by the other driver with a :class:`ConfigError`.
Loading uses ``torch.load(weights_only=True)``: nothing beyond tensors, numbers, strings, lists
and dicts is ever unpickled.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from repro import schema
from repro.errors import ConfigError


def save_checkpoint(state: dict, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(run_dir: Path, kind: str, device: torch.device | str) -> dict:
    """The run folder's checkpoint, which must have been written by the ``kind`` driver."""
    path = Path(run_dir) / schema.CHECKPOINT_FILE
    if not path.exists():
        raise ConfigError("resume", True, f"a run folder holding {schema.CHECKPOINT_FILE} "
                          f"(none at {path}; set checkpoint_every > 0 when starting a run)")
    state = torch.load(path, map_location=device, weights_only=True)
    if state.get("kind") != kind:
        raise ConfigError("resume", True, f"a {kind!r} checkpoint ({path} was written by the "
                          f"{state.get('kind')!r} backend)")
    return state
