"""The CIFAR-10 python batches, read safely: a pickle can run code, so :func:`read_batch` rebuilds
only dicts, lists, numbers, bytes and plain numpy arrays, and checks them (uint8 3x32x32 images,
labels 0..9). Every fault is a :class:`~repro.errors.DataError` on ``data.root`` saying what is wrong."""
from __future__ import annotations

import os
import pickle

import numpy as np

from repro.config.settings import CIFAR10_EXPECTED
from repro.errors import DataError

try:  # numpy >= 2 spelling; numpy.core is a deprecated alias there
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"


def _latin1_encode(text, encoding="latin1"):
    """The one use of ``_codecs.encode`` in a protocol-2 pickle written by Python 3: bytes."""
    if not isinstance(text, str) or not isinstance(encoding, str) \
            or encoding.lower().replace("-", "").replace("_", "") != "latin1":
        raise pickle.UnpicklingError(f"refusing _codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    # Python 3 pickles bytes at protocol 2 as _codecs.encode(str, 'latin1'): re-pickled batches load too
    ("_codecs", "encode"): _latin1_encode,
}


class _BatchUnpickler(pickle.Unpickler):
    """Refuses any global but :data:`_SAFE_GLOBALS` before it is looked up."""

    def find_class(self, module, name):
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return _SAFE_GLOBALS[module, name]


def _error(root, detail: str) -> DataError:
    err = DataError("data.root", root, CIFAR10_EXPECTED)
    err.args = (f"{detail}. {err.args[0]}",)
    return err


def read_batch(path: str, root) -> tuple[np.ndarray, np.ndarray]:
    """One batch file → (uint8 (n, 3, 32, 32), int64 (n,)), or DataError naming what is wrong."""
    def bad(what: str) -> DataError:
        return _error(root, f"CIFAR-10 file {path}: {what}")

    if not os.path.isfile(path):
        raise bad("file not found")
    try:
        with open(path, "rb") as f:
            # encoding='bytes': the official files are Python 2 pickles with byte-string keys
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # truncated/garbled pickles raise many types; all mean "bad file"
        raise bad(f"not a readable CIFAR-10 batch pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict):
        raise bad(f"expected a pickled dict, found {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        found = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise bad(f"b'data' must be a uint8 array of shape (n, 3072), found {found}")
    labels = np.asarray(labels) if isinstance(labels, (list, np.ndarray)) else None
    if labels is None or labels.shape != (data.shape[0],) or labels.dtype.kind not in "iu" \
            or (labels.size and (labels.min() < 0 or labels.max() > 9)):
        raise bad(f"b'labels' must be a list of {data.shape[0]} integers in 0..9")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def find_folder(root) -> str:
    if root is None:
        raise _error(root, "data 'cifar10' reads its files from data.root, which is not set")
    root_str = os.path.expanduser(os.fspath(root))
    # accept the folder above the extracted archive too (…/cifar-10-batches-py)
    nested = os.path.join(root_str, "cifar-10-batches-py")
    if not os.path.exists(os.path.join(root_str, TEST_FILE)) and os.path.isdir(nested):
        return nested
    if not os.path.isdir(root_str):
        raise _error(root, f"CIFAR-10 folder {root_str} does not exist")
    return root_str


def check_source(root) -> None:
    """The folder, its first training batch and its test batch exist (contents are checked as read)."""
    folder = find_folder(root)
    for name in (TRAIN_FILES[0], TEST_FILE):
        if not os.path.isfile(os.path.join(folder, name)):
            raise _error(root, f"CIFAR-10 file {os.path.join(folder, name)}: file not found")
