"""Benchmarks: ``python -m repro.bench {sim,real,grid,simreal}`` (:mod:`repro.bench.__main__`), each
printing ratios measured in one run. ``simreal`` is the sim-vs-real instruments'
(:mod:`repro.instruments`), which the command line alone reaches. What the benchmarks share: one
argparse number type, :func:`repro.errors.positive`."""
from __future__ import annotations

from repro.errors import positive

__all__ = ["positive"]
