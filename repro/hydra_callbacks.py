"""Hydra callbacks: after an experiment's sweep, rebuild its figure from the run folders.

An experiment file (``conf/exp/figN.yaml``) declares its grid as a Hydra sweep and registers
:class:`BuildFigure`, so ``python -m repro.run +exp=figN`` trains the grid and then draws
``figures/figN.png``/``.pdf``/``.csv`` with :mod:`repro.analysis`, from the logs alone.
"""
from __future__ import annotations

import logging
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger("repro")


class BuildFigure(Callback):
    def __init__(self, figure: str, out_dir: str = "figures", exp_name: str | None = None) -> None:
        # out_dir arrives resolved from the experiment file (${figures_dir})
        self.figure, self.out_dir, self.exp_name = figure, out_dir, exp_name

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from repro.analysis import build_figure

        exp_name = self.exp_name or config.exp_name
        paths = build_figure(self.figure, config.results_dir, self.out_dir, exp_name=exp_name)
        log.info("%s: wrote %s", self.figure, ", ".join(str(p) for p in paths))
        print(f"{self.figure}: wrote " + ", ".join(str(p) for p in paths), flush=True)
