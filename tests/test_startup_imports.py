"""The command line answers before the heavy imports: ``--help``, an unknown key and a bad value
are answered without importing torch, pandas or matplotlib (each costs seconds on a busy
machine); those load where a run uses them."""
import subprocess
import sys

import pytest

from tests.helpers.grids import cli_in_process
from tests.helpers.paths import ROOT

HEAVY = ("torch", "pandas", "matplotlib")
# the entry point named first, run as python -m MODULE runs it, reporting at exit what it had imported
PROBE = ("import atexit, runpy, sys; "
         "atexit.register(lambda: print('IMPORTED', sorted(m for m in %r if m in sys.modules), file=sys.stderr)); "
         "module = sys.argv.pop(1); runpy.run_module(module, run_name='__main__', alter_sys=True)"
         % (HEAVY,))


@pytest.mark.parametrize("args,code,needle", [
    (["--help"], 0, "usage: python -m repro.run"),
    (["+exp=fig3", "--help"], 0, "usage: python -m repro.run"),
    (["num_clientz=3"], 2, "error: unknown key 'num_clientz' (in 'num_clientz=3'); closest valid keys: num_clients"),
    (["num_clients=0"], 2, "error: invalid value for 'num_clients': 0; expected an integer in 1..1024"),
    (["algo.server_rule=adagrd"], 2, "error: invalid value for 'algo.server_rule': 'adagrd'; expected one of: "
                                     "'adagrad', 'dcasgd', 'delta'"),
    # a run folder that cannot be made or named: it was refused after the model was built (torch)
    (["hydra.run.dir="], 2, "error: hydra.run.dir is empty: the run would write into "),
    (["hydra.run.dir=${oops}"], 2, "error: cannot name the run folder (hydra.run.dir): Interpolation key 'oops'"),
    # Hydra's flags that only show run nothing: they loaded torch (check_components) and were refused
    # where the run folder could not be made (a read-only working folder; here /proc)
    (["--cfg", "job"], 0, "num_clients: 4"),
    (["+exp=fig1", "hydra.run.dir=/proc/repro", "-c", "job"], 0, "exp_name: fig1"),
    (["--info", "config"], 0, "Config search path"),
    (["--cfg", "job", "num_clients=0"], 2, "error: invalid value for 'num_clients': 0"),   # still checked
    # Hydra composes its own help without our config: any key of ours (results_dir here) was its traceback
    (["hydra.run.dir=/proc/repro", "+exp=fig1", "nsync=2", "--hydra-help"], 0, "== Flags =="),
    (["-m", "nsync=1,2", "--hydra-help"], 0, "== Flags =="),
    # no job, no job's folder: the Hydra record's resolver raised TypeError on None, a traceback
    (["--cfg", "all", "--resolve"], 0, "  output_subdir: .hydra\n"),
])
def test_the_command_line_answers_without_torch_pandas_or_matplotlib(tmp_path, args, code, needle):
    proc = subprocess.run([sys.executable, "-c", PROBE, "repro.run", f"results_dir={tmp_path / 'results'}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stdout + proc.stderr
    assert "IMPORTED []" in proc.stderr, proc.stderr.splitlines()[-1:]
    assert not (tmp_path / "results").exists()



def test_a_finished_grid_point_is_skipped_without_torch(tmp_path, monkeypatch):
    """A finished grid's re-run answers in a blink: each point decides to skip from its folder
    (repro.runs.folder.finished) before its driver loads torch, which cost every point's process
    (the launcher's, each joblib worker) about 2 s on a busy machine only to skip it."""
    grid = ["repro.run", "-m", "+exp=smoke", "num_epochs=0.5", f"results_dir={tmp_path}"]
    # the finished grid is made in this process (its imports are not the point; the re-run's are)
    assert cli_in_process(monkeypatch, *grid[1:]) == 0
    again = subprocess.run([sys.executable, "-c", PROBE, *grid], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "1/1 done (1 skipped: already finished)" in again.stderr
    assert "completed: version" in again.stderr and "run folder:" in again.stdout
    assert "IMPORTED []" in again.stderr, again.stderr.splitlines()[-1:]

@pytest.mark.parametrize("module,args,code,needle", [
    ("repro.analysis", ["--help"], 0, "usage: python -m repro.analysis"),
    ("repro.analysis", ["compare", "--help"], 0, "usage: python -m repro.analysis compare"),
    ("repro.analysis", ["fig9"], 2, "invalid choice: 'fig9'"),
    ("repro.bench", ["--help"], 0, "usage: python -m repro.bench [-h]"),
    *[("repro.bench", [name, "--help"], 0, f"usage: python -m repro.bench {name} [-h]")
      for name in ("sim", "real", "grid", "simreal", "startup")],
    ("repro.bench", ["fast"], 2, "error: argument {sim,real,grid,simreal,startup}: invalid choice: 'fast'"),
    ("repro.bench", ["real", "--blocks", "x"], 2,
     "python -m repro.bench real: error: argument --blocks: invalid int value: 'x'"),
    ("repro.bench", ["simreal", "--cores", "0:1"], 2,
     "error: argument --cores: nsync and clients must be at least 1, got '0:1'"),
])
def test_the_analysis_and_benchmarks_commands_answer_without_torch_pandas_or_matplotlib(module, args, code, needle):
    """Their parsers are built from light declarations (the figure names in repro.registry, each
    benchmark's options): what draws or measures loads once a figure or a benchmark runs. Each
    --help imported seaborn, pandas or torch first (2-7 s on a busy machine)."""
    proc = subprocess.run([sys.executable, "-c", PROBE, module, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert needle in proc.stdout + proc.stderr
    assert "IMPORTED []" in proc.stderr, proc.stderr.splitlines()[-1:]


def test_the_registries_names_are_known_before_their_modules_load():
    """--help and a bad name list a registry's names from its declaration (repro.registry); once
    its modules are imported, from the registry itself: the two agree, and every declared name
    is registered (a module registering a name it does not declare is refused at import)."""
    import importlib

    from repro import registry

    before = {key: registry.names_of(key)() for key in registry.DECLARED}
    for key, homes in registry.DECLARED.items():
        for module in homes:
            importlib.import_module(module)
        built = registry._BUILT[key]
        assert [name for name, _ in built.items()] == [n for names in homes.values() for n in names]
        assert registry.names_of(key)() == before[key] == built.names(), key
