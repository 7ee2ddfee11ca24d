"""Data sets (shapes, fixed splits, standardisation), the safe CIFAR-10 parser, client streams."""
from __future__ import annotations

import os
import pickle
import random
import struct

import numpy as np
import pytest
import torch

from repro.config.settings import DataConfig, RunConfig
from repro.errors import ConfigError, DataError
from repro.workload.build import load_data
from repro.workload.cifar import _latin1_encode
from repro.workload.data import DATASETS, ClientStream, Dataset, _mix, load_dataset

# ----------------------------------------------------------------------------- generated data sets


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits")


def test_dataset_names():
    assert DATASETS.names() == ("cifar10", "digits", "mnist1d", "quadratic", "synthetic")


def test_digits_fixed_stratified_split(digits):
    assert digits.name == "digits" and digits.num_classes == 10
    assert digits.x_train.shape == (1437, 1, 8, 8) and digits.x_test.shape == (360, 1, 8, 8)
    assert digits.input_shape == (1, 8, 8) and digits.num_train == 1437
    assert digits.x_train.dtype == torch.float32 and digits.y_train.dtype == torch.int64
    # stratified: every class has 35-37 of the 360 test images (1797 digits, ~180 per class)
    counts = torch.bincount(digits.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    # fixed: another training seed sees exactly the same data
    other = load_data(RunConfig(seed=7))
    assert torch.equal(other.x_train, digits.x_train) and torch.equal(other.y_test, digits.y_test)


def test_digits_read_without_scikit_learn_equal_scikit_learns():
    """The digits are read from the CSV in scikit-learn's wheel and split by stored indices, so no
    process imports scikit-learn (seconds each): the arrays and the split must be exactly those of
    load_digits and train_test_split(..., stratify=y, random_state=0), in the same order."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from repro.workload.data import DIGITS_SPLIT, digits_arrays

    x, y = load_digits(return_X_y=True)
    ours_x, ours_y = digits_arrays()
    assert ours_x.dtype == x.dtype and ours_y.dtype == y.dtype
    assert np.array_equal(ours_x, x) and np.array_equal(ours_y, y)
    train, test = train_test_split(np.arange(len(y)), test_size=360, stratify=y, random_state=0)
    assert np.array_equal(np.load(DIGITS_SPLIT), np.concatenate([train, test]))


def test_loading_digits_imports_no_scikit_learn():
    import subprocess
    import sys

    code = ("import sys; from repro.workload.data import load_dataset; load_dataset('digits'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_digits_standardised_with_train_statistics(digits):
    assert abs(digits.x_train.mean().item()) < 1e-5
    assert digits.x_train.std().item() == pytest.approx(1.0, abs=1e-3)
    # the test set is transformed with the TRAIN statistics, so it is only close to standard
    assert digits.x_test.mean().item() != pytest.approx(0.0, abs=1e-7)
    from sklearn.datasets import load_digits
    raw = load_digits().data / 16.0
    # the affine map is the same for both splits: the smallest raw value 0 maps to one value
    lo_train, lo_test = digits.x_train.min().item(), digits.x_test.min().item()
    assert raw.min() == 0 and lo_train == pytest.approx(lo_test)


def test_digits_subset_takes_first_n(digits):
    small = load_dataset("digits", num_train=100, num_test=50)
    assert small.num_train == 100 and small.y_test.shape == (50,)
    assert torch.equal(small.y_train, digits.y_train[:100])
    with pytest.raises(ConfigError) as info:
        load_dataset("digits", num_train=5000)
    assert info.value.key == "data.num_train" and "1437" in str(info.value)


def test_synthetic_is_fixed_and_learnable():
    a = load_dataset("synthetic")
    b = load_data(RunConfig(seed=123, data=DataConfig(name="synthetic")))
    assert a.x_train.shape == (512, 1, 8, 8) and a.x_test.shape == (128, 1, 8, 8)
    assert a.x_train.dtype == torch.float32 and a.y_train.dtype == torch.int64
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert len(torch.unique(a.y_train)) == 10
    # a linear rule: least squares on one-hot targets separates the training set well
    x = torch.cat([a.x_train.flatten(1), torch.ones(512, 1)], 1).double()
    w = torch.linalg.lstsq(x, torch.nn.functional.one_hot(a.y_train, 10).double()).solution
    assert ((x @ w).argmax(1) == a.y_train).float().mean() > 0.6
    # the test set does not move with the training-set size
    c = load_dataset("synthetic", num_train=64, num_test=16)
    assert c.num_train == 64 and torch.equal(c.x_test, a.x_test[:16])


def test_mnist1d_generated_locally_and_restores_global_rngs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # get_dataset would write a pickle here; make_dataset must not
    random.seed(5)
    np.random.seed(5)
    before = (random.random(), np.random.rand())
    random.seed(5)
    np.random.seed(5)
    ds = load_dataset("mnist1d", num_train=60, num_test=40)
    assert (random.random(), np.random.rand()) == before
    assert os.listdir(tmp_path) == []
    assert ds.x_train.shape == (60, 1, 40) and ds.x_test.shape == (40, 1, 40)
    assert ds.num_classes == 10 and ds.y_train.dtype == torch.int64
    assert abs(ds.x_train.mean().item()) < 1e-5
    assert ds.x_train.std().item() == pytest.approx(1.0, abs=0.02)
    again = load_data(RunConfig(seed=4, data=DataConfig(name="mnist1d", num_train=60, num_test=40)))
    assert torch.equal(again.x_train, ds.x_train) and torch.equal(again.y_test, ds.y_test)


def test_unknown_name_and_bad_sizes():
    with pytest.raises(ConfigError) as info:
        load_dataset("imagenet")
    assert info.value.key == "data.name" and "'digits'" in str(info.value)
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ConfigError) as info:
            load_dataset("synthetic", num_train=bad)
        assert info.value.key == "data.num_train"


def test_to_copies_every_tensor(digits):
    moved = digits.to("cpu")
    assert isinstance(moved, Dataset) and moved.name == "digits"
    assert torch.equal(moved.x_test, digits.x_test) and moved.num_classes == 10


# ----------------------------------------------------------------------------- CIFAR-10 files

PER_BATCH = 20


class _Py2Pickler(pickle._Pickler):
    """Writes what Python 2's cPickle wrote for the official files: byte strings as (SHORT_)BINSTRING
    and numpy's reconstructor as numpy.core.multiarray._reconstruct."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str

    def save_global(self, obj, name=None):
        if getattr(obj, "__name__", None) == "_reconstruct":
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)


def _batch(seed: int, n: int = PER_BATCH) -> dict:
    rng = np.random.default_rng(seed)
    return {b"batch_label": b"batch %d" % seed,
            b"labels": [int(v) for v in rng.integers(0, 10, n)],
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"img_%d.png" % i for i in range(n)]}


def _write(path, obj, py2: bool = False) -> None:
    with open(path, "wb") as f:
        if py2:
            _Py2Pickler(f, protocol=2).dump(obj)
        else:
            pickle.dump(obj, f, protocol=2)


@pytest.fixture()
def cifar_root(tmp_path):
    for i in range(1, 6):
        _write(tmp_path / f"data_batch_{i}", _batch(i))
    _write(tmp_path / "test_batch", _batch(0))
    return tmp_path


def test_cifar_round_trip(cifar_root):
    ds = load_dataset("cifar10", root=str(cifar_root))
    assert ds.x_train.shape == (5 * PER_BATCH, 3, 32, 32) and ds.x_test.shape == (PER_BATCH, 3, 32, 32)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    raw = np.concatenate([_batch(i)[b"data"] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    labels = sum((_batch(i)[b"labels"] for i in range(1, 6)), [])
    assert ds.y_train.tolist() == labels and ds.y_test.tolist() == _batch(0)[b"labels"]
    # per-channel standardisation with train statistics, rows laid out as (channel, row, column)
    mean = raw.mean(axis=(0, 2, 3), keepdims=True)
    std = raw.std(axis=(0, 2, 3), keepdims=True)
    assert np.allclose(ds.x_train.numpy(), (raw - mean) / std, atol=1e-5)
    test_raw = _batch(0)[b"data"].reshape(-1, 3, 32, 32)
    assert np.allclose(ds.x_test.numpy(), (test_raw - mean) / std, atol=1e-5)


def test_cifar_python2_official_encoding(tmp_path):
    for i in range(1, 6):
        _write(tmp_path / f"data_batch_{i}", _batch(i), py2=True)
    _write(tmp_path / "test_batch", _batch(0), py2=True)
    assert b"_codecs" not in (tmp_path / "test_batch").read_bytes()
    ds = load_dataset("cifar10", root=tmp_path, num_train=30, num_test=5)
    assert ds.num_train == 30 and ds.y_test.tolist() == _batch(0)[b"labels"][:5]


def test_cifar_subset_and_parent_folder(cifar_root):
    nested = cifar_root / "cifar-10-batches-py"
    nested.mkdir()
    for f in list(cifar_root.iterdir()):
        if f.is_file():
            f.rename(nested / f.name)
    (nested / "data_batch_5").write_bytes(b"garbage")  # not needed for 30 samples: never parsed
    ds = load_dataset("cifar10", root=str(cifar_root), num_train=30, num_test=7)
    assert ds.num_train == 30 and ds.y_test.shape == (7,)
    assert ds.y_train.tolist() == (_batch(1)[b"labels"] + _batch(2)[b"labels"])[:30]
    with pytest.raises(ConfigError) as info:
        load_dataset("cifar10", root=str(nested), num_train=10, num_test=PER_BATCH + 1)
    assert info.value.key == "data.num_test"


def _expect_data_error(root, *fragments):
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", root=None if root is None else str(root))
    err = info.value
    assert err.key == "data.root" and "cifar-10-python.tar.gz" in str(err)
    for fragment in fragments:
        assert fragment in str(err)
    return err


def test_cifar_missing_root_folder_and_file(tmp_path, cifar_root):
    _expect_data_error(None, "not set")
    _expect_data_error(tmp_path / "nowhere", "nowhere", "does not exist")
    (cifar_root / "data_batch_3").unlink()
    _expect_data_error(cifar_root, "data_batch_3", "file not found")


@pytest.mark.parametrize("corrupt, fragments", [
    (lambda p: p.write_bytes(p.read_bytes()[:5000]), ("not a readable CIFAR-10 batch pickle",)),
    (lambda p: p.write_bytes(b"\x00not a pickle at all"), ("not a readable",)),
    (lambda p: _write(p, [1, 2, 3]), ("expected a pickled dict", "list")),
    (lambda p: _write(p, {**_batch(4), b"data": np.zeros((20, 100), np.uint8)}), ("(n, 3072)", "(20, 100)")),
    (lambda p: _write(p, {**_batch(4), b"data": np.zeros((20, 3072), np.float32)}), ("float32",)),
    (lambda p: _write(p, {k: v for k, v in _batch(4).items() if k != b"data"}), ("b'data'", "NoneType")),
    (lambda p: _write(p, {**_batch(4), b"labels": [1] * 19}), ("b'labels'", "20 integers")),
    (lambda p: _write(p, {**_batch(4), b"labels": [10] * 20}), ("0..9",)),
])
def test_cifar_malformed_batches(cifar_root, corrupt, fragments):
    corrupt(cifar_root / "data_batch_4")
    _expect_data_error(cifar_root, "data_batch_4", *fragments)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_cifar_malicious_pickle_is_refused_without_running(cifar_root, tmp_path):
    marker = tmp_path / "pwned"
    _write(cifar_root / "data_batch_1", {**_batch(1), b"filenames": _Evil(marker)})
    err = _expect_data_error(cifar_root, "data_batch_1", "refusing to load global")
    assert "system" in str(err)
    assert not marker.exists()
    # control: the same payload really would run under an ordinary pickle.load
    with open(cifar_root / "data_batch_1", "rb") as f:
        pickle.load(f, encoding="bytes")
    assert marker.exists()


def test_codecs_encode_only_rebuilds_latin1_bytes():
    assert _latin1_encode("\xff\x00a", "latin1") == b"\xff\x00a"
    with pytest.raises(pickle.UnpicklingError):
        _latin1_encode("x", "zlib_codec")
    with pytest.raises(pickle.UnpicklingError):
        _latin1_encode(b"x", "latin1")


# ----------------------------------------------------------------------------- client streams


def _stream(n=10, batch_size=4, seed=0, client=1):
    # x and y are the sample indices, so a batch says exactly which samples it holds
    return ClientStream(torch.arange(n, dtype=torch.float32)[:, None], torch.arange(n),
                        batch_size, seed, client)


def _take(stream, k):
    return [stream.next_batch()[1].tolist() for _ in range(k)]


def test_stream_epochs_are_seeded_permutations_without_the_partial_batch():
    s = _stream(n=10, batch_size=4, seed=3, client=2)
    first = _take(s, 2)
    assert s.position == (1, 0)  # 2 full batches of 4; the last 2 samples of epoch 0 are dropped
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(_mix(3, 2, 0))).tolist()
    assert first == [perm[0:4], perm[4:8]]
    second = _take(s, 2)
    perm1 = torch.randperm(10, generator=torch.Generator().manual_seed(_mix(3, 2, 1))).tolist()
    assert second == [perm1[0:4], perm1[4:8]] and perm1 != perm
    x, y = _stream().next_batch()
    assert x.shape == (4, 1) and torch.equal(x[:, 0].long(), y)


def test_streams_are_deterministic_and_differ_by_client_and_seed():
    base = _take(_stream(n=50, batch_size=8), 12)
    assert _take(_stream(n=50, batch_size=8), 12) == base
    assert _take(_stream(n=50, batch_size=8, client=2), 12) != base
    assert _take(_stream(n=50, batch_size=8, seed=1), 12) != base
    assert all(len(b) == 8 for b in base)


def test_set_position_reproduces_the_following_batches():
    a = _stream(n=37, batch_size=5, seed=9)
    _take(a, 11)
    saved = a.position
    assert saved == (1, 20)  # 7 batches per epoch: 11 = 7 + 4
    expected = _take(a, 9)
    b = _stream(n=37, batch_size=5, seed=9)
    b.set_position(saved)
    assert _take(b, 9) == expected
    b.set_position((0, 35))  # no full batch left at index 35: that means the next epoch
    assert b.position == (1, 0)
    for bad in ((-1, 0), (0, 38)):
        with pytest.raises(ValueError):
            b.set_position(bad)


def test_stream_rejects_batches_larger_than_the_training_set():
    for bad in (11, 0):
        with pytest.raises(ConfigError) as info:
            _stream(n=10, batch_size=bad)
        assert info.value.key == "algo.batch_size"
    s = _stream(n=10, batch_size=10)
    assert sorted(_take(s, 1)[0]) == list(range(10)) and s.position == (1, 0)


def test_an_mnist1d_cache_root_that_cannot_be_a_folder_gives_the_samples_uncached(tmp_path, caplog):
    """data.root only caches MNIST-1D: a root that is a file (or read-only) raised a raw
    NotADirectoryError and left a failed run folder; the samples are the same without the cache."""
    a_file = tmp_path / "root"
    a_file.write_text("not a folder")
    ds = load_dataset("mnist1d", root=str(a_file), num_train=60, num_test=40)
    plain = load_dataset("mnist1d", num_train=60, num_test=40)
    assert torch.equal(ds.x_train, plain.x_train) and torch.equal(ds.y_test, plain.y_test)
    assert "cannot cache under data.root" in caplog.text and a_file.read_text() == "not a folder"
