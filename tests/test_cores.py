"""python -m repro.bench simreal --cores (repro_bench/instruments/cores.py): where a real run's cores go.

Fast: the report's arithmetic on samples whose numbers are known, the roles of processes told
apart by their command lines, the option's parsing. Slow (a real run, about 6 s, kept out of the
default suite's time budget): one loopback run measured for real (the two-host one needs root and
is the same code with torchrun's ranks, found by RANK).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from repro_bench.instruments import cores
from repro_bench.__main__ import build_parser


def _run_dir(tmp_path, pushes: int):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "updates.csv").write_text("version\n" + "".join(f"{i}\n" for i in range(pushes)))
    (run_dir / "config.json").write_text(json.dumps(
        {"nsync": 8, "algo": {"batch_size": 32}, "cost": {"comm_params": None}, "network": {"param_bytes": 250_000}}))
    return run_dir


def test_the_report_counts_cores_by_role_over_the_runs_steady_middle(tmp_path):
    run_dir = _run_dir(tmp_path, pushes=100)
    sampler = cores.Sampler(tmp_path)
    machine = lambda k: {"user": 1.5 * k, "nice": 0, "system": 0.2 * k, "idle": 0.1 * k, "iowait": 0, "irq": 0,
                         "softirq": 0.2 * k, "steal": 0}
    # one sample a second: 10 pushes a second; the server 0.5 user + 0.1 system cores, each of two
    # clients 0.6 + 0.05, the sampler 0.02 system; 0..19 pushes before the window, 80.. after
    for k in range(11):
        # (role, user, system, main thread on a CPU, in the run queue, time slices): each client's
        # main thread waits 0.3 s a second for a CPU, over 100 slices a second
        procs = {10: ("server", 0.5 * k, 0.1 * k, 0.0, 0.0, 0), 11: ("client", 0.6 * k, 0.05 * k, 0.6 * k, 0.3 * k, 100 * k),
                 12: ("client", 0.6 * k, 0.05 * k, 0.6 * k, 0.3 * k, 100 * k), 13: ("sampler", 0.0, 0.02 * k, 0.0, 0.0, 0)}
        sampler.samples.append((100.0 + k, machine(k), procs, 10 * k))
    r = cores.report(sampler, run_dir)
    assert sampler.window(100) == (2, 8)
    assert r["window_s"] == pytest.approx(6.0)
    assert r["pushes_per_s"] == pytest.approx(10.0)
    assert r["samples_per_s"] == pytest.approx(10 * 8 * 32)
    assert r["cores"]["server"] == pytest.approx([0.5, 0.1])
    assert r["cores"]["client"] == pytest.approx([1.2, 0.1])
    assert r["machine"]["idle"] == pytest.approx(0.1)
    assert r["mb_per_s"] == pytest.approx(10 * 2 * 0.25)   # a push and its reply, 250 kB each
    # the kernel: system + softirq, less the sampler's own system time
    assert r["kernel_cores"] == pytest.approx(0.2 + 0.2 - 0.02)
    assert r["kernel_ms_per_mb"] == pytest.approx(1e3 * 0.38 / 5.0)
    assert r["runq"]["client"] == pytest.approx(0.6) and r["slices_per_s"]["client"] == pytest.approx(200)


def test_a_run_too_short_for_a_steady_middle_is_refused(tmp_path):
    sampler = cores.Sampler(tmp_path)
    sampler.samples = [(0.0, {}, {}, 0), (0.1, {}, {}, 10)]
    with pytest.raises(RuntimeError, match="more epochs"):
        sampler.window(10)


def test_roles_come_from_the_command_line_and_rank():
    code = "import time; time.sleep(30)"
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    procs = {want: subprocess.Popen([sys.executable, "-c", code, "repro.run"], env={**env, **extra})
             for want, extra in (("server", {"RANK": "0"}), ("client", {"RANK": "3"}), ("other", {}))}
    try:
        time.sleep(0.2)   # exec'd: /proc shows the new command line
        assert cores.role(procs["server"].pid, None) == "server"
        assert cores.role(procs["client"].pid, None) == "client"
        assert cores.role(procs["other"].pid, None) is None
        assert cores.role(procs["other"].pid, procs["other"].pid) == "server"   # loopback: the one started
        assert cores.role(os.getpid(), None) is None
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_option_takes_nsync_and_clients():
    args = build_parser().parse_args(["simreal", "--cores", "8:4", "--cores-epochs", "20"])
    assert args.cores == (8, 4) and args.cores_epochs == 20
    for bad in ("8", "8:x", "0:4"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["simreal", "--cores", bad])


@pytest.mark.slow
def test_a_loopback_run_is_measured_by_role():
    r = cores.measure("loopback", ["nsync=8", "num_epochs=12", "eval_every=0.5"], 2)
    assert r["pushes_per_s"] > 0 and r["mb_per_s"] > 0
    assert sum(r["cores"]["server"]) > 0 and sum(r["cores"]["client"]) > 0
    # every CPU is in some state all the time: the states add up to the machine's CPUs
    assert sum(r["machine"].values()) == pytest.approx(os.cpu_count(), rel=0.25)


def test_nothing_to_resimulate_in_a_folder_without_runs(tmp_path):
    assert cores.resimulated_error(tmp_path, "link", 8, 4, compute_scale=1.1) is None


@pytest.mark.parametrize("option", ["--machine", "--parts", "--spread"])
def test_an_option_of_the_tables_beside_cores_is_refused_not_ignored(monkeypatch, capsys, option):
    # --cores prints none of the tables: --parts beside it was dropped in silence after minutes of runs
    from repro_bench.__main__ import main

    monkeypatch.setattr(cores, "print_cores", lambda *a, **k: pytest.fail("measured"))
    assert main(["simreal", "--cores", "8:4", option]) == 2
    assert capsys.readouterr().err == ("python -m repro.bench simreal: --cores measures instead of the tables; "
                                       "--machine, --parts and --spread go without it\n")


def test_too_few_epochs_for_a_steady_middle_is_one_line_and_exit_2(monkeypatch, capsys):
    from repro_bench.__main__ import main

    def short(*_, **__):   # what the run of --cores-epochs 0.2 met: 9 pushes, the sampler never saw 7
        sampler = cores.Sampler(".")
        sampler.samples = [(0.0, {}, {}, 0)]
        sampler.window(9)

    monkeypatch.setattr(cores, "print_cores", short)
    assert main(["simreal", "--cores", "1:1", "--cores-epochs", "0.2"]) == 2
    err = capsys.readouterr().err
    assert err == ("python -m repro.bench simreal: --cores 1:1 --cores-epochs 0.2: the run's steady middle "
                   "(9 pushes) is shorter than one sample; use more epochs\n")


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_during_a_loopback_measurement_takes_its_run_and_folder_along(tmp_path, monkeypatch, capsys,
                                                                          ctrl_c_raises, sig):
    # SIGTERM killed the command on the spot: its run went on to the end, in a temporary folder left behind
    import signal
    import tempfile
    import threading

    from repro_bench.__main__ import main

    started, popen = [], subprocess.Popen

    def run_that_sleeps(argv, **kwargs):   # stands for the real run: a minute of nothing
        started.append(popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs))
        return started[-1]

    monkeypatch.setattr(cores.subprocess, "Popen", run_that_sleeps)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    threading.Timer(1.5, os.kill, (os.getpid(), getattr(signal, sig))).start()
    try:
        rc = main(["simreal", "--cores", "1:1", "--results", str(tmp_path)])   # never read: stopped first
    except KeyboardInterrupt:
        rc = "a KeyboardInterrupt traceback"
    assert rc == 130 and f"stopped by {sig}" in capsys.readouterr().err
    assert started[0].poll() is not None and list(tmp_path.iterdir()) == []
