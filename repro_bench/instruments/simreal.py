"""``+exp=sim_vs_real``: the simulator's predictions held against real runs on this machine.

This module owns the experiment's pipeline after its Hydra grid (the real runs on loopback,
one after another: ``conf/exp/sim_vs_real.yaml``), as the grid's callback :class:`SimVsReal`:
the same grid across two hosts over a tbf-limited link (:mod:`repro_bench.instruments.two_hosts`),
per setting (link, nsync) a cost model fitted to its one-client runs (``cost=fit``), the whole
grid simulated with it, and the figure (:mod:`repro_bench.instruments.points`). What runs, with
which epochs, and where its folders go: docs/simulator.md, "The simulator against real runs".

The command's ``resume=auto`` reaches the two-host runs as it reaches the grid's, so a killed one
is continued. Without it such a point is refused (rank 0's own line is printed) and the
experiment ends 1 naming it: no figure is drawn without a point. One Ctrl-C stops the phase after
the grid too: the run in flight (across the two hosts as well) and everything after it; the
experiment ends 130. The benchmark (:mod:`repro_bench.instruments.cli`) reads the tree.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from repro.config.checks import validate
from repro.config.settings import BackendConfig, CostConfig, RunConfig
from repro.files import schema
from repro.runtime import EXIT_INTERRUPTED, StopRequest
from repro_bench.instruments import EXP, points as lab

# TCP payload per 1514-byte Ethernet frame: what of the tbf rate a transfer gets (REPRODUCE.md,
# "Two real hosts": measured 0.96-0.97 of the configured rate)
PAYLOAD = 1448 / 1514


def _say(line: str) -> None:
    print(f"{EXP}: {line}", file=sys.stderr, flush=True)


def _on_signal(name: str) -> None:
    """The first Ctrl-C after the grid: the run in flight stops (also across the two hosts, whose
    processes the terminal's signal never reaches) and nothing new starts."""
    _say(f"{name}: stopping the run in progress; nothing more starts (again to stop now)")


def grid_jobs(config: DictConfig) -> list[dict[str, str]]:
    """Each grid point's swept settings ({key: value}), from the experiment's sweep and the
    command line's, in launch order (Hydra's basic sweeper)."""
    from repro.hydra_internals import sweep_jobs

    params = config.hydra.sweeper.get("params") or {}
    task = list(config.hydra.overrides.task)
    swept = set(params) | {o.split("=", 1)[0] for o in task if "," in o}
    return [{k: v for k, v in (o.split("=", 1) for o in job) if k in swept} for job in sweep_jobs(config)]


def point_name(job: dict[str, str]) -> str:
    """A grid point's folder name, ``nsync1_num_clients2_seed0``: without the ``=`` and ``,``
    that Hydra would read as syntax in the ``results_dir=`` of a two-host run."""
    return "_".join(f"{k}{job[k]}" for k in sorted(job))


class SimVsReal(Callback):
    """After the loopback grid: the limited link's runs, the fits, the simulations, the figure."""

    def __init__(self, out_dir: str = "figures", link_mbit: float = 100.0, link_epochs: float = 4.0,
                 links: Any = ("loopback", "link"), name: str = EXP) -> None:
        self.out_dir, self.link_mbit, self.link_epochs = out_dir, float(link_mbit), float(link_epochs)
        self.links, self.name = tuple(links), name

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from omegaconf import OmegaConf

        from repro.config.loader import parse

        base = parse(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]))
        jobs = grid_jobs(config)
        swept = set(jobs[0]) if jobs else set()
        task = [o for o in config.hydra.overrides.task if o.split("=", 1)[0] not in swept
                and not o.lstrip("+~").startswith(("exp", "hydra", "num_epochs", "results_dir", "figures_dir",
                                                   "progress"))]
        self.pipeline(base, jobs, task)

    def pipeline(self, base: RunConfig, jobs: list[dict], task: list[str]) -> None:
        """The link's runs, the simulations, the figure. Ends the process with 130 at a Ctrl-C
        (the grid's own stop handling has ended with the grid; this phase needs its own), and
        with 1 naming each two-host point that did not finish: never a figure without it."""
        root = Path(base.results_dir) / base.exp_name
        with StopRequest(on_signal=_on_signal) as stop:
            links, missing = ["loopback"], {}
            if "link" in self.links:
                ran, missing = self.run_link(base, root, jobs, task, stop)
                links += ran
            for link in links:
                self.simulate(base, root, jobs, link, stop)
            if stop.is_set():
                _say(f"stopped by {stop.reason}. The same command with resume=auto continues the "
                     f"interrupted runs and skips the finished ones (their folders are under {root}).")
                raise SystemExit(EXIT_INTERRUPTED)
        if missing:
            _say(f"no figure drawn: {len(missing)} two-host point(s) did not finish: "
                 + "; ".join(f"{point}: {why}" for point, why in missing.items())
                 + f". The same command with resume=auto continues them (under {root / 'link'}).")
            raise SystemExit(1)
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
        from repro_bench.instruments.hosts import Link

        return Link(rate_mbit=self.link_mbit).burst_kb * 1024 * PAYLOAD

    def run_link(self, base: RunConfig, root: Path, jobs: list[dict], task: list[str],
                 stop: StopRequest) -> tuple[list[str], dict[str, str]]:
        """The grid across two hosts, one run after another, until ``stop`` is set: (['link'] when
        any could run, {point: why} of each point that did not finish)."""
        from repro_bench.instruments import two_hosts
        from repro_bench.instruments.hosts import HostsUnavailable, Link

        missing = {}
        for job in jobs:
            point = point_name(job)
            folder = root / "link" / point
            if stop.is_set():
                break
            if lab.run_dirs(folder):   # a finished run below it: skipped on a rerun
                continue
            overrides = [*task, *(f"{k}={v}" for k, v in job.items()), f"num_epochs={self.link_epochs:g}",
                         f"eval_every={base.eval_every:g}", f"target_error={base.target_error:g}",
                         "exp_name=two_hosts", "progress=false"]
            _say(f"two hosts over {self.link_mbit:g} Mbit/s: {point}")
            try:
                summary = two_hosts.run_two_hosts(overrides, int(job.get("num_clients", base.num_clients)), folder,
                                                  Link(rate_mbit=self.link_mbit), stop=stop)
            except HostsUnavailable as err:
                _say(f"the limited link is skipped: {err.reason}")
                return [], {}
            except (TimeoutError, RuntimeError) as err:   # the harness has cleaned up; say so, go on
                missing[point] = str(err).splitlines()[0]
                _say(f"{point} on the link did not finish: {err}")
                continue
            _say(f"{point}: {summary['status']}")
            if summary["status"] not in schema.FINISHED_STATUSES and not stop.is_set():
                missing[point] = f"it ended {summary['status']} (see {folder})"
        return ["link"], missing

    def simulate(self, base: RunConfig, root: Path, jobs: list[dict], link: str, stop: StopRequest) -> None:
        """Each grid point simulated with the cost model fitted to its setting's one-client runs."""
        from repro.runtime import usable_cores
        from repro.sim.driver import simulate

        runs, _, _, _ = lab.read_runs(root)
        for job in jobs:
            if stop.is_set():
                return
            cfg = point_config(base, job, link, self.link_epochs)
            real = runs[(runs.side == "measured") & (runs.link == link)] if not runs.empty else runs
            ones = real[(real.num_clients == 1) & (real.nsync == cfg.nsync)] if not real.empty else real
            if ones.empty:
                _say(f"no one-client {link} run at nsync {cfg.nsync} to fit: {point_name(job)} not simulated")
                continue
            cost = CostConfig(profile="fit", path=":".join(sorted(ones.run_dir)))
            if link == "link":   # the link's rate and burst are known, and its two hosts are one machine
                cost = cost.updated(topology="shared", server_bandwidth_Bps=self.link_Bps(),   # old flat names
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
