"""Command line: ``python -m repro.analysis {fig1,fig2,fig3,fig4,staleness,all} [options]``.

Owns argument parsing and exit codes only (0 on success, 2 when the experiment folder is missing
or holds no usable run); the work is :func:`repro.analysis.build.build_figure`.
"""
from __future__ import annotations

import argparse
import sys
import warnings

import matplotlib

from repro.errors import EXIT_BAD_INPUT, ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m repro.analysis",
                                description="Draw a figure (PNG, PDF and the CSV behind it) "
                                            "from the run folders of one experiment.")
    p.add_argument("figure", choices=["fig1", "fig2", "fig3", "fig4", "staleness", "all"])
    p.add_argument("--results", default="results", help="results tree (default: results)")
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument("--exp", default=None,
                   help="experiment folder under --results (default: the figure's name; "
                        "staleness falls back to fig3)")
    p.add_argument("--target", type=float, default=None,
                   help="target training error for fig4, as a fraction (default: the runs' "
                        "config target_error)")
    return p.parse_args(argv)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    matplotlib.use("Agg")  # files only, never a window: works with or without a display
    from repro.analysis.build import build_figure
    from repro.analysis.figures import set_style

    set_style()
    try:
        with warnings.catch_warnings():  # one plain line per skipped folder, not a traceback
            warnings.showwarning = _show_warning
            paths = build_figure(args.figure, args.results, args.out, args.exp, args.target)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
