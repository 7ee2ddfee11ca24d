"""The real driver across two hosts: ``torchrun --nnodes=2`` over :mod:`repro_bench.instruments.hosts`' link.

This module owns launching one real run across the two namespaces and waiting for its end; an
experiment or a benchmark calls :func:`run_two_hosts` (or :func:`start` and
:meth:`TwoHostRun.wait` when it acts on the run meanwhile, as the test that kills the client host
does). It is the two-node recipe of docs/real.md ("Across nodes with torchrun"), verbatim:

* node 0, in the server namespace: ``torchrun --nnodes=2 --nproc-per-node=1 --node-rank=0``,
  one process, rank 0 = the server, which alone makes the run folder;
* node 1, in the client namespace: ``--nproc-per-node=N --node-rank=1``, ranks 1..N = the
  clients (torchrun allows a different process count per node);
* both rendezvous at the server host's address (``--master-addr``, torchrun's static
  rendezvous: node 0's agent hosts the store), pass ``backend.master_addr`` the same, and set
  ``GLOO_SOCKET_IFNAME`` to their own end of the veth pair: gloo would otherwise bind the address
  the machine's host name resolves to, which does not exist inside a namespace.

The end of a run. Normally both agents exit by themselves. When a node is lost (the client host
killed), rank 0 still ends the run and writes a terminal ``summary.json``; if it exits 0
(``completed_degraded``), node 0's agent then waits in torchrun's exit barrier for the lost
node's agent (300 s, not configurable from torchrun's command line). When rank 0 exits at once
(it refused the folder), node 1's agent waits for it as long. So :meth:`TwoHostRun.wait` ends
when both agents have exited, or when rank 0 has exited with a terminal summary, or node 0's
agent has exited, and the agents have had a grace period; then it kills what is left on both hosts.

A stop asked for meanwhile (``stop``: the caller's :class:`~repro.runtime.StopRequest`, set by a
Ctrl-C) is forwarded: both agents run in sessions of their own, out of the terminal's reach, so
:meth:`TwoHostRun.wait` sends SIGINT to every rank on both hosts (never to torchrun's agents,
which would send it again: a second signal forces), and each stops as a Ctrl-C'd run does, rank 0
recording ``interrupted``. A run that rank 0 never started (it refused the folder: a killed run
there, without ``resume``) leaves the folder's summary as it was; :meth:`TwoHostRun.wait` then
raises with rank 0's own error line instead of returning that stale summary.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from repro.files.schema import FINISHED_STATUSES
from repro.runtime import StopRequest
from repro_bench.instruments.hosts import SERVER_ADDR, Host, Link, TwoHosts, cmdline

PORT = 29500   # inside a fresh namespace every port is free
LOG_DIR = ".two_hosts"   # under results_dir; hidden, so the analysis does not take it for a run
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def torchrun_command(node_rank: int, num_procs: int, overrides: list[str], results_dir: Path,
                     port: int = PORT) -> list[str]:
    """One node's command line: docs/real.md's two-node recipe with the server host as master."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={num_procs}",
            f"--node-rank={node_rank}", f"--master-addr={SERVER_ADDR}", f"--master-port={port}",
            "--max-restarts=0", "-m", "repro.run", "backend=real", f"backend.master_addr={SERVER_ADDR}",
            f"results_dir={results_dir}", *overrides]


def node_env(host: Host, gloo_ifname: bool = True) -> dict[str, str]:
    """The caller's environment, with this package importable, gloo on the host's veth (unless
    ``gloo_ifname`` is False: then the driver finds the interface towards the master itself), and
    no torchrun variables of the caller's own (it may itself run under torchrun)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.pop("GLOO_SOCKET_IFNAME", None)
    if gloo_ifname:
        env["GLOO_SOCKET_IFNAME"] = host.ifname
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@dataclass
class TwoHostRun:
    """One real run across the two hosts: node 0's and node 1's torchrun agents."""
    hosts: TwoHosts
    results_dir: Path
    server: subprocess.Popen
    client: subprocess.Popen
    previous: str | None = None
    """The folder's summary.json as it was before the launch (None: there was none)."""
    agents_killed: bool = field(default=False)
    """True when :meth:`wait` had to kill an agent left waiting (see the module docstring)."""
    interrupted: set[int] = field(default_factory=set)
    """The ranks :meth:`interrupt` sent SIGINT to."""

    def run_dir(self) -> Path | None:
        """The run folder rank 0 made (None before it exists)."""
        return run_folder(self.results_dir)

    def summary(self) -> dict | None:
        return parsed(summary_text(self.results_dir))

    def applied(self) -> int:
        """Pushes applied so far (rows of updates.csv)."""
        run_dir = self.run_dir()
        path = run_dir / "updates.csv" if run_dir else None
        return max(0, len(path.read_text().splitlines()) - 1) if path and path.exists() else 0

    def server_alive(self) -> bool:
        """Whether rank 0 (a ``repro.run`` process on the server host other than its agent) lives."""
        return any(pid != self.server.pid and _runs_repro(pid) for pid in self.hosts.pids(self.hosts.server))

    def ranks(self) -> set[int]:
        """The live ranks on both hosts: ``repro.run`` processes that are not torchrun's agents."""
        return {pid for host in (self.hosts.server, self.hosts.client) for pid in self.hosts.pids(host)
                if _runs_repro(pid) and b"torch.distributed.run" not in cmdline(pid)}

    def interrupt(self) -> None:
        """SIGINT to each rank not sent one yet (a rank that started since gets its own): each stops
        cleanly, as at a Ctrl-C. The agents are left alone: they would forward it a second time."""
        for pid in self.ranks() - self.interrupted:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                continue
            self.interrupted.add(pid)

    def log(self, node_rank: int) -> str:
        return (self.results_dir / LOG_DIR / f"node{node_rank}.log").read_text()

    def wait(self, timeout_s: float, grace_s: float = 10.0, stop: StopRequest | None = None) -> dict:
        """Until the run has ended (see the module docstring); its summary. Raises TimeoutError
        (the hosts' clean-up then stops everything) when it has not ended within ``timeout_s``,
        RuntimeError when rank 0 never ran it. Once ``stop`` is set, the ranks are interrupted."""
        deadline, ended = time.monotonic() + timeout_s, None
        while self.server.poll() is None or self.client.poll() is None:
            if stop is not None and stop.is_set():
                self.interrupt()
            # over: rank 0 gone with a terminal summary of this launch (one left from an earlier
            # launch says nothing: rank 0 may not have started yet), or node 0's agent gone (rank 0
            # is its only worker: it refused the folder, say; node 1's agent would wait for minutes)
            text = summary_text(self.results_dir)   # read once a poll: it may change between reads
            summary = parsed(text) if text != self.previous else None
            if ended is None and (self.server.poll() is not None
                                  or summary and summary["status"] != "running" and not self.server_alive()):
                ended = time.monotonic()
            if ended is not None and time.monotonic() > ended + grace_s:
                self.agents_killed = True
                for host in (self.hosts.server, self.hosts.client):
                    self.hosts.kill(host)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the two-host run did not end within {timeout_s:g} s; node 0's log:\n"
                                   + self.log(0)[-3000:])
            time.sleep(0.1)
        for proc in (self.server, self.client):
            proc.wait(10)
        text = summary_text(self.results_dir)
        summary = parsed(text)
        if summary is None:
            raise RuntimeError("the two-host run ended without a summary.json; node 0's log:\n" + self.log(0)[-3000:])
        if self.previous is not None and text == self.previous and summary["status"] not in FINISHED_STATUSES:
            raise RuntimeError(f"rank 0 did not run it, the folder still says {summary['status']!r}: "
                               + refusal(self.log(0)))
        return summary


def run_folder(results_dir: Path) -> Path | None:
    """The one run folder under ``results_dir`` (None before rank 0 makes it)."""
    found = [p.parent for p in Path(results_dir).rglob("config.json") if LOG_DIR not in p.parts]
    if len(found) > 1:
        raise RuntimeError(f"more than one run folder under {results_dir}: {found}")
    return found[0] if found else None


def summary_text(results_dir: Path) -> str | None:
    """The text of that run folder's summary.json (None: none yet)."""
    run_dir = run_folder(results_dir)
    try:
        return (run_dir / "summary.json").read_text() if run_dir else None
    except OSError:
        return None


def parsed(text: str | None) -> dict | None:
    """A summary.json's text as a dict (None: no summary yet)."""
    try:
        return json.loads(text or "null")
    except json.JSONDecodeError:   # written atomically by the run core; never half, but be safe
        return None


def refusal(log: str) -> str:
    """Why rank 0 ended before its run: the entry point's own ``error:`` line in node 0's log
    (repro.run's one-line refusal of bad input), else the log's last lines."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    return errors[-1] if errors else "node 0's log ends: " + " | ".join(lines[-3:])   # one line, to name


def _runs_repro(pid: int) -> bool:
    return b"repro.run" in cmdline(pid)


def start(hosts: TwoHosts, overrides: list[str], num_clients: int, results_dir: str | Path,
          port: int = PORT, gloo_ifname: bool = True) -> TwoHostRun:
    """Launch node 0 (the server) and node 1 (``num_clients`` clients) across ``hosts``, with
    Hydra ``overrides`` (``backend=real``, ``backend.master_addr`` and ``results_dir`` are added
    here). ``gloo_ifname=False`` leaves GLOO_SOCKET_IFNAME unset. Logs go to
    ``results_dir/.two_hosts/node{0,1}.log``."""
    results_dir = Path(results_dir).resolve()
    (results_dir / LOG_DIR).mkdir(parents=True, exist_ok=True)
    previous = summary_text(results_dir)   # before rank 0 can touch it
    procs = []
    for node_rank, host, num_procs in ((0, hosts.server, 1), (1, hosts.client, num_clients)):
        log = open(results_dir / LOG_DIR / f"node{node_rank}.log", "w")
        with log:   # the child holds its own copy of the descriptor
            procs.append(hosts.popen(host, torchrun_command(node_rank, num_procs, overrides, results_dir, port),
                                     env=node_env(host, gloo_ifname), cwd=results_dir, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    return TwoHostRun(hosts, results_dir, *procs, previous=previous)


def run_two_hosts(overrides: list[str], num_clients: int, results_dir: str | Path, link: Link = Link(),
                  timeout_s: float = 600.0, stop: StopRequest | None = None) -> dict:
    """One real run with its server and clients on two hosts over ``link``; its summary. Raises
    :class:`~repro_bench.instruments.hosts.HostsUnavailable` where namespaces cannot be made; ``stop``:
    see :meth:`TwoHostRun.wait`."""
    with TwoHosts(link) as hosts:
        return start(hosts, overrides, num_clients, results_dir).wait(timeout_s, stop=stop)
