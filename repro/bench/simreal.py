"""``+exp=sim_vs_real`` and ``python -m repro.bench simreal``: the simulator's predictions held
against real runs on this machine.

This module owns the experiment's pipeline after its Hydra grid (the real runs on loopback,
one after another: ``conf/exp/sim_vs_real.yaml``), as the grid's callback :class:`SimVsReal`:

1. the same grid across two hosts over a tbf-limited link (:mod:`repro.bench.two_hosts`), with
   fewer epochs (a slow link); skipped, with the harness's reason, where namespaces cannot be
   made;
2. for each setting (link, nsync) the cost model fitted to that setting's one-client runs (all
   seeds: ``cost=fit``, :mod:`repro.sim.fit`), on the limited link with the link's known rate;
3. the whole grid simulated with it, each seed;
4. the figure and its table (:mod:`repro.analysis.lab.simreal`).

Every run has a folder of its own under ``results/sim_vs_real/``: the grid's (Hydra's names),
``link/<point>/`` (the two-host runs), ``predicted/<link>/<point>/`` (the simulator's). A
finished folder is skipped on a rerun. The benchmark reads the tree (running the experiment first
when it holds no run) and prints each grid point against the issue's targets.
"""
from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.analysis.lab import simreal as lab
from repro.bench import positive
from repro.config.checks import validate
from repro.config.settings import BackendConfig, CostConfig, RunConfig
from repro.files import schema

EXP = "sim_vs_real"
# TCP payload per 1514-byte Ethernet frame: what of the tbf rate a transfer gets (REPRODUCE.md,
# "Two real hosts": measured 0.96-0.97 of the configured rate)
PAYLOAD = 1448 / 1514


def _say(line: str) -> None:
    print(f"{EXP}: {line}", file=sys.stderr, flush=True)


def grid_jobs(config: DictConfig) -> list[dict[str, str]]:
    """Each grid point's swept settings ({key: value}), from the experiment's sweep and the
    command line's, in launch order (Hydra's basic sweeper)."""
    from repro.launcher import sweep_jobs

    params = config.hydra.sweeper.get("params") or {}
    task = list(config.hydra.overrides.task)
    swept = set(params) | {o.split("=", 1)[0] for o in task if "," in o}
    return [{k: v for k, v in (o.split("=", 1) for o in job) if k in swept} for job in sweep_jobs(config)]


def point_name(job: dict[str, str]) -> str:
    """A grid point's folder name, ``nsync1_num_clients2_seed0``: without the ``=`` and ``,``
    that Hydra would read as syntax in the ``results_dir=`` of a two-host run."""
    return "_".join(f"{k}{job[k]}" for k in sorted(job))


def finished(folder: Path) -> bool:
    """Whether ``folder`` holds a finished run anywhere below it."""
    return bool(lab.run_dirs(folder))


class SimVsReal(Callback):
    """After the loopback grid: the limited link's runs, the fits, the simulations, the figure."""

    def __init__(self, out_dir: str = "figures", link_mbit: float = 100.0, link_epochs: float = 4.0,
                 links: Any = ("loopback", "link"), name: str = EXP) -> None:
        self.out_dir, self.link_mbit, self.link_epochs = out_dir, float(link_mbit), float(link_epochs)
        self.links, self.name = tuple(links), name

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        from repro.config.help import parse

        base = parse(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
        root = Path(base.results_dir) / base.exp_name
        jobs = grid_jobs(config)
        swept = set(jobs[0]) if jobs else set()
        task = [o for o in config.hydra.overrides.task if o.split("=", 1)[0] not in swept
                and not o.lstrip("+~").startswith(("exp", "hydra", "num_epochs", "results_dir", "figures_dir", "progress"))]
        links = ["loopback"]
        if "link" in self.links:
            links += self.run_link(base, root, jobs, task)
        for link in links:
            self.simulate(base, root, jobs, link)
        try:
            paths = lab.write_figure(root, base.figures_dir, self.name)
        except ValueError as err:
            _say(f"no figure drawn: {err}")
            return
        _say("wrote " + ", ".join(str(p) for p in paths))

    def link_Bps(self) -> float:
        """Bytes/s of TCP payload the link gives one transfer alone (its known rate)."""
        return self.link_mbit * 1e6 / 8 * PAYLOAD

    def burst_bytes(self) -> float:
        """Bytes of TCP payload the link's token bucket sends at once after a pause (tbf's burst
        counts whole frames)."""
        from repro.bench.hosts import Link

        return Link(rate_mbit=self.link_mbit).burst_kb * 1024 * PAYLOAD

    def run_link(self, base: RunConfig, root: Path, jobs: list[dict], task: list[str]) -> list[str]:
        """The grid across two hosts, one run after another; ['link'] when any could run."""
        from repro.bench.hosts import HostsUnavailable, Link
        from repro.bench.two_hosts import run_two_hosts

        for job in jobs:
            folder = root / "link" / point_name(job)
            if finished(folder):
                continue
            overrides = [*task, *(f"{k}={v}" for k, v in job.items()), f"num_epochs={self.link_epochs:g}",
                         f"eval_every={base.eval_every:g}", f"target_error={base.target_error:g}",
                         "exp_name=two_hosts", "progress=false"]
            _say(f"two hosts over {self.link_mbit:g} Mbit/s: {point_name(job)}")
            try:
                summary = run_two_hosts(overrides, int(job.get("num_clients", base.num_clients)), folder,
                                        Link(rate_mbit=self.link_mbit))
            except HostsUnavailable as err:
                _say(f"the limited link is skipped: {err.reason}")
                return []
            except (TimeoutError, RuntimeError) as err:   # the harness has cleaned up; say so, go on
                _say(f"{point_name(job)} on the link did not end: {err}")
                continue
            _say(f"{point_name(job)}: {summary['status']}")
        return ["link"]

    def simulate(self, base: RunConfig, root: Path, jobs: list[dict], link: str) -> None:
        """Each grid point simulated with the cost model fitted to its setting's one-client runs."""
        from repro.runtime import usable_cores
        from repro.sim.driver import simulate

        runs, _, _ = lab.read_runs(root)
        for job in jobs:
            cfg = point_config(base, job, link, self.link_epochs)
            real = runs[(runs.side == "measured") & (runs.link == link)] if not runs.empty else runs
            ones = real[(real.num_clients == 1) & (real.nsync == cfg.nsync)] if not real.empty else real
            if ones.empty:
                _say(f"no one-client {link} run at nsync {cfg.nsync} to fit: {point_name(job)} not simulated")
                continue
            cost = CostConfig(profile="fit", path=":".join(sorted(ones.run_dir)))
            if link == "link":   # the link's rate and burst are known, and its two hosts are one machine
                cost = dataclasses.replace(cost, topology="shared", server_bandwidth_Bps=self.link_Bps(),
                                           server_burst_bytes=self.burst_bytes(), one_machine=True,
                                           clients_per_host=cfg.num_clients, devices_per_host=usable_cores())
            cfg = cfg.replace(cost=cost)
            validate(cfg)
            simulate(cfg, root / "predicted" / link / point_name(job))


def point_config(base: RunConfig, job: dict[str, str], link: str, link_epochs: float) -> RunConfig:
    """The simulator's configuration of one grid point: the experiment's settings, the point's."""
    ints = {k: int(v) for k, v in job.items() if k in ("num_clients", "nsync", "seed")}
    cfg = base.replace(backend=BackendConfig(), progress=False, **ints)
    return cfg.replace(num_epochs=link_epochs) if link == "link" else cfg


# ---------------------------------------------------------------------------------------------
# python -m repro.bench simreal
# ---------------------------------------------------------------------------------------------

DESCRIPTION = """\
The simulator against reality. Reads the runs of +exp=sim_vs_real (real runs
on this machine over loopback and across two hosts on a limited link, and the
simulator's runs with a cost model fitted to each setting's one-client runs),
running the experiment first when --results holds none, and prints per grid
point, median over seeds: measured and predicted samples/s and the error
(target: within 15%), mean staleness and its error (target: within 10%), the
Kolmogorov-Smirnov distance between the staleness distributions (target:
below 0.1, points with 2 or more clients), and whether the measured time to
the target error lies inside the simulator's range over seeds."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--results", default=f"results/{EXP}",
                        help="the experiment's folder (default: %(default)s)")
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
PARTS = (("dedicated", dict(topology="dedicated", clients_per_host=1, devices_per_host=None, one_machine=False, eval_s=0.0)),
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

    from repro.analysis.lab.spread import resimulate

    runs, _, _ = lab.read_runs(root)
    predicted = runs[(runs.side == "predicted") & (runs.link == "loopback")]
    measured = runs[(runs.side == "measured") & (runs.link == "loopback")]
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
              f"{r.measured_time_to_target_s:6.3f} in [{r.predicted_time_to_target_min_s:.3f}, "
              f"{r.predicted_time_to_target_max_s:.3f}] {'yes' if r.time_to_target_inside else 'no'}")
    return ok


def machine_now() -> float:
    """Bare training loops side by side: the cores this machine gives the runs right now, which
    the fit takes to be the cores they may use (os.sched_getaffinity)."""
    from repro.bench.real import _plain_rate

    one, cores = _plain_rate(1), {}
    print(f"bare training loops side by side (digits_cnn, one thread each): 1: {one:.0f} samples/s", end="")
    for k in (2, 4):
        rate = _plain_rate(k)
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


def scheduler_spread() -> None:
    """Per-step time CV of 1, 2 and 4 bare training loops side by side: the OS's share."""
    from repro.bench.real import plain_step_cv

    print("per-step time CV of bare training loops side by side (no server, no messages): "
          + "; ".join(f"{k}: {plain_step_cv(k):.3f}" for k in (1, 2, 4)), flush=True)


def _point(text: str) -> tuple[int, int]:
    try:
        nsync, clients = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NSYNC:CLIENTS such as 8:4, got {text!r}") from None
    if nsync < 1 or clients < 1:
        raise argparse.ArgumentTypeError(f"nsync and clients must be at least 1, got {text!r}")
    return nsync, clients


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    if args.cores:
        from repro.bench.cores import print_cores

        print_cores(*args.cores, args.cores_epochs, results=Path(args.results))
        return 0

    cores = machine_now() if args.machine else None
    root = Path(args.results)
    if not lab.run_dirs(root):
        results_dir, exp_name = root.parent, root.name
        cmd = [sys.executable, "-m", "repro.run", f"+exp={EXP}", f"results_dir={results_dir}", f"exp_name={exp_name}"]
        print("no runs in " + str(root) + ": running " + " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=False)
    runs, stale, _ = lab.read_runs(root)
    table = lab.points_table(runs, stale)
    if table.empty:
        print(f"python -m repro.bench simreal: no grid point in {root} has both a measured and a predicted run",
              file=sys.stderr)
        return 2
    ok = print_table(table)
    if args.parts:
        print("\nwhere a round trip went, ms (timings.csv means, median over seeds):")
        with pd.option_context("display.width", 250, "display.max_columns", 20):
            print(lab.parts_table(runs).to_string(float_format=lambda x: f"{x:.2f}"))
        print("\nsamples/s error of the loopback points with parts of the machine's model (median over seeds):")
        print(machine_parts(root, cores).to_string(float_format=lambda x: f"{x:+.1%}"))
    if args.spread:
        from repro.analysis.lab.spread import spread_table

        print("\nstaleness KS of the points with 2+ clients (median over seeds): the fitted jitter, "
              "the jitter of the point's own measured compute spread, the real runs' seed-to-seed floor:")
        print_spread(spread_table(root))
        if args.machine:
            scheduler_spread()
    return 0 if ok else 1
