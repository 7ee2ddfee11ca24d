"""The data sets users name with ``data=...`` (fixed train/test splits, standardised) and
:class:`ClientStream`, each client's seeded order over the training set. The training ``seed``
never changes which samples are in the train or test set."""
from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from repro.errors import ConfigError
from repro.workload import cifar
from repro.workload.datacache import mnist1d_arrays
from repro.registry import Registry

if TYPE_CHECKING:   # torch is imported where tensors are made: a skipped grid point reads DATASETS
    import torch


@dataclass(frozen=True)
class DataSpec:
    """A registered data set: ``load(root, num_train, num_test) -> Dataset`` and what is known before."""
    load: Callable[..., "Dataset"]
    input_shape: tuple[int, ...]
    num_classes: int
    task: str = "classification"   # or "quadratic" (the loss the worker minimises)
    check_source: Callable[..., None] | None = None   # DataError for missing files, before Hydra makes a folder
    num_train: int | None = None   # training-set size when data.num_train is null (None: unknown)


DATASETS: Registry[DataSpec] = Registry("data.name", DataSpec)


@dataclass(frozen=True, eq=False)  # eq=False: comparing tensors with == has no single truth value
class Dataset:
    """A training and a test set, already standardised with training-set statistics."""
    name: str
    x_train: torch.Tensor  # float32, (N, *input_shape)
    y_train: torch.Tensor  # int64, (N,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    task: str = "classification"   # "quadratic": loss 0.5 (w.x)^2, errors meaningless (0)
    facts: dict = dataclasses.field(default_factory=dict)   # config.json's "dataset": the analysis reads it

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    def to(self, device) -> "Dataset":
        """A copy with all four tensors on ``device`` (e.g. the GPU, so minibatches never cross PCIe)."""
        return dataclasses.replace(self, x_train=self.x_train.to(device), y_train=self.y_train.to(device),
                                   x_test=self.x_test.to(device), y_test=self.y_test.to(device))


def load_dataset(name: str, *, root: str | None = None,
                 num_train: int | None = None, num_test: int | None = None) -> Dataset:
    """Data set ``name``: the first ``num_train``/``num_test`` samples of its fixed split (how many
    are generated, for ``synthetic`` and ``mnist1d``); ``root``: its files or cache."""
    return DATASETS[name].load(root, _check_count("data.num_train", num_train), _check_count("data.num_test", num_test))


def check_batch_size(batch_size, num_train: int, key: str = "algo.batch_size") -> None:
    """A minibatch is 1 to ``num_train`` samples (every step sees exactly ``batch_size``)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= num_train:
        raise ConfigError(key, batch_size, f"an integer from 1 to the training-set size {num_train}")


def _check_count(key: str, n):
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(key, n, "a positive integer or null (the data set's default size)")
    return int(n)


def _take(key: str, x: np.ndarray, y: np.ndarray, n: int | None):
    """The first ``n`` samples (all when ``n`` is None); asking for more than exist is an error."""
    if n is None:
        return x, y
    if n > len(y):
        raise ConfigError(key, n, f"at most {len(y)} (the samples this data set has)")
    return x[:n], y[:n]


def _finish(name: str, train: tuple, test: tuple, num_train: int | None, num_test: int | None,
            channel_dims: tuple[int, ...] | None) -> Dataset:
    """The first ``num_train``/``num_test`` samples of a 10-class set, standardised with training
    statistics only (``channel_dims``: the dims reduced per channel; None: one scalar mean/std).
    In float32, in place: CIFAR-10's training set is 600 MB as float32, twice that as float64."""
    import torch
    x_train, y_train = _take("data.num_train", *train, num_train)
    x_test, y_test = _take("data.num_test", *test, num_test)
    # torch.tensor always copies: safe to modify in place
    x_train, x_test = (torch.tensor(x, dtype=torch.float32) for x in (x_train, x_test))
    std, mean = torch.std_mean(x_train, dim=channel_dims, correction=0, keepdim=channel_dims is not None)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant input stays 0, not NaN
    for x in (x_train, x_test):
        x.sub_(mean).div_(std)
    as_y = lambda a: torch.tensor(np.asarray(a), dtype=torch.int64)  # noqa: E731
    return Dataset(name, x_train, as_y(y_train), x_test, as_y(y_test), 10)


DIGITS_SPLIT = Path(__file__).with_name("digits_split.npy")   # train indices, then test indices


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's ``load_digits(return_X_y=True)`` read from its wheel's CSV (importing sklearn takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ConfigError("data", "digits", "scikit-learn installed (it ships the digits data set): "
                          "pip install scikit-learn")
    with gzip.open(Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int, copy=False)


@DATASETS.register("digits", input_shape=(1, 8, 8), num_classes=10, num_train=1437)
def _load_digits(root, num_train, num_test) -> Dataset:
    """sklearn's 8x8 digits, split 1437/360 by stored indices (docs/getting-started.md)."""
    x, y = digits_arrays()
    x = (x / 16.0).reshape(-1, 1, 8, 8)
    order = np.load(DIGITS_SPLIT, allow_pickle=False).astype(np.int64)
    train, test = order[:-360], order[-360:]
    return _finish("digits", (x[train], y[train]), (x[test], y[test]), num_train, num_test, None)


MNIST1D_DEFAULT_TRAIN, MNIST1D_DEFAULT_TEST = 4000, 1000


@DATASETS.register("mnist1d", input_shape=(1, 40), num_classes=10, num_train=MNIST1D_DEFAULT_TRAIN)
def _load_mnist1d(root, num_train, num_test) -> Dataset:
    """MNIST-1D generated locally (never downloaded): train the first ``num_train`` samples, test the
    last ``num_test``; the defaults are the library's own split. ``root``: a cache folder, or None."""
    n_tr = MNIST1D_DEFAULT_TRAIN if num_train is None else num_train
    n_te = MNIST1D_DEFAULT_TEST if num_test is None else num_test
    # make_dataset draws whole classes of (num_samples // 10) samples: round up to a multiple of 10.
    raw = mnist1d_arrays(-(-(n_tr + n_te) // 10) * 10, root)
    x = np.concatenate([raw["x"], raw["x_test"]])[:, None, :]
    y = np.concatenate([raw["y"], raw["y_test"]])
    return _finish("mnist1d", (x[:n_tr], y[:n_tr]), (x[len(y) - n_te:], y[len(y) - n_te:]),
                   num_train=None, num_test=None, channel_dims=None)   # already cut to size, not images


_SYNTHETIC_SEED = 1234  # fixed: the data must not depend on the training seed
SYNTHETIC_DEFAULT_TRAIN, SYNTHETIC_DEFAULT_TEST = 512, 128


@DATASETS.register("synthetic", input_shape=(1, 8, 8), num_classes=10, num_train=SYNTHETIC_DEFAULT_TRAIN)
def _load_synthetic(root, num_train, num_test) -> Dataset:
    """Gaussian 1x8x8 inputs labelled by argmax of a fixed random linear map: learnable, tiny."""
    import torch
    weights = torch.randn(64, 10, generator=torch.Generator().manual_seed(_SYNTHETIC_SEED))

    def draw(n: int, stream: int):
        # one generator per split, so the test set does not change with num_train
        x = torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(_SYNTHETIC_SEED + stream))
        return x, (x.flatten(1) @ weights).argmax(1)

    x_tr, y_tr = draw(SYNTHETIC_DEFAULT_TRAIN if num_train is None else num_train, 1)
    x_te, y_te = draw(SYNTHETIC_DEFAULT_TEST if num_test is None else num_test, 2)
    return Dataset("synthetic", x_tr, y_tr, x_te, y_te, 10)


QUADRATIC_DIM = 10
QUADRATIC_CURVATURES = tuple(float(v) for v in np.logspace(-2, 0, QUADRATIC_DIM))   # 0.01 .. 1


@DATASETS.register("quadratic", input_shape=(QUADRATIC_DIM,), num_classes=1, task="quadratic",
                   num_train=QUADRATIC_DIM)
def _load_quadratic(root, num_train, num_test) -> Dataset:
    """The staleness lab's quadratic (TEACHING.md): basis vectors scaled by sqrt(d * l_i), so the
    full-batch loss is ``0.5 * sum_i l_i w_i^2``. Train set = test set; labels unused zeros."""
    for key, n in (("data.num_train", num_train), ("data.num_test", num_test)):
        if n not in (None, QUADRATIC_DIM):
            raise ConfigError(key, n, f"null (the quadratic has exactly {QUADRATIC_DIM} samples)")
    import torch
    x = torch.diag(torch.tensor([math.sqrt(QUADRATIC_DIM * c) for c in QUADRATIC_CURVATURES], dtype=torch.float32))
    y = torch.zeros(QUADRATIC_DIM, dtype=torch.int64)
    return Dataset("quadratic", x, y, x.clone(), y.clone(), 1, task="quadratic",
                   facts={"curvatures": list(QUADRATIC_CURVATURES)})


@DATASETS.register("cifar10", input_shape=(3, 32, 32), num_classes=10,
                   check_source=cifar.check_source, num_train=50_000)
def _load_cifar10(root, num_train, num_test) -> Dataset:
    """The official CIFAR-10 python batches (:mod:`repro.workload.cifar`)."""
    folder = cifar.find_folder(root)
    xs, ys = [], []
    for name in cifar.TRAIN_FILES:
        x, y = cifar.read_batch(os.path.join(folder, name), root)
        xs.append(x)
        ys.append(y)
        if num_train is not None and sum(map(len, ys)) >= num_train:
            break  # only parse the batches the requested subset needs
    test = cifar.read_batch(os.path.join(folder, cifar.TEST_FILE), root)
    return _finish("cifar10", (np.concatenate(xs), np.concatenate(ys)), test, num_train, num_test, (0, 2, 3))


def _mix(seed: int, client: int, epoch: int) -> int:
    """Deterministic integer hash of (seed, client, local epoch) → a generator seed."""
    return ((seed * 1_000_003 + client) * 1_000_033 + epoch) % 2**63


class ClientStream:
    """A client's minibatches: local epoch ``e`` is ``randperm(N)`` seeded by ``(seed, client, e)``,
    cut into ``batch_size`` slices (the last partial one dropped). Its state is its position."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int, client: int):
        n = int(x.shape[0])
        if int(y.shape[0]) != n:
            raise ValueError(f"x has {n} samples but y has {int(y.shape[0])}")
        check_batch_size(batch_size, n)
        self.x, self.y = x, y
        self.batch_size, self.seed, self.client = batch_size, int(seed), int(client)
        self.num_samples, self.batches_per_epoch = n, n // batch_size
        self._epoch, self._index = 0, 0
        self._perm_epoch, self._perm = None, None  # cache of the current epoch's order

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm_epoch != epoch:
            import torch
            gen = torch.Generator().manual_seed(_mix(self.seed, self.client, epoch))
            # drawn on CPU so the order is the same on every device, then moved once per epoch
            self._perm = torch.randperm(self.num_samples, generator=gen).to(self.x.device)
            self._perm_epoch = epoch
        return self._perm

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._permutation(self._epoch)[self._index:self._index + self.batch_size]
        self._index += self.batch_size
        self._normalise()
        return self.x[idx], self.y[idx]

    def _normalise(self) -> None:
        # roll over as soon as a full batch no longer fits: the position always names the next batch
        if self._index + self.batch_size > self.num_samples:
            self._epoch, self._index = self._epoch + 1, 0

    @property
    def position(self) -> tuple[int, int]:
        """(local epoch, index into that epoch's permutation) of the next batch."""
        return self._epoch, self._index

    def set_position(self, position: tuple[int, int]) -> None:
        epoch, index = (int(v) for v in position)
        if epoch < 0 or not 0 <= index <= self.num_samples:
            raise ValueError(f"position {tuple(position)} outside (epoch >= 0, 0..{self.num_samples})")
        self._epoch, self._index = epoch, index
        self._normalise()

