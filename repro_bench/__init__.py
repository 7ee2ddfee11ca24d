"""What measures the library, beside it: the benchmarks (``python -m repro.bench
{sim,real,grid,simreal,startup}``, or ``python -m repro_bench``: :mod:`repro_bench.__main__`), each
printing ratios measured in one run, and the sim-vs-real instruments (:mod:`.instruments`), which
the command line alone reaches. This package imports ``repro``; ``repro`` never imports it (its
one shim, :mod:`repro.bench.__main__`, only runs the command line). What they share: one argparse
number type, :func:`positive`. A module the command line imports holds at its top only what its
parser is built from (descriptions, targets, options); torch, pandas and the library's training
code load inside the functions that measure, so ``--help`` and a usage error answer in a blink
(``tests/test_startup_imports.py``)."""
from __future__ import annotations

from typing import Any, Callable


def positive(kind: type, allow_zero: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) > 0 (or >= 0 with ``allow_zero``; never nan nor
    inf), so a bad value is a usage error (exit 2), not a traceback minutes into a run (inf was
    one: an OverflowError sizing a budget). Here, where every benchmark's and instrument's
    command line finds it."""
    import argparse
    import math

    def parse(text: str):
        value = kind(text)
        if not (value > 0 or (allow_zero and value == 0)) or value == math.inf:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number {'>=' if allow_zero else '>'} 0")
        return value
    parse.__name__ = kind.__name__   # argparse names the type in its "invalid ... value" message
    return parse
