"""One implementation per concern (issue 15, section 4): each question the package asks in more
than one place is answered by one function, and the places that ask agree.

* lock probing: :func:`repro.files.locks.read_holder`, for the analysis and the grid alike;
* recursive to-CPU: :func:`repro.files.storage.to_cpu`, for run checkpoints and the warm start;
* table integrity: :func:`repro.files.schema.version_fault`, for a resume and for the analysis;
* the warm-start baseline: the simulator's one-client run, bitwise;
* what the lab needs to know of a run is in its folder (the analysis imports no torch);
* validation: once per run, where the config enters; the API's defaults are the config's;
* the machine's memory: :func:`repro.runtime.memory_bytes`, for build_model and the startup benchmark.

Every exactness claim here compares two computations in one process at one thread count.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from repro.config.settings import AlgoConfig, DataConfig, ModelConfig, RunConfig
from repro.files import locks, schema
from repro.files.locks import FileLock, LockHeld, lock_held, read_holder
from repro.files.storage import read_checkpoint, to_cpu

from tests.helpers.grids import cli_in_process, cli_run
from tests.helpers.paths import ROOT


# ---------------------------------------------------------------------------------------------
# Lock probing: one probe, and the writers' view agrees with it
# ---------------------------------------------------------------------------------------------

HOLD = ("import sys, time; from repro.files.locks import FileLock; "
        "FileLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)")


def _writer_would_be_refused(path: Path) -> bool:
    try:
        with FileLock(path):
            return False
    except LockHeld:
        return True


def test_one_lock_probe_agrees_with_the_writers_for_held_released_and_dead_holders(tmp_path):
    from repro import grid

    released, dead, live, never = (tmp_path / n for n in ("released", "dead", "live", "never"))
    for d in (released, dead, live, never):
        d.mkdir()
    FileLock(released / schema.LOCK_FILE).acquire().release()
    # a killed holder leaves its record behind; a record naming a live pid (ours) that holds no
    # lock is what a recycled pid looks like: neither holds the lock
    dead_proc = subprocess.Popen([sys.executable, "-c", HOLD, str(dead / schema.LOCK_FILE)],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT)
    live_proc = subprocess.Popen([sys.executable, "-c", HOLD, str(live / schema.LOCK_FILE)],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert dead_proc.stdout.readline().strip() == "held"
        assert live_proc.stdout.readline().strip() == "held"
        dead_proc.kill()
        dead_proc.wait(timeout=30)
        (released / schema.LOCK_FILE).write_text(json.dumps(locks.holder_info()))   # stale record
        assert json.loads((dead / schema.LOCK_FILE).read_text())["pid"] == dead_proc.pid
        for d in (released, dead, live, never):
            path = d / schema.LOCK_FILE
            holder = read_holder(path)
            assert lock_held(path) == (holder is not None) == (d is live), d.name
            assert (grid.point_state(d) == "running") == (d is live), d.name
            assert d is not live or holder["pid"] == live_proc.pid
        assert not (never / schema.LOCK_FILE).exists()   # probed, never created
        for d in (released, dead, live, never):   # what a writer finds is what the probe said
            assert _writer_would_be_refused(d / schema.LOCK_FILE) == (d is live), d.name
    finally:
        for proc in (dead_proc, live_proc):
            proc.kill()
            proc.wait(timeout=30)


def test_a_probe_in_progress_never_makes_a_writer_refused(tmp_path):
    """The probe takes a shared lock for an instant; a writer starting in that instant retries
    (locks.PROBE_GRACE_S) instead of reporting the observer as another run."""
    path = tmp_path / schema.LOCK_FILE
    FileLock(path).acquire().release()
    done = threading.Event()

    def probe():
        while not done.is_set():
            read_holder(path)

    prober = threading.Thread(target=probe)
    prober.start()
    refused = 0
    try:
        for _ in range(300):
            refused += _writer_would_be_refused(path)
    finally:
        done.set()
        prober.join()
    assert refused == 0


# ---------------------------------------------------------------------------------------------
# To the CPU, once
# ---------------------------------------------------------------------------------------------

def test_to_cpu_copies_nested_tensors_so_a_view_saves_only_itself(tmp_path):
    big = torch.arange(100_000, dtype=torch.float32)
    state = {"params": big[:10], "rule": {"sum_sq": big[10:20], "step": 3}, "name": "x"}
    moved = to_cpu(state)
    assert moved["rule"]["step"] == 3 and moved["name"] == "x"
    assert torch.equal(moved["params"], big[:10]) and torch.equal(moved["rule"]["sum_sq"], big[10:20])
    assert moved["params"].untyped_storage().nbytes() == 40   # not the whole storage
    torch.save(moved, tmp_path / "small.pt")
    torch.save(state, tmp_path / "whole.pt")
    assert (tmp_path / "small.pt").stat().st_size < (tmp_path / "whole.pt").stat().st_size / 10


# ---------------------------------------------------------------------------------------------
# The warm-start baseline is the simulator's one-client run
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["adagrad", "dcasgd"])
def test_the_warm_start_baseline_is_bitwise_the_simulators_one_client_run(tmp_path, rule):
    """The baseline's server state (parameters and the rule's state: Adagrad's sums, DC-ASGD's
    backups) equals the final checkpoint of ``simulate`` on the baseline's config."""
    from repro.workload.start import baseline_config, train_baseline
    from repro.sim.driver import simulate

    cfg = RunConfig(start="warm", warm_start_epochs=0.3, num_threads=0, progress=False,
                    results_dir=str(tmp_path / "results"), algo=AlgoConfig(server_rule=rule))
    params, rule_state = train_baseline(cfg, torch.device("cpu"))
    base = baseline_config(cfg)
    summary = simulate(base, tmp_path / "sim")
    assert summary["status"] == "completed" and summary["version"] > 10
    server = read_checkpoint(tmp_path / "sim" / schema.CHECKPOINT_FILE)["server"]
    assert server["version"] == summary["version"]
    assert torch.equal(params, server["params"])
    assert rule_state.keys() == server["rule"].keys() and rule_state

    def flat(state):
        return {k: v for k, v in state.items() if not isinstance(v, dict)} | {
            f"{k}.{kk}": vv for k, v in state.items() if isinstance(v, dict) for kk, vv in v.items()}
    ours, theirs = flat(rule_state), flat(server["rule"])
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


# ---------------------------------------------------------------------------------------------
# Table integrity: a resume and the analysis refuse the same tables with the same words
# ---------------------------------------------------------------------------------------------

def _finished_run(run: Path, versions: int = 6) -> Path:
    """A completed run's folder as the run log writes it, every other version evaluated."""
    run.mkdir(parents=True)
    (run / schema.CONFIG_FILE).write_text(json.dumps({"num_clients": 2, "nsync": 4, "seed": 0}))
    summary = {"status": "completed", "backend": "sim", "clock": "virtual", "version": versions}
    (run / schema.SUMMARY_FILE).write_text(json.dumps(summary))
    updates = [dict(version=v, time_s=0.1 * v, clock="virtual", client=1 + v % 2, read_version=v - 1,
                    staleness=0, num_steps=4, num_samples=128, samples_seen=128 * v, epoch=0.1 * v,
                    train_loss=1.0, train_error=0.5) for v in range(1, versions + 1)]
    evals = [dict(version=v, time_s=0.1 * v, clock="virtual", epoch=0.1 * v, samples_seen=128 * v,
                  test_loss=1.0, test_error=0.5, train_loss=1.0, train_error=0.5)
             for v in range(0, versions + 1, 2)]
    for name, columns, rows in ((schema.UPDATES_FILE, schema.UPDATE_COLUMNS, updates),
                                (schema.EVALS_FILE, schema.EVAL_COLUMNS, evals)):
        (run / name).write_text("".join(",".join(str(r[c]) for c in columns) + "\n"
                                        for r in [dict(zip(columns, columns)), *rows]))
    return run


def _rows(path: Path, edit) -> None:
    header, *rows = path.read_text().splitlines(keepends=True)
    path.write_text(header + "".join(edit(rows)))


DAMAGE = {   # (file, edit of its rows): each one a resume and the analysis both refuse
    "duplicated update": (schema.UPDATES_FILE, lambda r: r[:3] + [r[2]] + r[3:]),
    "lost update": (schema.UPDATES_FILE, lambda r: r[:3] + r[4:]),
    "swapped updates": (schema.UPDATES_FILE, lambda r: [r[1], r[0], *r[2:]]),
    "duplicated evaluation": (schema.EVALS_FILE, lambda r: r[:2] + [r[1]] + r[2:]),
    "evaluation going back": (schema.EVALS_FILE, lambda r: [r[0], r[2], r[1], *r[3:]]),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_resume_and_the_analysis_refuse_the_same_tables_in_the_same_words(tmp_path, damage):
    from repro.analysis.load import load_runs
    from repro.errors import ConfigError

    run = _finished_run(tmp_path / "exp" / "run")
    assert len(load_runs(tmp_path, "exp")) == 1   # whole, for both
    assert schema.check_table(run / schema.UPDATES_FILE, schema.UPDATE_COLUMNS, 6, True)[1] == 0
    file, edit = DAMAGE[damage]
    _rows(run / file, edit)
    version = json.loads((run / schema.SUMMARY_FILE).read_text())["version"]
    last_eval = max(int(line.split(",")[0]) for line in (run / schema.EVALS_FILE).read_text().splitlines()[1:])
    with pytest.warns(UserWarning):
        skipped = load_runs(tmp_path, "exp").skipped
    assert skipped["kind"].tolist() == ["corrupt"]
    reason = skipped["reason"].iloc[0]
    columns = schema.UPDATE_COLUMNS if file == schema.UPDATES_FILE else schema.EVAL_COLUMNS
    with pytest.raises(ConfigError) as refused:
        schema.check_table(run / file, columns, version if file == schema.UPDATES_FILE else last_eval,
                           contiguous=file == schema.UPDATES_FILE)
    assert file in reason and reason in str(refused.value), (reason, str(refused.value))


# ---------------------------------------------------------------------------------------------
# What the lab needs is recorded in the run folder; the analysis imports no torch
# ---------------------------------------------------------------------------------------------

def test_the_lab_reads_the_network_size_from_the_run_folder_and_times_transfers_as_the_simulator(tmp_path):
    from repro.analysis.lab.sync import timing_of
    from repro.analysis.load import NoRunsError, load_runs
    from repro.config.loader import composed
    from repro.workload.models import build_model, num_parameters
    from repro.sim.cost import CostModel
    from repro.sim.driver import simulate

    cfg = composed(("cost=straggler", "num_epochs=0.1", "progress=false", "exp_name=exp"))
    simulate(cfg, tmp_path / "exp" / "run")
    recorded = json.loads((tmp_path / "exp" / "run" / schema.CONFIG_FILE).read_text())["network"]
    assert recorded["num_params"] == num_parameters(build_model("digits_cnn", (1, 8, 8), 10))
    assert recorded["param_bytes"] == 4 * recorded["num_params"]
    run = load_runs(tmp_path, "exp").runs.iloc[0]
    model = CostModel(cfg.cost, cfg.seed, recorded["param_bytes"], cfg.cost.compute_s)
    assert timing_of(run).overhead_s == 2 * model.transfer_s + model.server_apply_s
    assert cfg.cost.bandwidth_Bps and model.transfer_s > cfg.cost.latency_s   # the bytes count
    with pytest.raises(NoRunsError, match="network.param_bytes.*force=true"):
        timing_of(run.drop("network.param_bytes"))   # a folder from before: refused, not guessed


def test_the_analysis_imports_no_torch():
    """Every analysis module, and what the lab derives from a run's recorded columns (transfer
    times from the network's size, the quadratic's curvatures), without torch."""
    code = """if True:
        import importlib, pkgutil, sys
        import pandas as pd
        import repro.analysis
        for m in pkgutil.walk_packages(repro.analysis.__path__, "repro.analysis."):
            importlib.import_module(m.name)
        from repro.analysis.lab.sync import timing_of
        from repro.analysis.load import recorded
        run = pd.Series({"run_dir": "r", "cost.latency_s": 1e-4, "cost.bandwidth_Bps": 1e9,
                         "cost.comm_params": float("nan"), "network.param_bytes": 4000,
                         "cost.straggler_client": float("nan"), "cost.compute_s": 0.01,
                         "cost.jitter": "none", "cost.jitter_sigma": 0.0, "nsync": 1,
                         "num_clients": 2, "cost.server_apply_s": 0.0,
                         "dataset.curvatures": "[0.01, 1.0]"})
        assert timing_of(run).overhead_s == 2 * (1e-4 + 4000 / 1e9)
        assert recorded(pd.DataFrame([run]), "dataset.curvatures") == [0.01, 1.0]
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# Validation: each check once per run, where the config enters; composition once
# ---------------------------------------------------------------------------------------------

def test_one_command_line_run_composes_and_validates_its_config_once(tmp_path, monkeypatch):
    """``python -m repro.run`` composes its config once (it was three times: the pre-check,
    the run folder's check, Hydra's main) and validates it once (the command line's parse,
    Hydra's main, the run folder and the real launcher each asked; a memo hid the repeats),
    and the run still completes."""
    from hydra._internal.hydra import Hydra

    from repro.config import checks
    from tests.helpers.runs import CLI_ARGS

    validated, composed = [], []
    validate, compose_config = checks.validate, Hydra.compose_config
    counted = lambda cfg: validated.append(cfg) or validate(cfg)  # noqa: E731
    for module in list(sys.modules.values()):   # every module that holds validate by name
        if getattr(module, "validate", None) is validate and module.__name__.startswith("repro"):
            monkeypatch.setattr(module, "validate", counted)
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *a, **k: composed.append(a) or compose_config(self, *a, **k))
    assert cli_in_process(monkeypatch, *CLI_ARGS, f"results_dir={tmp_path}") == 0
    assert len(composed) == 1 and len(validated) == 1
    summary = json.loads(next(tmp_path.glob("*/*/summary.json")).read_text())
    assert summary["status"] == "completed"


def test_config_validation_refuses_every_bad_config_each_time_it_is_asked():
    """Validation remembers nothing: an invalid config is refused every time, and a value equal
    to a valid one (True == 1) but not of its type is refused too."""
    from repro.config import checks
    from repro.config.loader import compose, parse

    cfg = parse(compose(["nsync=3", "seed=11"]))
    checks.validate(cfg)
    with pytest.raises(Exception, match="num_clients"):
        checks.validate(cfg.replace(num_clients=0))
    with pytest.raises(Exception, match="num_clients"):
        checks.validate(cfg.replace(num_clients=0))
    with pytest.raises(Exception, match="nsync"):   # equal (True == 1) but not the same config
        checks.validate(cfg.replace(nsync=True))


def test_model_and_batch_are_checked_once_per_process_before_any_data_is_loaded(tmp_path, monkeypatch):
    from repro.config.settings import CostConfig
    from repro.errors import ConfigError
    from repro.workload import build
    from repro.workload.start import build_problem

    build._check_components.cache_clear()
    calls = []
    fits = build.check_fits
    monkeypatch.setattr(build, "check_fits", lambda *a: calls.append(a) or fits(*a))
    loaded = []
    load = build.load_dataset
    monkeypatch.setattr(build, "load_dataset", lambda *a, **k: loaded.append(a) or load(*a, **k))
    cfg = RunConfig(start="warm", warm_start_epochs=0.2, progress=False, cost=CostConfig(),
                    results_dir=str(tmp_path))
    build.check_components(cfg)                 # the command line, before Hydra makes a folder
    build_problem(cfg, torch.device("cpu"))      # the baseline's problem, then the run's
    assert len(calls) == 1 and len(loaded) == 2
    too_big = cfg.replace(algo=AlgoConfig(batch_size=1438), data=DataConfig(name="digits"))
    with pytest.raises(ConfigError, match="'algo.batch_size': 1438.*1437"):
        build.check_components(too_big)
    with pytest.raises(ConfigError, match="'model.name'"):
        build.check_components(cfg.replace(model=ModelConfig(name="mnist1d_cnn")))
    assert len(loaded) == 2                      # refused from the declaration: nothing loaded


def test_a_batch_larger_than_the_training_set_exits_2_and_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)   # in the test's process (what the refusal says and leaves: cli_run)
    out = cli_run(monkeypatch, capsys, "algo.batch_size=5000", "num_epochs=0.1", f"results_dir={tmp_path / 'results'}")
    assert out.returncode == 2, out.stderr
    assert "'algo.batch_size': 5000" in out.stderr and "1437" in out.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("*"))


# ---------------------------------------------------------------------------------------------
# The API reads its defaults and cost profiles through the command line's configuration
# ---------------------------------------------------------------------------------------------

API_KEYS = {"num_clients": "num_clients", "nsync": "nsync", "num_epochs": "num_epochs",
            "eval_every": "eval_every", "lr": "algo.lr", "momentum": "algo.momentum",
            "weight_decay": "algo.weight_decay", "batch_size": "algo.batch_size",
            "server_rule": "algo.server_rule", "lr_server": "algo.lr_server",
            "dc_lambda": "algo.dc_lambda", "protocol": "protocol.name",
            "backup_workers": "protocol.backup_workers", "staleness_bound": "protocol.staleness_bound",
            "cost": "cost.profile", "seed": "seed", "target_error": "target_error",
            "divergence_factor": "divergence_factor", "device": "device", "force": "force"}


def test_the_apis_defaults_are_the_command_lines_and_its_help_states_them():
    import inspect
    import re

    from repro import api
    from repro.config.loader import compose, parse
    from repro.config.settings import get, to_dict

    cli = to_dict(parse(compose([])))
    params = inspect.signature(api.simulate).parameters
    doc = inspect.getdoc(api.simulate)
    assert set(API_KEYS) <= set(params)
    for name, key in API_KEYS.items():
        assert params[name].default == get(cli, key), name
    for name, param in params.items():
        if param.default is inspect.Parameter.empty or name == "loss_fn":
            continue
        stated = re.search(rf"^{name} : .*, default (.+)$", doc, re.MULTILINE)
        shown = f'"{param.default}"' if isinstance(param.default, str) else str(param.default)
        assert stated and stated.group(1) == shown, (name, stated and stated.group(1), shown)
    assert params["num_epochs"].default == 20.0


def test_the_apis_cost_profiles_are_the_command_lines():
    from repro import api
    from repro.config.loader import compose, group_options, parse
    from repro.errors import ConfigError

    for name in group_options("cost"):
        if name == "replay":
            with pytest.raises(ConfigError, match="'cost': 'replay'.*cost=replay cost.path"):
                api.cost_profile(name)
        elif name == "fit":   # a fit without its recordings (cost.path) is refused by both (issue 32)
            for ask in (lambda: api.cost_profile(name), lambda: parse(compose(["cost=fit"]))):
                with pytest.raises(ConfigError, match="'cost.path'.*cost=fit cost.path=RUN_DIR"):
                    ask()
        else:
            assert api.cost_profile(name) == parse(compose([f"cost={name}"])).cost, name
    with pytest.raises(ConfigError, match="'cost': 'replay'"):
        api.cost_profile({"schedule": "replay", "path": "somewhere"})


def test_the_readme_layout_names_every_module_and_folder_of_the_package():
    """The docs' map mirrors ``tree -L 2`` (issue 15): every module of repro/ (and of repro_bench/,
    beside it) is named in the Layout block of docs/architecture.md (where the README's layout
    moved, issue 33), under its own folder, and nothing it names is gone."""
    readme = (ROOT / "docs" / "architecture.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    top, folder, named = None, None, {}
    for line in block.splitlines():
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 2 and words[0].endswith("/"):
            folder = words[0].rstrip("/")
        elif indent == 0:
            top, folder = words[0].rstrip("/"), None
        for word in words:
            if word.endswith(".py") and indent >= 2:
                path = f"{folder}/{word}" if folder and indent >= 4 else word
                named.setdefault(top, set()).add(path)
        if indent >= 4 and words[0] == "lab/":
            named[top].add("analysis/lab/")
    lab = block.split(" lab/", 1)[1].split(" bench/", 1)[0]   # the lab's figures, named by stem
    for name in ("repro", "repro_bench"):
        package = ROOT / name
        modules = {str(p.relative_to(package)) for p in package.rglob("*.py")
                   if p.name != "__init__.py" and "__pycache__" not in p.parts}
        for module in sorted(m for m in modules if m.startswith("analysis/lab/")):
            assert Path(module).stem in lab, module
        modules = {m if "/lab/" not in m else "analysis/lab/" for m in modules}
        assert modules - named[name] == set(), f"{name}/: modules the Layout does not name"
        assert named[name] - modules == set(), f"{name}/: the Layout names modules that do not exist"


# ---------------------------------------------------------------------------------------------
# The analysis only reads; the instruments stand apart (issue 31, item 3)
# ---------------------------------------------------------------------------------------------

# What repro.analysis may import of the package: its own modules and the floors below that hold
# no training (settings, errors, files, the registry, logs), the ceiling's closed-form bound
# (repro.sim.ceiling: arithmetic on a cost profile, no clock is run) and the cost model it is
# built on (repro.sim.cost: a transfer's or a step's time from the profile, no clock is run; the
# lab's theory charges a transfer what the simulator charges). Everything else of repro
# (sim's driver, real, runs, problem's models and data, asgd, the entry points, the instruments)
# trains, simulates or builds a network, which the analysis promises never to do; torch builds
# networks. Read from every Import and ImportFrom node, also those inside functions, and from
# every string that names a module (an import by name).
ANALYSIS_MAY_IMPORT = ("repro.analysis", "repro.config", "repro.errors", "repro.files", "repro.registry",
                       "repro.logs", "repro.sim.ceiling", "repro.sim.cost")
NEVER_IN_ANALYSIS = ("torch",)


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import anywhere in ``path``'s AST (relative ones resolved against
    ``package``; ``from X import y`` also as ``X.y``, which may be a module), and every string
    constant that reads as a module of repro or repro_bench."""
    import ast
    import re

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names
                      if base in ("repro", "repro_bench")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"repro(_bench)?(\.\w+)+", node.value):
            found.append((node.lineno, node.value))
    return found


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_analysis_never_imports_what_trains_simulates_or_builds_a_network():
    root = ROOT / "repro" / "analysis"
    bad = []
    for path in sorted(root.rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for line, module in _imports(path, package):
            repro_ok = not _under(module, ("repro",)) or _under(module, ANALYSIS_MAY_IMPORT)
            if not repro_ok or _under(module, NEVER_IN_ANALYSIS):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_walk_sees_imports_inside_functions_and_by_name(tmp_path):
    """The rule's own reading: what ceiling.py once did (torch and a model builder inside a
    function) and what spread.py did (the simulator's driver) are found."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    import torch\n    from repro.workload.models import build_model\n"
                      "    from ...sim.driver import simulate\n    from repro import real\n"
                      "MODS = ('repro.runs.core',)\n")
    found = {m for _, m in _imports(source, "repro.analysis.lab")}
    assert {"torch", "repro.workload.models", "repro.sim.driver", "repro.real", "repro.runs.core"} <= found


def test_the_library_never_imports_its_benchmarks_and_only_their_command_line_the_instruments():
    """repro_bench (benchmarks; instruments: two hosts, core sampling, re-simulation) sits beside
    repro: nothing under repro/ imports it but the shim ``python -m repro.bench`` runs
    (repro/bench/__main__.py), and of repro_bench only its command line imports the instruments;
    from conf/, only the sim_vs_real experiment's callback names them."""
    bad = []
    for path in sorted([*(ROOT / "repro").rglob("*.py"), *(ROOT / "repro_bench").glob("*.py"),
                        *(ROOT / "hydra_plugins").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        if rel in (Path("repro/bench/__main__.py"), Path("repro_bench/__main__.py")):
            continue
        package = ".".join(rel.with_suffix("").parts[:-1])
        banned = ("repro_bench",) if rel.parts[0] != "repro_bench" else ("repro_bench.instruments",)
        bad += [f"{rel}:{line} imports {m}" for line, m in _imports(path, package) if _under(m, banned)]
    assert not bad, "\n".join(bad)
    targets = [p.name for p in (ROOT / "conf").rglob("*.yaml") if "repro_bench" in p.read_text()]
    assert targets == ["sim_vs_real.yaml"]


def test_hydra_beyond_its_public_interface_is_used_in_one_place_only():
    """Issue 31: no private Hydra import outside one commented place. Hydra's documented API
    (``hydra``, ``hydra.types``, ``hydra.experimental.callback``, and from ``hydra.core`` only the
    documented ``config_store`` and ``hydra_config``) may be used anywhere; what Hydra keeps for
    its plugins and its main (``hydra._internal``, the rest of ``hydra.core``) only in
    ``repro/hydra_internals.py``, whose docstring says which code and why. Imports inside
    functions count too."""
    import ast

    documented = {"hydra.core.config_store", "hydra.core.hydra_config"}
    private = []
    for path in sorted([*(ROOT / "repro").rglob("*.py"), *(ROOT / "repro_bench").rglob("*.py")]):
        if path.name == "hydra_internals.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                if (name.startswith("hydra._internal") or name.startswith("hydra.core")) and name not in documented:
                    private.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not private, f"Hydra's internals imported outside repro/hydra_internals.py: {private}"
    text = (ROOT / "repro" / "hydra_internals.py").read_text()
    assert "hydra._internal" in text and "why" in text.split('"""')[1]


# ---------------------------------------------------------------------------------------------
# The house's shape: lines and modules a reader takes in whole
# ---------------------------------------------------------------------------------------------

def _sources() -> list[Path]:
    return sorted(p for package in ("repro", "repro_bench") for p in (ROOT / package).rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_no_line_of_the_package_or_its_benchmarks_is_over_120_characters():
    long = [f"{p.relative_to(ROOT)}:{i} ({len(line)})" for p in _sources()
            for i, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 120]
    assert not long, "\n".join(long)


def test_no_module_of_the_package_or_its_benchmarks_is_over_400_lines():
    long = [f"{p.relative_to(ROOT)} ({n})" for p in _sources() if (n := len(p.read_text().splitlines())) > 400]
    assert not long, "\n".join(long)


def test_every_name_the_package_uses_is_bound_in_its_module():
    """pyflakes said "undefined name 'torch'" of annotations naming torch in modules that import it
    only inside functions (harmless when annotations stay strings, but a reader's tool stumbled):
    such a name is imported under TYPE_CHECKING."""
    pytest.importorskip("pyflakes")
    import ast
    from pyflakes import checker, messages

    unbound = [f"{p.relative_to(ROOT)}:{m.lineno}: {m.message % m.message_args}" for p in _sources()
               for m in checker.Checker(ast.parse(p.read_text()), str(p)).messages
               if isinstance(m, messages.UndefinedName)]
    assert not unbound, "\n".join(unbound)


def test_the_machines_memory_is_read_in_one_place():
    """build_model bounds a model by it and the startup benchmark its client processes by it:
    both ask :func:`repro.runtime.memory_bytes` (the benchmark imports no torch for it)."""
    readers = [str(p.relative_to(ROOT)) for p in _sources() if "SC_PHYS_PAGES" in p.read_text()]
    assert readers == ["repro/runtime.py"]
    from repro.runtime import memory_bytes
    assert memory_bytes() > 0


def test_every_pointer_from_the_code_into_the_docs_names_a_section_there():
    """The code's docstrings say what a module owns and point to the docs page that explains the rest
    (``docs/simulator.md, "Where speedup stops"``): each named page exists and holds that heading or a
    paragraph led in bold by it, so prose moved out of the code stays where its pointer says."""
    import re
    root = Path(__file__).resolve().parents[1]

    def norm(text: str) -> str:
        return " ".join(text.replace("`", "").split()).lower()

    def leads(doc: Path) -> list[str]:   # its headings and the bold words that lead its paragraphs
        return [norm(heading or bold) for heading, bold in re.findall(r"^#+\s*(.+)$|^\*\*([^*]+)\*\*",
                                                                       doc.read_text(), re.M)]

    missing = []
    for path in sorted((root / "repro").rglob("*.py")):
        for page, section in re.findall(r"docs/([a-z-]+\.md)(?:,\s+['\"]([^'\"]+)['\"])?", path.read_text()):
            doc = root / "docs" / page
            if not doc.is_file() or section and not any(lead.startswith(norm(section)) for lead in leads(doc)):
                missing.append(f"{path.relative_to(root)}: docs/{page}" + (f", {section!r}" if section else ""))
    assert not missing, "pointers to no section:\n" + "\n".join(missing)
