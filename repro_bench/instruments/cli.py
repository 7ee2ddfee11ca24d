"""``python -m repro.bench simreal``: the simulator's predictions held against the real runs of
``+exp=sim_vs_real``, printed per grid point against the targets, then summed up in the five
numbers of :mod:`repro_bench.instruments.accuracy` (MAPE, worst point, bias, Kendall's tau, time to
target against the seed spread).

This module owns the subcommand's options and its report; :mod:`repro_bench.__main__` mounts it
(the one module outside the instruments that imports them) and hands it the bare training loops
of :mod:`repro_bench.real` (``--machine``), so the instruments import nothing of the benchmarks'.
"""
from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple

from repro.files import schema
from repro.runtime import EXIT_INTERRUPTED
from repro_bench import positive
from repro_bench.instruments import EXP


DEFAULT = f"results/{EXP}"   # the experiment's own folder: the one the command may run it into


class BareLoops(NamedTuple):
    """What ``--machine`` measures with (:mod:`repro_bench.real`'s bare training loops side by side)."""
    rate: Callable[[int], float]       # samples/s of k loops together
    step_cv: Callable[[int], float]    # per-step time CV of k loops together

DESCRIPTION = """\
The simulator against reality. Reads the runs of +exp=sim_vs_real (real runs
on this machine over loopback and across two hosts on a limited link, and the
simulator's runs with a cost model fitted to each setting's one-client runs),
running the experiment first when its folder holds none (one --results names
must exist), and prints per grid point, median over seeds: measured and
predicted samples/s and the error (target: within 15%), mean staleness and its
error (target: within 10%), the Kolmogorov-Smirnov distance between the
staleness distributions (target: below 0.1, points with 2 or more clients),
and whether the measured time to the target error lies inside the simulator's
range over seeds. Then, over all points: the mean absolute percentage error
(MAPE) of samples/s, the worst point, the bias (mean signed error: over- or
under-prediction), Kendall's tau between predicted and measured samples/s (do
the configurations keep their order?) and the time-to-target error against the
real runs' seed spread."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=None,
                        help=f"the experiment's folder, run into first when it holds no run; one named "
                             f"here must exist (default: {DEFAULT})")
    parser.add_argument("--machine", action="store_true",
                        help="first measure what this machine gives now: samples/s of 1, 2 and 4 bare "
                             "training loops side by side (no server, no messages), and the cores they "
                             "add up to (other jobs' load lowers it below the cores the run may use)")
    parser.add_argument("--parts", action="store_true",
                        help="also re-simulate each loopback point with parts of the machine's model "
                             "left out (a device per client; shared cores alone; and transfers; and "
                             "evaluations: the fit; with --machine also the fit on the cores bare loops "
                             "got now), in a temporary folder, and print each one's error")
    parser.add_argument("--spread", action="store_true",
                        help="also, per point with 2 or more clients: the staleness KS distance when the "
                             "point is re-simulated (temporary folder) with a compute jitter matching its "
                             "own measured per-push compute spread, the measured compute CV against the "
                             "fitted model's, and the KS distance between real runs of different seeds "
                             "(the measurement's noise floor); with --machine also the per-step time CV "
                             "of 1, 2 and 4 bare training loops side by side (the OS scheduler's spread)")
    parser.add_argument("--cores", metavar="NSYNC:CLIENTS", type=_point, default=None,
                        help="instead of the tables, measure where the cores go at one grid point, e.g. "
                             "8:4: real runs of it and of its one-client counterpart over loopback and "
                             "across the two hosts (as root), each process's CPU time sampled every 0.1 s: "
                             "cores used by the server, the clients and the machine's kernel, the clients' "
                             "CPU and run-queue wait per push, and the kernel's CPU ms per MB the messages "
                             "moved; then the point's predicted runs in --results re-simulated with what "
                             "was measured (about 2.5 minutes)")
    parser.add_argument("--cores-epochs", type=positive(float), default=40.0,
                        help="epochs of each --cores run: enough for a steady middle (default: %(default)s)")


# what --parts leaves out of the fitted machine, from nothing modelled to all of it
PARTS = (("dedicated", dict(topology="dedicated", clients_per_host=1, devices_per_host=None, one_machine=False,
                            eval_s=0.0)),
         ("cores", dict(one_machine=False, eval_s=0.0)),
         ("+transfers", dict(eval_s=0.0)),
         ("+evaluations", {}))


def machine_parts(root: Path, cores: float | None = None):
    """Samples/s error (median over seeds) of each loopback point re-simulated with each of
    :data:`PARTS` of the fitted machine: how much of the clock each part explains; with
    ``cores`` (what bare loops side by side got, :func:`machine_now`) also the fit on that many
    cores (rounded) instead of those the run could use: how much other jobs' load explains."""
    import tempfile

    import pandas as pd

    from repro_bench.instruments import points as lab
    from repro_bench.instruments.spread import resimulate

    runs, _, _, _ = lab.read_runs(root)
    predicted = runs[(runs.side == "predicted") & (runs.link == "loopback")]
    measured = runs[(runs.side == "measured") & (runs.link == "loopback")]
    if predicted.empty or measured.empty:   # links=[link]: nothing on loopback to take apart
        return pd.DataFrame()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, r in predicted.iterrows():
            variants = PARTS if cores is None else (*PARTS, ("now", dict(devices_per_host=max(1, round(cores)))))
            for name, change in variants:
                run_dir = resimulate(r.run_dir, Path(tmp) / f"{name}-{Path(r.run_dir).name}", **change)
                rows.append({**{k: r[k] for k in ("nsync", "num_clients", "seed")}, "part": name,
                             "samples_per_s": lab.samples_per_s(pd.read_csv(run_dir / schema.UPDATES_FILE))})
    table = pd.DataFrame(rows).groupby(["nsync", "num_clients", "part"], sort=False).samples_per_s.median()
    meas = measured.groupby(["nsync", "num_clients"]).samples_per_s.median()
    out = table.unstack("part")[[name for name, _ in PARTS] + ([] if cores is None else ["now"])]
    return out.div(meas, axis=0).sub(1)


def print_table(table) -> bool:
    """The grid points against the targets; True when every target is met."""
    from repro_bench.instruments import points as lab

    ok = True
    head = (f"{'link':9s} {'nsync':>5s} {'clients':>7s} {'meas/s':>9s} {'pred/s':>9s} {'error':>7s}   "
            f"{'stale m/p':>11s} {'error':>7s}   {'KS':>5s}   {'time to target (s): meas in [sim]':34s}")
    print(head)
    for _, r in table.iterrows():
        s_ok = abs(r.samples_error) <= lab.SAMPLES_TARGET
        st_ok = r.num_clients < 2 or abs(r.staleness_error) <= lab.STALENESS_TARGET
        ks_ok = r.num_clients < 2 or r.ks_distance <= lab.KS_TARGET
        ok &= s_ok and st_ok and ks_ok and bool(r.time_to_target_inside)
        stale_err = "" if r.num_clients < 2 else f"{r.staleness_error:+7.1%}"
        ks = "" if r.num_clients < 2 else f"{r.ks_distance:5.3f}"
        print(f"{r.link:9s} {r.nsync:5d} {r.num_clients:7d} {r.measured_samples_per_s:9.0f} "
              f"{r.predicted_samples_per_s:9.0f} {r.samples_error:+7.1%} {'PASS' if s_ok else 'FAIL'} "
              f"{r.measured_staleness:5.2f}/{r.predicted_staleness:5.2f} {stale_err:>7s} "
              f"{'' if r.num_clients < 2 else ('PASS' if st_ok else 'FAIL'):4s} {ks:>5s} "
              f"{'' if r.num_clients < 2 else ('PASS' if ks_ok else 'FAIL'):4s} "
              f"{_time(r.measured_time_to_target_s):>6s} in [{_time(r.predicted_time_to_target_min_s)}, "
              f"{_time(r.predicted_time_to_target_max_s)}] {'yes' if r.time_to_target_inside else 'no'}")
    return ok


def _time(seconds: float) -> str:
    """A time to target as the table prints it: 'never' where no seed reached it (NaN was printed)."""
    return "never" if seconds != seconds else f"{seconds:.3f}"


def machine_now(loops: BareLoops) -> float:
    """Bare training loops side by side: the cores this machine gives the runs right now, which
    the fit takes to be the cores they may use (os.sched_getaffinity)."""
    one, cores = loops.rate(1), {}
    print(f"bare training loops side by side (digits_cnn, one thread each): 1: {one:.0f} samples/s", end="")
    for k in (2, 4):
        rate = loops.rate(k)
        cores[k] = rate / one
        print(f"; {k}: {rate:.0f} samples/s = {cores[k]:.2f} cores", end="")
    print(flush=True)
    return max(cores.values())


def print_spread(table) -> None:
    """The staleness KS of each point with the fitted jitter, with the point's own spread, and
    the noise floor of the real runs; the compute CVs behind them."""
    print(f"{'link':9s} {'nsync':>5s} {'clients':>7s}   {'KS fitted':>9s} {'KS spread':>9s} {'KS floor':>8s}   "
          f"{'compute CV meas/fitted':>22s}   {'jitter_sigma fitted -> spread':>29s}")
    for _, r in table.iterrows():
        print(f"{r.link:9s} {r.nsync:5d} {r.num_clients:7d}   {r.ks_distance:9.3f} {r.ks_spread:9.3f} "
              f"{r.ks_floor:8.3f}   {r.measured_compute_cv:10.3f}/{r.predicted_compute_cv:<11.3f}   "
              f"{r.jitter_sigma:14.3f} -> {r.spread_jitter_sigma:<11.3f}")


def scheduler_spread(loops: BareLoops) -> None:
    """Per-step time CV of 1, 2 and 4 bare training loops side by side: the OS's share."""
    print("per-step time CV of bare training loops side by side (no server, no messages): "
          + "; ".join(f"{k}: {loops.step_cv(k):.3f}" for k in (1, 2, 4)), flush=True)


def _point(text: str) -> tuple[int, int]:
    try:
        nsync, clients = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NSYNC:CLIENTS such as 8:4, got {text!r}") from None
    if nsync < 1 or clients < 1:
        raise argparse.ArgumentTypeError(f"nsync and clients must be at least 1, got {text!r}")
    return nsync, clients


def _quoted(text: str) -> str:
    """``text`` as one quoted Hydra override value (not one that ends in a backslash: no path does)."""
    return "'" + text.replace("'", "\\'") + "'"


def _for_shell(override: str) -> str:
    """``override`` as bash must be given it for Hydra to read the same value: a plain name or path
    as it is (bash drops its quotes, Hydra reads the same string), any other quoted for bash too."""
    key, value = override.split("=", 1)
    plain = re.fullmatch(r"'[A-Za-z_/][\w./-]*'", value, re.ASCII) and \
        value[1:-1].lower() not in ("true", "false", "null", "inf", "nan")   # Hydra reads those bare as no string
    if plain or shlex.quote(value) == value:
        return override
    # "'a b'" reads best; inside bash's double quotes $ ` \ ! " still act
    return f'{key}="{value}"' if not set(value) & set('"$`\\!') else f"{key}={shlex.quote(value)}"


def _cores(args: argparse.Namespace, root: Path) -> int:
    """``--cores``: its measurement, ended in one line (a stop: :func:`repro_bench.__main__.main`)."""
    from repro_bench.instruments.cores import print_cores

    try:
        print_cores(*args.cores, args.cores_epochs, results=root)
    # too few epochs (cores.TooShort) or a --results run that does not read: 2; a real run that failed: 1
    except (ValueError, RuntimeError) as exc:
        print(f"python -m repro.bench simreal: --cores {args.cores[0]}:{args.cores[1]} "
              f"--cores-epochs {args.cores_epochs:g}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    return 0


def _experiment(cmd: list[str]) -> int:
    """Run the experiment in a session of its own and hand it each Ctrl-C, SIGTERM or SIGHUP once,
    so it stops as it does alone (first: runs end interrupted, resumable; second: forced). A
    subprocess.run SIGKILLed it 0.25 s after a Ctrl-C, mid-checkpoint, and a SIGTERM left it running."""
    import signal

    proc = subprocess.Popen(cmd, start_new_session=True)
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda signum, frame: proc.send_signal(signum)) for sig in sigs}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace, loops: BareLoops) -> int:
    import pandas as pd

    from repro_bench.instruments import points as lab
    from repro_bench.instruments.accuracy import accuracy

    root = Path(DEFAULT if args.results is None else args.results)
    # a typo ran the whole experiment into it (minutes); '' (a $DIR unset) into the current folder
    if args.results is not None and not (args.results and root.exists()):
        print(f"python -m repro.bench simreal: --results {args.results or repr('')}: no such folder; make it to "
              f"run the experiment into it, or leave --results out for {DEFAULT}", file=sys.stderr)
        return 2
    if args.cores and (args.machine or args.parts or args.spread):   # ignored in silence after its minutes
        print("python -m repro.bench simreal: --cores measures instead of the tables; --machine, --parts and "
              "--spread go without it", file=sys.stderr)
        return 2
    if args.cores:
        return _cores(args, root)

    cores = machine_now(loops) if args.machine else None
    if not lab.run_dirs(root):
        where = root.resolve()   # '.' or 'x/..' has no name of its own to give exp_name
        # quoted: a ',' in a bare Hydra override is a sweep (two experiments), '=' or '[' a parse error
        cmd = [sys.executable, "-m", "repro.run", f"+exp={EXP}", f"results_dir={_quoted(str(where.parent))}",
               f"exp_name={_quoted(where.name)}"]
        shown = " ".join(["python", *cmd[1:3], *map(_for_shell, cmd[3:])])   # a command to copy
        print(f"no runs in {root}: running {shown}", flush=True)
        code = _experiment(cmd)
        if code == EXIT_INTERRUPTED:   # its "same command with resume=auto" is not this one
            print(f"python -m repro.bench simreal: the experiment stopped; {shown} resume=auto "
                  "finishes it, then this command reports on it", file=sys.stderr)
            return EXIT_INTERRUPTED
        if code and not lab.run_dirs(root):   # it said why (e.g. --results a file); "no grid point" would not
            return code
    try:
        runs, stale, _, unfinished = lab.read_runs(root)
    except ValueError as exc:   # a run folder that does not read: named in one line
        print(f"python -m repro.bench simreal: {exc}", file=sys.stderr)
        return 2
    # a killed run (summary 'running'), an interrupted or a failed one is not read: say so, not in silence
    unfinished = f" ({unfinished} run folder(s) not finished, left out)" if unfinished else ""
    table = lab.points_table(runs, stale)
    if table.empty:
        print(f"python -m repro.bench simreal: no grid point in {root} has both a measured and a predicted "
              f"run{unfinished}", file=sys.stderr)
        return 2
    if unfinished:
        print(f"in {root}{unfinished}: their points have fewer seeds")
    ok = print_table(table)
    print("\nthe simulator's accuracy over all points (samples/s medians over seeds):")
    print("\n".join("  " + line for line in accuracy(table, runs).lines()))
    try:   # a run folder without timings.csv (an older or edited recording): named, not a traceback
        if args.parts:
            print("\nwhere a round trip went, ms (timings.csv means, median over seeds):")
            with pd.option_context("display.width", 250, "display.max_columns", 20):
                print(lab.parts_table(runs).to_string(float_format=lambda x: f"{x:.2f}"))
            print("\nsamples/s error of the loopback points with parts of the machine's model (median over seeds):")
            parts = machine_parts(root, cores)
            print(parts.to_string(float_format=lambda x: f"{x:+.1%}") if not parts.empty else
                  f"  none: {root} has no loopback point with both a measured and a predicted run")
        if args.spread:
            from repro_bench.instruments.spread import spread_table

            print("\nstaleness KS of the points with 2+ clients (median over seeds): the fitted jitter, "
                  "the jitter of the point's own measured compute spread, the real runs' seed-to-seed floor:")
            print_spread(spread_table(root))
            if args.machine:
                scheduler_spread(loops)
    except (OSError, ValueError) as exc:
        print(f"python -m repro.bench simreal: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1
