"""What the entry point's one resolve step hands a driver: a plain frozen config, and what was
derived from it there, so that no driver rewrites or builds a config.

:class:`Resolved`: the config a driver runs as it is, the cost fit it was made with (``cost=fit``)
and, for a warm start, the config of the single-client baseline whose final server state it
starts from (:func:`baseline_config`, derived here once; :mod:`repro.workload.start` trains and
caches that run, keyed by the baseline config's training-shaping values). No torch here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from repro.config.settings import BackendConfig, CostConfig, DataConfig, RunConfig

WARM_SEED = 0   # every grid point of an experiment starts from the same baseline, whatever its seed


def baseline_config(cfg: RunConfig) -> RunConfig:
    """The single-client run whose final server state is the warm start (only what shapes that
    state is kept from ``cfg``: data, model, algo, threads, device, warm_start_epochs; the one
    client reads the whole training set, whatever the clients' own data, data.partition)."""
    whole = dataclasses.replace(cfg.data, partition="iid", alpha=DataConfig.alpha, slow_client_classes=None)
    return cfg.replace(start="cold", num_clients=1, nsync=1, num_epochs=cfg.warm_start_epochs, data=whole,
                       eval_every=cfg.warm_start_epochs, seed=WARM_SEED, exp_name="_warmstart",
                       cost=CostConfig(), backend=BackendConfig(), checkpoint_every=0,
                       target_error=0.0, resume=False, force=False)


def warm_baseline(cfg: RunConfig) -> RunConfig | None:
    """The baseline config of a warm start (None: a cold start has none)."""
    return baseline_config(cfg) if cfg.start == "warm" else None


@dataclass(frozen=True)
class Resolved:
    """A plain, frozen config for a driver, the fit it was made with (None: no fit; config.json
    and summary.json record it under "fit"), and the warm start's baseline config (None: a cold
    start). Make it with :meth:`of`, which derives the baseline."""

    cfg: RunConfig
    fit: dict | None = None
    baseline: RunConfig | None = None

    @classmethod
    def of(cls, cfg: RunConfig, fit: dict | None = None) -> "Resolved":
        return cls(cfg, fit, warm_baseline(cfg))
