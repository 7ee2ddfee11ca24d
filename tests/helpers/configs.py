"""The committed ``conf/`` composed once per session for each list of overrides.

Many tests ask Hydra for the same composition: ``+exp=fig3`` is read by the experiments' and
docs' command checks, the figures' axes, the grid launchers' and the progress callbacks' tests
and the lab's grids; ``+exp=uneven +mitigation=ssp`` by the docs' check, the figures' axes and the
lab's. Each costs Hydra about a tenth of a second on the suite's 2 cores, and the same overrides
compose to the same config while ``conf/`` and the ConfigStore stay as committed: a test that
changes either composes for itself (:func:`repro.config.loader.compose`).
"""
from __future__ import annotations

import copy
import functools

from omegaconf import DictConfig, OmegaConf, open_dict

from repro.config.loader import compose


@functools.cache
def _composed(overrides: tuple[str, ...]) -> DictConfig:
    return compose(list(overrides), return_hydra_config=True)


def composed(overrides: list[str] | tuple[str, ...], hydra: bool = False) -> DictConfig:
    """``compose(overrides, return_hydra_config=hydra)``: a copy of this session's one
    composition of them (the caller may change it, as it may what compose returns). Hydra
    composes its own node either way and, without ``hydra``, drops it: so does this. Raises
    what composing raises."""
    cfg = copy.deepcopy(_composed(tuple(overrides)))
    if not hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def container(overrides: list[str] | tuple[str, ...]) -> dict:
    """``OmegaConf.to_container(composed(overrides), resolve=False)``, read from this session's
    composition without copying it first (a deep copy of a whole composition, Hydra's node
    included, costs a few milliseconds): for a caller that only reads the tree."""
    tree = OmegaConf.to_container(_composed(tuple(overrides)), resolve=False)
    del tree["hydra"]
    return tree
