"""Experiment grids under Hydra's launchers: the same numbers whoever launches them.

A grid point run by a joblib worker (``hydra/launcher=parallel``, the experiments' default) or by
submitit's local executor (the stand-in for Slurm: ``hydra/launcher=submitit_local``) must write
byte-identical tables to the same point run one after another in the launching process
(``hydra/launcher=basic``): the same torch build, CPU kernel family and thread count (one torch
thread per job, the default ``num_threads``), so the same numbers. Also here: the figure is drawn
once after the grid, the warm-start baseline is trained once when jobs start together, progress
names what is done and what runs, Ctrl-C stops every job with no process left behind, and a
finished grid launched again skips every point.
"""
from __future__ import annotations

import filecmp
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from repro_bench import __main__ as bench
from repro_bench import grid as bench_grid
from tests.helpers.grids import cli_in_process
from tests.helpers.paths import ROOT
from tests.helpers.processes import assert_no_leftovers


def _drawn(stdout: str) -> int:
    """How many times the figure was drawn (its callback prints one line each time; Hydra's log
    repeats it after a time stamp)."""
    return len(re.findall(r"^fig3: wrote", stdout, flags=re.M))


SHRUNK = ["num_epochs=0.5", "warm_start_epochs=0.5", "eval_every=0.25", "progress=false",
          "hydra.sweeper.params.num_clients='1,2'", "hydra.sweeper.params.nsync='1,4'",
          "hydra.sweeper.params.seed='0'"]
POINTS = 4
BASELINE_LINE = "warm start: training the single-client baseline"


def grid_cmd(root: Path, launcher: str | None, *extra: str, exp: str = "fig3") -> list[str]:
    cmd = [sys.executable, "-m", "repro.run", f"+exp={exp}", f"results_dir={root / 'results'}",
           f"figures_dir={root / 'figures'}", *SHRUNK, *extra]
    return cmd + ([f"hydra/launcher={launcher}"] if launcher else [])


def launch(root: Path, launcher: str | None, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(grid_cmd(root, launcher, *extra), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def run_folders(root: Path, exp: str = "fig3") -> dict[str, Path]:
    return {p.parent.name: p.parent for p in (root / "results" / exp).glob("*/summary.json")}


def figure_csv(root: Path, name: str = "fig3") -> str:
    """The figure's numbers, with the results tree's own location taken out of run_dir."""
    return (root / "figures" / f"{name}.csv").read_text().replace(str(root / "results"), "RESULTS")


def assert_same_runs(a: Path, b: Path) -> None:
    runs_a, runs_b = run_folders(a), run_folders(b)
    assert sorted(runs_a) == sorted(runs_b) and len(runs_a) == POINTS
    for name, folder in runs_a.items():
        for table in ("updates.csv", "evals.csv"):
            assert filecmp.cmp(folder / table, runs_b[name] / table, shallow=False), f"{name}/{table}"
        sa, sb = (json.loads((r / "summary.json").read_text()) for r in (folder, runs_b[name]))
        for s in (sa, sb):
            s.pop("wall_time_s")
        assert sa == sb and sa["status"] == "completed"
        ca, cb = (json.loads((r / "config.json").read_text()) for r in (folder, runs_b[name]))
        for c in (ca, cb):
            c.pop("results_dir"), c.pop("figures_dir")
        assert ca == cb and ca["num_threads"] == 1 and ca["environment"]["num_threads"] == 1
    assert figure_csv(a) == figure_csv(b)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> Path:
    """The grid run one point after another in the launching process: this one (the reference
    needs no process of its own; the parallel launches compared with it start theirs)."""
    root = tmp_path_factory.mktemp("basic")
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert cli_in_process(monkeypatch, *grid_cmd(root, "basic")[3:]) == 0
    return root


def test_joblib_workers_write_the_same_runs_and_figure_as_sequential(sequential, tmp_path):
    """Two joblib workers start together: one trains the warm-start baseline, the other waits for
    it; every table and the figure's numbers equal the sequential launch's, byte for byte. The
    grid launched again skips every finished point and touches no table."""
    proc = launch(tmp_path, None, "hydra.launcher.n_jobs=2")   # the experiment's default launcher
    out = proc.stdout + proc.stderr
    assert "joblib (loky): launching 4 jobs in 2 worker process(es)" in out
    assert_same_runs(sequential, tmp_path)
    assert out.count(BASELINE_LINE) == 1
    assert len(list((tmp_path / "results" / "_warmstart").glob("*/server.pt"))) == 1
    assert _drawn(proc.stdout) == 1               # drawn once, after the grid
    assert f"[grid fig3] finished: {POINTS}/{POINTS} done" in out
    assert (tmp_path / "figures" / "fig3.png").stat().st_size > 10_000
    assert (tmp_path / "figures" / "fig3.pdf").exists()

    runs = run_folders(tmp_path)
    before = {name: (r / "updates.csv").stat().st_mtime_ns for name, r in runs.items()}
    again = launch(tmp_path, None, "hydra.launcher.n_jobs=2")   # finished points are skipped
    out = again.stdout + again.stderr
    assert out.count("already completed") == POINTS
    assert f"[grid fig3] finished: {POINTS}/{POINTS} done ({POINTS} skipped: already finished)" in out
    assert all((runs[n] / "updates.csv").stat().st_mtime_ns == t for n, t in before.items())
    assert _drawn(again.stdout) == 1 and BASELINE_LINE not in out


# slow: the Slurm launcher's local stand-in; the joblib test checks the same guarantee (parallel
# points write exactly the sequential runs and figure) in the default suite
@pytest.mark.slow
def test_submitit_local_executor_writes_the_same_runs_and_figure_as_sequential(sequential, tmp_path):
    """submitit's local executor (the stand-in for a Slurm cluster) starts every point at once,
    each in its own process; the numbers are still the sequential launch's."""
    proc = launch(tmp_path, "submitit_local")
    out = proc.stdout + proc.stderr
    assert_same_runs(sequential, tmp_path)
    assert _drawn(proc.stdout) == 1
    assert len(list((tmp_path / "results" / "_warmstart").glob("*/server.pt"))) == 1
    logs = "".join(p.read_text() for p in (tmp_path / "results" / "fig3" / ".submitit").rglob("*.err"))
    assert logs.count(BASELINE_LINE) == 1                      # four jobs, one baseline


WARM_JOB = textwrap.dedent("""
    import hashlib, os, sys, time
    from pathlib import Path
    import torch
    import repro.workload.start as ws
    from repro.run import compose, parse

    results, go, calls, ready = sys.argv[1:5]
    cfg = parse(compose([f"results_dir={results}", "start=warm", "warm_start_epochs=1", "progress=false"]))
    train = ws.train_baseline

    def counted(cfg, device):
        with open(calls, "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(1.0)            # a slow baseline: the other job must wait, not train its own
        return train(cfg, device)

    ws.train_baseline = counted
    with open(ready, "a") as f:    # torch imported: at the start line
        f.write(f"{os.getpid()}\\n")
    while not Path(go).exists():   # both jobs start together
        time.sleep(0.01)
    params, rule = ws.warm_start_state(cfg, torch.device("cpu"))
    print(hashlib.sha1(params.numpy().tobytes()).hexdigest())
""")


# slow (two interpreters importing torch, ~5 s): the same path (warm_start_state's lock, one
# baseline for two jobs starting together) is default in
# test_joblib_workers_write_the_same_runs_and_figure_as_sequential (its baseline line once, one
# server.pt); this one forces the race with a slowed baseline
@pytest.mark.slow
def test_two_jobs_starting_together_train_the_warm_start_baseline_once(tmp_path):
    go, calls, ready = tmp_path / "go", tmp_path / "calls", tmp_path / "ready"
    procs = [subprocess.Popen([sys.executable, "-c", WARM_JOB, str(tmp_path / "results"), str(go), str(calls),
                               str(ready)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    deadline = time.monotonic() + 120
    while not (ready.exists() and len(ready.read_text().split()) == 2):   # both wait at the start line
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a job never reached the start"
        time.sleep(0.05)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert len(calls.read_text().split()) == 1                 # trained once
    assert outs[0][0] == outs[1][0] and len(outs[0][0].strip()) == 40   # the same start for both
    assert len(list((tmp_path / "results" / "_warmstart").glob("*/server.pt"))) == 1


def _wait_running(root: Path, n: int, timeout_s: float = 120) -> None:
    """Until ``n`` grid points are training (their summary says running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [json.loads(p.read_text()).get("status") for p in (root / "results" / "fig3").glob("*/summary.json")
                  if p.stat().st_size]
        if states.count("running") >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"{n} grid points never ran")


def _ctrl_c(root: Path, launcher: str, running: int, *extra: str, epochs: float = 400) -> tuple[subprocess.Popen, str]:
    """Start a long grid in its own session, press Ctrl-C (SIGINT to the process group, as a
    terminal does) once ``running`` points train, and wait for the launcher to end."""
    cmd = [a if not a.startswith("num_epochs=") else f"num_epochs={epochs:g}"
           for a in grid_cmd(root, launcher, *extra)]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "MPLBACKEND": "Agg"})
    try:
        _wait_running(root, running)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc, out


def _statuses(root: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["status"] for p in (root / "results" / "fig3").glob("*/summary.json"))


def test_ctrl_c_stops_every_joblib_job_cleanly_and_leaves_no_process(tmp_path):
    proc, out = _ctrl_c(tmp_path, "parallel", 2, "hydra.launcher.n_jobs=2")
    assert proc.returncode == 130, out[-3000:]
    assert_no_leftovers(proc, within_s=10.0)
    assert _statuses(tmp_path) == ["interrupted", "interrupted"], out[-3000:]   # both stopped cleanly
    assert "[grid fig3] SIGINT: no new grid point starts" in out and "stopped by SIGINT" in out
    assert "2 interrupted" in out and "2 not started" in out
    assert f"resume=auto continues the interrupted points" in out
    assert f"(their folders are under {tmp_path / 'results' / 'fig3'})" in out   # which folders to resume
    assert "Traceback" not in out and "fig3: wrote" not in out


@pytest.mark.slow
def test_ctrl_c_then_resume_auto_finishes_the_grid(tmp_path):
    proc, out = _ctrl_c(tmp_path, "parallel", 2, "hydra.launcher.n_jobs=2", epochs=20)
    assert proc.returncode == 130, out[-3000:]
    assert_no_leftovers(proc, within_s=10.0)
    assert _statuses(tmp_path) == ["interrupted", "interrupted"]
    cmd = [a if not a.startswith("num_epochs=") else "num_epochs=20"
           for a in grid_cmd(tmp_path, "parallel", "hydra.launcher.n_jobs=2", "resume=auto")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"finished: {POINTS}/{POINTS} done" in done.stderr
    assert _statuses(tmp_path) == ["completed"] * POINTS
    assert _drawn(done.stdout) == 1


@pytest.mark.slow
def test_ctrl_c_stops_a_sequential_grid_instead_of_starting_the_next_point(tmp_path):
    proc, out = _ctrl_c(tmp_path, "basic", 1)
    assert proc.returncode == 130, out[-3000:]
    assert_no_leftovers(proc, within_s=10.0)
    assert _statuses(tmp_path) == ["interrupted"]
    assert "stopped:" in out and "resume=auto" in out and str(tmp_path / "results" / "fig3") in out


@pytest.mark.slow
def test_ctrl_c_under_submitit_local_leaves_no_process_and_no_running_point(tmp_path):
    proc, out = _ctrl_c(tmp_path, "submitit_local", POINTS)
    assert proc.returncode == 130, out[-3000:]
    assert_no_leftovers(proc, within_s=10.0)
    # each job's controller forwards the Ctrl-C to its task once more: a forced stop, still recorded
    assert _statuses(tmp_path) == ["interrupted"] * POINTS


# ---------------------------------------------------------------------------------------------
# The benchmark's command line (running it takes minutes: docs/benchmarks.md)
# ---------------------------------------------------------------------------------------------

def test_bench_grid_options_and_dispatch(monkeypatch):
    args = bench.parse_args(["grid", "--exp", "fig2", "--epochs", "0", "--jobs", "2"])
    assert (args.which, args.exp, args.epochs, args.jobs, args.keep) == ("grid", "fig2", 0.0, 2, None)
    defaults = bench.parse_args(["grid"])
    assert (defaults.exp, defaults.epochs, defaults.jobs) == ("fig4", 0.0, None)
    for bad in (["grid", "--jobs", "0"], ["grid", "--epochs", "-1"], ["grid", "--repeats", "0"], ["grid", "--blocks", "2"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    seen = []
    monkeypatch.setattr(bench_grid, "run", lambda a: seen.append(a.exp) or 0)
    assert bench.main(["grid", "--exp", "fig1"]) == 0 and seen == ["fig1"]


def test_bench_grid_commands_differ_only_in_the_launcher(tmp_path):
    basic = bench_grid.command("fig3", tmp_path / "a", "basic", 5.0, 2, tmp_path / "_data")
    parallel = bench_grid.command("fig3", tmp_path / "b", "parallel", 5.0, 2, tmp_path / "_data")
    assert "hydra/launcher=basic" in basic and "hydra/launcher=parallel" in parallel
    assert "hydra.launcher.n_jobs=2" in parallel and "num_epochs=5" in basic
    assert not any(a.startswith("num_threads") for a in basic + parallel)   # same folder names


def test_bench_grid_of_an_experiment_without_a_figure_compares_its_tables_only(monkeypatch, capsys):
    """smoke draws no figure: no figure CSV in either launch is no difference (it was reported as
    "figure CSVs: [] vs []", the benchmark failing on identical launches)."""
    def launch(cmd, log_path):   # the launch's tables, the same in both; no figures folder
        root = log_path.parent
        run = root / "results" / "smoke" / "point"
        run.mkdir(parents=True)
        for name in ("summary.json", "updates.csv", "evals.csv"):
            (run / name).write_text("step,loss\n1,0.5\n")
        return 2.0 if "hydra/launcher=basic" in cmd else 1.0

    monkeypatch.setattr(bench_grid, "timed", launch)
    assert bench.main(["grid", "--exp", "smoke"]) == 0
    out = capsys.readouterr().out
    assert "identical tables: 1/1 grid points" in out and "DIFFERS" not in out and "differs:" not in out
    assert "figure CSV none (the experiment draws no figure): tables only  PASS" in out


# ---------------------------------------------------------------------------------------------
# Every experiment grid: parallel by default, with progress and a clean Ctrl-C
# ---------------------------------------------------------------------------------------------

GRIDS = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml") if "MULTIRUN" in p.read_text()
               and "override /backend: real" not in p.read_text())
# grids of real runs run one point after another: each real run needs the machine's cores
REAL_GRIDS = sorted(p.stem for p in (ROOT / "conf" / "exp").glob("*.yaml") if "MULTIRUN" in p.read_text()
                    and "override /backend: real" in p.read_text())


def test_every_grid_experiment_is_found():
    assert {"fig1", "fig2", "fig3", "fig4", "staleness", "fig3_paper", "fig4_paper", "stability",
            "momentum", "sync_vs_async", "mitigation"} <= set(GRIDS)


@pytest.mark.parametrize("exp", REAL_GRIDS)
def test_a_grid_of_real_runs_runs_one_point_at_a_time_with_progress_and_its_pipeline(exp):
    from tests.helpers.configs import composed

    full = composed([f"+exp={exp}"], hydra=True)
    assert full.backend.name == "real" and str(full.hydra.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
    assert full.hydra.launcher._target_.endswith("BasicLauncher")
    callbacks = full.hydra.callbacks
    assert list(callbacks)[-1] == "grid" and callbacks.grid._target_ == "repro.grid.Grid"
    assert callbacks[list(callbacks)[0]]._target_ == "repro_bench.instruments.simreal.SimVsReal"


@pytest.mark.parametrize("exp", GRIDS)
def test_every_grid_experiment_runs_in_parallel_with_progress_and_a_figure(exp):
    from tests.helpers.configs import composed

    full = composed([f"+exp={exp}"], hydra=True)
    assert str(full.hydra.mode) in ("MULTIRUN", "RunMode.MULTIRUN")
    assert full.hydra.launcher._target_.endswith("JoblibLauncher") and full.hydra.launcher.n_jobs == -1
    callbacks = full.hydra.callbacks
    assert callbacks.grid._target_ == "repro.grid.Grid"
    assert callbacks.figure._target_ == "repro.grid.BuildFigure"
    # Hydra ends them in reverse: progress, then the figure(s) (fig4_paper_shared draws two)
    assert list(callbacks)[0] == "figure" and list(callbacks)[-1] == "grid"
    assert all(callbacks[c]._target_ == "repro.grid.BuildFigure" for c in list(callbacks)[:-1])
    assert full.num_threads == 1                    # one torch thread per job


# ---------------------------------------------------------------------------------------------
# A grid from any folder (issue 32, item 11)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("launcher", ["parallel", "slurm"])
def test_the_grid_launchers_are_hydras_own_found_without_the_checkout(launcher):
    """Hydra takes a launcher only from the ``hydra_plugins`` packages it scans; a launcher kept in
    the checkout is found only when Python starts there (issue 32, item 11)."""
    import importlib

    from repro.run import compose

    target = str(compose(["+exp=fig1", f"hydra/launcher={launcher}"], return_hydra_config=True).hydra.launcher._target_)
    module = importlib.import_module(target.rpartition(".")[0])
    # an installed plugin (site-packages: also where a virtual environment inside the checkout,
    # as the README's .venv and CI's .ci/.venv, keeps it), never a folder of the checkout's own
    path = Path(module.__file__).resolve()
    assert target.startswith("hydra_plugins.") and "site-packages" in path.parts
    assert not any(p == ROOT / "hydra_plugins" for p in path.parents)


@pytest.mark.slow
def test_a_grid_runs_from_any_folder_with_the_package_installed_as_an_editable_install_does(tmp_path):
    """An editable install makes ``repro`` importable and nothing else of the checkout: Hydra,
    which finds launchers by scanning the ``hydra_plugins`` namespace, did not see the grid
    launcher that lived there, and ``+exp=fig1`` from any folder but the checkout died with
    ``RuntimeError: Unknown plugin class``. The grid now uses Hydra's own joblib launcher."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    site.mkdir(), elsewhere.mkdir()
    (site / "repro").symlink_to(ROOT / "repro")   # repro alone, as setuptools' editable finder maps it
    cmd = [sys.executable, "-m", "repro.run", "+exp=fig1", f"results_dir={tmp_path / 'results'}",
           f"figures_dir={tmp_path / 'figures'}", "num_epochs=0.25", "eval_every=0.25", "progress=false",
           "hydra.sweeper.params.seed='0'"]
    done = subprocess.run(cmd, cwd=elsewhere, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(site), "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Unknown plugin class" not in done.stderr and "Traceback" not in done.stderr
    assert len(list((tmp_path / "results" / "fig1").glob("*/summary.json"))) == 1
    assert "[grid fig1] finished: 1/1 done" in done.stderr and (tmp_path / "figures" / "fig1.png").exists()


def test_a_quoted_results_dir_or_exp_name_names_the_folders_the_points_run_in():
    """results_dir='/r' exp_name='x' (quoted, as python -m repro.bench simreal runs the experiment, and
    as a path with a comma must be) put every point's folder under ./'/r'/'x'/: the progress line
    counted them all waiting (0/18 done with 6 finished), and a Ctrl-C waited for none running."""
    from repro.gridpoint import point_folders
    from repro.run import compose

    plain, quoted = (compose(["+exp=sim_vs_real", *places], return_hydra_config=True)
                     for places in (["results_dir=/r", "exp_name=x"], ["results_dir='/r'", "exp_name='x'"]))
    assert point_folders(quoted) == point_folders(plain)
    assert point_folders(plain)[0] == "nsync=1,num_clients=1,seed=0"


def test_hydra_sweep_dir_with_results_dir_names_the_folders_the_points_run_in():
    """``results_dir=R hydra.sweep.dir=S``: each point runs in S/NAME (the launcher's folder), but the
    grid looked for it in R/EXP/NAME: the progress line said 'finished: 0/2 done, 2 not started'
    for two completed points, and a Ctrl-C waited for none of those running."""
    from hydra import initialize_config_dir

    from repro.config.loader import CONF_DIR
    from repro.gridpoint import point_folders
    from repro.run import compose

    config = compose(["+exp=fig1", "results_dir=/r", "hydra.sweep.dir=/s"], return_hydra_config=True)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):   # the launch's Hydra
        folders = point_folders(config)
    assert folders == point_folders(compose(["+exp=fig1"], return_hydra_config=True)) and folders[0] == "seed=0"


@pytest.mark.parametrize("exp", GRIDS + REAL_GRIDS)
def test_the_job_list_is_the_one_hydras_basic_sweeper_launches(exp):
    """The progress line, the figure and sim-vs-real read the job list before the grid runs
    (:func:`repro.hydra_internals.sweep_jobs`, the one place that parses Hydra's overrides): it must be
    Hydra's own, job for job and in order, with the command line's sweeps and overrides too."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from repro.hydra_internals import sweep_jobs
    from repro.run import compose

    config = compose([f"+exp={exp}", "nsync=2", "num_epochs=3"], return_hydra_config=True)
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    hydras = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(arguments), None)
    assert sweep_jobs(config) == [job for batch in hydras for job in batch]
