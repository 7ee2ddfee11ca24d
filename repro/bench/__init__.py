"""Benchmarks: ``python -m repro.bench {sim,real,grid}`` (:mod:`repro.bench.__main__`), each
printing ratios measured in one run. What they share: one argparse number type."""
from __future__ import annotations

import argparse


def positive(kind: type, allow_zero: bool = False):
    """An argparse type: ``kind`` (int or float) > 0 (or >= 0 with ``allow_zero``; never nan), so
    a bad value is a usage error (exit 2), not a traceback minutes into a run."""
    def parse(text: str):
        value = kind(text)
        if not (value > 0 or (allow_zero and value == 0)):
            raise argparse.ArgumentTypeError(f"{text!r} is not {'>=' if allow_zero else '>'} 0")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its "invalid ... value" message
    return parse
