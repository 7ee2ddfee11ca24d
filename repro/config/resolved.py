"""What the entry point's one resolve step hands a driver: a plain frozen config, and the cost fit
it was made with, so that no driver rewrites or builds a config. (A warm start's baseline config
is not here: :func:`repro.workload.start.baseline_config` derives it, a pure function of the
config, where the warm start is built.) No torch here.
"""
from __future__ import annotations

from dataclasses import dataclass

from repro.config.settings import RunConfig


@dataclass(frozen=True)
class Resolved:
    """A plain, frozen config for a driver and the fit it was made with (None: no fit;
    config.json and summary.json record it under "fit")."""

    cfg: RunConfig
    fit: dict | None = None
