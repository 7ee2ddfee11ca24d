"""MNIST-1D generated offline (``mnist1d.data.make_dataset``), and its cache under ``data.root``
(docs/failures.md, "Caches")."""
from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import numpy as np

from repro.files.locks import FileLock
from repro.files.storage import atomic_write, write_json
from repro.logs import get_logger

log = get_logger("repro.workload.data")
MNIST1D_CACHE_FORMAT = 1   # bump when what a cache file holds changes
MNIST1D_CLASSES = 10       # the generator's digit templates: labels 0..9
_MNIST1D_ARRAYS = ("x", "y", "x_test", "y_test")


def _mnist1d_args(num_samples: int):
    from mnist1d.data import get_dataset_args
    args = get_dataset_args()
    args.num_samples = int(num_samples)
    return args


def _generate_mnist1d(num_samples: int) -> dict[str, np.ndarray]:
    from mnist1d.data import make_dataset
    # make_dataset reseeds Python's and numpy's global RNGs: put them back
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        raw = make_dataset(_mnist1d_args(num_samples))
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return {k: np.ascontiguousarray(raw[k]) for k in _MNIST1D_ARRAYS}


def mnist1d_cache_key(num_samples: int) -> dict:
    """Everything the generated arrays depend on: the generator's arguments and library versions."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:   # pragma: no cover - installed without metadata
            return "unknown"

    args = {k: v for k, v in vars(_mnist1d_args(num_samples)).items() if k != "url"}
    return {"format": MNIST1D_CACHE_FORMAT, "args": args,
            "versions": {p: ver(p) for p in ("mnist1d", "numpy", "scipy")}}


def mnist1d_cache_path(root, num_samples: int) -> Path:
    digest = hashlib.sha1(json.dumps(mnist1d_cache_key(num_samples), sort_keys=True).encode()).hexdigest()[:12]
    return Path(os.path.expanduser(os.fspath(root))) / "mnist1d" / f"n{num_samples}-{digest}.npz"


def mnist1d_arrays(num_samples: int, root) -> dict[str, np.ndarray]:
    """x, y, x_test, y_test of ``num_samples`` samples: cached under ``root``, else generated."""
    if root is None:
        return _generate_mnist1d(num_samples)
    path = mnist1d_cache_path(root, num_samples)
    if (cached := _read_mnist1d_cache(path, num_samples)) is not None:
        return cached
    raw = None
    try:   # one generator at a time: jobs that start together wait for the first one's file
        with FileLock(path.with_name(path.stem + ".lock"), wait=True):
            if (cached := _read_mnist1d_cache(path, num_samples)) is not None:
                return cached
            log.info(f"mnist1d: generating {num_samples} samples once (cached in {path})")
            raw = _generate_mnist1d(num_samples)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, lambda f: np.savez(f, **raw))
            write_json(path.with_suffix(".json"), {**mnist1d_cache_key(num_samples), "file": path.name,
                                                   "shapes": {k: list(v.shape) for k, v in raw.items()}})
    except OSError as exc:   # a root that is a file, read-only or full: the samples are the same uncached
        log.warning(f"mnist1d: cannot cache under data.root {root} ({exc}); using the samples uncached")
    return _generate_mnist1d(num_samples) if raw is None else raw


def _read_mnist1d_cache(path: Path, num_samples: int) -> dict[str, np.ndarray] | None:
    """The cached arrays; None when absent, damaged or mismatched (a warning; pickles are never loaded)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            raw = {k: f[k] for k in _MNIST1D_ARRAYS}
        args = _mnist1d_args(num_samples)
        n_tr = int(num_samples * args.train_split)
        sizes = {"x": n_tr, "y": n_tr, "x_test": num_samples - n_tr, "y_test": num_samples - n_tr}
        for k, v in raw.items():
            kind = "f" if k.startswith("x") else "iu"
            if v.shape[0] != sizes[k] or v.dtype.kind not in kind or v.ndim != (2 if kind == "f" else 1):
                raise ValueError(f"array {k!r} has shape {v.shape} and dtype {v.dtype}")
            if kind == "f" and not np.isfinite(v).all():
                raise ValueError(f"array {k!r} holds non-finite values")
            if kind == "f" and v.shape[1] != args.final_seq_length:
                raise ValueError(f"array {k!r} holds signals of length {v.shape[1]}; the generator "
                                 f"makes {args.final_seq_length}")
            if kind == "iu" and v.size and (v.min() < 0 or v.max() >= MNIST1D_CLASSES):
                raise ValueError(f"array {k!r} holds labels outside 0..{MNIST1D_CLASSES - 1}")
        return raw
    except Exception as exc:   # zipfile, ValueError (pickled objects refused), KeyError, OSError
        log.warning(f"mnist1d: cache file {path} is unusable ({type(exc).__name__}: {exc}); generating it again")
        return None
