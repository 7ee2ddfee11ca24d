"""The command line under attack (waves 7 and 8): a Ctrl-C while its imports load, a grid with one
bad point, a sweep without --multirun, a number's spelling, --run of a grid. Each ends with one
line and the exit code the guide gives."""
from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.helpers.grids import cli_in_process, cli_run
from tests.helpers.paths import ROOT
from tests.helpers.runs import cli, stop_process, wait_rows


@pytest.fixture
def cli_here(monkeypatch, capsys):
    """``python -m repro.run ARGS`` in the test's process, answered as :func:`cli` answers
    (tests/helpers/grids.cli_run): what a refusal says and leaves is what most tests here check,
    not a fresh interpreter's start-up (about a second each; tests/test_startup_imports.py)."""
    return functools.partial(cli_run, monkeypatch, capsys)


CTRL_C_WHILE_IMPORTING = """
import builtins, os, runpy, signal, sys
real_import = builtins.__import__
def ctrl_c_on_hydra(name, *args, **kwargs):   # the first heavy import of repro.run
    if name == "hydra":
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)
builtins.__import__ = ctrl_c_on_hydra
sys.argv = ["repro.run", "--help"]
runpy.run_module("repro.run", run_name="__main__", alter_sys=True)
"""


def test_a_ctrl_c_while_the_command_line_imports_exits_130_without_a_traceback():
    """Ctrl-C in the first half second (Hydra, OmegaConf loading) printed importlib's traceback
    and died by the signal: no handler was installed before the imports."""
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHILE_IMPORTING], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (130, ""), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


# The Ctrl-C lands where an exception is swallowed: a library's broad except around an optional
# import, or a __del__ or weakref callback running then (Python only prints what those raise)
CTRL_C_WHERE_SWALLOWED = CTRL_C_WHILE_IMPORTING.replace("""        os.kill(os.getpid(), signal.SIGINT)
""", """        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.getsignal(signal.SIGINT)   # (the handler has run by the next call)
        except BaseException:
            pass
""")


def test_a_ctrl_c_while_the_command_line_imports_ends_it_even_where_an_import_swallows_exceptions():
    """Ctrl-C in the first quarter second sometimes did nothing (exit 0, the grid ran) or ended in
    OmegaConf's traceback: the handler raised SystemExit inside an import, where it was swallowed."""
    assert CTRL_C_WHERE_SWALLOWED != CTRL_C_WHILE_IMPORTING
    proc = subprocess.run([sys.executable, "-c", CTRL_C_WHERE_SWALLOWED], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (130, ""), (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("launcher", ["basic", "parallel"])
def test_a_grid_runs_its_good_points_past_a_bad_one_names_it_and_exits_2(tmp_path, launcher, cli_here):
    """``-m nsync=1,0,2``: under the basic launcher the bad point's exit 2 ended the grid there,
    so nsync=2 never ran; under the parallel one (without +exp's Grid) it broke the worker pool,
    which killed the nsync=1 point mid-run and left its folder 'running'. Now every good point
    runs and the bad one is named."""
    args = ["-m", f"hydra/launcher={launcher}", f"results_dir={tmp_path}", "progress=false", "num_epochs=0.2",
            "nsync=1,0,2"]
    # the basic launcher runs its points in the command's process, so in this one; the parallel
    # one's worker pool (what the bad point broke) is a process of its own
    proc = cli_here(*args) if launcher == "basic" else \
        subprocess.run([sys.executable, "-m", "repro.run", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: grid point nsync=0,num_epochs=0.2 not run: invalid value for 'nsync': 0" in proc.stderr
    assert proc.stderr.endswith("error: 1 grid point(s) not run, named above: nsync=0,num_epochs=0.2\n")
    runs = sorted(p.parent.name for p in (tmp_path / "default").glob("*/summary.json"))
    assert runs == ["nsync=1,num_epochs=0.2", "nsync=2,num_epochs=0.2"]
    assert all('"completed"' in (tmp_path / "default" / r / "summary.json").read_text() for r in runs)


def test_a_sweep_without_multirun_is_bad_input_and_a_list_or_quoted_comma_is_no_sweep(tmp_path, cli_here):
    """``nsync=1,2`` without -m ended in Hydra's five-line message with exit 1; a list value
    (``cost.speeds=[1,2]``) was taken for a sweep by a regular expression and skipped the
    single run's checks (here: a results_dir that is a file, refused with one line)."""
    sweep = cli_here(f"results_dir={tmp_path}", "nsync=1,2")
    assert (sweep.returncode, sweep.stderr) == (2, "error: 'nsync=1,2' is a sweep: add -m to run one run per "
                                                   "value (a list is KEY=[A,B], a text with a comma KEY='A,B')\n")
    (tmp_path / "file").write_text("")
    listed = cli_here(f"results_dir={tmp_path / 'file'}", "num_clients=2", "cost.speeds=[1,2]")
    assert listed.returncode == 2 and listed.stderr.startswith("error: invalid value for 'results_dir'"), \
        listed.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_hydras_flags_may_stand_between_the_overrides_and_two_modes_are_one_line(cli_here):
    """``num_epochs=0.2 --cfg job seed=3`` failed with argparse's usage text ("unrecognized
    arguments: seed=3"): Hydra's parser takes the overrides as one run of words. ``-m ...
    --cfg job`` ended in a raw ValueError traceback."""
    shown = cli_here("num_epochs=0.2", "--cfg", "job", "seed=3")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert {"seed: 3", "num_epochs: 0.2"} <= set(shown.stdout.splitlines())
    both = cli_here("-m", "nsync=1,2", "--cfg", "job")
    assert (both.returncode, both.stderr) == (2, "error: -m and --cfg: give one of --run, --multirun (-m), "
                                                 "--cfg and --info (--cfg job shows a single run's config)\n")


@pytest.mark.parametrize("argv, advice", [(["~nsync"], "write nsync=VALUE"), (["exp", "fig1"], "write +exp=fig1"),
                                          (["~exp"], "write +exp=VALUE"),
                                          (["-m", "-sc", "bash"], "--cfg and --info (")])
def test_the_advice_of_a_refusal_is_itself_accepted(argv, advice, capsys):
    """``~nsync`` was answered "write ~nsync=VALUE", which is refused in turn (~ deletes a key); two
    modes listed --shell-completion as a choice, which is refused for python -m repro.run."""
    from repro.config.loader import check_words
    with pytest.raises(SystemExit):
        check_words(argv)
    assert advice in capsys.readouterr().err


def test_an_interpolation_that_does_not_resolve_is_one_line(tmp_path, cli_here):
    """``exp_name=${oops}`` or an unset ``${oc.env:...}`` ended in OmegaConf's raw traceback, exit 1."""
    for value, why in [("${oops}", "Interpolation key 'oops' not found"),
                       ("${oc.env:REPRO_UNSET_VARIABLE}", "KeyError raised while resolving interpolation: "
                                                          "\"Environment variable 'REPRO_UNSET_VARIABLE' not found\"")]:
        proc = cli_here(f"results_dir={tmp_path}", f"exp_name={value}")
        assert (proc.returncode, proc.stderr) == (2, f"error: invalid value for 'exp_name': '{value}'; expected "
                                                     f"a ${{...}} that resolves ({why})\n"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_run_folder_that_is_a_file_is_one_line(tmp_path, cli_here):
    """``hydra.run.dir=FILE`` ended in Hydra's mkdir traceback (FileExistsError), exit 1."""
    (tmp_path / "file").write_text("mine")
    proc = cli_here(f"hydra.run.dir={tmp_path / 'file'}", "num_epochs=0.2")
    assert (proc.returncode, proc.stderr) == (2, f"error: cannot make the run folder {tmp_path / 'file'}: "
                                                 f"{tmp_path / 'file'} is a file, not a folder (set "
                                                 "results_dir=FOLDER to a writable folder)\n"), proc.stderr[-2000:]
    assert (tmp_path / "file").read_text() == "mine"


def test_a_run_folder_holding_someones_files_is_refused_untouched_as_simulate_refuses_it(tmp_path, monkeypatch,
                                                                                           capsys):
    """``hydra.run.dir=DIR`` where DIR holds the user's readme.txt ran, its files mixed in with
    theirs; simulate(run_dir=DIR) refuses such a folder. What a run killed before its config.json
    left (its lock, run.log, Hydra's record) is a run's: that folder runs."""
    mine, killed = tmp_path / "mine", tmp_path / "killed"
    mine.mkdir()
    (mine / "readme.txt").write_text("mine")
    # in the test's process (what it writes and says is tested, not its process: tests/helpers/grids)
    code = cli_in_process(monkeypatch, f"hydra.run.dir={mine}", "+exp=smoke")
    err = capsys.readouterr().err
    assert (code, err) == (2, f"error: invalid value for 'hydra.run.dir': '{mine}'; expected "
                              "a new or empty folder, or a run's (holding its config.json): "
                              "this one is a file or holds others, which a run is never mixed "
                              "with\n"), err[-2000:]
    assert [p.name for p in mine.iterdir()] == ["readme.txt"] and (mine / "readme.txt").read_text() == "mine"
    (killed / ".hydra").mkdir(parents=True)
    (killed / ".lock").touch()
    (killed / "run.log").write_text("[...] sim: building the data\n")
    code = cli_in_process(monkeypatch, f"hydra.run.dir={killed}", "+exp=smoke", "num_epochs=0.2", "progress=false")
    assert code == 0 and (killed / "summary.json").exists(), capsys.readouterr().err[-2000:]


def test_a_grid_folder_holding_someones_files_is_refused_untouched_as_a_run_folder_is(tmp_path, monkeypatch,
                                                                                      capsys):
    """``-m hydra.sweep.dir=DIR`` where DIR holds the user's notes.txt and photos/ ran, Hydra's
    multirun.yaml and every point's folder mixed in with them (over a multirun.yaml of theirs).
    A grid's own folder (its multirun.yaml, its run folders, one killed before its config.json
    among them, folders of runs' folders as sim_vs_real's predicted/LINK/POINT) is re-run as before."""
    mine, grid = tmp_path / "mine", tmp_path / "grid"
    (mine / "photos" / "2024").mkdir(parents=True)
    (mine / "photos" / "2024" / "cat.jpg").write_text("mine")
    (mine / "links").mkdir()
    (mine / "links" / "back").symlink_to(mine / "links")   # a loop, read without end if followed
    (mine / "notes.txt").write_text("mine")
    for holding in ("notes.txt", "photos", "links"):   # a file of theirs, folders of theirs
        code = cli_in_process(monkeypatch, "-m", f"hydra.sweep.dir={mine}", "nsync=1,2")
        err = capsys.readouterr().err
        assert (code, err) == (2, f"error: invalid value for 'hydra.sweep.dir': '{mine}'; expected a new or empty "
                                  "folder, or a grid's (its multirun.yaml and run folders): this one is a file or "
                                  "holds others, which a grid is never mixed with\n"), err[-2000:]
        (mine / holding).rename(tmp_path / holding)
    assert list(mine.iterdir()) == []
    args = ("-m", f"hydra.sweep.dir={grid}", "+exp=smoke", "num_epochs=0.2", "progress=false")
    assert cli_in_process(monkeypatch, *args, "nsync=1") == 0
    (grid / "nsync=2,num_epochs=0.2" / ".hydra").mkdir(parents=True)   # a point killed before its config.json
    (grid / "nsync=2,num_epochs=0.2" / "run.log").write_text("[...] sim: building the data\n")
    (grid / "predicted" / "loopback" / "nsync1").mkdir(parents=True)
    shutil.copy(grid / "nsync=1,num_epochs=0.2" / "config.json", grid / "predicted" / "loopback" / "nsync1")
    assert cli_in_process(monkeypatch, *args, "nsync=1,2") == 0, capsys.readouterr().err[-2000:]
    assert (grid / "nsync=2,num_epochs=0.2" / "summary.json").exists()


def test_resume_and_force_together_are_refused_before_the_folder_is_touched(tmp_path, cli_here):
    """``resume=true force=true`` started the folder over without a word: the interrupted run
    the user asked to continue was thrown away."""
    proc = cli_here(f"results_dir={tmp_path}", "resume=true", "force=true")
    assert (proc.returncode, proc.stderr) == (2, "error: invalid value for 'resume': True; expected false with "
                                                 "force=true (force=true starts the folder over, resume=true "
                                                 "continues its run: keep one)\n"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_an_override_hydras_grammar_cannot_read_says_to_quote_it(tmp_path, cli_here):
    """``exp_name=é`` (unquoted unicode) said only 'LexerNoViableAltException: exp_name=é'."""
    proc = cli_here(f"results_dir={tmp_path}", "exp_name=é")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: LexerNoViableAltException: exp_name=é (quote a value with other "
                                  "characters: KEY='VALUE'; See https://hydra.cc/docs/"), proc.stderr
    assert cli_here(f"results_dir={tmp_path}", "exp_name='é'", "--cfg", "job").returncode == 0


@pytest.mark.parametrize("words,shown", [(["--cfg", "job", "-p", "algo"], "# @package algo\nlr: 0.05\n"),
                                         (["--cfg", "all", "--package=hydra.run"], "# @package hydra.run\ndir: "),
                                         (["-c", "job", "-p", "_global_", "seed=3"], "exp_name: default\nseed: 3\n"),
                                         (["--cfg", "hydra", "-p", "hydra.overrides.task.0", "seed=3"], "seed=3\n"),
                                         (["--cfg", "all", "-p", "hydra.run.dir"], "results/default/"),
                                         (["--cfg", "hydra", "-p", "hydra.sweep.subdir"], "base\n"),   # (a resolver's)
                                         (["--cfg", "hydra", "-p", "hydra.job_logging.handlers.file"],
                                          "# @package hydra.job_logging.handlers.file\n"),
                                         (["--cfg", "all", "-p", "hydra.output_subdir"], ".hydra\n")])   # ${hydra:...}
def test_a_package_of_the_config_shown_is_shown(cli_here, words, shown):
    proc = cli_here(*words)
    assert proc.returncode == 0 and proc.stdout.startswith(shown), proc.stdout[:200] + proc.stderr[-2000:]


@pytest.mark.parametrize("verbose", ["true", "repro"])
def test_hydra_verbose_turns_on_debug_logging_for_a_single_run(tmp_path, cli_here, verbose):
    """``hydra.verbose=true`` (or ``=repro``) on a single run printed nothing more than without it:
    the command line composes the config itself, so Hydra's main never logged its loading, and the
    package's logger kept the INFO its fallback pins (Hydra's true sets the root's level only)."""
    quiet = cli_here(f"results_dir={tmp_path / 'quiet'}", "num_epochs=0.2", "progress=false")
    assert quiet.returncode == 0 and "sim run in" not in quiet.stderr, quiet.stderr[-2000:]
    assert "Installed Hydra Plugins" not in quiet.stdout
    proc = cli_here(f"results_dir={tmp_path / 'told'}", "num_epochs=0.2", "progress=false", f"hydra.verbose={verbose}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"sim run in {tmp_path / 'told'}" in proc.stderr   # the package's DEBUG line, in run.log too
    assert "sim run in" in next((tmp_path / "told").rglob("run.log")).read_text()
    # Hydra's own DEBUG, on stdout as its hydra_logging has it (version, plugins, search path, defaults
    # tree, config): true's, not repro's
    assert ("Installed Hydra Plugins" in proc.stdout) == (verbose == "true"), proc.stdout[-2000:]
    assert ("Defaults Tree" in proc.stdout) == (verbose == "true")


def test_a_grid_or_run_folder_whose_name_does_not_resolve_is_one_line(tmp_path, cli_here):
    """``-m exp_name=${oops} nsync=1,2`` (the grid's folder is results_dir/exp_name) and
    ``hydra.run.dir=${oops}`` ended in OmegaConf's raw traceback, exit 1."""
    grid = cli_here("-m", f"results_dir={tmp_path}", "exp_name=${oops}", "nsync=1,2")
    assert (grid.returncode, grid.stderr) == (2, "error: cannot name the grid folder (hydra.sweep.dir): "
                                                 "Interpolation key 'oops' not found\n"), grid.stderr[-2000:]
    single = cli_here("hydra.run.dir=${oops}")
    assert (single.returncode, single.stderr) == (2, "error: cannot name the run folder (hydra.run.dir): "
                                                     "Interpolation key 'oops' not found\n"), single.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_an_experiments_bad_point_under_its_parallel_launcher_still_draws_its_figure(tmp_path):
    """``+exp=fig1 nsync=1,0``: the worker's exit 2 reached Hydra as a failed job, which printed
    "Error executing job with overrides: None" and never called the figure's callback. Now the
    figure is drawn from the good point, as under hydra/launcher=basic, and the bad one is named."""
    proc = cli("+exp=fig1", "nsync=1,0", "num_epochs=0.2", "hydra.sweeper.params.seed=0", "progress=false",
               f"results_dir={tmp_path / 'r'}", f"figures_dir={tmp_path / 'f'}", timeout_s=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Error executing job" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.endswith("error: 1 grid point(s) not run, named above: nsync=0,num_epochs=0.2,seed=0\n")
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["fig1.csv", "fig1.pdf", "fig1.png"]


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_number_names_its_run_folder_by_its_value_not_its_spelling(tmp_path):
    """``seed=-0 algo.lr=0.10`` ran in a folder of its own beside ``seed=0 algo.lr=0.1`` (a grid
    point's, whose numbers Hydra writes by value), so resume=auto ran the finished run again.
    A normal spelling keeps its name: ``2.0``, a list or an interpolation as given."""
    from repro.config.loader import job_name

    assert job_name(["seed=-0", "nsync=+4", "algo.lr=0.10", "algo.momentum=.5", "num_epochs=2.00"]) == \
        "algo.lr=0.1,algo.momentum=0.5,nsync=4,num_epochs=2.0,seed=0"
    kept = ["cost.speeds=[1, 2]", "nsync=${num_clients}", "num_epochs=2.0", "seed=1,2"]   # 1e-3: below
    assert [job_name([k]) for k in kept] == kept
    first = cli(f"results_dir={tmp_path}", "num_epochs=0.2", "progress=false", "seed=-0", "algo.lr=0.10")
    again = cli(f"results_dir={tmp_path}", "num_epochs=0.2", "progress=false", "seed=0", "algo.lr=0.1",
                "resume=auto")
    assert (first.returncode, again.returncode) == (0, 0), first.stderr[-2000:] + again.stderr[-2000:]
    assert "already completed" in again.stderr, again.stderr[-2000:]
    assert [p.name for p in (tmp_path / "default").iterdir()] == ["algo.lr=0.1,num_epochs=0.2,seed=0"]


def test_a_float_names_its_run_folder_in_one_spelling_so_resume_auto_finds_it(tmp_path, monkeypatch):
    """``algo.lr=1e-3`` named a folder of its own beside ``algo.lr=0.001`` (an exponent was kept
    as given): resume=auto did not find a run started with the other spelling and ran it again
    in a second folder. A float names its folder as Python writes it (as Hydra's sweeper writes a
    grid point's): ``0.001`` keeps its name, ``1e-3`` is ``0.001``, ``1e-5`` is ``1e-05``."""
    from repro.config.loader import job_name
    from repro.sim.driver import simulate
    from tests.helpers.grids import cli_in_process
    from tests.helpers.runs import CLI_ARGS, STOP_AT, cli_cfg
    from tests.helpers.tables import summary_of

    spellings = ("1e-3", "1E-3", "1.0e-3", "0.001", "0.0010", "+1e-3")
    assert {job_name([f"algo.lr={v}"]) for v in spellings} == {"algo.lr=0.001"}
    assert job_name(["algo.lr=1e-5"]) == job_name(["algo.lr=0.00001"]) == "algo.lr=1e-05"
    folder = tmp_path / "default" / job_name([*CLI_ARGS, "algo.lr=0.001"])
    assert simulate(cli_cfg("algo.lr=0.001"), folder, stop_at_version=STOP_AT)["status"] == "interrupted"
    assert cli_in_process(monkeypatch, f"results_dir={tmp_path}", *CLI_ARGS, "algo.lr=1e-3", "resume=auto") == 0
    assert [p.name for p in (tmp_path / "default").iterdir()] == [folder.name]
    summary = summary_of(folder)
    assert summary["status"] == "completed" and any(e["type"] == "resumed" for e in summary["events"])


def test_run_of_an_experiment_grid_is_refused_with_how_to_run_one_point(tmp_path, cli_here):
    """``--run +exp=fig1`` ran the experiment's whole grid (its file sets hydra.mode=MULTIRUN)."""
    proc = cli_here("--run", "+exp=fig1", f"results_dir={tmp_path}")
    assert (proc.returncode, proc.stderr) == (2, "error: --run: +exp=fig1 is a grid: leave out --run to run the "
                                                 "whole grid, or run one point with hydra.mode=RUN and one value "
                                                 "of seed\n"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


ONE_LINE_REFUSALS = [   # (the command line's words, the start of its one line): each printed a traceback,
    # a misleading line or nothing, and went on (the points of +exp=fig1,fig2 ran each experiment's
    # base config once, no grid, no figure; an empty folder wrote the run into the working folder;
    # two points of one folder ran one run twice)
    (["hydra.run.dir="], "error: hydra.run.dir is empty: the run would write into "),
    (["-m", "hydra.sweep.dir=", "nsync=1,2"], "error: hydra.sweep.dir is empty: the grid would write into "),
    (["-m", "hydra.sweep.subdir=", "nsync=1,2"], "error: hydra.sweep.subdir is empty: the grid would write into "),
    (["-m", "+exp=fig1,fig2"], "error: '+exp=fig1,fig2' sweeps experiments, and each is a grid of its own: "
                               "run one experiment per command (+exp=fig1, then +exp=fig2)"),
    (["-m", "seed=0,-0"], "error: grid points share a run folder (num_epochs=0.2,seed=0): sweep values that "
                          "differ"),   # raced for its lock under the parallel launcher: one refused
    # the first point ran, the second was refused (its folder held the first's run), and the
    # progress said 'finished: 0/2 done, 2 not started': the folders were judged by job name
    (["-m", "hydra.sweep.subdir=same", "nsync=1,2"], "error: grid points share a run folder (same): "),
    # hydra.sweep.dir holds every point, whatever its results_dir: both ran in X/num_epochs=0.2
    (["-m", "results_dir=a,b", "hydra.sweep.dir=x"], "error: grid points share a run folder (num_epochs=0.2): "),
    # OmegaConf's 'Unexpected type for root: NoneType' (a grid: its traceback, exit 1): no experiment, no params
    (["-m", "hydra.sweeper.params.seed=0", "nsync=1,2"], "error: 'hydra.sweeper.params.seed' is set under a node "
                                                        "that is null here, as hydra.sweeper.params is without"),
    (["hydra.sweeper.params.seed=0"], "error: 'hydra.sweeper.params.seed' is set under a node that is null here"),
    (["-m", "hydra.sweep.subdir=${oops}", "nsync=1,2"], "error: cannot name a grid point's folder "
                                                        "(hydra.sweep.subdir): Interpolation key 'oops' not found\n"),
    (["-m", "hydra/launcher=nope", "nsync=1,2"], "error: In 'hydra/config': Could not find 'hydra/launcher/nope' "
                                                 "(one of: basic, joblib, parallel, slurm, submitit_local"),
    (["+exp=fig1", "figures_dir="], "error: invalid value for 'figures_dir': ''; expected a folder, not empty ('.' "
                                    "is the working folder) and not starting with '~' (write $HOME/...)"),
    (["results_dir='~/runs'"], "error: invalid value for 'results_dir': '~/runs'; expected a folder, not empty"),
    (["-m", "hydra.launcher.n_jobs=2", "nsync=1,2"], "error: Could not override 'hydra.launcher.n_jobs'. Key "
                                                     "'n_jobs' not in 'BasicLauncherConf'"),
    (["--cfg"], "error: argument --cfg/-c: expected one argument (python -m repro.run --hydra-help lists Hydra's "
                "flags)"),   # argparse's nine lines of usage, under the name run.py
    (["--info", "bogus"], "error: argument --info/-i: invalid choice: 'bogus' (choose from 'all', 'config'"),
    # Hydra resolves its node alone, whose folders name results_dir and exp_name: its 75-line traceback, exit 1
    (["-c", "hydra", "--resolve"], "error: --cfg hydra --resolve: Hydra's node names its folders from keys outside "
                                   "it (results_dir, exp_name); --cfg all --resolve --package hydra shows it resolved"),
    # Hydra's 'package ... not found in config', exit 1: a node that is not there, or not in what --cfg shows
    (["--cfg", "job", "-p", "nope"], "error: -p/--package nope: not a node of the config --cfg job shows"),
    (["--cfg", "hydra", "--package", "algo"], "error: -p/--package algo: not a node of the config --cfg hydra"),
    (["--cfg", "job", "--package=hydra.run"], "error: -p/--package hydra.run: not a node of the config --cfg job"),
    (["--cfg", "job", "-p", "protocol.collection_size"], "error: -p/--package protocol.collection_size: null in "),
    # Hydra's own node as it shows it: without its help texts, and a job's ??? is shown as no value ('not found')
    (["--cfg", "hydra", "-p", "hydra.help.app_name"], "error: -p/--package hydra.help.app_name: not a node of the "
                                                      "config --cfg hydra shows"),
    (["--cfg", "hydra", "-p", "hydra.runtime.output_dir"], "error: -p/--package hydra.runtime.output_dir: set by "
                                                           "Hydra only as a run starts: no value to show before"),
    # Hydra resolves a value shown alone: hydra.run.dir names results_dir, outside --cfg hydra: its traceback, exit 1
    (["--cfg", "hydra", "-p", "hydra.run.dir"], "error: -p/--package hydra.run.dir: its value names exp_name, "
                                                "results_dir, outside the config --cfg hydra shows; --cfg all -p "
                                                "hydra.run.dir shows it"),
    # Hydra resolves a value shown alone: the log file's names hydra.runtime.output_dir (???): its traceback, exit 1
    (["--cfg", "hydra", "-p", "hydra.job_logging.handlers.file.filename"], "error: -p/--package hydra.job_logging."
     "handlers.file.filename: its value ${hydra.runtime.output_dir}/${hydra.job.name}.log cannot be resolved before "
     "a run (MissingMandatoryValue while resolving interpolation: Missing mandatory value: hydra.runtime.output_dir);"
     " --cfg hydra -p hydra.job_logging.handlers.file shows it unresolved"),
    (["--cfg", "all", "-p", "hydra.job_logging.handlers.file.filename"], "error: -p/--package hydra.job_logging."
     "handlers.file.filename: its value ${hydra.runtime.output_dir}/${hydra.job.name}.log cannot be resolved "),
    (["--shell-completion"], "error: --shell-completion: Hydra's completion completes 'python FILE.py'"),
    (["-sc", "install=bash"], "error: -sc: Hydra's completion completes 'python FILE.py'"),
    (["-cn", "exp/fig1"], "error: -cn: the command's config is conf/config.yaml, whose experiments"),
    (["--experimental-rerun", "missing.pickle"], "error: --experimental-rerun: no file missing.pickle"),
]


@pytest.mark.parametrize("words,line", ONE_LINE_REFUSALS, ids=[" ".join(w) for w, _ in ONE_LINE_REFUSALS])
def test_what_cannot_work_here_is_one_line_and_writes_nothing(tmp_path, monkeypatch, cli_here, words, line):
    monkeypatch.chdir(tmp_path)
    proc = cli_here("num_epochs=0.2", "progress=false", *words)
    assert proc.returncode == 2 and proc.stderr.startswith(line), proc.stderr[-2000:]
    assert len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sweep,line", [
    ("nsync=range(1,5,0)", "error: the grid's sweeps cannot be expanded: range() arg 3 must not be zero\n"),
    ("algo.lr=interval(0.1,0.2)", "error: the grid's sweeps cannot be expanded: BasicSweeper does not support "
                                  "sweep type : INTERVAL_SWEEP\n"),
    ("nsync=choice()", "error: Error parsing override 'nsync=choice()'; ValueError while evaluating 'choice()': "
                       "empty choice is not legal (quote"),
    ("seed=range(0,0)", "error: the grid has no point: a sweep gives it no value (seed=range(0,0))\n"),
    ("nsync=glob(*)", "error: the grid has no point: a sweep gives it no value (nsync=glob(*))\n")],
    ids=["range-step-0", "interval", "choice-of-nothing", "range-of-nothing", "glob-of-a-number"])
def test_a_sweep_hydras_sweeper_cannot_expand_or_that_gives_no_point_is_one_line(tmp_path, monkeypatch, capsys,
                                                                                sweep, line):
    """``-m nsync=range(1,5,0)`` or ``interval(...)`` ended in the basic sweeper's traceback (exit
    1) and ``choice()`` in Hydra's five lines, after the grid's folder and multirun.yaml were made;
    ``range(0,0)`` or ``glob(*)`` of a number ran nothing and exited 0 ('finished: 0/0 done')."""
    code = cli_in_process(monkeypatch, "-m", f"results_dir={tmp_path}", "num_epochs=0.2", sweep)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(line) and len(err.splitlines()) == 1, err[-2000:]
    assert list(tmp_path.iterdir()) == []


def test_a_group_sweep_in_hydras_other_spellings_is_read_as_hydra_reads_it(tmp_path, monkeypatch, capsys):
    """``-m 'algo=sgd, adagrad'`` (a space after the comma, as a number's sweep takes it) and
    ``algo=choice(sgd,adagrad)``, which Hydra sweeps as sgd and adagrad, were refused naming
    ' adagrad' and 'choice(sgd' as options that do not exist; a glob was refused too. An option
    that does not exist is still named, in any spelling."""
    from repro.config.loader import check_overrides

    for value in ("sgd,adagrad", "sgd, adagrad", "choice(sgd,adagrad)", "glob(sg*)", "sgd"):
        check_overrides(["-m", f"algo={value}"])
    options = "expected one of: 'adagrad', 'dcasgd', 'downpour', 'easgd', 'outer_nesterov', 'sgd', 'staleness_scaled'\n"
    for value, bad in (("sgd, nope", "nope"), ("choice(sgd,nope)", "nope"), ("range(1,2)", "1"), ("nope", "nope")):
        with pytest.raises(SystemExit):
            check_overrides(["-m", f"algo={value}"])
        assert capsys.readouterr().err == f"error: invalid value for 'algo': '{bad}'; {options}"
    code = cli_in_process(monkeypatch, "-m", f"results_dir={tmp_path}", "num_epochs=0.2", "progress=false",
                          "algo=choice(sgd, adagrad)")
    assert code == 0, capsys.readouterr().err[-2000:]
    assert sorted(p.parent.name for p in tmp_path.glob("default/*/summary.json")) == \
        ["algo=adagrad,num_epochs=0.2", "algo=sgd,num_epochs=0.2"]


def test_a_sweep_subdir_of_the_jobs_number_names_each_points_folder(tmp_path, monkeypatch, capsys):
    """``-m hydra.sweep.subdir=${hydra.job.num}`` (Hydra's own default) ended in OmegaConf's
    traceback: the grid's folder check resolved the subdir before any job had a number. Each
    point now runs in the folder the launcher gives it, and a second launch skips both."""
    for skipped in ("", " (2 skipped: already finished)"):
        code = cli_in_process(monkeypatch, "-m", f"results_dir={tmp_path}", "num_epochs=0.2", "progress=false",
                              "hydra.sweep.subdir=${hydra.job.num}", "nsync=1,2")
        err = capsys.readouterr().err
        assert code == 0 and f"finished: 2/2 done{skipped} " in err, err[-2000:]
        assert sorted(p.parent.name for p in tmp_path.glob("default/*/summary.json")) == ["0", "1"]


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_ctrl_c_stops_a_plain_multirun_grid_and_exits_130(tmp_path):
    """``-m nsync=1,2`` (no +exp, so none of its grid callback) under Ctrl-C: the run in flight
    stopped, then every later point started, recorded 'interrupted' at version 0 in a folder of
    its own, and the command exited 0. Now a plain grid stops as an experiment's does."""
    FIRST = "data=synthetic,model=mlp,nsync=1,num_epochs=5000"
    proc = subprocess.Popen([sys.executable, "-m", "repro.run", "-m", f"results_dir={tmp_path}", "data=synthetic",
                             "model=mlp", "num_epochs=5000", "progress=false", "nsync=1,2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_rows(proc, tmp_path / "default" / FIRST, 5)
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        stop_process(proc)
    assert proc.returncode == 130, err[-2000:]
    assert "The same command with resume=auto continues the interrupted points" in err, err[-2000:]
    assert {p.name for p in (tmp_path / "default").iterdir()} == {".grid_stops", "multirun.yaml", FIRST}


def test_version_names_the_package_not_only_hydra(cli_here):
    """``--version`` printed Hydra's version alone ("Hydra 1.3.8")."""
    import hydra

    import repro

    proc = cli_here("--version")
    assert (proc.returncode, proc.stdout) == (0, f"gpu-asgd-repro {repro.__version__} (Hydra {hydra.__version__})\n")


def test_an_empty_results_dir_is_refused_before_a_run_reaches_the_file_systems_root():
    """``results_dir=`` made hydra.run.dir ``/default/base``: the run wrote at the root (as root)."""
    from repro.config.checks import check_places
    from repro.config.settings import RunConfig
    from repro.errors import ConfigError

    with pytest.raises(ConfigError, match="invalid value for 'results_dir': ''; expected a folder, not empty"):
        check_places(RunConfig(results_dir=""))


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_an_experiment_grid_moved_by_hydra_sweep_dir_still_draws_its_figure(tmp_path):
    """``+exp=fig1 hydra.sweep.dir=X``: the points ran in X, the figure looked in results_dir/fig1,
    said 'no figure drawn' and the command exited 0."""
    proc = cli("+exp=fig1", f"hydra.sweep.dir={tmp_path / 'moved'}", "num_epochs=0.2", "hydra.sweeper.params.seed='0'",
               "progress=false", f"results_dir={tmp_path / 'r'}", f"figures_dir={tmp_path / 'f'}", timeout_s=300)
    assert proc.returncode == 0 and "no figure drawn" not in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["fig1.csv", "fig1.pdf", "fig1.png"]


@pytest.mark.slow   # seconds of subprocesses: the default suite keeps its ~6 minutes
def test_a_grid_over_exp_name_is_no_shared_folder(tmp_path):
    """The check that refuses two points of one folder counts the keys that place a folder:
    ``-m exp_name=a,b`` runs one run in each experiment's folder, and its progress counts them
    there (it said 'finished: 0/1 done', looking in results_dir/default)."""
    proc = cli("-m", "exp_name=a,b", "num_epochs=0.2", "progress=false", f"results_dir={tmp_path}")
    assert proc.returncode == 0 and "[grid default] finished: 2/2 done" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.parent.parent.name for p in tmp_path.glob("*/num_epochs=0.2/summary.json")) == ["a", "b"]


@pytest.mark.parametrize("target", ["nowhere", "link"])
def test_a_run_folder_that_is_a_broken_link_or_a_loop_is_one_line(tmp_path, cli_here, target):
    """``hydra.run.dir=LINK`` to nothing (or to itself) ended in mkdir's FileExistsError traceback:
    exists() is False for it, so it was taken for a folder to make."""
    (tmp_path / "link").symlink_to(tmp_path / target)
    proc = cli_here(f"hydra.run.dir={tmp_path / 'link'}", "num_epochs=0.2")
    assert (proc.returncode, proc.stderr) == (2, f"error: cannot make the run folder {tmp_path / 'link'}: "
                                                 f"{tmp_path / 'link'} is a broken link, not a folder (set "
                                                 "results_dir=FOLDER to a writable folder)\n"), proc.stderr[-2000:]
