"""The server rules: the arithmetic of one apply, ``w <- rule(w, update, staleness, client)``.

``push_kind``: what a rule's clients push, ``delta`` (their local change), ``gradient`` (Downpour's
accrued gradient) or ``params`` (their own, EASGD, whose rule declares the client's ``exchange``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from repro.registry import Registry

RULES: Registry[type] = Registry("algo.server_rule")


class ServerRule:
    """What a rule has (it need not derive from this) and by default does: no state, no fetch
    bookkeeping; optional: ``exchange``, what its clients do with the parameters they receive."""
    push_kind: str             # delta, gradient or params

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        raise NotImplementedError

    def fetched(self, client: int, params: Tensor) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@RULES.register("delta")
class DeltaRule(ServerRule):
    """``w <- w + scale * delta``: with one client and scale 1, sequential SGD. Our default."""
    push_kind = "delta"

    def __init__(self, lr_server: float = 1.0, **_):
        self.scale = lr_server

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=self.scale)


@RULES.register("downpour")
class DownpourRule(ServerRule):
    """Downpour's server step ``w <- w - lr_server * accrued`` (Dean et al. 2012, Sec. 4.1)."""
    push_kind = "gradient"

    def __init__(self, lr_server: float, **_):
        self.lr_server = lr_server

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=-self.lr_server)


@RULES.register("staleness_scaled")
class StalenessScaledRule(DownpourRule):
    """Staleness-aware ASGD (Zhang, Gupta, Lian, Liu, IJCAI 2016, Eq. 3):
    ``w <- w - (lr_server / max(1, tau)) * accrued`` (tau = 0 is their tau = 1)."""

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update, alpha=-self.lr_server / max(1, staleness))


@RULES.register("dcasgd")
class DCASGDRule(DownpourRule):
    """Delay-compensated ASGD, DC-ASGD-c (Zheng et al., ICML 2017, Eq. 10): with w_bak the client's
    fetched parameters, kept per client, ``w <- w - lr_server * (g + lambda * g * g * (w - w_bak))``."""

    def __init__(self, lr_server: float, dc_lambda: float = 0.04, **_):
        self.lr_server, self.dc_lambda = lr_server, dc_lambda
        self.backups: dict[str, Tensor] = {}

    def fetched(self, client: int, params: Tensor) -> None:
        backup = self.backups.get(str(client))
        self.backups[str(client)] = params.detach().clone() if backup is None else backup.copy_(params)

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        if staleness == 0:   # nothing applied since the fetch: w == w_bak, no compensation (Downpour's step)
            return super().apply(params, update)
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
class AdagradRule(ServerRule):
    """DistBelief's per-parameter Adagrad: ``eta_i = gamma / sqrt(sum of squared updates_i)``
    (Dean et al. 2012, Sec. 4.1), which they found far more robust with many replicas."""
    push_kind = "gradient"

    def __init__(self, lr_server: float, eps: float = 1e-8, **_):
        self.lr_server, self.eps = lr_server, eps
        self.sum_sq: Tensor | None = None

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        if self.sum_sq is None:
            self.sum_sq = torch.zeros_like(params)
        self.sum_sq.addcmul_(update, update)
        params.addcdiv_(update, self.sum_sq.sqrt().add_(self.eps), value=-self.lr_server)

    def state_dict(self) -> dict:
        return {"sum_sq": self.sum_sq}

    def load_state_dict(self, state: dict) -> None:
        self.sum_sq = state["sum_sq"]


class ElasticExchange:
    """A client's side of an EASGD exchange: x <- x - alpha / (1 - alpha) (x - c'), from the centre
    c' after the apply (why, and its rounding: docs/simulator.md, "EASGD's exchange")."""

    def __init__(self, alpha: float):
        self.pull = alpha / (1.0 - alpha)

    def receive(self, own: Tensor, centre: Tensor) -> None:
        # .to: a GPU client reads its reply from a pinned CPU frame (same device: centre itself)
        own.sub_(own - centre.to(own.device), alpha=self.pull)


@RULES.register("easgd")
class ElasticRule(ServerRule):
    """Asynchronous EASGD (Zhang, Choromanska, LeCun, NIPS 2015, Algorithm 1): each exchange moves
    the centre toward the client, ``c <- c + alpha (x - c)``, and the client toward the centre."""
    push_kind = "params"

    def __init__(self, lr_server: float | None = None, elastic_alpha: float = 0.9, **_):
        self.alpha = elastic_alpha
        self.exchange = ElasticExchange(elastic_alpha)

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        params.add_(update - params, alpha=self.alpha)   # c <- c + alpha (x - c)


@RULES.register("outer_nesterov")
class OuterNesterovRule(ServerRule):
    """An outer Nesterov step on each apply's outer gradient ``g = w_fetched - w_local`` (DiLoCo,
    Douillard et al. 2023). Delay d (Liu et al. 2024, delayed Nesterov): ``m <- mu m + sum/d`` once
    every d applies, each stepping ``w <- w - lr (g/d + mu m)``, the others ``w <- w - lr g/d``;
    d = 1 is torch.optim.SGD(nesterov=True)'s arithmetic."""
    push_kind = "delta"

    def __init__(self, lr_server: float | None = None, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 outer_delay: int = 1, **_):
        self.lr, self.mu, self.delay = outer_lr, outer_momentum, outer_delay
        self.momentum: Tensor | None = None   # m
        self.pending: Tensor | None = None    # outer gradients since the momentum last moved
        self.count = 0                        # applies so far

    def apply(self, params: Tensor, update: Tensor, staleness: int = 0, client: int = 0) -> None:
        if self.momentum is None:
            self.momentum, self.pending = torch.zeros_like(params), torch.zeros_like(params)
        g = update.neg()                    # DiLoCo's outer gradient: fetched - local
        self.pending.add_(g)
        self.count += 1
        step = g.div_(self.delay)
        if self.count % self.delay == 0:    # the momentum moves (every apply when d = 1)
            self.momentum.mul_(self.mu).add_(self.pending.div_(self.delay))
            self.pending.zero_()
            step.add_(self.momentum, alpha=self.mu)   # Nesterov's look-ahead: g + mu m
        params.sub_(step, alpha=self.lr)

    def state_dict(self) -> dict:
        return {"momentum": self.momentum, "pending": self.pending, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.momentum, self.pending = state["momentum"], state["pending"]
        self.count = int(state["count"])


def make_rule(name: str, lr_server: float, **options) -> ServerRule:
    """The registered rule ``name``; each takes the options it knows (e.g. Adagrad's ``eps``)."""
    return RULES[name](lr_server, **options)
