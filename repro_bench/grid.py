"""Grid benchmark: ``python -m repro.bench grid``. One figure's grid launched twice as a user
launches it, one point after another and in parallel: the wall times' ratio, and the two launches'
tables compared byte for byte (parallel jobs must not change a number). What it measures, its
target and its exit status are its ``--help``, :data:`DESCRIPTION`.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro_bench import positive

TARGET = 1.7
LAUNCHERS = (("basic", "basic (one after another)"), ("parallel", "parallel (joblib)"))
# what a --keep folder holds: this mark (the benchmark made the folder), the launches' trees
# (each launch starts by deleting its own) and the generated data
KEPT = (".repro-bench-grid", "basic", "parallel", "_data")

DESCRIPTION = f"""\
Grid launchers: wall time of one figure's grid run one point after another
(hydra/launcher=basic) divided by the same grid run in parallel, one job per
core with one torch thread each (hydra/launcher=parallel, the experiments'
default). Each launch starts from an empty results folder and is timed as a
user runs it: python -m repro.run +exp=NAME, with the warm-start baseline and
the figure included. Target >= {TARGET} on 2 cores.

Both launches must also write byte-identical tables (updates.csv and
evals.csv of every grid point) and the same figure CSV (an experiment that
draws no figure has its tables compared only); the benchmark says so, and
fails if they differ. A grid of one point (smoke) has no speedup to measure,
nothing runs in parallel: the benchmark says so and compares its tables only.

Exit status 0 when the ratio meets the target (a grid of one point has none)
and the tables are identical, 1 otherwise, 2 when python -m repro.run refuses
the launch."""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--exp", default="fig4", type=_experiment,
                        help="the experiment of simulated runs whose grid is timed (default: %(default)s)")
    parser.add_argument("--epochs", type=positive(float, allow_zero=True), default=0.0,
                        help="num_epochs of every grid point, to make the benchmark shorter; 0 "
                             "keeps the experiment's own (default: %(default)s). Fixed costs (start-up, "
                             "warm-start baseline, figure) weigh more in a shorter grid, so the ratio drops")
    parser.add_argument("--jobs", type=positive(int), default=None,
                        help="parallel jobs (default: one per core, as the launcher does)")
    parser.add_argument("--repeats", type=positive(int), default=1,
                        help="launches of each kind, interleaved; the fastest of each counts, so a "
                             "burst of other load on a shared machine counts less (default: %(default)s)")
    parser.add_argument("--keep", metavar="DIR", default=None,
                        help="write both results trees under DIR and keep them: a new or empty "
                             "folder, or one an earlier --keep wrote (its trees are replaced); "
                             "default: a temporary folder, removed afterwards")
    return parser


def _experiment(name: str) -> str:
    """An argparse type: an experiment of conf/exp/ that simulates (an unknown one was a RuntimeError
    traceback after its first launch failed; sim_vs_real's real runs, two-host ones too, took minutes
    to FAIL: their tables differ by nature, and in parallel they share the cores each needs)."""
    from repro.config.loader import CONF_DIR, group_options

    def simulated(exp: str) -> bool:   # the experiment's own mark, as tests/test_grids.py reads it
        return "override /backend: real" not in (CONF_DIR / "exp" / f"{exp}.yaml").read_text()

    if name not in (names := [exp for exp in group_options("exp") if simulated(exp)]):
        raise argparse.ArgumentTypeError(f"no experiment of simulated runs {name!r}; one of: {', '.join(names)}")
    return name


def command(exp: str, root: Path, launcher: str, epochs: float, jobs: int | None, data_root: Path) -> list[str]:
    cmd = [sys.executable, "-m", "repro.run", f"+exp={exp}", f"results_dir={root / 'results'}",
           f"figures_dir={root / 'figures'}", f"data.root={data_root}", "progress=false",
           f"hydra/launcher={launcher}"]
    if epochs:
        cmd.append(f"num_epochs={epochs:g}")
    if launcher == "parallel" and jobs:
        cmd.append(f"hydra.launcher.n_jobs={jobs}")
    return cmd


def timed(cmd: list[str], log_path: Path) -> float:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    start = time.perf_counter()
    with open(log_path, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:   # its status kept: a launch refused (2) is the benchmark's usage error
        raise subprocess.CalledProcessError(proc.returncode, cmd, log_path.read_text()[-3000:])
    return elapsed


def compare_trees(a: Path, b: Path, exp: str) -> tuple[int, list[str], list[str]]:
    """(grid points compared, what differs, figure CSVs compared) between two results trees of
    one experiment. An experiment that draws no figure has its tables compared only."""
    runs_a = {p.parent.name for p in (a / "results" / exp).glob("*/summary.json")}
    runs_b = {p.parent.name for p in (b / "results" / exp).glob("*/summary.json")}
    differ = [f"only in one launch: {name}" for name in sorted(runs_a ^ runs_b)]
    for name in sorted(runs_a & runs_b):
        for table in ("updates.csv", "evals.csv"):
            fa, fb = a / "results" / exp / name / table, b / "results" / exp / name / table
            if not filecmp.cmp(fa, fb, shallow=False):
                differ.append(f"{name}/{table}")
    figures_a = sorted(p.name for p in (a / "figures").glob("*.csv"))
    figures_b = sorted(p.name for p in (b / "figures").glob("*.csv"))
    if figures_a != figures_b:
        differ.append(f"figure CSVs: {figures_a} vs {figures_b}")
    for name in sorted(set(figures_a) & set(figures_b)):
        # the figure's numbers; run_dir names each run by its path, which differs by the tree
        text_a = (a / "figures" / name).read_text().replace(str(a / "results"), "RESULTS")
        text_b = (b / "figures" / name).read_text().replace(str(b / "results"), "RESULTS")
        if text_a != text_b:
            differ.append(f"figures/{name}")
    return len(runs_a & runs_b), differ, figures_a


def run(args: argparse.Namespace) -> int:
    from repro.runtime import usable_cores

    n_cores = usable_cores()
    jobs = args.jobs or n_cores
    keep = Path(args.keep).resolve() if args.keep else None
    base = keep or Path(tempfile.mkdtemp(prefix="repro-bench-grid-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        held = {p.name for p in base.iterdir()}
    except OSError as exc:   # a file, or a place no folder can be made: a usage error, not a traceback
        print(f"python -m repro.bench grid: --keep {args.keep}: cannot make the folder ({exc.strerror})",
              file=sys.stderr)
        return 2
    if held and not (KEPT[0] in held and held <= set(KEPT)):   # a launch deletes its tree: never a user's
        print(f"python -m repro.bench grid: --keep {args.keep}: holds files an earlier --keep did not "
              f"write; name a new or empty folder", file=sys.stderr)
        return 2
    (base / KEPT[0]).touch()
    try:
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        epochs = f" num_epochs={args.epochs:g}" if args.epochs else ""
        print(f"grid launchers: +exp={args.exp}{epochs}, {n_cores} cores, {jobs} parallel jobs, "
              f"1 torch thread per job (target >= {TARGET:.2f})")
        print(f"load average before: {load}", flush=True)
        data_root = base / "_data"   # generated data (mnist1d) once for both launches
        walls: dict[str, list[float]] = {launcher: [] for launcher, _ in LAUNCHERS}
        print(f"{'launcher':<28} {'jobs':>5} {'wall s':>8}")
        for _ in range(args.repeats):   # interleaved, so a busy spell slows both alike
            for launcher, label in LAUNCHERS:
                root = base / launcher
                shutil.rmtree(root, ignore_errors=True)   # every launch starts from nothing
                root.mkdir(parents=True)
                cmd = command(args.exp, root, launcher, args.epochs, jobs, data_root)
                walls[launcher].append(timed(cmd, root / "launch.log"))
                print(f"{label:<28} {1 if launcher == 'basic' else jobs:>5} {walls[launcher][-1]:>8.1f}",
                      flush=True)
        points, differ, figures = compare_trees(base / "basic", base / "parallel", args.exp)
        ratio = min(walls["basic"]) / min(walls["parallel"])
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        ok_ratio, ok_same = ratio >= TARGET or points == 1, not differ
        print(f"load average after:  {load}")
        best = f"fastest of {args.repeats} each, " if args.repeats > 1 else ""
        if points == 1:   # smoke: its one run timed under each launcher, whose ratio was printed as a speedup
            print("speedup: none, a grid of one point has nothing to run in parallel (its tables are compared only)")
        else:
            print(f"speedup ({best}basic / parallel): {ratio:.2f}  {'PASS' if ok_ratio else 'FAIL'}")
        differing = {d.split("/")[0] for d in differ if d.endswith((".csv",)) and not d.startswith("figures")}
        figure_same = not any(d.startswith("figure") for d in differ)
        figure = ("identical" if figures else "none (the experiment draws no figure): tables only") \
            if figure_same else "DIFFERS"
        print(f"identical tables: {points - len(differing)}/{points} grid points; figure CSV "
              f"{figure}  {'PASS' if ok_same else 'FAIL'}")
        for d in differ:
            print(f"  differs: {d}")
        if keep:
            print(f"results kept in {keep}")
        return 0 if ok_ratio and ok_same else 1
    except subprocess.CalledProcessError as exc:   # a launch that failed: its command, status and log's tail
        print(f"python -m repro.bench grid: {' '.join(exc.cmd)} exited {exc.returncode}:\n{exc.output.rstrip()}",
              file=sys.stderr)
        return 2 if exc.returncode == 2 else 1
    finally:
        if keep is None:
            shutil.rmtree(base, ignore_errors=True)
