"""The networks users name with ``model=...`` and the check that one accepts a data set's inputs. No
model has buffers (no BatchNorm) or dropout: the server synchronises parameters only, and training is
deterministic given ``torch.manual_seed`` (callers seed before :func:`build_model`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from repro.errors import ConfigError, numbers
from repro.registry import Registry
from repro.runtime import memory_bytes


@dataclass(frozen=True)
class ModelSpec:
    """A registered network: its builder and the inputs it is made for (not merely those it runs on)."""
    build: Callable[[tuple, int], nn.Module]
    expects: str                                  # for messages, e.g. "(channels, 8, 8) images"
    accepts: Callable[[tuple], bool]              # input shape (without the batch) -> ok?


MODELS: Registry[ModelSpec] = Registry("model.name", ModelSpec)


def _flat_size(body: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Features ``body`` produces for one sample, found by a dry run (no RNG is drawn)."""
    with torch.no_grad():
        return int(body(torch.zeros(1, *input_shape)).numel())


@MODELS.register("mlp", expects="inputs of any shape", accepts=lambda shape: True)
def _mlp(input_shape, num_classes) -> nn.Module:
    """flatten → 128 ReLU → classes: accepts any input shape."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 128), nn.ReLU(), nn.Linear(128, num_classes))


@MODELS.register("digits_cnn", expects="(channels, 8, 8) images",
                 accepts=lambda shape: len(shape) == 3 and tuple(shape[1:]) == (8, 8))
def _digits_cnn(input_shape, num_classes) -> nn.Module:
    """Two 3x3 convs and a max-pool for 8x8 images (the default model)."""
    return nn.Sequential(
        nn.Conv2d(input_shape[0], 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),                                  # (32, 4, 4)
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, num_classes))


@MODELS.register("mnist1d_cnn", expects="(channels, length >= 2) 1-D signals",   # its pool halves the length
                 accepts=lambda shape: len(shape) == 2 and shape[1] >= 2)
def _mnist1d_cnn(input_shape, num_classes) -> nn.Module:
    """Three 1-D convs for MNIST-1D's (1, 40) signals."""
    body = nn.Sequential(
        nn.Conv1d(input_shape[0], 32, 5, padding=2), nn.ReLU(),
        nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool1d(2),
        nn.Conv1d(32, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten())
    return nn.Sequential(*body, nn.Linear(_flat_size(body, input_shape), num_classes))


class ChannelLRN(nn.Module):
    """``torch.nn.LocalResponseNorm``'s formula with pads and adds only: torch's own sums the window
    with ``avg_pool3d``, whose CUDA backward has no deterministic kernel (no bit-for-bit GPU runs)."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        before, after = self.size // 2, (self.size - 1) // 2   # torch's window: c - n/2 .. c + (n-1)/2
        padded = nn.functional.pad(x.pow(2), (0, 0, 0, 0, before, after))
        window = sum(padded[:, i:i + x.shape[1]] for i in range(self.size))
        return x * (self.k + self.alpha / self.size * window).pow(-self.beta)


@MODELS.register("cifar_18pct", expects="(3, 32, 32) colour images",
                 accepts=lambda shape: tuple(shape) == (3, 32, 32))
def _cifar_18pct(input_shape, num_classes) -> nn.Module:
    """cuda-convnet's ``layers-18pct.cfg`` (Krizhevsky), of the paper's era; ``ceil_mode`` pools: 32 → 16 → 8 → 4."""
    body = nn.Sequential(
        nn.Conv2d(input_shape[0], 32, 5, padding=2),
        nn.MaxPool2d(3, stride=2, ceil_mode=True), nn.ReLU(),
        ChannelLRN(3, alpha=5e-5, beta=0.75, k=1.0),
        nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(),
        nn.AvgPool2d(3, stride=2, ceil_mode=True),
        ChannelLRN(3, alpha=5e-5, beta=0.75, k=1.0),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(),
        nn.AvgPool2d(3, stride=2, ceil_mode=True),
        nn.Flatten())
    return nn.Sequential(*body, nn.Linear(_flat_size(body, input_shape), num_classes))


@MODELS.register("quadratic", expects="(d,) vectors (data=quadratic)",
                 accepts=lambda shape: len(shape) == 1)
def _quadratic(input_shape, num_classes) -> nn.Module:
    """One bias-free linear output: with data=quadratic its loss is a quadratic in the weights."""
    return nn.Linear(int(input_shape[0]), num_classes, bias=False)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A fresh model, initialised from torch's global RNG (seed it first). ConfigError for an
    unknown name, a shape it is not made for, ``num_classes`` not an integer >= 1, or parameters
    larger than this machine's memory, naming the argument that makes them so."""
    spec = MODELS[name]
    shape = tuple(int(d) for d in numbers("input_shape", input_shape, "a sample's sizes, integers >= 1",
                                          lambda d: d >= 1, integer=True).reshape(-1))
    if not spec.accepts(shape):
        raise ConfigError("input_shape", input_shape, f"{spec.expects} (what model '{name}' is made for)")
    classes = int(numbers("num_classes", num_classes, "an integer >= 1", lambda n: n >= 1, scalar=True, integer=True))
    memory = memory_bytes()
    # else torch's allocator error (or an overflow) from deep in a layer: input_shape's, unless one class fits
    for key, value, tried in (("input_shape", input_shape, 1), ("num_classes", num_classes, classes)):
        if (need := _parameter_bytes(spec, shape, tried)) > memory:
            raise ConfigError(key, value, f"a value whose model '{name}' fits this machine's memory "
                              f"({memory / 2**30:.0f} GiB); its parameters would take {need / 2**30:.3g} GiB")
    return spec.build(shape, classes)


def _parameter_bytes(spec: ModelSpec, shape: tuple, classes: int) -> float:
    """The bytes of ``spec``'s model's parameters, sized on the meta device (no allocation, no RNG);
    inf past int64; 0 where the meta device fails otherwise (the real build raises, or builds)."""
    try:
        with torch.device("meta"):
            return sum(p.numel() * p.element_size() for p in spec.build(shape, classes).parameters())
    except (RuntimeError, TypeError) as exc:
        return math.inf if "overflow" in str(exc).lower() else 0


def fits(name: str, input_shape, num_classes: int) -> bool:
    """Model ``name`` is made for these inputs (declared) and maps them to class scores (tried)."""
    shape = tuple(int(d) for d in input_shape)
    if not MODELS[name].accepts(shape):
        return False
    # the model is thrown away: keep the caller's RNG stream as if we had never built it
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            out = build_model(name, shape, num_classes)(torch.zeros(2, *shape))
        except (ValueError, RuntimeError, TypeError):
            return False
    return tuple(out.shape) == (2, num_classes)


def check_fits(name: str, input_shape, num_classes, data_name: str) -> None:
    """Raise ConfigError unless model ``name`` is made for data ``data_name``'s inputs."""
    input_shape = tuple(int(d) for d in input_shape)
    if not fits(name, input_shape, num_classes):
        fitting = [m for m in MODELS.names() if fits(m, input_shape, num_classes)]
        raise ConfigError("model.name", name, f"a model that accepts data '{data_name}' (inputs of shape "
                          f"{input_shape}); '{name}' expects {MODELS[name].expects}; models made for "
                          f"'{data_name}': {', '.join(fitting) or 'none'}")


def num_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
