"""The sim-vs-real instruments (repro_bench/instruments/): the accuracy report's arithmetic on known
numbers, and the experiment's phase after its grid (issue 32, items 2 and 4): one Ctrl-C stops it,
the stop reaches the two-host run's ranks (in sessions of their own), and a two-host point that
rank 0 refused is named, never dropped from the figure in silence.

Fast: the two-host run is a stand-in (or, for the forwarding, local processes that stand for
torchrun's agents and ranks); tests/test_two_hosts.py runs the real thing in namespaces.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from repro.config.settings import RunConfig
from repro_bench.instruments import accuracy as acc
from repro_bench.instruments import two_hosts
from repro_bench.instruments.simreal import SimVsReal
from repro.runtime import StopRequest

from tests.test_simreal import fake_run


# ---------------------------------------------------------------------------------------------
# The five numbers
# ---------------------------------------------------------------------------------------------

def _table(measured, predicted):
    return pd.DataFrame({"link": "loopback", "nsync": 1, "num_clients": range(1, len(measured) + 1),
                         "measured_samples_per_s": measured, "predicted_samples_per_s": predicted,
                         "samples_error": [p / m - 1 for m, p in zip(measured, predicted)]})


def _runs(point, side, times):
    return pd.DataFrame({"side": side, "link": "loopback", "nsync": 1, "num_clients": point,
                         "seed": range(len(times)), "time_to_target_s": times})


def test_mape_worst_bias_and_kendalls_tau_on_known_numbers():
    # errors +10%, +60%, -5%, -5%; the second and third points swap their order
    table = _table([100.0, 200.0, 300.0, 400.0], [110.0, 320.0, 285.0, 380.0])
    runs = pd.concat([_runs(1, "measured", [1.0, 1.2, 0.8]), _runs(1, "predicted", [1.1, 1.1]),
                      _runs(2, "measured", [2.0, 2.0]), _runs(2, "predicted", [2.5]),
                      _runs(3, "measured", [3.0]), _runs(3, "predicted", [math.nan])])
    a = acc.accuracy(table, runs)
    assert a.points == 4 and a.mape == pytest.approx(0.20) and a.bias == pytest.approx(0.15)
    assert a.worst_point == "loopback, nsync 1, 2 client(s)" and a.worst_error == pytest.approx(0.60)
    assert a.kendall_tau == pytest.approx((5 - 1) / 6)   # 6 pairs, one discordant
    # time to target: point 1 +10% inside its seeds' ±20%; point 2 +25% outside its ±0%; point 3 left out
    assert (a.ttt_points, a.ttt_within_spread, a.ttt_missing) == (2, 1, 1)
    assert a.ttt_mape == pytest.approx(0.175) and a.ttt_seed_spread == pytest.approx(0.10)
    lines = "\n".join(a.lines())
    for text in ("MAPE over 4 point(s): 20.0%", "worst point: loopback, nsync 1, 2 client(s): +60.0%",
                 "bias (mean signed error): +15.0%: the simulator over-predicts", "Kendall's tau", "+0.667",
                 "time to target: mean |error| 17.5% against the real runs' seed spread ±10.0%; 1 of 2"):
        assert text in lines, lines


def test_kendalls_tau_b_counts_ties_as_neither_order():
    assert acc.kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert acc.kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / math.sqrt(2 * 3))
    assert math.isnan(acc.kendall_tau([5], [5])) and math.isnan(acc.kendall_tau([1, 1], [1, 2]))


def test_under_prediction_reads_as_such():
    a = acc.accuracy(_table([100.0, 200.0], [90.0, 170.0]), _runs(1, "measured", []))
    assert a.bias == pytest.approx(-0.125) and "under-predicts" in a.lines()[2]
    assert "no point where both sides reached the target" in a.lines()[4]


def test_the_benchmark_prints_all_five(tmp_path, capsys):
    from repro_bench.__main__ import main

    one = {"cpu_cores": 2, "torch_threads": 1}
    r1 = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1})
    fake_run(tmp_path / "m2", backend="real", clients=2, nsync=1, seed=0, host={**one, "clients_on_host": 2}, rate=2000.0)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[r1], rate=1100.0)
    fake_run(tmp_path / "p2", backend="sim", clients=2, nsync=1, seed=0, fit_paths=[r1], rate=1500.0)
    main(["simreal", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    for text in ("samples/s MAPE over 2 point(s): 17.5%", "worst point: loopback, nsync 1, 2 client(s): -25.0%",
                 "bias (mean signed error): -7.5%", "Kendall's tau, predicted against measured samples/s across the points: +1.000",
                 "time to target:"):
        assert text in out, out


# ---------------------------------------------------------------------------------------------
# The phase after the grid: one Ctrl-C, and no point dropped in silence
# ---------------------------------------------------------------------------------------------

JOBS = [{"nsync": "1", "num_clients": "1", "seed": str(s)} for s in (0, 1, 2)]


def _base(tmp_path) -> RunConfig:
    return RunConfig(results_dir=str(tmp_path / "r"), figures_dir=str(tmp_path / "f"), exp_name="sim_vs_real",
                     progress=False)


def test_one_ctrl_c_stops_the_two_host_phase_and_starts_no_further_run(tmp_path, monkeypatch, capsys):
    calls = []

    def stand_in(overrides, num_clients, folder, link, stop=None):
        calls.append(folder)
        os.kill(os.getpid(), signal.SIGINT)   # a Ctrl-C while the run is in flight
        assert stop is not None and stop.wait(10), "the stop request never reached the two-host run"
        return {"status": "interrupted"}

    monkeypatch.setattr(two_hosts, "run_two_hosts", stand_in)
    with pytest.raises(SystemExit) as ended:
        SimVsReal().pipeline(_base(tmp_path), JOBS, [])
    assert ended.value.code == 130 and len(calls) == 1
    err = capsys.readouterr().err
    assert "SIGINT: stopping the run in progress" in err and "resume=auto" in err
    assert not (tmp_path / "f").exists()


def test_a_point_rank_0_refused_is_named_and_the_experiment_ends_1_without_a_figure(tmp_path, monkeypatch, capsys):
    seen = []

    def stand_in(overrides, num_clients, folder, link, stop=None):
        seen.append(overrides)
        if folder.name == "nsync1_num_clients1_seed1":
            raise RuntimeError("rank 0 did not run it, the folder still says 'running': error: invalid value "
                               "for 'resume': False; expected a fresh folder")
        return {"status": "failed" if folder.name.endswith("seed2") else "completed"}

    monkeypatch.setattr(two_hosts, "run_two_hosts", stand_in)
    with pytest.raises(SystemExit) as ended:
        SimVsReal().pipeline(_base(tmp_path), JOBS, ["resume=auto"])
    assert ended.value.code == 1 and len(seen) == 3
    assert all("resume=auto" in o for o in seen)   # the command's resume reaches the two-host runs
    err = capsys.readouterr().err
    assert "nsync1_num_clients1_seed1 on the link did not finish: rank 0 did not run it" in err
    assert "error: invalid value for 'resume'" in err
    assert "no figure drawn: 2 two-host point(s) did not finish: nsync1_num_clients1_seed1: rank 0" in err
    assert "nsync1_num_clients1_seed2: it ended failed" in err
    assert not (tmp_path / "f").exists()


# ---------------------------------------------------------------------------------------------
# The two-host run's end: the stop forwarded to the ranks, a refusal never read as a result
# ---------------------------------------------------------------------------------------------

RANK = """if True:
    import json, pathlib, signal, sys, time
    run = pathlib.Path(sys.argv[1])
    def stop(signum, frame):
        (run / "summary.json").write_text(json.dumps({"status": "interrupted"}))
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    (run / ("ready" + sys.argv[2])).write_text("")
    time.sleep(60)
"""
AGENT = """if True:
    import pathlib, signal, subprocess, sys, time
    signal.signal(signal.SIGINT, lambda s, f: pathlib.Path(sys.argv[1], "agent_signalled").write_text(""))
    time.sleep(float(sys.argv[4]))   # torchrun's rendezvous before it starts its rank
    sys.exit(subprocess.call([sys.executable, "-c", sys.argv[5], *sys.argv[6:]]))
"""


class FakeHosts:
    """Two 'hosts' that are process trees of this machine: each host's processes are its agent
    and the agent's children."""

    def __init__(self):
        self.server, self.client = "server", "client"
        self.agents: dict[str, subprocess.Popen] = {}

    def pids(self, host) -> set[int]:
        agent = self.agents[host]
        try:
            children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
        except OSError:
            children = []
        return ({agent.pid} if agent.poll() is None else set()) | {int(p) for p in children}

    def kill(self, host) -> set[int]:
        for pid in self.pids(host):
            os.kill(pid, signal.SIGKILL)
        return set()


def _agent(hosts, host, results, rank_code, *args, delay_s=0.0):
    # the agent's command line names torch.distributed.run and repro.run, as torchrun's does
    log = open(results / two_hosts.LOG_DIR / f"node{0 if host == 'server' else 1}.log", "w")
    with log:
        proc = subprocess.Popen([sys.executable, "-c", AGENT, str(results), "torch.distributed.run", "repro.run",
                                 str(delay_s), rank_code, *args], stdout=log, stderr=subprocess.STDOUT)
    hosts.agents[host] = proc
    return proc


def _results(tmp_path, summary=None):
    results = tmp_path / "link"
    (results / two_hosts.LOG_DIR).mkdir(parents=True)
    (results / "run").mkdir()
    (results / "run" / "config.json").write_text("{}")
    if summary is not None:
        (results / "run" / "summary.json").write_text(json.dumps(summary))
    return results


def test_a_stop_is_forwarded_to_every_rank_on_both_hosts_and_never_to_the_agents(tmp_path):
    results, hosts = _results(tmp_path), FakeHosts()
    run_dir = results / "run"
    try:
        server = _agent(hosts, "server", results, RANK, str(run_dir), "0", "repro.run")
        client = _agent(hosts, "client", results, RANK, str(run_dir), "1", "repro.run")
        run = two_hosts.TwoHostRun(hosts, results, server, client, previous=two_hosts.summary_text(results))
        deadline = time.monotonic() + 60
        while not ((run_dir / "ready0").exists() and (run_dir / "ready1").exists()):
            assert time.monotonic() < deadline, "the stand-in ranks did not start"
            time.sleep(0.05)
        assert len(run.ranks()) == 2   # the ranks, not their agents
        stop = StopRequest()
        stop.set("SIGINT")
        assert run.wait(60, stop=stop) == {"status": "interrupted"}
        assert len(run.interrupted) == 2 and not (results / "agent_signalled").exists()
    finally:
        for host in ("server", "client"):
            if host in hosts.agents:
                hosts.kill(host)
                hosts.agents[host].wait(10)


def test_a_folder_rank_0_refused_raises_with_its_error_line_instead_of_the_stale_summary(tmp_path):
    results, hosts = _results(tmp_path, {"status": "running"}), FakeHosts()
    refuse = "print(\"error: invalid value for 'resume': False; expected a fresh folder\"); raise SystemExit(2)"
    try:
        server = _agent(hosts, "server", results, refuse)
        client = _agent(hosts, "client", results, "raise SystemExit(1)")
        run = two_hosts.TwoHostRun(hosts, results, server, client, previous=two_hosts.summary_text(results))
        with pytest.raises(RuntimeError, match="rank 0 did not run it, the folder still says 'running': "
                                               "error: invalid value for 'resume'"):
            run.wait(60)
    finally:
        for host in ("server", "client"):
            if host in hosts.agents:
                hosts.agents[host].wait(10)


def test_a_terminal_summary_left_by_an_earlier_launch_does_not_end_the_wait(tmp_path):
    """An interrupted folder continued with resume=auto: its old 'interrupted' summary is there
    before rank 0 has even started, and must not be read as this launch's end."""
    results, hosts = _results(tmp_path, {"status": "interrupted"}), FakeHosts()
    # rank 0 starts 1 s late (torchrun's rendezvous): ten polls that see the old summary
    finish = ("import json, pathlib, sys, time; time.sleep(0.5); "
              "pathlib.Path(sys.argv[1], 'summary.json').write_text(json.dumps({'status': 'completed'}))")
    try:
        server = _agent(hosts, "server", results, finish, str(results / "run"), "repro.run", delay_s=1.0)
        client = _agent(hosts, "client", results, "import time; time.sleep(1.5)", "repro.run")
        run = two_hosts.TwoHostRun(hosts, results, server, client, previous=two_hosts.summary_text(results))
        assert run.wait(60, grace_s=0.5) == {"status": "completed"} and not run.agents_killed
    finally:
        for host in ("server", "client"):
            if host in hosts.agents:
                hosts.kill(host)
                hosts.agents[host].wait(10)


class _Agent:
    """A stand-in agent that has exited after ``polls`` polls."""
    pid = -1

    def __init__(self, polls: int):
        self.polls = polls

    def poll(self):
        self.polls -= 1
        return None if self.polls >= 0 else 0

    def wait(self, timeout=None):
        return 0


def test_the_wait_reads_the_summary_once_a_poll(tmp_path, monkeypatch):
    """One read of summary.json a poll (and one at the end): two reads could see two summaries."""
    results, reads = _results(tmp_path, {"status": "completed"}), []
    read = two_hosts.summary_text
    monkeypatch.setattr(two_hosts, "summary_text", lambda d: reads.append(d) or read(d))
    run = two_hosts.TwoHostRun(FakeHosts(), results, _Agent(0), _Agent(1))   # one poll, then both gone
    assert run.wait(60) == {"status": "completed"} and len(reads) == 2


@pytest.mark.slow
def test_a_run_stopped_while_its_clients_join_is_started_over_by_resume_auto(tmp_path):
    """Issue 32, item 4's way back: a two-host point stopped before its clients joined (rank 0
    waits in torchrun's rendezvous; here rank 0 alone, in a torchrun world of 2) recorded a
    checkpoint without the clients' state, which every resume refused ('it lacks driver.clients').
    It now records none, so the experiment's resume=auto starts the point over."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = ["backend=real", "data=synthetic", "model=mlp", "num_clients=1", "num_epochs=1", "progress=false",
           f"results_dir={tmp_path}", "exp_name=j", "hydra.run.dir=" + str(tmp_path / "j" / "run")]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    proc = subprocess.Popen([sys.executable, "-m", "repro.run", *run, "backend.timeout_s=120"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "j" / "run" / "config.json").exists():   # the folder is the run's: the stop is heard
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0][-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    summary = json.loads((tmp_path / "j" / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "joining" in summary["message"], out[-3000:]
    assert not (tmp_path / "j" / "run" / "checkpoint.pt").exists()
    again = subprocess.run([sys.executable, "-m", "repro.run", *run, "resume=auto"], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "j" / "run" / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("name", ["a,b", "x=y", "it's", "a b", "[x] $HOME", "nan"])
def test_an_empty_results_folder_runs_the_experiment_into_that_very_folder(tmp_path, monkeypatch, capsys, name):
    # a bare exp_name=a,b was a Hydra sweep: two experiments, in a/ and b/, then none read from a,b/;
    # the command printed to copy was quoted for Hydra alone: bash split "a b" and ate its quotes
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from repro_bench.__main__ import main

    commands = []

    class Experiment:   # stands for the experiment's process: records its command, ends at once
        def __init__(self, cmd, **_):
            commands.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Experiment)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "res" / name).mkdir(parents=True)   # a folder named by --results must exist
    assert main(["simreal", "--results", f"res/{name}"]) == 2   # the stand-in ran nothing: no point
    out = capsys.readouterr().out
    assert "running python -m repro.run +exp=sim_vs_real results_dir=" in out   # one to copy,
    pasted = shlex.split(out.split(": running ", 1)[1])   # as bash splits it
    assert pasted[:4] == ["python", "-m", "repro.run", "+exp=sim_vs_real"]
    main(["simreal", "--results", "."])
    values = [{o.key_or_group: o.value() for o in OverridesParser.create().parse_overrides(cmd[4:])}
              for cmd in [*commands, pasted]]
    assert values[:2] == [{"results_dir": str(tmp_path / "res"), "exp_name": name},
                          {"results_dir": str(tmp_path.parent), "exp_name": tmp_path.name}]
    assert values[2] == values[0]   # pasted, the printed command runs the same experiment


def test_a_point_without_samples_per_s_is_left_out_and_counted_not_in_silence():
    # one push (no span: NaN) and none measured (0 samples/s: an infinite error) beside two good points
    table = _table([100.0, 200.0, math.nan, 1.0], [110.0, 180.0, 300.0, 400.0])
    table.loc[3, ["measured_samples_per_s", "samples_error"]] = [0.0, math.inf]   # as pandas divides
    a = acc.accuracy(table, _runs(1, "measured", []))
    assert (a.points, a.left_out) == (2, 2) and a.mape == pytest.approx(0.10) and a.kendall_tau == 1.0
    assert a.lines()[0] == ("samples/s MAPE over 2 point(s): 10.0% (2 point(s) left out: no samples/s on a side, "
                            "or none measured)")
    assert "2 point(s) left out" in acc.accuracy(table.iloc[2:], _runs(1, "measured", [])).lines()[0]


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_ctrl_c_while_the_benchmark_runs_the_experiment_lets_it_stop_as_it_does_alone(tmp_path, monkeypatch, capsys,
                                                                                          ctrl_c_raises):
    # subprocess.run SIGKILLed the experiment 0.25 s after a Ctrl-C: its runs never wrote their stop
    import threading

    from repro_bench.__main__ import main

    stand_in = tmp_path / "experiment"   # takes a second to stop, as a run checkpointing does
    stand_in.write_text(f"#!/bin/sh\ntrap 'kill $!; sleep 1; echo stopped > {tmp_path}/mark; exit 130' INT\n"
                        "sleep 5 & wait\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    (tmp_path / "none").mkdir()   # empty: the experiment is run into it
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        rc = main(["simreal", "--results", str(tmp_path / "none")])
    except KeyboardInterrupt:
        rc = "a KeyboardInterrupt traceback"
    assert rc == 130 and (tmp_path / "mark").read_text() == "stopped\n"
    # the experiment says "the same command with resume=auto": simreal takes no resume=, so it names the command
    assert "exp_name='none' resume=auto finishes it" in capsys.readouterr().err


def test_a_point_where_a_seed_never_reached_the_target_is_left_out_of_time_to_target():
    # one real seed of two reached it: its spread is unknown, not the 0 one time makes; its median is no median
    runs = pd.concat([_runs(1, "measured", [2.0, math.nan]), _runs(1, "predicted", [2.1, 2.1]),
                      _runs(2, "measured", [1.0, 1.2]), _runs(2, "predicted", [1.1, math.nan])])
    a = acc.accuracy(_table([100.0, 200.0], [100.0, 200.0]), runs)
    assert (a.ttt_points, a.ttt_missing) == (0, 2)
    assert "2 point(s) left out: a run never reached the target" in a.lines()[4]


def test_one_seed_per_point_has_no_seed_spread_not_a_spread_of_0():
    """With one real seed a point's spread was 0, printed as '±0.0%; 0 of 1 point(s) within
    their spread': no error can lie inside a spread one time cannot show. Now the error is
    given, and the spread is said to be unknown."""
    runs = pd.concat([_runs(1, "measured", [2.0]), _runs(1, "predicted", [2.2])])
    a = acc.accuracy(_table([100.0], [100.0]), runs)
    assert a.ttt_points == 1 and a.ttt_mape == pytest.approx(0.1) and math.isnan(a.ttt_seed_spread)
    assert a.lines()[4] == ("time to target: mean |error| 10.0% over 1 point(s); "
                            "the real runs' seed spread: n/a (one seed per point)")
