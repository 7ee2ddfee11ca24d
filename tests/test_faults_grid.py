"""Grids whose launcher dies or is stopped (issue 16, section 3).

* The stop mark is one launch's own and stops a point for real (Hydra turns a callback's
  exception into a warning, so it used to only warn), and a second grid in the same folder
  neither clears nor obeys it.
* A grid point's process watches its launcher: a SIGKILLed launcher takes its workers along
  (each run stops cleanly first), a stop mark stops a running point.
* The launcher forwards a stop to every point (SIGTERM to the launcher alone, SIGHUP to the
  group), a worker that dies costs only its point, and ``resume=auto`` runs the rest.
The grids are fig3 shrunk to four points on two workers, as in tests/test_grids.py.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hydra._internal.callbacks import Callbacks
from omegaconf import OmegaConf

from repro.grid import Grid
from repro.run import compose

from tests.helpers.paths import ROOT  # noqa: E402
POINTS = 4


# ---------------------------------------------------------------------------------------------
# The stop mark: one launch's, and obeyed
# ---------------------------------------------------------------------------------------------

def _launched(tmp_path: Path, monkeypatch) -> Grid:
    """A Grid as the launching process has it after on_multirun_start (signals left alone)."""
    monkeypatch.setattr("repro.grid.StopRequest.__enter__", lambda self: self)
    grid = Grid(every_s=0)
    grid.on_multirun_start(compose(["+exp=fig3", f"results_dir={tmp_path}", "progress=false"],
                                   return_hydra_config=True))
    grid._stop_watching()
    return grid


def test_a_ctrl_c_while_the_grid_is_composed_stops_it_before_any_point(tmp_path, capsys):
    """A Ctrl-C after the command line's handler was installed and before the grid's own (the
    second of a second's start-up, as Hydra composes) asked this process's runs to stop, and
    no other process heard it: the joblib launcher ran every point, drew the figure and exited
    0. The grid now stops as for a Ctrl-C while it runs: its mark, exit 130, the resume hint."""
    from repro.runtime import StopRequest, request_stop

    grid = Grid(every_s=0)
    config = compose(["+exp=fig3", f"results_dir={tmp_path}", "progress=false"], return_hydra_config=True)
    request_stop("SIGINT")   # what the command line's StopRequest does with the Ctrl-C
    try:
        with pytest.raises(SystemExit) as stopped:
            grid.on_multirun_start(config)
    finally:
        grid._stop_watching()
        StopRequest._pending = ""
    assert stopped.value.code == 130 and grid.mark_path().exists()
    assert "[grid fig3] stopped by SIGINT. The same command with resume=auto" in capsys.readouterr().err


def test_the_progress_thread_ends_before_the_signal_handlers_go_back():
    """A second Ctrl-C while the launcher joins its progress thread (up to 5 s) still reaches the
    grid's own handler (exit 130, its message), not Python's default (a traceback)."""
    order = []

    class Thread:
        def join(self, timeout=None):
            order.append("thread joined")

    class Stop:
        def __exit__(self, *exc):
            order.append("handlers back")

    grid = Grid(every_s=0)
    grid._thread, grid._stop = Thread(), Stop()
    grid._stop_watching()
    assert order == ["thread joined", "handlers back"] and grid._stop is None and grid._thread is None


def test_a_point_refused_at_a_resume_is_counted_refused_not_done(tmp_path, monkeypatch):
    """Every point of a finished grid launched again with resume=auto and other settings is
    refused (exit 2, each named), and the last progress line read '4/4 done (4 skipped: already
    finished)': the refused points' folders still hold the finished runs of the old settings.
    A refused point is counted refused (here all points but one)."""
    from repro.errors import BAD_POINTS

    grid = _launched(tmp_path, monkeypatch)
    states = {p: "done" for p in grid.points}
    grid._skipped = set(grid.points)   # finished when the launch began
    before = list(BAD_POINTS)
    BAD_POINTS.extend(grid.points[1:])   # as repro.run.job and repro.launcher record a refused point
    try:
        line = grid.progress_line(final=True, prefix="finished: ", states=states)
    finally:
        BAD_POINTS[:] = before
    n = len(grid.points)
    assert line.startswith(f"[grid fig3] finished: 1/{n} done (1 skipped: already finished), {n - 1} refused: "), line


def _job(tmp_path: Path, name: str):
    """A point's config as Hydra hands it to on_job_start, its folder made with Hydra's record."""
    run_dir = tmp_path / "fig3" / name
    (run_dir / f".hydra_incoming_{os.getpid()}").mkdir(parents=True)
    return OmegaConf.create({"hydra": {"runtime": {"output_dir": str(run_dir)}}}), run_dir


def test_a_stopped_launch_keeps_its_queued_points_from_starting_and_no_other_launch(tmp_path, monkeypatch):
    """Grid A is stopped (its Ctrl-C wrote its mark); grid B then starts in the same experiment
    folder. A's queued point (a Slurm task starting later, in its own process: a pickled copy
    of the callback) does not start, even through Hydra's callback machinery, which swallows
    exceptions; its folder goes. B's points are not stopped by A's mark, nor did B clear it."""
    a = _launched(tmp_path, monkeypatch)
    a._mark_stopped()
    b = _launched(tmp_path, monkeypatch)
    assert a.mark_path().exists() and a.launch_id != b.launch_id

    queued = Callbacks()
    queued.callbacks = [pickle.loads(pickle.dumps(a))]
    config, run_dir = _job(tmp_path, "nsync=4,seed=0")
    with pytest.raises(SystemExit) as stopped:
        queued.on_job_start(config=config, task_function=None)
    assert stopped.value.code == 130 and not run_dir.exists()

    other = Callbacks()
    other.callbacks = [pickle.loads(pickle.dumps(b))]
    other.callbacks[0].main_pid = os.getpid()   # as in the launching process: no guard thread here
    config, run_dir = _job(tmp_path, "nsync=8,seed=0")
    other.on_job_start(config=config, task_function=None)   # starts
    assert run_dir.exists()


GUARDED = textwrap.dedent("""
    import os, socket, sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from repro.gridpoint import PointGuard, process_started
    from repro.runtime import StopRequest

    launcher, mark = int(sys.argv[1]), Path(sys.argv[2])
    grid = SimpleNamespace(main_pid=launcher, main_host=socket.gethostname(), stop_wait_s=30.0,
                           main_started=process_started(launcher), mark_path=lambda: mark)
    PointGuard.start(grid)
    with StopRequest() as stop:          # a run: it stops when asked, as a run does
        print("running", flush=True)
        while not stop.wait(0.05):
            pass
        print("stopped:", stop.reason, flush=True)
        time.sleep(0.5)                  # writing its checkpoint and summary
    print("idle", flush=True)            # a joblib worker between points
    time.sleep(120)
""")


def test_a_point_stops_on_its_launchs_mark_and_ends_with_its_launcher(tmp_path):
    """Two point processes, each guarded: one sees its launch's stop mark (what SIGTERM to the
    launcher alone now reaches) and stops its run as a first signal would, staying alive for
    the launcher to end; the other's launcher is SIGKILLed: its run stops cleanly, then the
    process ends with 130 (workers used to live on, holding their folders' locks)."""
    launchers = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    points = [subprocess.Popen([sys.executable, "-c", GUARDED, str(launcher.pid), str(tmp_path / f"mark{i}")],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True)
              for i, launcher in enumerate(launchers)]
    try:
        assert all(p.stdout.readline().strip() == "running" for p in points)
        (tmp_path / "mark0").write_text("{}")
        launchers[1].kill()
        launchers[1].wait()
        assert points[0].stdout.readline().strip() == "stopped: the grid was stopped"
        assert points[1].stdout.readline().strip() == "stopped: the grid's launcher ended"
        assert points[1].wait(timeout=30) == 130 and points[1].stdout.read().strip() == "idle"
        assert points[0].stdout.readline().strip() == "idle" and points[0].poll() is None
    finally:
        for proc in points + launchers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------------------
# Whole grids (slow): signals, a lost worker, a killed launcher, resume=auto
# ---------------------------------------------------------------------------------------------

SHRUNK = ["warm_start_epochs=0.5", "eval_every=0.25", "progress=false", "hydra.launcher.n_jobs=2",
          "hydra.sweeper.params.num_clients='1,2'", "hydra.sweeper.params.nsync='1,4'",
          "hydra.sweeper.params.seed='0'", "+hydra.callbacks.grid.stop_wait_s=30"]


def grid_cmd(root: Path, epochs: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "repro.run", "+exp=fig3", f"results_dir={root / 'results'}",
            f"figures_dir={root / 'figures'}", f"num_epochs={epochs:g}", *SHRUNK, *extra]


def start_grid(root: Path, epochs: float, *extra: str) -> subprocess.Popen:
    """A grid in its own session (a terminal's process group), its output in a file."""
    return subprocess.Popen(grid_cmd(root, epochs, *extra), cwd=ROOT, start_new_session=True,
                            stdout=open(root / "out.txt", "a"), stderr=subprocess.STDOUT,
                            env={**os.environ, "MPLBACKEND": "Agg"})


def summaries(root: Path) -> dict[str, dict]:
    out = {}
    for path in (root / "results" / "fig3").glob("*/summary.json"):
        try:
            out[path.parent.name] = json.loads(path.read_text())
        except ValueError:   # mid-write
            pass
    return out


def wait_running(proc: subprocess.Popen, root: Path, n: int, timeout_s: float = 180) -> list[str]:
    """Until ``n`` points train (their summary says running and a process holds them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [name for name, s in summaries(root).items() if s.get("status") == "running"
                   and (root / "results" / "fig3" / name / ".lock").read_text().strip()]
        if len(running) >= n:
            return running
        assert proc.poll() is None, (root / "out.txt").read_text()[-3000:]
        time.sleep(0.1)
    raise AssertionError(f"{n} grid points never ran")


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``: the launcher's whole tree."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(pid))
    return out


def assert_none_left(sid: int, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while session_processes(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = session_processes(sid)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def statuses(root: Path) -> list[str]:
    return sorted(s["status"] for s in summaries(root).values())


def resume_auto(root: Path, epochs: float) -> subprocess.CompletedProcess:
    done = subprocess.run(grid_cmd(root, epochs, "resume=auto"), cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"finished: {POINTS}/{POINTS} done" in done.stderr and statuses(root) == ["completed"] * POINTS
    return done


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_sigkilled_launcher_takes_its_workers_along_and_resume_auto_runs_the_rest(tmp_path):
    proc = start_grid(tmp_path, 6)
    try:
        wait_running(proc, tmp_path, 2)
        proc.kill()                               # the launcher alone, as the OOM killer or kill -9
        proc.wait()
        assert_none_left(proc.pid, within_s=60)   # its workers followed it
    finally:
        assert_none_left(proc.pid, within_s=0)
    assert statuses(tmp_path) == ["interrupted", "interrupted"]   # each stopped cleanly first
    resume_auto(tmp_path, 6)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "SIGHUP to the group"])
def test_sigterm_or_sighup_stops_every_running_point_cleanly(tmp_path, how):
    """SIGTERM to the launcher alone (a supervisor's kill PID) never reached the points: they
    were SIGKILLed after stop_wait_s and left running. A closed terminal's SIGHUP killed the
    launcher and left its workers."""
    proc = start_grid(tmp_path, 400)
    try:
        wait_running(proc, tmp_path, 2)
        if how.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=120) == 130
        assert_none_left(proc.pid, within_s=20)
    finally:
        assert_none_left(proc.pid, within_s=0)
    out = (tmp_path / "out.txt").read_text()
    assert statuses(tmp_path) == ["interrupted", "interrupted"], out[-3000:]
    assert "did not stop within" not in out and "Traceback" not in out
    assert f"stopped by {how.split()[0]}" in out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_worker_killed_by_the_oom_killer_costs_only_its_point(tmp_path):
    proc = start_grid(tmp_path, 3)
    try:
        victim = wait_running(proc, tmp_path, 2)[0]
        holder = json.loads((tmp_path / "results" / "fig3" / victim / ".lock").read_text())
        os.kill(holder["pid"], signal.SIGKILL)
        assert proc.wait(timeout=600) == 0
        assert_none_left(proc.pid, within_s=20)
    finally:
        assert_none_left(proc.pid, within_s=0)
    out = (tmp_path / "out.txt").read_text()
    states = {name: s["status"] for name, s in summaries(tmp_path).items()}
    assert states.pop(victim) == "running" and list(states.values()) == ["completed"] * 3, out[-3000:]
    assert "its worker process died (killed by SIGKILL" in out and "resume=auto continues this one" in out
    assert f"finished: 3/{POINTS} done" in out and "1 killed" in out and "Traceback" not in out
    assert "fig3: wrote" in out                   # the grid ended normally: the figure is drawn
    resume_auto(tmp_path, 3)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stopping_one_grid_leaves_another_in_the_same_folder_running(tmp_path):
    """Two launches of fig3 with other settings share results/fig3/: stopping the first (SIGTERM)
    stops only its points; the second finishes every one of its own."""
    first = start_grid(tmp_path, 400)
    second = start_grid(tmp_path, 2, "hydra.launcher.n_jobs=1", "target_error=0.1")
    try:
        wait_running(first, tmp_path, 3)   # two points of the first grid, one of the second
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 130
        assert second.wait(timeout=600) == 0
    finally:
        for proc in (first, second):
            assert_none_left(proc.pid, within_s=20)
    out = (tmp_path / "out.txt").read_text()
    second_states = [s["status"] for n, s in summaries(tmp_path).items() if "target_error" in n]
    first_states = [s["status"] for n, s in summaries(tmp_path).items() if "target_error" not in n]
    assert second_states == ["completed"] * POINTS and first_states == ["interrupted"] * 2, out[-3000:]
