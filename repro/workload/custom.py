"""A user's own problem for :func:`repro.api.simulate` (docs/api.md), checked and made the
:class:`~repro.workload.build.Problem` the simulator trains: every fault is a ConfigError naming the
argument before any training, never an index error or a nan loss blamed on the learning rate."""
from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import Union

import numpy as np
import torch
from torch import Tensor, nn

from repro.asgd.flatnet import FlatNet
from repro.errors import ConfigError
from repro.files import schema
from repro.files.storage import unmakeable
from repro.workload.build import EvalSets, Problem
from repro.workload.data import Dataset, check_batch_size

ArrayLike = Union[Tensor, np.ndarray]   # inputs and labels: numpy arrays or torch tensors


def custom_problem(module: nn.Module, train: tuple[ArrayLike, ArrayLike], test: tuple[ArrayLike, ArrayLike],
                   loss_fn, batch_size: int, device: torch.device) -> Problem:
    """The problem of a copy of ``module`` (its current weights the initial ones) on ``device``."""
    (x_train, y_train), (x_test, y_test) = _pair("train", *train), _pair("test", *test)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ConfigError("test", f"inputs of shape {tuple(x_test.shape)}",
                          f"the training inputs' sample shape {tuple(x_train.shape[1:])}")
    ds = Dataset("custom", x_train, y_train, x_test, y_test, int(max(y_train.max(), y_test.max())) + 1).to(device)
    check_batch_size(batch_size, ds.num_train, key="batch_size")
    net = FlatNet(copy.deepcopy(module).to(device), loss_fn)
    _check_fit(net, ds)
    return Problem(ds, net, net.params.detach().clone(), EvalSets.of(ds))


def check_objects(module, train, test, loss_fn, run_dir) -> Path | None:
    """ConfigError naming an argument (an object, not a setting) of a wrong type; the run folder, or None."""
    if not isinstance(module, nn.Module):
        raise ConfigError("module", f"a {type(module).__name__}", "a torch.nn.Module")
    for key, pair in (("train", train), ("test", test)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ConfigError(key, f"a {type(pair).__name__}", "a pair (inputs, labels) of arrays or tensors")
    if not callable(loss_fn):
        raise ConfigError("loss_fn", f"a {type(loss_fn).__name__}", "a callable loss_fn(outputs, labels)")
    if run_dir is not None and not isinstance(run_dir, (str, os.PathLike)):
        raise ConfigError("run_dir", f"a {type(run_dir).__name__}", "a folder (str or Path) or None")
    if run_dir is not None and not os.fspath(run_dir):   # Path("") is the working folder
        raise ConfigError("run_dir", "''", "a folder (str or Path) or None")
    if run_dir is None:
        return None
    # ~: else trained into ./~, read by pandas from $HOME; absolute: result.run_dir names it after a chdir too
    folder = Path(run_dir).expanduser().absolute()
    if schema.holds_others(folder):   # e.g. home: the run's files among the user's
        raise ConfigError("run_dir", os.fspath(run_dir), schema.OTHERS)
    if why := unmakeable(folder):   # e.g. under a file: else NotADirectoryError from the run folder's lock
        raise ConfigError("run_dir", os.fspath(run_dir), f"a folder that can be made: {why}")
    return folder


def check_trainable(module: nn.Module, weight_decay: float) -> None:
    """Frozen parameters the clients can honour: not every one (else backward() fails), and none
    under weight decay, which acts on the whole flat vector (torch.optim.SGD skips them)."""
    frozen = [not p.requires_grad for p in module.parameters()]
    if frozen and all(frozen):
        raise ConfigError("module", f"a {type(module).__name__} with every parameter frozen",
                          "a module with a parameter to train (requires_grad=True)")
    if weight_decay and any(frozen):
        raise ConfigError("weight_decay", weight_decay, "0 for a module with frozen parameters "
                          "(requires_grad=False): the decay would shrink them every step")


def names(problem: Problem, module: nn.Module, loss_fn) -> tuple[str, str]:
    """config.json's data.name and model.name for a user's problem (docs/api.md): training-shaping,
    so a run_dir holding a run of other data or weights is refused, never returned as this one's."""
    ds = problem.dataset
    loss = getattr(loss_fn, "__qualname__", type(loss_fn).__name__)
    return (f"custom:{_digest(ds.x_train, ds.y_train, ds.x_test, ds.y_test)}",
            f"custom:{type(module).__name__}@{_digest(problem.init_params, text=loss)}")


def _digest(*tensors: Tensor, text: str = "") -> str:
    h = hashlib.blake2b(text.encode(), digest_size=6)
    for t in tensors:
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def _pair(key: str, x: ArrayLike, y: ArrayLike) -> tuple[Tensor, Tensor]:
    """(inputs, labels) as float32 and int64 tensors, or a ConfigError that says what is wrong."""
    dtype = getattr(y, "dtype", None)   # the caller's own dtype name, numpy's or torch's
    x, y = _tensor(key, x), _tensor(key, y)
    if x.ndim == 0 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
        raise ConfigError(key, f"inputs of shape {tuple(x.shape)}, labels of shape {tuple(y.shape)}",
                          "equally many (>0) inputs and labels, labels of shape (N,)")
    if y.dtype == torch.bool or y.dtype.is_floating_point or y.dtype.is_complex:
        raise ConfigError(key, f"labels of dtype {dtype or y.dtype}", "integer class labels 0..C-1 (any integer dtype)")
    y = y.to(torch.long)
    if y.min() < 0:
        raise ConfigError(key, f"a label of {int(y.min())}", "integer class labels 0..C-1 (none negative)")
    if x.dtype.is_complex:   # else the cast drops the imaginary part, with only torch's warning
        raise ConfigError(key, f"inputs of dtype {x.dtype}", "real inputs (they become float32)")
    x = x.to(torch.float32)
    finite = torch.isfinite(x.reshape(len(x), -1)).all(dim=1)
    if not bool(finite.all()):   # else the first push's loss is NaN and the run blames the learning rate
        i = int((~finite).nonzero()[0])
        raise ConfigError(key, f"a non-finite input (nan or inf) in sample {i}",
                          "finite inputs (clean or drop those samples)")
    return x, y


def _check_fit(net: FlatNet, ds: Dataset) -> None:
    """A minibatch through the module and loss_fn: it takes the inputs, has every label, gives one loss."""
    x, y = ds.x_train[:2], ds.y_train[:2]   # two: a per-sample loss (reduction="none") shows
    with torch.no_grad():
        out = _call("module", net.module, f"a module that takes inputs of shape {tuple(x.shape)}", x)
        if isinstance(out, Tensor) and out.ndim == 2:   # else loss_fn decides what a label means
            for key, labels in (("train", ds.y_train), ("test", ds.y_test)):
                if int(labels.max()) >= out.shape[1]:
                    raise ConfigError(key, f"a label of {int(labels.max())}", f"class labels 0..{out.shape[1] - 1}: "
                                      f"the module outputs {out.shape[1]} classes")
        loss = _call("loss_fn", net.loss_fn, "loss_fn(outputs, labels) giving the mean minibatch loss", out, y)
    if not isinstance(loss, Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ConfigError("loss_fn", f"a result of {got}", "the mean minibatch loss: a tensor of one element")


def _call(key: str, fn, expected: str, *args):
    try:
        return fn(*args)
    except Exception as exc:   # the user's code: whatever it raises, name the argument
        raise ConfigError(key, f"one that raises {type(exc).__name__}: {exc}", expected) from None


def _tensor(key: str, a: ArrayLike) -> Tensor:
    # through numpy: torch.as_tensor refuses negative strides (a[::-1]), warns of a read-only array
    # and indexes a pandas DataFrame or Series by its labels (a KeyError once they are shuffled)
    try:
        return torch.as_tensor(a if isinstance(a, Tensor) else np.require(a, requirements="CW"))
    except (TypeError, ValueError, RuntimeError) as exc:   # a string, an object, ragged lists
        raise ConfigError(key, f"a {type(a).__name__}", f"numpy arrays or torch tensors of numbers ({exc})") from None
