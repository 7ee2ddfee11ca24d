"""Where a real run's cores go: ``python -m repro.bench simreal --cores``.

This module owns one measurement: real runs of a grid point and of its one-client counterpart,
over loopback and across the two hosts of :mod:`repro_bench.instruments.two_hosts`, while a thread
samples every tenth of a second the CPU time (user and system) of each of the run's processes, by
role (the server, the clients, torchrun's agents), and the machine's ``/proc/stat`` (user, system,
softirq, idle). Over the steady middle of the run (from its fifth to its last fifth applied push,
counted in ``updates.csv`` as it grows) it reports the cores each role used, the machine's, and
the kernel's CPU time (system + softirq) per megabyte the messages moved, and from each process's
main thread's ``/proc/PID/schedstat`` (a client's main thread computes) how long the clients
waited in the run queue for a CPU and how often they were scheduled. The simulator gives the cores
to the computing clients and the evaluator and, on one machine, to loopback copies; a transfer
across the limited link takes none (:mod:`repro.sim.resources`); this measures what that leaves
out, and re-simulates the point's predicted runs of ``+exp=sim_vs_real`` with what it measured
(REPRODUCE.md, "The simulator against reality").

Processes are found by their command lines: torchrun's ranks carry ``RANK`` (0 the server); a
loopback run's server is the ``repro.run`` process this module starts, its clients the forks of
that process's multiprocessing fork server (its child, which is not counted; spawned children
count as clients too). The sampler's own process is measured too (it is not free) and reported apart.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from repro.config.renames import read_recorded
from repro.gridpoint import proc_stat
from repro_bench.instruments.hosts import cmdline

HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _proc_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of process ``pid``, its exited threads included."""
    fields = proc_stat(pid)
    return None if fields is None else (int(fields[11]) / HZ, int(fields[12]) / HZ)


def _main_thread_sched(pid: int) -> tuple[float, float, int]:
    """(seconds on a CPU, seconds waiting in the run queue, time slices) of ``pid``'s main thread
    (/proc/PID/schedstat; zeros where the kernel keeps no schedstats)."""
    try:
        run_ns, wait_ns, slices = Path(f"/proc/{pid}/schedstat").read_text().split()[:3]
    except (OSError, ValueError):
        return 0.0, 0.0, 0
    return int(run_ns) / 1e9, int(wait_ns) / 1e9, int(slices)


def _machine_times() -> dict[str, float]:
    """/proc/stat's first line: seconds of every CPU together in each state."""
    values = Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(STAT_FIELDS)]
    return {name: int(v) / HZ for name, v in zip(STAT_FIELDS, values)}


def _softirqs() -> dict[str, int]:
    """/proc/softirqs: each kind's count, all CPUs together (empty where the file is missing)."""
    try:
        lines = Path("/proc/softirqs").read_text().splitlines()[1:]
    except OSError:
        return {}
    return {line.split(":")[0].strip(): sum(int(x) for x in line.split(":")[1].split()) for line in lines}


def role(pid: int, loopback_server: int | None) -> str | None:
    """'server', 'client' or 'agent' for a process of the run, None for any other."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    cmd = cmdline(pid)
    if pid == loopback_server:
        return "server"
    if b"torch.distributed.run" in cmd:
        return "agent"
    rank = next((e[5:] for e in env if e.startswith(b"RANK=")), None)
    if rank is not None and b"repro.run" in cmd:
        return "server" if rank == b"0" else "client"
    if loopback_server is None or b"multiprocessing" not in cmd or b"resource_tracker" in cmd:
        return None
    parent = _parent(pid)
    if parent == loopback_server:   # a spawned client, or the fork server clients are forked from
        return None if b"multiprocessing.forkserver" in cmd else "client"
    if parent is not None and _parent(parent) == loopback_server and b"multiprocessing.forkserver" in cmdline(parent):
        return "client"   # a fork of the run's fork server (repro.real.processes.client_context)
    return None


def _parent(pid: int) -> int | None:
    fields = proc_stat(pid)
    return None if fields is None else int(fields[1])


class Sampler(threading.Thread):
    """Samples the run's processes and the machine until :meth:`stop`; see the module docstring."""

    def __init__(self, results_dir: Path, interval_s: float = 0.1):
        super().__init__(daemon=True)
        self.results_dir, self.interval_s = results_dir, interval_s
        self.loopback_server: int | None = None
        # (t, machine, {pid: (role, user, system, main thread on a CPU, in the run queue, slices)}, pushes)
        self.samples: list[tuple[float, dict, dict, int]] = []
        self._roles: dict[int, str | None] = {}
        self._updates: Path | None = None
        self._done = threading.Event()

    def pushes(self) -> int:
        if self._updates is None:
            found = [p for p in self.results_dir.rglob("updates.csv") if ".two_hosts" not in p.parts]
            if not found:
                return 0
            self._updates = found[0]
        try:
            return max(0, self._updates.read_bytes().count(b"\n") - 1)
        except OSError:
            return 0

    def run(self) -> None:
        me = os.getpid()
        while not self._done.is_set():
            procs = {}
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                pid = int(name)
                if pid not in self._roles:
                    self._roles[pid] = "sampler" if pid == me else role(pid, self.loopback_server)
                if self._roles[pid] and (times := _proc_times(pid)):
                    procs[pid] = (self._roles[pid], *times, *_main_thread_sched(pid))
            machine = {**_machine_times(), **{f"softirq_{k}": n for k, n in _softirqs().items()}}
            self.samples.append((time.monotonic(), machine, procs, self.pushes()))
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def window(self, applied: int) -> tuple[int, int]:
        """Indices of the first and last sample of the steady middle (see the module docstring)."""
        first = next((i for i, s in enumerate(self.samples) if s[3] >= applied // 5), None)
        last = next((i for i, s in enumerate(self.samples) if s[3] >= applied - applied // 5), None)
        if first is None or last is None or last <= first:
            raise TooShort(f"the run's steady middle ({applied} pushes) is shorter than one sample; "
                           "use more epochs")
        return first, last


class TooShort(RuntimeError, ValueError):
    """A run's steady middle shorter than one sample: too few ``--cores-epochs``, a usage error."""


def report(sampler: Sampler, run_dir: Path) -> dict:
    """Cores by role and by machine state over the window, and kernel ms per MB moved."""
    import pandas as pd

    from repro.sim.fit import message_bytes

    updates = pd.read_csv(run_dir / "updates.csv")
    config = read_recorded(run_dir)
    first, last = sampler.window(len(updates))
    (t0, m0, p0, n0), (t1, m1, p1, n1) = sampler.samples[first], sampler.samples[last]
    span = t1 - t0
    cores: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    runq = defaultdict(float)   # seconds per second a role's main threads waited for a CPU
    slices = defaultdict(float)
    for pid, (who, user, system, _, wait, n) in p1.items():
        if pid in p0:
            cores[who][0] += (user - p0[pid][1]) / span
            cores[who][1] += (system - p0[pid][2]) / span
            runq[who] += (wait - p0[pid][4]) / span
            slices[who] += (n - p0[pid][5]) / span
    rates = {k: (m1[k] - m0[k]) / span for k in m1 if k in m0}
    machine = {k: rates[k] for k in STAT_FIELDS}
    pushes_per_s = (n1 - n0) / span
    mb_per_s = pushes_per_s * 2 * message_bytes(config) / 1e6   # a push and its reply
    kernel = machine["system"] + machine["softirq"] - cores["sampler"][1]
    return {"pushes_per_s": pushes_per_s,
            "samples_per_s": pushes_per_s * config["nsync"] * config["algo"]["batch_size"],
            "window_s": span, "cores": dict(cores), "machine": machine, "mb_per_s": mb_per_s,
            "kernel_cores": kernel, "kernel_ms_per_mb": 1e3 * kernel / mb_per_s if mb_per_s else float("nan"),
            "runq": dict(runq), "slices_per_s": dict(slices),
            "softirqs_per_s": {k[len("softirq_"):]: v for k, v in rates.items() if k.startswith("softirq_")}}


def measure(link: str, overrides: list[str], num_clients: int, link_mbit: float = 100.0) -> dict:
    """One real run (``link`` 'loopback' or 'link') sampled; :func:`report`'s numbers."""
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp)
        sampler = Sampler(results)
        common = [f"num_clients={num_clients}", "exp_name=cores", "progress=false", *overrides]
        if link == "link":
            from repro_bench.instruments.hosts import Link
            from repro_bench.instruments.two_hosts import run_two_hosts

            sampler.start()
            try:
                run_two_hosts(common, num_clients, results, Link(rate_mbit=link_mbit))
            finally:
                sampler.stop()
        else:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen([sys.executable, "-m", "repro.run", "backend=real", f"results_dir={results}",
                                     *common], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            sampler.loopback_server = proc.pid
            sampler.start()
            try:
                _, err = proc.communicate(timeout=600)
            except BaseException:   # a Ctrl-C or SIGTERM here: the run must not outlive us (nor its folder)
                proc.kill()
                proc.wait()
                raise
            finally:
                sampler.stop()
            if proc.returncode != 0:
                raise RuntimeError(f"the loopback run failed:\n{err.decode()[-2000:]}")
        run_dir = next(p.parent for p in results.rglob("summary.json") if ".two_hosts" not in p.parts)
        return report(sampler, run_dir)


def cpu_per_push(r: dict) -> float:
    """The clients' CPU seconds (user + system) per applied push."""
    return sum(r["cores"].get("client", [0.0, 0.0])) / r["pushes_per_s"]


def resimulated_error(root: Path, link: str, nsync: int, num_clients: int, compute_scale: float = 1.0,
                      **cost) -> tuple[float, float] | None:
    """The point's samples/s error (median over seeds) as predicted, and with its predicted runs
    re-simulated with the fitted compute_s times ``compute_scale`` and ``cost`` changed; None when
    ``root`` holds no such point."""
    import pandas as pd

    from repro_bench.instruments import points as lab
    from repro_bench.instruments.spread import predicted_config, resimulate

    if not lab.run_dirs(root):
        return None
    runs, _, _, _ = lab.read_runs(root)
    at = (runs.link == link) & (runs.nsync == nsync) & (runs.num_clients == num_clients)
    predicted, measured = runs[at & (runs.side == "predicted")], runs[at & (runs.side == "measured")]
    if predicted.empty or measured.empty:
        return None
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, run_dir in enumerate(predicted.run_dir):
            fitted = predicted_config(run_dir).cost.compute_s
            out = resimulate(run_dir, Path(tmp) / str(i), compute_s=fitted * compute_scale, **cost)
            rates.append(lab.samples_per_s(pd.read_csv(out / "updates.csv")))
    meas = measured.samples_per_s.median()
    return predicted.samples_per_s.median() / meas - 1, float(pd.Series(rates).median()) / meas - 1


def print_cores(nsync: int, num_clients: int, epochs: float, link_mbit: float = 100.0,
                results: Path | None = None) -> None:
    """Measure the point, and its one-client counterpart, over loopback and over the link; one
    row each; with ``results`` (the experiment's folder) also the point re-simulated with what was
    measured (see the module docstring)."""
    from repro_bench.instruments.hosts import HostsUnavailable

    print(f"where the cores go: nsync {nsync}, {epochs:g} epochs; cores used over the steady middle of one "
          f"run (server and clients: user+system; machine: /proc/stat of all {os.cpu_count()} CPUs together; "
          "the sampler's own share apart)", flush=True)
    print(f"{'link':9s} {'clients':>7s} {'samples/s':>9s} {'server u+s':>11s} {'clients u+s':>12s} "
          f"{'CPU ms/push':>11s} {'runq ms/push':>12s} {'slices/s':>8s} {'m user':>6s} {'m sys':>6s} "
          f"{'softirq':>7s} {'idle':>5s} {'MB/s':>6s} {'kernel ms/MB':>12s}")
    overrides = [f"nsync={nsync}", f"num_epochs={epochs:g}", "eval_every=0.5"]
    for link in ("loopback", "link"):
        measured = {}
        for clients in sorted({1, num_clients}):
            try:
                measured[clients] = r = measure(link, overrides, clients, link_mbit)
            except HostsUnavailable as err:
                print(f"{link:9s} skipped: {err.reason}")
                break
            c, m = r["cores"], r["machine"]
            part = lambda who: f"{c.get(who, [0, 0])[0]:.2f}+{c.get(who, [0, 0])[1]:.2f}"
            print(f"{link:9s} {clients:7d} {r['samples_per_s']:9.0f} {part('server'):>11s} {part('client'):>12s} "
                  f"{1e3 * cpu_per_push(r):11.1f} {1e3 * r['runq'].get('client', 0.0) / r['pushes_per_s']:12.1f} "
                  f"{r['slices_per_s'].get('client', 0.0) / clients:8.0f} {m['user']:6.2f} {m['system']:6.2f} "
                  f"{m['softirq']:7.2f} {m['idle']:5.2f} {r['mb_per_s']:6.1f} {r['kernel_ms_per_mb']:12.1f}",
                  flush=True)
            softirqs = {k: v for k, v in r["softirqs_per_s"].items() if v >= 1}
            if softirqs:
                print(f"{'':17s} softirqs per second: " + ", ".join(f"{k} {v:.0f}" for k, v in softirqs.items()))
        if len(measured) == len({1, num_clients}) and results is not None:
            _print_resimulated(results, link, nsync, num_clients, measured)


def _print_resimulated(results: Path, link: str, nsync: int, num_clients: int, measured: dict) -> None:
    """The point's predicted runs re-simulated with the clients' CPU per push as measured at
    ``num_clients`` against one client, and across the link with the kernel's CPU per byte."""
    scale = cpu_per_push(measured[num_clients]) / cpu_per_push(measured[1])
    # across the link the kernel's work is a cost of its own; on loopback the copies' shares stand for it
    cost = {"link_cpu_s_per_byte": measured[num_clients]["kernel_ms_per_mb"] * 1e-9} if link == "link" else {}
    errors = resimulated_error(results, link, nsync, num_clients, compute_scale=scale, **cost)
    if errors is None:
        print(f"{'':17s} (no predicted runs of this point in {results} to re-simulate)")
        return
    what = f"compute_s x {scale:.2f}" + (f", cost.machine.link_cpu_s_per_byte {cost['link_cpu_s_per_byte']:.3g}"
                                         if "link_cpu_s_per_byte" in cost else "")
    print(f"{'':17s} samples/s error {errors[0]:+.1%} as predicted; {errors[1]:+.1%} re-simulated with "
          f"what this measured ({what})", flush=True)
