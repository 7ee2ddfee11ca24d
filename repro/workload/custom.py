"""A user's own problem, for :func:`repro.api.simulate`: the objects it is handed (a module, two
(inputs, labels) pairs of numpy arrays or torch tensors, a loss function) checked, and turned
into the :class:`~repro.workload.build.Problem` the simulator trains (a classification problem:
float32 inputs, int64 labels, C = one more than the largest label). Every fault is a
:class:`~repro.errors.ConfigError` naming the argument, the value and what would be valid,
before any training (a label the module has no output for, a non-finite input, ragged or empty
sets, a batch larger than the training set); no fault surfaces later as an index error or a
loss of nan that the run would blame on the learning rate.
"""
from __future__ import annotations

import copy
import os
from typing import Union

import numpy as np
import torch
from torch import Tensor, nn

from repro.asgd.flatnet import FlatNet
from repro.errors import ConfigError
from repro.workload.build import EvalSets, Problem
from repro.workload.data import Dataset, check_batch_size

ArrayLike = Union[Tensor, np.ndarray]   # inputs and labels: numpy arrays or torch tensors


def custom_problem(module: nn.Module, train: tuple[ArrayLike, ArrayLike], test: tuple[ArrayLike, ArrayLike],
                   loss_fn, batch_size: int, device: torch.device) -> Problem:
    """The problem of ``module`` (copied: the caller's is never trained) on ``train`` and
    ``test``, its current weights the initial ones, on ``device``."""
    ds = _dataset(train, test, device)
    check_batch_size(batch_size, ds.num_train, key="batch_size")
    net = FlatNet(copy.deepcopy(module).to(device), loss_fn)
    _check_labels_fit(net.module, ds)
    return Problem(ds, net, net.params.detach().clone(), EvalSets.of(ds))


def check_objects(module, train, test, loss_fn, run_dir) -> None:
    """The arguments that are objects, not settings: ConfigError naming the one of a wrong type."""
    if not isinstance(module, nn.Module):
        raise ConfigError("module", f"a {type(module).__name__}", "a torch.nn.Module")
    for key, pair in (("train", train), ("test", test)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ConfigError(key, f"a {type(pair).__name__}", "a pair (inputs, labels) of arrays or tensors")
    if not callable(loss_fn):
        raise ConfigError("loss_fn", f"a {type(loss_fn).__name__}", "a callable loss_fn(outputs, labels)")
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise ConfigError("run_dir", f"a {type(run_dir).__name__}", "a folder (str or Path) or None")


def _dataset(train: tuple[ArrayLike, ArrayLike], test: tuple[ArrayLike, ArrayLike],
             device: torch.device) -> Dataset:
    (x_train, y_train), (x_test, y_test) = _pair("train", *train), _pair("test", *test)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ConfigError("test", f"inputs of shape {tuple(x_test.shape)}",
                          f"the training inputs' sample shape {tuple(x_train.shape[1:])}")
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return Dataset("custom", x_train, y_train, x_test, y_test, num_classes).to(device)


def _pair(key: str, x: ArrayLike, y: ArrayLike) -> tuple[Tensor, Tensor]:
    """(inputs, labels) as float32 and int64 tensors, or a ConfigError that says what is wrong."""
    dtype = getattr(y, "dtype", None)   # the caller's own dtype name, numpy's or torch's
    x, y = _tensor(key, x), _tensor(key, y)
    if x.ndim == 0 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise ConfigError(key, f"inputs of shape {tuple(x.shape)}, labels of shape {tuple(y.shape)}",
                          "equally many (>0) inputs and labels, labels of shape (N,)")
    if y.dtype == torch.bool or y.dtype.is_floating_point or y.dtype.is_complex:
        raise ConfigError(key, f"labels of dtype {dtype or y.dtype}",
                          "integer class labels 0..C-1 (any integer dtype)")
    y = y.to(torch.long)
    if y.min() < 0:
        raise ConfigError(key, f"a label of {int(y.min())}", "integer class labels 0..C-1 (none negative)")
    x = x.to(torch.float32)
    finite = torch.isfinite(x.reshape(len(x), -1)).all(dim=1)
    if not bool(finite.all()):   # else the first push's loss is NaN and the run blames the learning rate
        i = int((~finite).nonzero()[0])
        raise ConfigError(key, f"a non-finite input (nan or inf) in sample {i}",
                          "finite inputs (clean or drop those samples)")
    return x, y


def _check_labels_fit(module: nn.Module, ds: Dataset) -> None:
    """Every label must be one of the module's outputs (a (N, K) output: classes 0..K-1), else
    the loss fails deep inside training with an index error."""
    with torch.no_grad():
        out = module(ds.x_train[:1])
    if not isinstance(out, Tensor) or out.ndim != 2:
        return   # not a classifier's (N, K) output: loss_fn decides what a label means
    for key, y in (("train", ds.y_train), ("test", ds.y_test)):
        if int(y.max()) >= out.shape[1]:
            raise ConfigError(key, f"a label of {int(y.max())}", f"class labels 0..{out.shape[1] - 1}: "
                              f"the module outputs {out.shape[1]} classes")


def _tensor(key: str, a: ArrayLike) -> Tensor:
    # torch.as_tensor shares a numpy array's memory but refuses negative strides (a[::-1])
    try:
        t = torch.as_tensor(np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a)
    except (TypeError, ValueError, RuntimeError) as exc:   # a string, an object, ragged lists
        raise ConfigError(key, f"a {type(a).__name__}", f"numpy arrays or torch tensors of numbers ({exc})") from None
    return t
