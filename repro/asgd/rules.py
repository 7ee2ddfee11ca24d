"""The server rules: the arithmetic of one apply, ``w <- rule(w, update, staleness, client)``.

A rule turns a client's push into a change of the server's parameters. ``push_kind`` says what
its clients push: ``delta`` (their local parameter change) or ``gradient`` (Downpour's accrued
gradient). Each rule is registered under the name ``algo.server_rule`` takes; a rule that keeps
state between pushes (Adagrad's accumulators, DC-ASGD's per-client backups) checkpoints it.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from repro.registry import Registry


class ServerRule(Protocol):
    push_kind: str

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None: ...
    def fetched(self, client: int, params: Tensor) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


RULES: Registry[type] = Registry("algo.server_rule")


class _Stateless:
    """Rules that keep nothing between pushes and need no fetch bookkeeping."""

    def fetched(self, client: int, params: Tensor) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@RULES.register("delta")
class DeltaRule(_Stateless):
    """``w <- w + scale * delta``: the server adds the client's local parameter change. With one
    client and scale 1 this is sequential SGD (momentum stays on the client). Our default."""

    push_kind = "delta"

    def __init__(self, lr_server: float = 1.0, **_):
        self.scale = lr_server

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=self.scale)


@RULES.register("downpour")
class DownpourRule(_Stateless):
    """Downpour's server step ``w <- w - lr_server * accrued`` (Dean et al. 2012, Sec. 4.1)."""

    push_kind = "gradient"

    def __init__(self, lr_server: float, **_):
        self.lr_server = lr_server

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=-self.lr_server)


@RULES.register("staleness_scaled")
class StalenessScaledRule(_Stateless):
    """Staleness-aware ASGD (Zhang, Gupta, Lian, Liu, IJCAI 2016, Eq. 3): the step of a push
    with staleness tau is divided by tau, ``w <- w - (lr_server / max(1, tau)) * accrued``; a
    fresh push (tau = 0) takes the full step, as tau = 1 does in their count."""

    push_kind = "gradient"

    def __init__(self, lr_server: float, **_):
        self.lr_server = lr_server

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=-self.lr_server / max(1, staleness))


@RULES.register("dcasgd")
class DCASGDRule:
    """Delay-compensated ASGD, constant-lambda form DC-ASGD-c (Zheng et al., ICML 2017, Eq. 10):
    the stale gradient g, computed at the parameters the client fetched (w_bak), is corrected
    towards the gradient at today's w with the diagonal outer-product approximation of the
    Hessian: ``w <- w - lr_server * (g + lambda * g * g * (w - w_bak))``. The server keeps w_bak
    per client (its parameters at that client's last fetch)."""

    push_kind = "gradient"

    def __init__(self, lr_server: float, dc_lambda: float = 0.04, **_):
        self.lr_server, self.dc_lambda = lr_server, dc_lambda
        self.backups: dict[str, Tensor] = {}

    def fetched(self, client: int, params: Tensor) -> None:
        backup = self.backups.get(str(client))
        if backup is None:
            self.backups[str(client)] = params.detach().clone()
        else:
            backup.copy_(params)

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        if staleness == 0:   # nothing applied since the fetch: w == w_bak, no compensation
            params.add_(update, alpha=-self.lr_server)
            return
        backup = self.backups.get(str(client))
        if backup is None:
            raise ValueError(f"dcasgd: client {client} pushed without a recorded fetch")
        compensation = update * update * (params - backup)   # g (.) g (.) (w - w_bak)
        params.add_(update.add(compensation, alpha=self.dc_lambda), alpha=-self.lr_server)

    def state_dict(self) -> dict:
        return {"backups": dict(self.backups)}

    def load_state_dict(self, state: dict) -> None:
        self.backups = {str(k): v for k, v in state["backups"].items()}


@RULES.register("adagrad")
class AdagradRule:
    """DistBelief's per-parameter Adagrad: ``eta_i = gamma / sqrt(sum of squared updates_i)``
    (Dean et al. 2012, Sec. 4.1), which they found far more robust with many replicas."""

    push_kind = "gradient"

    def __init__(self, lr_server: float, eps: float = 1e-8, **_):
        self.lr_server, self.eps = lr_server, eps
        self.sum_sq: Tensor | None = None

    def fetched(self, client: int, params: Tensor) -> None:
        pass

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        if self.sum_sq is None:
            self.sum_sq = torch.zeros_like(params)
        self.sum_sq.addcmul_(update, update)
        params.addcdiv_(update, self.sum_sq.sqrt().add_(self.eps), value=-self.lr_server)

    def state_dict(self) -> dict:
        return {"sum_sq": self.sum_sq}

    def load_state_dict(self, state: dict) -> None:
        self.sum_sq = state["sum_sq"]


def make_rule(name: str, lr_server: float, **options) -> ServerRule:
    """The registered rule ``name``; each takes the options it knows (e.g. Adagrad's ``eps``)."""
    return RULES[name](lr_server, **options)
