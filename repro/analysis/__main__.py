"""``python -m repro.analysis NAME`` and ``... compare DIR_A DIR_B`` (docs/paper.md): argument
parsing and exit codes only (0 success, 1 a comparison disagrees, 2 bad input).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
import warnings

from repro.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, ConfigError
from repro.files.schema import CONFIG_FILE
from repro.files.storage import LONGEST_NAME
from repro.registry import declared

COMPARE_USAGE = ("python -m repro.analysis compare DIR_A DIR_B [--k K] [--figures LIST] "
                 "[--target T] [--config KEY=VALUE,...] [--csv FILE.csv]")
CONFIG_HELP = ("draw the runs whose settings match these KEY=VALUE pairs (comma-separated, e.g. "
               "num_epochs=3): needed when the experiment folder holds runs of several "
               "configurations, which a figure never pools (the refusal lists them)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m repro.analysis",
                                description="Draw a figure (PNG, PDF and the CSV behind it) "
                                            "from the run folders of one experiment, or "
                                            "compare two trees of results.",
                                epilog=f"compare: {COMPARE_USAGE} -- says per figure whether two "
                                       "results trees or figures folders agree within the "
                                       "spread over seeds (exit 0: agree, 1: disagree, 2: bad "
                                       "input); see 'python -m repro.analysis compare --help'.")
    p.add_argument("figure", choices=[*declared("figure"), "all", "compare"],   # declared order, none imported
                   help="the figure to draw ('all': every one), or 'compare' (see below)")
    p.add_argument("--results", default="results", help="results tree (default: results)")
    p.add_argument("--out", default="figures", help="output folder (default: figures)")
    p.add_argument("--exp", default=None,
                   help="experiment folder under --results, for one figure (default: its name; "
                        "staleness falls back to fig3)")
    p.add_argument("--target", type=float, default=None,
                   help="target training error, as a fraction, of fig4, churn, mitigation and "
                        "sync_vs_async (default: the runs' config target_error); uneven's is a "
                        "training loss (default 0.5)")
    p.add_argument("--config", default=None, metavar="KEY=VALUE,...", help=CONFIG_HELP)
    p.add_argument("--name", default=None, metavar="STEM",
                   help="base name of the files written (default: the figure's name, or "
                        "NAME-KEY=VALUE,... with --config, so that a chosen variant never "
                        "overwrites the figure of the experiment as committed)")
    args = p.parse_args(argv)
    if args.figure == "compare":  # only reached when an option came before it
        p.error(f"'compare' takes its own arguments and must come first: {COMPARE_USAGE}")
    return args


def parse_compare_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m repro.analysis compare",
        description="Say, per figure, whether two trees agree within the spread over seeds. "
                    "Each of DIR_A, DIR_B is a results tree (holding fig1/ .. fig4/, "
                    "staleness/, fig3_paper/, fig4_paper/) or a figures folder (holding fig1.csv "
                    ".. fig4.csv, staleness.csv, fig3_paper.csv, fig4_paper.csv); the kinds may "
                    "be mixed. Runs of different configurations are never pooled, and a "
                    "warm-started figure's shared baseline is compared first. Exit code 0: every "
                    "figure in both agrees (incomplete ones included), 1: some comparison disagrees, 2: bad "
                    "input. The rule: docs/paper.md, 'How compare decides'.")
    p.add_argument("dir_a", metavar="DIR_A", help="results tree or figures folder A")
    p.add_argument("dir_b", metavar="DIR_B", help="results tree or figures folder B")
    p.add_argument("--k", type=float, default=3.0,
                   help="a difference of means over k pooled standard deviations over seeds (and "
                        "over the metric's floor) is a disagreement (default: 3)")
    p.add_argument("--figures", default=None,
                   help="comma-separated figures to compare, e.g. fig3,fig4 (default: every "
                        "figure found in either tree)")
    p.add_argument("--target", type=float, default=None,
                   help="target training error, as a fraction, for fig2/fig3's time to target "
                        "and for the fig4 speedups of results trees (default: the runs' config "
                        "target_error, else 0.01)")
    p.add_argument("--config", default=None, metavar="KEY=VALUE,...",
                   help="in a results tree, compare only the runs whose settings match (as "
                        "when drawing: needed when a figure's folder holds several "
                        "configurations; a figures folder's CSV holds one)")
    p.add_argument("--csv", "--out", dest="csv", metavar="FILE.csv", default=None,
                   help="also write the comparison table (one row per figure, grid point and "
                        "metric) to this CSV file")
    return p.parse_args(argv)


def outside_runs(key: str, path: str, *trees: str) -> None:
    """ConfigError naming ``key`` when ``path`` is one of ``trees``, lies in a run folder of one, or
    holds run folders (a figures folder beside experiment folders is neither kind to compare)."""
    roots, place = [Path(t).resolve() for t in trees], Path(path).resolve()
    if place in roots or any(place.glob("*/config.json")) or any(place.glob("*/*/config.json")):
        raise ConfigError(key, path, "a folder of its own, not a results tree nor a folder holding run folders "
                                     "(the analysis never writes beside the runs it reads)")
    for folder in (place, *place.parents):
        if any(root in folder.parents for root in roots) and (folder / CONFIG_FILE).exists():
            raise ConfigError(key, path, f"a place outside the run folders it reads ({folder} is "
                                         "a run's: the analysis never writes into one)")


class _Lines:
    """stdout that, once its reader has gone (``| head``), writes to /dev/null: a BrokenPipeError
    stopped the analysis before the rest of its files were written."""

    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def write(self, text: str):
        return self._quiet(self.stream.write, text)

    def flush(self):
        return self._quiet(self.stream.flush)

    def _quiet(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:   # the lines still buffered, and the interpreter's last flush, go nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            return call(*args)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    compared = argv[:1] == ["compare"]
    args = parse_compare_args(argv[1:]) if compared else parse_args(argv)
    import matplotlib   # after parsing: --help and a typo answer without it

    matplotlib.use("Agg")  # files only, never a window: works with or without a display
    stdout, sys.stdout = sys.stdout, _Lines(sys.stdout)
    try:
        with warnings.catch_warnings():  # one plain line per skipped folder, not a traceback
            warnings.showwarning = _show_warning
            return compare_main(args) if compared else draw_main(args)
    except ConfigError as e:   # an API parameter an option fills (k, config...) is named as typed (--k, --config)
        typed = e.key in vars(args).keys() - {"figure", "dir_a", "dir_b"}   # less the positional arguments
        print(f"error: {ConfigError('--' + e.key, e.value, e.expected) if typed else e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:   # Ctrl-C: the shell's 128 + SIGINT, without a traceback (as repro.lab's)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


def draw_main(args: argparse.Namespace) -> int:
    from repro.analysis.render import LONGEST_STEM, build_figure, file_label

    if not Path(args.results).is_dir():   # else the first folder missing under it takes the blame
        what = "is a file" if Path(args.results).exists() else "does not exist"
        raise ConfigError("--results", args.results, f"an existing results folder (this one {what}): "
                          "where python -m repro.run +exp=NAME wrote its runs (results_dir, default results)")
    top = math.inf if args.figure == "uneven" else 1   # uneven times a loss (nats), not an error
    if args.target is not None and not 0 <= args.target <= top:   # nan too: else every speedup is blank
        raise ConfigError("--target", args.target, "a training error as a fraction in [0, 1]"
                          if top == 1 else "a training loss >= 0")
    named = args.name is not None
    if named and (args.figure == "all" or not args.name.strip() or args.name in (".", "..")
                  or Path(args.name).name != args.name):
        # else "a/b" blamed --out (no such file), all or '' ignored it without a word, and ' ' wrote ' .png'
        raise ConfigError("--name", args.name, "a file name, not blank and without a folder, for one figure "
                          "(with all, each figure's files are named after it; the folder is --out)")
    if args.exp is not None and not args.exp.strip():   # else '' drew the figure's own folder without a word
        raise ConfigError("--exp", args.exp, "an experiment folder's name, not blank "
                          "(leave --exp out for the figure's own)")
    if args.exp is not None and args.figure == "all":   # else every figure was drawn from that one folder's runs
        raise ConfigError("--exp", args.exp, "no --exp with all (each figure reads its own experiment folder); "
                          "name one figure to draw it from another folder")
    outside_runs("--out", args.out, args.results, Path(args.results) / (args.exp or ""))   # --exp may lie elsewhere
    each = args.figure == "all"
    figure = max(declared("figure"), key=len) if each else args.figure   # all: each is named after its figure
    widest = args.name or (f"{figure}-{file_label(args.config)}" if args.config else "")
    if len(widest.encode()) > LONGEST_STEM:
        # else the file system refused it as the first file was written: a traceback, or a line blaming --out
        made = "" if named else f": --config names them {figure}-SETTINGS" + ("" if each else "; give a shorter --name")
        raise ConfigError(*(("--config", args.config) if each else ("--name", widest)),   # all takes no --name
                          f"a file name of at most {LONGEST_STEM} bytes (a figure writes <name>_speedup.csv, and "
                          f"a temporary name {255 - LONGEST_NAME} bytes longer, within the file system's 255){made}")
    try:   # the loader skips unreadable runs with a warning: an OSError here is a file it writes
        paths = build_figure(args.figure, args.results, args.out, args.exp, args.target,
                             config=args.config, stem=widest or None)   # all: each named after its figure
    except OSError as e:   # a file in the way, no permission: one line, not a traceback
        # the rename into place names the file it would replace second; a full disk's names it in words
        where = f"{e.filename2 or e.filename}: " if e.filename else ""
        raise ConfigError("--out", args.out, f"a folder the figures can be written to "
                          f"({where}{e.strerror})") from None
    for path in paths:
        print(f"wrote {path}")
    return 0


def compare_main(args: argparse.Namespace) -> int:
    from repro.analysis import compare, trees
    from repro.analysis.render import write_csv

    names = compare.figure_names(args.figures)
    compare.check_options(args.k, args.target)
    if args.csv:
        outside_runs("--csv", args.csv, args.dir_a, args.dir_b)
    for d in (args.dir_a, args.dir_b):   # B missing is said before A is read (minutes, on a big tree)
        trees.tree_kind(d)
    a, b = (trees.read_tree(d, names, args.target, args.config) for d in (args.dir_a, args.dir_b))
    table = compare.compare(a, b, args.k, args.target)
    print(f"A: {a.describe()}\nB: {b.describe()}\n")
    print(compare.format_report(table))
    if args.csv:
        try:
            Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
            write_csv(table, Path(args.csv))
        except OSError as e:
            print(f"error: cannot write {args.csv}: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"wrote {args.csv}")
    return compare.exit_code(table)


if __name__ == "__main__":
    sys.exit(main())
