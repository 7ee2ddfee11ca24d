"""The compute side of a client: a network whose parameters live in one flat vector, so a push or
a fetch is a single tensor and loading parameters is one ``copy_``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

LossFn = Callable[[Tensor, Tensor], Tensor]


class FlatNet:
    """A module whose parameters are views into one flat float32 vector ``flat`` (``params``, in
    ``module.parameters()`` order) and their .grad views into ``grad``, where autograd accumulates
    in place (use :meth:`zero_grad`, which re-links grads ``module.zero_grad()`` set to None); its
    losses and gradients: a compute engine, not a client."""

    def __init__(self, module: nn.Module, loss_fn: LossFn = nn.functional.cross_entropy):
        buffers = [name for name, _ in module.named_buffers()]
        if buffers:
            raise ValueError(
                f"{type(module).__name__} has buffers (e.g. BatchNorm running statistics) that the "
                f"parameter server would not synchronise; use a model without buffers (found: "
                f"{', '.join(buffers[:5])})")
        named = list(module.named_parameters())
        if not named:
            raise ValueError(f"{type(module).__name__} has no parameters to train")
        params, device = [p for _, p in named], named[0][1].device
        for name, p in named:   # the user's module and parameter named, not this class
            if p.dtype != torch.float32 or p.device != device:
                raise ValueError(f"{type(module).__name__}'s parameter {name} is {p.dtype} on {p.device}; every "
                                 f"parameter must be torch.float32 on one device ({device}): module.float() converts")
        sizes = [p.numel() for p in params]
        self.module, self.numel, self.loss_fn = module, sum(sizes), loss_fn
        self.flat = self.params = torch.empty(self.numel, dtype=torch.float32, device=device)
        self.grad = torch.zeros_like(self.flat)
        self._params, self._grad_views = params, [g.view_as(p) for p, g in zip(params, self.grad.split(sizes))]
        for p, view in zip(params, self.flat.split(sizes)):
            view.copy_(p.detach().reshape(-1))
            p.data = view.view_as(p)
        self._link_grads()

    def _link_grads(self) -> None:
        for p, view in zip(self._params, self._grad_views):
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view

    def load(self, vector: torch.Tensor) -> None:
        """Set every parameter from one flat vector (e.g. the server's parameters)."""
        self.flat.copy_(vector)

    def zero_grad(self) -> None:
        self._link_grads()
        self.grad.zero_()

    def backward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Gradient of the minibatch loss into ``self.grad``; returns (loss, num_errors) as tensors
        (no host sync here: on a GPU the caller reads them once per push)."""
        self.zero_grad()
        out = self.module(x)
        loss = self.loss_fn(out, y)
        loss.backward()
        return loss.detach(), (out.detach().argmax(1) != y).sum()

    @torch.no_grad()
    def evaluate(self, params: Tensor, x: Tensor, y: Tensor, batch_size: int = 1024) -> tuple[float, float]:
        """Mean loss and error of ``params`` on (x, y)."""
        self.load(params)
        loss_sum, errors = torch.zeros((), device=x.device), torch.zeros((), device=x.device)
        for i in range(0, len(x), batch_size):
            out = self.module(x[i:i + batch_size])
            yb = y[i:i + batch_size]
            loss_sum += self.loss_fn(out, yb, reduction="sum") if self.loss_fn in REDUCING \
                else self.loss_fn(out, yb) * len(yb)
            errors += (out.argmax(1) != yb).sum()
        n = max(len(x), 1)
        return loss_sum.item() / n, errors.item() / n


def quadratic_loss(out: Tensor, y: Tensor, reduction: str = "mean") -> Tensor:
    """``0.5 * (w . x)^2`` per sample (labels unused): on the ``quadratic`` data set (scaled basis
    vectors) the mean is ``0.5 * sum_i l_i w_i^2``, of known curvatures (the lab's stability problem)."""
    per_sample = 0.5 * out.reshape(len(out), -1).pow(2).sum(1)
    return per_sample.sum() if reduction == "sum" else per_sample.mean()


FlatModule = FlatNet   # the flat views alone: a FlatNet whose losses go unused
LOSSES = {"classification": nn.functional.cross_entropy, "quadratic": quadratic_loss}
REDUCING = (nn.functional.cross_entropy, nn.functional.nll_loss, quadratic_loss)   # take reduction="sum"
