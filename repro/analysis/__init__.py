"""Analysis: run folders -> tidy DataFrames -> figures and tables; it never runs training.

Its modules: docs/architecture.md, 'Layout'; the command line: docs/paper.md. Each module loads
on first use of one of its names, so that ``python -m repro.analysis --help`` needs no pandas,
matplotlib or seaborn.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"NoRunsError": "load", "Runs": "load", "load_runs": "load", "format_speedup_table": "tables",
         "run_speedups": "tables", "speedup_table": "tables", "time_to_target": "tables",
         "build_figure": "render", "figure_frame": "render", "compare_trees": "compare",
         "fig1_frame": "frames", "fig2_frame": "frames", "fig4_frame": "frames",
         "staleness_frame": "frames"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [*_LAZY]
