"""The benchmarks' command line: ``python -m repro.bench {sim,real,grid,simreal,startup}``.

One subcommand per benchmark, each owning its options and its plain-text help (written for users,
unlike these docstrings); each prints ratios measured in one run, never asserted by tests (wall
times vary by machine): docs/benchmarks.md has the targets and our numbers. This is the one module
that imports the instruments (:mod:`repro_bench.instruments`): it mounts their ``simreal``
subcommand and hands them the bare training loops they measure the machine with, so they import
no benchmark.
"""
from __future__ import annotations

import argparse
import sys

from repro.errors import ConfigError
from repro_bench import positive
from repro_bench import grid as bench_grid
from repro_bench import real as bench_real
from repro_bench import startup as bench_startup
from repro_bench.instruments import cli as bench_simreal   # the one import of the instruments (see above)
from repro_bench.sim import SIM_DESCRIPTION, TARGET_SIM, bench_sim

DESCRIPTION = """\
Benchmarks of the two drivers. Each measures ratios of wall times or
throughputs in one run, so the machine's speed largely cancels out, and prints
each ratio against its target with PASS or FAIL. Ratios on a busy machine move
by about 10% between runs."""

EPILOG = """\
'python -m repro.bench sim --help', 'python -m repro.bench real --help',
'python -m repro.bench grid --help', 'python -m repro.bench simreal --help' and
'python -m repro.bench startup --help'
say more about each benchmark and list its options. Exit status: 0 when every
ratio meets its target, 1 when one does not, 2 on a usage error."""


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per benchmark, each owning its options, so they go after its name."""
    raw = argparse.RawDescriptionHelpFormatter   # keep the hand-wrapped paragraphs
    parser = argparse.ArgumentParser(prog="python -m repro.bench", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=raw)
    sub = parser.add_subparsers(dest="which", required=True, metavar="{sim,real,grid,simreal,startup}",
                                title="benchmarks")
    sim = sub.add_parser("sim", formatter_class=raw, description=SIM_DESCRIPTION,
                         help=f"simulator overhead: simulator wall time / a plain training loop "
                              f"taking the same steps (target <= {TARGET_SIM:.2f})")
    sim.add_argument("--epochs", type=positive(float), default=20.0,
                     help="simulated epochs per measurement (default: %(default)s)")
    sim.add_argument("--repeats", type=positive(int), default=3,
                     help="measurements per setting, interleaved with the plain loop's; the best "
                          "counts (default: %(default)s)")
    real = sub.add_parser("real", formatter_class=raw, description=bench_real.DESCRIPTION,
                          help=f"real driver: (a) push+fetch round trips / raw gloo send+recv "
                               f"(target >= {bench_real.PROTOCOL_TARGET}); (b) training samples/s, "
                               f"2 CPU clients / 1 client (target >= {bench_real.THROUGHPUT_TARGET})")
    bench_real.add_arguments(real)
    grid = sub.add_parser("grid", formatter_class=raw, description=bench_grid.DESCRIPTION,
                          help=f"grid launchers: one figure's grid run one point after another / in "
                               f"parallel, one job per core (target >= {bench_grid.TARGET} on 2 cores)")
    bench_grid.add_arguments(grid)
    simreal = sub.add_parser("simreal", formatter_class=raw, description=bench_simreal.DESCRIPTION,
                             help="the simulator against real runs (+exp=sim_vs_real): predicted / measured "
                                  "samples/s within 15%%, staleness within 10%% and KS < 0.1, time to target")
    bench_simreal.add_arguments(simreal)
    startup = sub.add_parser("startup", formatter_class=raw, description=bench_startup.DESCRIPTION,
                             help="start-up: --help, a typo, a simulation's and a real run's time beyond "
                                  "their work, each / a torch import in the same run")
    bench_startup.add_arguments(startup)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark named; a Ctrl-C, SIGTERM or SIGHUP ends it in one line, 130, its runs
    and temporary folders taken along (a Ctrl-C was a traceback; a SIGTERM died on the spot,
    leaving them: grid's launch ran on, its folder stayed in /tmp); a reader of its output that
    left (``| head``) ends it quietly, as a Unix tool (a BrokenPipeError traceback)."""
    import os
    import signal

    from repro.runtime import EXIT_INTERRUPTED
    from repro_bench.instruments.hosts import Terminated

    args = parse_args(argv)

    def unwind(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, unwind) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = _run(args)
        sys.stdout.flush()   # here, where a reader that left is caught, not at exit
        return code
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"python -m repro.bench {args.which}: stopped by {str(exc) or 'SIGINT'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:   # nothing more reaches the reader, nor at exit; the status a SIGPIPE gives
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.which == "sim":
            return 0 if bench_sim(args.epochs, args.repeats) else 1
        if args.which == "real":
            return bench_real.run(args)
    except ConfigError as exc:   # the benchmark's runs refuse the budget: a usage error
        print(f"python -m repro.bench {args.which}: --epochs {args.epochs:g} does not fit the benchmark's "
              f"runs: {exc}", file=sys.stderr)
        return 2
    if args.which == "grid":
        return bench_grid.run(args)
    if args.which == "simreal":
        return bench_simreal.run(args, bench_simreal.BareLoops(bench_real.plain_rate, bench_real.plain_step_cv))
    return bench_startup.run(args)


if __name__ == "__main__":
    sys.exit(main())
