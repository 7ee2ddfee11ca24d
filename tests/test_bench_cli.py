"""The benchmark command line: subcommands own their options; help is plain text. Nothing here
runs a benchmark (they take minutes): parsing is tested directly, dispatch with stand-ins."""
import argparse
import os
import subprocess
import sys

import pytest

from repro_bench import __main__ as bench
from repro_bench import real as bench_real


def _exit_code(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(argv)
    out = capsys.readouterr()
    return stop.value.code, out.out + out.err


def test_options_after_the_subcommand_are_used():
    args = bench.parse_args(["sim", "--epochs", "1", "--repeats", "1"])
    assert (args.which, args.epochs, args.repeats) == ("sim", 1.0, 1)
    args = bench.parse_args(["real", "--blocks", "3", "--epochs", "2", "--rounds", "2", "--skip-throughput"])
    assert (args.which, args.blocks, args.epochs, args.rounds, args.skip_throughput) == ("real", 3, 2.0, 2, True)


def test_defaults_are_each_benchmarks_own():
    sim = bench.parse_args(["sim"])
    assert (sim.epochs, sim.repeats) == (20.0, 3)
    # the real subcommand and bench_real's standalone parser share one list of options
    standalone = bench_real.add_arguments(argparse.ArgumentParser()).parse_args([])
    real = vars(bench.parse_args(["real"]))
    assert real.pop("which") == "real" and real == vars(standalone)


@pytest.mark.parametrize("argv", [
    [],                                   # no benchmark named
    ["fast"],                             # no such benchmark
    ["sim", "--bogus"],
    ["sim", "--blocks", "2"],             # the real benchmark's option
    ["real", "--repeats", "2"],           # the sim benchmark's option
    ["--epochs", "1", "sim"],             # options belong after their subcommand
    ["sim", "--repeats", "0"],
    ["sim", "--epochs", "-1"],
    ["real", "--blocks", "x"],
    ["sim", "--epochs", "inf"],           # an OverflowError traceback sizing the budget
    ["grid", "--epochs", "inf"],          # every run refused it, a RuntimeError traceback
    ["simreal", "--cores-epochs", "inf"],
    ["grid", "--exp", "nosuch"],          # a RuntimeError traceback once its first launch failed
    ["grid", "--exp", "sim_vs_real"],     # real runs: minutes, tables that always differ
])
def test_bad_command_lines_are_usage_errors(argv, capsys):
    code, _ = _exit_code(argv, capsys)
    assert code == 2


@pytest.mark.parametrize("argv, says", [
    (["--help"], ["sim", "real", "startup", "<= 1.10", ">= 0.9", ">= 1.6", "Exit status"]),
    (["sim", "--help"], ["--epochs", "--repeats", "plain torch", "<= 1.10"]),
    (["real", "--help"], ["--blocks", "--epochs", "--rounds", "--skip-throughput", "gloo", ">= 0.9", ">= 1.6"]),
    (["startup", "--help"], ["--repeats", "--clients", "--skip-protocol", "import torch", "<= 0.5", "<= 1.5",
                             "<= 3.0", ">= 0.9"]),
])
def test_help_is_plain_text_about_each_benchmark(argv, says, capsys):
    code, text = _exit_code(argv, capsys)
    assert code == 0
    for markup in (":mod:", ":class:", ":func:", "``", "DESIGN.md"):
        assert markup not in text, markup
    for phrase in says:
        assert phrase in text, phrase


def test_main_dispatches_the_parsed_options(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "bench_sim", lambda epochs, repeats: calls.append(("sim", epochs, repeats)))
    monkeypatch.setattr(bench_real, "run", lambda args: calls.append(("real", args.blocks)) or 0)
    assert bench.main(["sim", "--epochs", "0.5", "--repeats", "1"]) == 1   # stand-in returns None: a FAIL
    assert bench.main(["real", "--blocks", "2"]) == 0
    assert calls == [("sim", 0.5, 1), ("real", 2)]


def test_a_budget_too_short_for_the_benchmark_is_a_usage_error(capsys):
    """--epochs 0.1 holds fewer minibatches than one nsync-16 push: exit 2 naming the option and
    the run's own reason, not a traceback."""
    assert bench.main(["sim", "--epochs", "0.1", "--repeats", "1"]) == 2
    out, err = capsys.readouterr()
    assert "--epochs 0.1" in err and "nsync" in err and "Traceback" not in err
    assert out == ""   # refused before anything is timed


def test_a_budget_too_short_for_the_real_benchmarks_runs_is_a_usage_error_before_anything_is_measured(
        monkeypatch, capsys):
    """--epochs 0.01 holds fewer minibatches than one nsync-4 push: the throughput runs raised a
    ConfigError traceback (exit 1) after the protocol's minute of measuring. Now: exit 2 at once."""
    monkeypatch.setattr(bench_real, "measure_protocol", lambda *a: pytest.fail("measured before the budget's check"))
    assert bench.main(["real", "--epochs", "0.01"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("python -m repro.bench real: --epochs 0.01 does not fit the benchmark's runs: ") \
        and "nsync" in err and err.count("\n") == 1 and out == "", err


def test_python_dash_m_help_exits_zero():
    done = subprocess.run([sys.executable, "-m", "repro.bench", "sim", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--repeats" in done.stdout and "DESIGN.md" not in done.stdout


def test_the_simulator_benchmark_runs_and_prints_its_ratios(capsys):
    """Shrunk: two rows (nsync 1 and 16), each with a measured ratio and a verdict; no time is
    asserted (wall times vary by machine)."""
    ok = bench.bench_sim(num_epochs=0.5, repeats=1)   # a push of nsync 16 fits the budget
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["1"], ["16"])]
    assert [r[0] for r in rows] == ["1", "16"] and all(r[-1] in ("PASS", "FAIL") for r in rows)
    assert all(int(r[1]) > 0 and float(r[4]) > 0 for r in rows) and isinstance(ok, bool)


@pytest.mark.slow
def test_the_real_benchmark_runs_shrunk(capsys):
    assert bench.main(["real", "--blocks", "1", "--epochs", "1"]) in (0, 1)
    out = capsys.readouterr().out
    assert "nan" not in out and "run_real" in out and "raw/raw" in out


def test_startup_options_and_dispatch(monkeypatch):
    from repro_bench import startup as bench_startup

    args = bench.parse_args(["startup", "--repeats", "2", "--clients", "2", "3", "--skip-protocol"])
    assert (args.which, args.repeats, args.clients, args.skip_protocol) == ("startup", 2, [2, 3], True)
    assert bench.parse_args(["startup"]).clients == [4, 8]
    monkeypatch.setattr(bench_startup, "run", lambda a: 7 if a.repeats == 2 else 0)
    assert bench.main(["startup", "--repeats", "2"]) == 7


def test_a_client_count_the_real_driver_refuses_is_a_usage_error_before_anything_is_measured(monkeypatch, capsys):
    """--clients 2000 was a RuntimeError traceback (exit 1) after the torch import, --help, the typo
    and the simulations had been timed, when python -m repro.run refused it. Now: exit 2 at once."""
    from repro_bench import startup as bench_startup

    monkeypatch.setattr(bench_startup, "median_s", lambda *a: pytest.fail("measured before the check"))
    assert bench.main(["startup", "--clients", "4", "2000"]) == 2
    out, err = capsys.readouterr()
    assert err == ("python -m repro.bench startup: --clients 2000: invalid value for 'num_clients': 2000; "
                   "expected an integer in 1..1024\n") and out == "", err


def test_more_clients_than_the_machines_memory_holds_are_refused_before_any_real_run(monkeypatch, capsys):
    """--clients 1024 was accepted on any machine: 1025 processes each importing torch, on a
    machine whose memory holds a few dozen. Now: exit 2 naming --clients once the torch import
    has been measured (its size is each process's least), before any run, and before anything is
    printed (the header and the torch import's time came first, then the refusal)."""
    from repro_bench import startup as bench_startup

    monkeypatch.setattr(bench_startup, "median_s", lambda *a: 1.0)
    monkeypatch.setattr(bench_startup, "run_overhead", lambda *a: pytest.fail("a run before the check"))
    monkeypatch.setattr(bench_startup, "clients_that_fit", lambda: (10, "8 GiB of memory, 700 MiB a process"),
                        raising=False)
    assert bench.main(["startup", "--clients", "4", "11", "--skip-protocol"]) == 2
    out, err = capsys.readouterr()
    assert err == ("python -m repro.bench startup: --clients 11: at most 10 client processes "
                   "beside the server on this machine (8 GiB of memory, 700 MiB a process)\n")
    assert out == ""
    fit, why = bench_startup.clients_that_fit()   # the real one: this machine's, from its children's sizes
    assert fit >= 0 and why.endswith(" a process") and "of memory" in why


def test_a_client_count_given_twice_is_measured_once(monkeypatch, capsys):
    """--clients 4 4 ran the second real run into the first's folder, where python -m repro.run
    skipped it as done: its start-up alone was reported as the real run's time beyond training."""
    from repro_bench import startup as bench_startup

    measured = []
    monkeypatch.setattr(bench_startup, "median_s", lambda *a: 1.0)
    monkeypatch.setattr(bench_startup, "run_overhead", lambda *a: {"process_s": 1.0, "summary": {"wall_time_s": 0.5}})
    monkeypatch.setattr(bench_startup, "measure_real", lambda n, folder: measured.append(n) or
                        {"process_s": 2.0, "training_s": 1.0, "beyond_s": 1.0, "phases": []})
    bench.main(["startup", "--clients", "4", "2", "4", "--repeats", "1", "--skip-protocol"])
    assert measured == [4, 2]
    assert capsys.readouterr().out.count("beyond training") == 2


def test_startup_phases_are_the_time_between_marks(tmp_path):
    """A real run's trace (wall time, role, pid, phase per line) becomes the time from the launch to
    each phase in order: the server's marks as they are, each client phase at the median over the
    clients, and the process's exit last."""
    from repro_bench.startup import phases

    trace = tmp_path / "trace.tsv"
    trace.write_text("".join(f"{t}\t{role}\t{pid}\t{phase}\n" for t, role, pid, phase in [
        (101.0, "main", 1, "imported"), (102.5, "server", 1, "clients started"),
        (103.0, "client", 2, "started"), (105.0, "client", 3, "started"), (104.0, "client", 4, "started"),
        (106.0, "server", 1, "serving")]))
    assert phases(trace, start=100.0, end=110.0) == [
        ("main: imported", 1.0), ("server: clients started", 1.5), ("client: started", 1.5),
        ("server: serving", 2.0), ("main: exited", 4.0)]


def test_a_startup_mark_appends_one_line_that_phases_reads(tmp_path, monkeypatch):
    """repro.logs.mark appends ``wall-time role pid phase`` to $REPRO_STARTUP_TRACE, one line per
    mark after what is there (nothing without the variable): the trace phases() reads."""
    import os

    from repro.logs import TRACE_ENV, mark
    from repro_bench.startup import phases

    trace = tmp_path / "trace.tsv"
    monkeypatch.delenv(TRACE_ENV, raising=False)
    mark("main", "imported")
    assert not trace.exists()
    trace.write_text(f"1.0\tserver\t{os.getpid()}\tclients started\n")
    monkeypatch.setenv(TRACE_ENV, str(trace))
    mark("main", "imported")
    lines = [line.split("\t") for line in trace.read_text().splitlines()]
    assert [fields[1:] for fields in lines] == [["server", str(os.getpid()), "clients started"],
                                                 ["main", str(os.getpid()), "imported"]]
    assert [name for name, _ in phases(trace, start=0.0, end=float(lines[-1][0]))][:2] == [
        "server: clients started", "main: imported"]


def test_a_grid_of_one_point_says_it_has_no_speedup(monkeypatch, capsys):
    """``grid --exp smoke`` (one run, no sweep) timed that run under both launchers and printed
    their ratio as a 'speedup', PASS or FAIL: nothing ran in parallel. Now it says so, and its
    tables alone decide the exit status."""
    from repro_bench import grid as bench_grid

    def launch(cmd, log_path):   # the one point's tables, the same in both launches
        run = log_path.parent / "results" / "smoke" / "point"
        run.mkdir(parents=True)
        for name in ("summary.json", "updates.csv", "evals.csv"):
            (run / name).write_text("step,loss\n1,0.5\n")
        return 1.0   # a ratio of 1.00: below the target, which judged it FAIL

    monkeypatch.setattr(bench_grid, "timed", launch)
    assert bench.main(["grid", "--exp", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "speedup: none, a grid of one point has nothing to run in parallel (its tables are compared only)\n" in out
    assert "basic / parallel" not in out and "identical tables: 1/1 grid points" in out


def test_a_grid_keep_folder_that_cannot_be_made_or_a_failed_launch_is_one_line(tmp_path, capsys, monkeypatch):
    """--keep naming a file was a FileExistsError traceback; a launch that exited non-zero a
    RuntimeError traceback. Now: the option and why (2), the launch's command and log tail (1; 2 when
    python -m repro.run refused the launch: its bad input)."""
    (tmp_path / "file").write_text("")
    assert bench.main(["grid", "--keep", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == f"python -m repro.bench grid: --keep {tmp_path / 'file'}: cannot make the folder (File exists)\n"

    stand_in = tmp_path / "run"   # python -m repro.run's refusal (2) or failure (1), without its imports
    stand_in.write_text("#!/bin/sh\necho 'error: no'\nexit $STATUS\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    # a launch python -m repro.run refused (its bad input, exit 2) was exit 1: bad input is 2 across the project
    for status in ("1", "2"):
        monkeypatch.setenv("STATUS", status)
        assert bench.main(["grid", "--keep", str(tmp_path / "kept")]) == int(status)
        err = capsys.readouterr().err
        assert err.startswith(f"python -m repro.bench grid: {stand_in} -m repro.run +exp=fig4 results_dir=") \
            and err.endswith(f" exited {status}:\nerror: no\n"), err


def test_a_grid_keep_folder_holding_the_users_files_is_refused_untouched(tmp_path, capsys, monkeypatch):
    """--keep DIR deleted DIR/basic and DIR/parallel before each launch, whoever made them: a
    user's folder was lost. Now a folder holding anything an earlier --keep did not write is
    refused (2, one line naming --keep) before anything is written or deleted; a new folder, and
    one an earlier --keep wrote, are still taken."""
    from repro_bench import grid as bench_grid

    launched = []
    monkeypatch.setattr(bench_grid, "timed", lambda cmd, log: launched.append(cmd) or 1.0)
    monkeypatch.setattr(bench_grid, "compare_trees", lambda a, b, exp: (0, [], []))
    for held in ("basic/mine.txt", "parallel/mine.txt", "notes.txt"):
        users = tmp_path / held.replace("/", "_") / "dir"
        (users / held).parent.mkdir(parents=True)
        (users / held).write_text("mine")
        assert bench.main(["grid", "--keep", str(users)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m repro.bench grid: --keep {users}: ") and err.count("\n") == 1, err
        assert (users / held).read_text() == "mine" and sorted(p.name for p in users.iterdir()) == [held.split("/")[0]]
    assert not launched
    kept = tmp_path / "kept"
    for _ in range(2):   # a new folder, then the one it left
        assert bench.main(["grid", "--keep", str(kept), "--jobs", "2"]) in (0, 1)
    assert len(launched) == 4 and (kept / "basic").is_dir() and (kept / "parallel").is_dir()


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_mid_benchmark_is_one_line_and_130_and_takes_its_folder_along(tmp_path, monkeypatch, capsys,
                                                                               ctrl_c_raises, sig):
    """A Ctrl-C was a KeyboardInterrupt traceback; a SIGTERM killed the benchmark on the spot: grid's
    launch ran on, orphaned, and its temporary folder stayed. Now: one line, 130, both gone."""
    import signal
    import tempfile
    import time

    from repro_bench import grid as bench_grid

    def launch(cmd, log_path):   # stands for python -m repro.run: the signal comes while it runs
        os.kill(os.getpid(), getattr(signal, sig))
        time.sleep(5)

    monkeypatch.setattr(bench_grid, "timed", launch)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    before = signal.signal(signal.SIGTERM, lambda *a: pytest.fail("SIGTERM would have killed the benchmark"))
    try:
        rc = bench.main(["grid"])
    except KeyboardInterrupt:
        rc = "a KeyboardInterrupt traceback"
    finally:
        signal.signal(signal.SIGTERM, before)
    assert rc == 130 and capsys.readouterr().err == f"python -m repro.bench grid: stopped by {sig}\n"
    assert list(tmp_path.iterdir()) == []


def test_a_stop_during_the_protocol_measurement_kills_its_client_at_once(monkeypatch):
    """The client process, which never learns that rank 0 stopped, was waited for 30 s before it
    was killed: a SIGTERM took 30 s to end the real benchmark."""
    calls = []

    class Client:   # stands for the spawned rank 1, measuring on
        def __init__(self, **kwargs):
            pass

        def start(self):
            pass

        def join(self, timeout=None):
            calls.append(("join", timeout))

        def is_alive(self):
            return ("kill",) not in calls

        def kill(self):
            calls.append(("kill",))

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_real.mp, "get_context", lambda kind: argparse.Namespace(Process=Client))
    monkeypatch.setattr(bench_real, "_protocol_server", stopped)
    with pytest.raises(KeyboardInterrupt):
        bench_real.measure_protocol((1000,), blocks=1)
    assert calls == [("kill",)]
