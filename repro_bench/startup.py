"""Start-up benchmark (``python -m repro.bench startup``): what a command costs beyond its work.

Every figure is a ratio to ``python -c "import torch"`` timed in the same run, so a busy machine
moves both sides alike, measured as whole processes, the way a user waits for them; what each
measures and its target: its ``--help``, :data:`DESCRIPTION`. A simulation's own time is
``wall_time_s`` in summary.json, a real run's training time the server's first fetch to its last
applied push.

With ``REPRO_STARTUP_TRACE`` set, every process of a real run appends its marks
(:func:`repro.logs.mark`), and the report takes each real run apart: imports, the config, the
store, the problem, the clients' start and build, the rendezvous, serving, stopping the clients,
the summary, the exit. Last, the protocol's efficiency against raw gloo send/recv at 0.1M, 1M and
10M parameters (:func:`repro_bench.real.measure_protocol`, target at least 0.9): what a push and
a fetch cost beyond moving their bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from repro.logs import TRACE_ENV
from repro.runtime import memory_bytes
from repro_bench import positive
from repro_bench.real import PROTOCOL_TARGET, SIZES, measure_protocol

CLI_TARGET, SIM_TARGET, REAL_TARGET = 0.5, 1.5, 3.0

DESCRIPTION = f"""\
What a command costs beyond its own work, each figure a ratio to
'python -c "import torch"' timed in the same run (median of --repeats):

  --help and a typo        the whole process          target <= {CLI_TARGET}
  the default simulation   process time beyond the run's own     <= {SIM_TARGET}
  the real driver, 4 and 8 clients: process time beyond training  <= {REAL_TARGET}

The real runs are also taken apart: where each process's time goes before
the first fetch and after the last push. Then the protocol's efficiency:
push+fetch round trips / raw gloo send+recv at 0.1M, 1M and 10M parameters,
target >= {PROTOCOL_TARGET}. Exit status 0 when every ratio meets its target, 1 otherwise,
2 when the real driver refuses a --clients, or when more client processes than
the machine's memory holds (each the size of the torch import, at least) are
asked for."""


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--repeats", type=positive(int), default=3,
                        help="measurements of each command; the median counts (default: %(default)s)")
    parser.add_argument("--clients", type=positive(int), nargs="+", default=[4, 8],
                        help="client counts of the real runs (default: 4 8)")
    parser.add_argument("--skip-protocol", action="store_true",
                        help="skip the protocol-efficiency measurement (about a minute)")
    return parser


def _timed(args: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``python ARGS`` as a process, and what it did."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    return time.perf_counter() - start, done


def median_s(args: list[str], repeats: int) -> float:
    return statistics.median(_timed(args)[0] for _ in range(repeats))


def clients_that_fit() -> tuple[int, str]:
    """How many client processes beside the server this machine's memory holds at once (what
    build_model bounds a model by), each at least the largest torch-importing child measured so
    far (its peak resident set); and why, in words. More would swap, not measure start-up."""
    import resource

    each = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, 1)   # Linux: KiB
    memory = memory_bytes()
    return memory // each - 1, f"{memory / 2**30:.0f} GiB of memory, {each / 2**20:.0f} MiB a process"


def run_overhead(overrides: list[str], folder: Path, trace: Path | None = None) -> dict:
    """One run as a process: its wall time, the summary's own times and, with a trace, the marks."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if trace is not None:
        env[TRACE_ENV] = str(trace)
    results = folder / "results"
    start = time.time()
    argv = ["-m", "repro.run", *overrides, f"results_dir={results}", "progress=false"]
    seconds, done = _timed(argv, env)
    if done.returncode != 0:
        raise RuntimeError(f"python -m repro.run {' '.join(overrides)} exited {done.returncode}:\n"
                           + done.stderr[-2000:])
    summary = json.loads(next(results.rglob("summary.json")).read_text())
    return {"process_s": seconds, "start": start, "summary": summary}


def phases(trace: Path, start: float, end: float) -> list[tuple[str, float]]:
    """(phase, seconds since the previous one) along a real run, from its trace: the server's
    marks in order, the clients' as the median over clients, and the process's exit."""
    marks: dict[tuple[str, str], list[float]] = {}
    for line in trace.read_text().splitlines():
        t, role, _pid, phase = line.split("\t")
        marks.setdefault((role, phase), []).append(float(t))
    points = sorted((statistics.median(ts), f"{role}: {phase}") for (role, phase), ts in marks.items())
    out, last = [], start
    for t, name in points + [(end, "main: exited")]:
        out.append((name, t - last))
        last = t
    return out


def measure_real(num_clients: int, folder: Path) -> dict:
    trace = folder / "trace.tsv"
    out = run_overhead(["backend=real", f"num_clients={num_clients}"], folder, trace)
    training = out["summary"]["time_s"]
    out["training_s"] = training
    out["beyond_s"] = out["process_s"] - training
    out["phases"] = phases(trace, out["start"], out["start"] + out["process_s"]) if trace.exists() else []
    return out


def protocol_report(proto: dict) -> int:
    """Print the protocol's efficiency per size; the number of sizes below the target."""
    print(f"\nprotocol efficiency: push+fetch round trips / raw gloo send+recv (target >= {PROTOCOL_TARGET})")
    failures = 0
    for size, row in proto.items():
        verdict = "PASS" if row["ratio"] >= PROTOCOL_TARGET else "FAIL"
        failures += verdict == "FAIL"
        print(f"{size / 1e6:>9.1f}M params {row['ratio']:>7.3f} {verdict:>7}  (raw/raw noise floor "
              f"{row['ratio_raw_vs_raw']:.3f})")
    return failures


def run(args: argparse.Namespace) -> int:
    from repro.config.checks import validate
    from repro.config.settings import BackendConfig, RunConfig
    from repro.errors import ConfigError

    for n in args.clients:   # refused here, not in a traceback after the minute measuring the rest
        try:
            validate(RunConfig(num_clients=n, backend=BackendConfig(name="real")))
        except ConfigError as exc:
            print(f"python -m repro.bench startup: --clients {n}: {exc}", file=sys.stderr)
            return 2
    load = os.getloadavg()   # before the torch import: its size bounds --clients, refused before any output
    torch_s = median_s(["-c", "import torch"], args.repeats)
    fit, why = clients_that_fit()
    if (most := max(args.clients)) > fit:
        print(f"python -m repro.bench startup: --clients {most}: at most {fit} client processes beside the "
              f"server on this machine ({why})", file=sys.stderr)
        return 2
    print(f"start-up benchmark: {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in load)}")
    print(f"python -c 'import torch': {torch_s:.2f} s (median of {args.repeats})\n", flush=True)
    rows = [(name, median_s(["-m", "repro.run", word], args.repeats), CLI_TARGET)
            for name, word in (("--help", "--help"), ("a typo (num_clientz=3)", "num_clientz=3"))]
    with tempfile.TemporaryDirectory(prefix="repro-bench-startup-") as tmp:
        sims = [run_overhead([], Path(tmp) / f"sim{i}") for i in range(args.repeats)]
        beyond = statistics.median(s["process_s"] - s["summary"]["wall_time_s"] for s in sims)
        rows.append(("default simulation, beyond its run", beyond, SIM_TARGET))
        # once each: a count given twice timed its second run, skipped as done, as the real one
        reals = {n: measure_real(n, Path(tmp) / f"real{n}") for n in dict.fromkeys(args.clients)}
    for n, out in reals.items():
        rows.append((f"real, {n} clients, beyond training", out["beyond_s"], REAL_TARGET))
    failures = 0
    print(f"{'what':<40} {'seconds':>8} {'x torch':>8} {'target':>7} {'verdict':>7}")
    for name, seconds, target in rows:
        verdict = "PASS" if seconds / torch_s <= target else "FAIL"
        failures += verdict == "FAIL"
        print(f"{name:<40} {seconds:>8.2f} {seconds / torch_s:>8.2f} {target:>7.1f} {verdict:>7}")
    for n, out in reals.items():
        print(f"\nreal, {n} clients: {out['process_s']:.2f} s in all, {out['training_s']:.2f} s training")
        for name, seconds in out["phases"]:
            print(f"  {name:<36} {seconds:>7.2f} s")
    if not args.skip_protocol:
        failures += protocol_report(measure_protocol(SIZES))
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failures else 0
