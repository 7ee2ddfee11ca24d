"""Configuration: every shipped config composes and converts; bad input is rejected clearly."""
import itertools
import subprocess
import sys

import pytest

from repro.config.checks import from_dict, ignored_protocol_keys
from repro.config.settings import RunConfig, to_dict
from repro.errors import ConfigError
from repro.run import CONF_DIR, compose, parse
from tests.helpers.configs import composed
from tests.helpers.grids import cli_run, sweep_grid

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "exp").glob("*.yaml"))


def test_default_config_converts_and_round_trips():
    cfg = parse(compose([]))
    assert isinstance(cfg, RunConfig)
    assert (cfg.data.name, cfg.model.name, cfg.backend.name) == ("digits", "digits_cnn", "sim")
    assert from_dict(to_dict(cfg)) == cfg


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_converts(exp):
    cfg = parse(composed([f"+exp={exp}"]))
    assert cfg.exp_name == exp
    assert ignored_protocol_keys(cfg) == []     # no shipped experiment sets a key its protocol ignores


@pytest.mark.parametrize("group", ["data", "model", "algo", "cost", "backend", "protocol", "+mitigation"])
def test_every_group_option_composes(group):
    for option in sorted(p.stem for p in (CONF_DIR / group.lstrip("+")).glob("*.yaml")):
        extra = {"cifar10": ["data.root=/nowhere"], "replay": ["cost.path=/nowhere"], "fit": ["cost.path=/nowhere"]}.get(option, [])
        cfg = parse(composed([f"{group}={option}", *extra]))
        assert cfg is not None and ignored_protocol_keys(cfg) == []


def test_only_the_protocol_that_reads_a_key_checks_it_against_num_clients():
    """protocol=async protocol.backup_workers=2 num_clients=2 was refused (fewer than num_clients)
    though async does not read the key (the run warns that it is ignored); sync still refuses it."""
    assert parse(compose(["protocol=async", "protocol.backup_workers=2", "num_clients=2"])).protocol.backup_workers == 2
    with pytest.raises(ConfigError, match="fewer than num_clients"):
        parse(compose(["protocol=sync", "protocol.backup_workers=2", "num_clients=2"]))


@pytest.mark.parametrize("exp,expected", [
    ("fig1", {"seed": [0, 1, 2]}),
    ("fig2", {"num_clients": [1, 2, 4, 8], "seed": [0, 1]}),
    ("fig3", {"num_clients": [1, 2, 4, 8], "nsync": [1, 4, 16], "seed": [0, 1]}),
    ("fig4", {"num_clients": [1, 2, 4, 8], "nsync": [1, 4, 16], "seed": [0, 1, 2]}),
    ("staleness", {"num_clients": [1, 2, 4, 8], "nsync": [1, 4, 16], "seed": [0, 1]}),
])
def test_figure_grids_expand_to_the_intended_runs(exp, expected):
    grid = sweep_grid(exp)
    want = [dict(zip(expected, values)) for values in itertools.product(*expected.values())]
    assert sorted(map(sorted_items, grid)) == sorted(map(sorted_items, want))
    assert len({tuple(sorted(p.items())) for p in grid}) == len(grid)
    for point in (grid[0], grid[-1]):   # the grid's corners are valid configs with fixed seeds
        cfg = parse(compose([f"+exp={exp}"] + [f"{k}={v}" for k, v in point.items()]))
        assert cfg.seed in (0, 1, 2)


def sorted_items(d):
    return tuple(sorted((k, int(v)) for k, v in d.items()))


def test_figure_experiments_use_the_paper_regime_and_warm_start():
    for exp in ("fig2", "fig3", "fig4", "staleness"):
        cfg = parse(composed([f"+exp={exp}"]))
        assert (cfg.cost.profile, cfg.algo.server_rule, cfg.cost.comm_params) == ("paper2013", "adagrad", 6.1e7)
    assert parse(composed(["+exp=fig3"])).start == "warm"
    assert parse(composed(["+exp=fig2"])).start == "cold"


BAD_INPUTS = [
    (["num_clients=0"], "num_clients", "an integer in 1..1024"),
    (["nsync=0"], "nsync", "an integer in 1..1000000"),
    (["algo.lr=-0.1"], "algo.lr", "a number in (0, 1e+09]"),
    (["algo.momentum=1.5"], "algo.momentum", "[0, 0.999999]"),
    (["num_epochs=abc"], "num_epochs", "a number"),
    (["algo.server_rule=magic"], "algo.server_rule", "'adagrad', 'dcasgd', 'delta', 'downpour', 'easgd', 'outer_nesterov', 'staleness_scaled'"),
    (["cost.jitter=gaussian"], "cost.jitter", "'none', 'lognormal', 'exponential'"),
    (["cost.straggler_client=9"], "cost.straggler_client", "1..4"),
    (["backend=real", "backend.master_port=70000"], "backend.master_port", "0..65535"),
    (["start=hot"], "start", "'cold', 'warm'"),
    # no number may hang or overflow a run: every numeric key has a finite range
    (["eval_every=1e-12"], "eval_every", "[0.001, 100000]"),
    (["num_epochs=inf"], "num_epochs", "(0, 100000]"),
    (["num_epochs=nan"], "num_epochs", "(0, 100000]"),
    (["backend=real", "backend.timeout_s=1e300"], "backend.timeout_s", "[0.1, 604800]"),
    (["backend=real", "backend.timeout_s=0.001"], "backend.timeout_s", "[0.1, 604800]"),
    (["backend=real", "backend.client_timeout_s=0"], "backend.client_timeout_s", "(0, 604800]"),
    (["num_epochs=1000", "eval_every=0.001"], "eval_every", "at most 100000 evaluations"),
    (["cost.latency_s=-1"], "cost.latency_s", "[0, 1e+06]"),
    (["seed=-1"], "seed", "0..2147483647"),
]


@pytest.mark.parametrize("overrides,key,expected", BAD_INPUTS)
def test_bad_values_name_key_value_and_choices(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        parse(compose(overrides))
    message = str(err.value)
    assert f"'{key}'" in message and expected in message
    assert overrides[-1].split("=", 1)[1] in message or overrides[-1].split("=", 1)[1] == "1e300"


def test_every_numeric_key_has_a_finite_range():
    """Issue: eval_every=1e-12 looped forever, num_epochs=inf never ended, timeout_s=1e300
    overflowed. Every number is checked against a finite range before any work."""

    from repro.config.settings import Range, _leaves
    for key, f, _ in _leaves():
        valid = f.metadata["valid"]
        hint = f.type if isinstance(f.type, str) else str(f.type)
        if "int" in hint or "float" in hint:
            assert isinstance(valid, Range), key
            assert valid.hi < float("inf") and valid.lo > -float("inf"), key


def test_every_key_is_documented_for_help():
    from repro.config.loader import key_docs
    from repro.config.settings import all_keys
    docs = key_docs()
    assert set(docs) == set(all_keys())
    assert all(len(doc) > 10 for doc in docs.values()), [k for k, d in docs.items() if len(d) <= 10]


def test_training_shaping_keys_are_declared_once():
    from repro.config.loader import job_name
    from repro.config.settings import shaping_keys
    keys = set(shaping_keys())
    assert {"seed", "num_clients", "nsync", "num_threads", "device", "algo.lr", "cost.jitter"} <= keys
    assert not keys & {"exp_name", "resume", "force", "progress", "results_dir", "figures_dir",
                       "checkpoint_every", "cost.path", "data.root", "backend.master_port",
                       "backend.master_addr", "backend.timeout_s", "backend.client_timeout_s"}
    assert job_name(["+exp=fig3", "num_threads=2", "nsync=4", "backend.timeout_s=9", "algo=adagrad",
                     "results_dir=/x", "cost.path='a=b,c'"]) == "algo=adagrad,nsync=4,num_threads=2"
    assert job_name([]) == "base"


def _cli(args, tmp_path, monkeypatch, capsys):
    # in the test's process: what a refusal says and leaves is tested here, the exit status of a
    # fresh interpreter in tests/test_startup_imports.py (each interpreter: ~1-3 s of imports)
    return cli_run(monkeypatch, capsys, f"results_dir={tmp_path}", "progress=false", *args)


@pytest.mark.parametrize("args,needle", [
    (["num_clients=0"], "'num_clients': 0; expected an integer in 1..1024"),
    (["model=resnet"], "'model': 'resnet'; expected one of: 'cifar_18pct', 'digits_cnn', 'mlp', 'mnist1d_cnn'"),
    (["data=imagenet"], "'data': 'imagenet'; expected one of: 'cifar10', 'digits', 'mnist1d', 'quadratic', 'synthetic'"),
    (["model=mnist1d_cnn"], "'model.name': 'mnist1d_cnn'; expected a model that accepts data 'digits'"),
    (["model=cifar_18pct"], "'cifar_18pct' expects (3, 32, 32) colour images"),
    (["data=cifar10", "model=cifar_18pct", "data.root=/nonexistent"], "data.root"),
    (["data=cifar10", "model=cifar_18pct"], "'data.root'"),          # unset: named, never '???'
    # typos get our message (exit 2, the closest keys), not Hydra's "use +num_client=4"
    (["num_client=4"], "unknown key 'num_client' (in 'num_client=4'); closest valid keys: num_clients"),
    (["+num_client=4"], "unknown key 'num_client' (in '+num_client=4'); closest valid keys: num_clients"),
    (["algo.lrr=0.1"], "closest valid keys: algo.lr"),
    (["+num_clients=4"], "'num_clients' is already a key; write num_clients=4"),
    (["exp=fig3"], "write +exp=fig3"),
    (["backend.timeout_s=5"], "'backend.timeout_s' is a setting of backend=real"),
    (["+exp=fig3", "eval_every=0"], "'eval_every': 0"),
])
def test_cli_rejects_bad_input_with_exit_code_2_and_no_complete_run(tmp_path, monkeypatch, capsys, args, needle):
    proc = _cli(args, tmp_path, monkeypatch, capsys)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert "???" not in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("summary.json"))     # nothing looks like a run
    assert not list(tmp_path.rglob("config.json"))
    assert not [p for p in tmp_path.rglob("*") if p.is_dir()]   # not even an empty folder


def test_a_refusal_after_torch_loads_is_exit_2_from_a_fresh_interpreter(tmp_path):
    # the cases above run in the test's process; this one keeps a process's own exit, after torch
    # and the data are loaded (a refusal before torch: tests/test_startup_imports.py)
    proc = subprocess.run([sys.executable, "-m", "repro.run", f"results_dir={tmp_path}", "model=cifar_18pct"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "'cifar_18pct' expects (3, 32, 32) colour images" in proc.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_dir()]


def test_help_shows_every_key_with_its_meaning_and_valid_values(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "repro.run", "+exp=fig3", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("algo.server_rule", "valid: adagrad, dcasgd, delta, downpour, easgd,", "outer_nesterov, staleness_scaled",
                   "Local minibatch steps between exchanges", "lan, local, paper2013*",
                   "+exp     ceiling, churn, fig1, fig2, fig3*"):
        assert needle in out, needle
    assert not list(tmp_path.iterdir())                 # help runs nothing, makes nothing


def test_a_key_an_old_config_json_lacks_is_left_out_of_its_shaping_values_not_an_error():
    from repro.config.settings import differences, shaping_values
    tree = to_dict(RunConfig(seed=3))
    del tree["cost"]["churn"], tree["algo"]["lr"]    # recorded before these keys existed
    values = shaping_values(tree)
    assert "algo.lr" not in values and "cost.churn.leave" not in values and values["seed"] == 3
    assert values["data.num_train"] is None                    # a key that holds null is kept
    assert differences(tree, RunConfig()) == ["seed: 3 -> 0"]


def test_a_key_that_is_not_text_is_an_unknown_key_not_a_type_error():
    # repro.api.simulate(cost={1: 2}) was a TypeError from joining the key to its group's name
    from repro.config.settings import CostConfig
    with pytest.raises(ConfigError, match="'cost.1': 2; expected a known key"):
        from_dict({1: 2, "profile": "lan"}, CostConfig, "cost.")


def test_a_float_where_an_integer_belongs_is_refused_by_validate():
    # repro.api.run_config(cfg.replace(nsync=2.5)) passed validate() and died in numpy: "seed must be integer"
    from repro.config.checks import validate
    with pytest.raises(ConfigError, match="'nsync': 2.5; expected an integer in 1..1000000"):
        validate(RunConfig().replace(nsync=2.5))


def test_a_group_replaced_by_a_name_is_refused_by_validate():
    # repro.api.run_config(cfg.replace(protocol="sync")) was "TypeError: string indices must be integers"
    from repro.config.checks import validate
    with pytest.raises(ConfigError, match=r"'protocol': 'sync'; expected its settings: dataclasses.replace\(cfg.protocol"):
        validate(RunConfig().replace(protocol="sync"))
