"""Analysis: run folders -> tidy DataFrames -> figures and tables. It never runs training.

* :mod:`.load`    -- :func:`load_runs` reads ``results/<exp>/<job>/`` into :class:`Runs`;
* :mod:`.tables`  -- time to target, per-run speedups, the speedup table;
* :mod:`.frames`  -- ``figN_frame(runs)``: the tidy frame behind each figure;
* :mod:`.figures` -- ``figN(frame) -> Figure`` (pure), style and colours;
* :mod:`.configs` -- a run's configuration: the runs one figure may draw (never a pool of settings);
* :mod:`.render`  -- :func:`build_figure` (PNG + PDF + CSV), shared by the CLI and the grid callback;
* :mod:`.trees`   -- a results tree or a figures folder -> each figure's per-run scalar metrics;
* :mod:`.compare` -- :func:`compare_trees`: do two trees agree within the spread over seeds?
* ``python -m repro.analysis {fig1,...,fig3_paper,fig4_paper,all} [--config KEY=VALUE,...]`` and
  ``python -m repro.analysis compare DIR_A DIR_B`` -- the CLI.

Each module loads on first use of one of its names, so that ``python -m repro.analysis --help``
answers without pandas, matplotlib or seaborn (``compare_trees`` reads results trees through
the figure registry: the plotting modules too).
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
