"""The public notebook API: any torch module, tensors or numpy arrays in, DataFrames out, CLI
semantics."""
import inspect
import json
import os
import re
import signal
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from repro import api
from repro.errors import ConfigError
from repro.files import schema


def _problem(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    return x, y


def test_simulate_returns_the_run_tables(tmp_path):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    x, y = _problem()
    result = api.simulate(module, (x[:200], y[:200]), (x[200:], y[200:]), num_clients=3, nsync=2,
                          num_epochs=20, eval_every=5, lr=0.1, momentum=0.0, cost="uniform",
                          run_dir=tmp_path)
    assert list(result.updates.columns) == list(schema.UPDATE_COLUMNS)
    assert list(result.evals.columns) == list(schema.EVAL_COLUMNS)
    assert result.summary["status"] == "completed"
    assert result.evals.test_error.iloc[-1] < 0.15 < result.evals.test_error.iloc[0]
    assert set(result.updates.client) == {1, 2, 3}
    assert (result.run_dir / "summary.json").exists()


def test_simulate_is_deterministic_and_matches_seed_semantics(tmp_path):
    x, y = _problem()
    torch.manual_seed(0)
    module = nn.Linear(6, 2)
    kw = dict(num_clients=2, nsync=3, num_epochs=2, cost="lan", seed=4)
    a = api.simulate(module, (x, y), (x, y), run_dir=tmp_path / "a", **kw)
    b = api.simulate(module, (x, y), (x, y), run_dir=tmp_path / "b", **kw)
    assert a.updates.equals(b.updates) and a.evals.equals(b.evals)


def test_cost_profiles_by_name_dict_and_errors():
    assert api.cost_profile("paper2013").comm_params == 6.1e7
    assert api.cost_profile("straggler").straggler_factor == 4.0      # inherits lan's other fields
    assert api.cost_profile("straggler").latency_s == api.cost_profile("lan").latency_s
    assert api.cost_profile({"compute_s": 0.2}).compute_s == 0.2
    # a dict naming a profile is that profile with the dict's changes, not the defaults under its label
    assert api.cost_profile({"profile": "straggler"}) == api.cost_profile("straggler")
    assert api.cost_profile({"profile": "straggler", "latency_s": 0.5}).straggler_factor == 4.0
    assert api.cost_profile({"profile": "paper2013_shared", "shared": {"devices_per_host": 2}}).shared == \
        replace(api.cost_profile("paper2013_shared").shared, devices_per_host=2)   # clients_per_host kept
    with pytest.raises(ConfigError, match="'cost': 'fast'"):
        api.cost_profile("fast")


def test_bad_api_input_is_a_clear_error():
    x, y = _problem()
    with pytest.raises(ConfigError, match="num_clients"):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=0)
    with pytest.raises(ConfigError, match="'train'.*labels of dtype torch.float32.*integer class labels 0..C-1"):
        api.simulate(nn.Linear(6, 2), (x, y.float()), (x, y))


def _tables(train, test, tmp_path, name):
    torch.manual_seed(0)   # the same initial weights for every call
    result = api.simulate(nn.Linear(6, 2), train, test, num_clients=2, nsync=2, num_epochs=1,
                          eval_every=0.5, cost="lan", run_dir=tmp_path / name)
    return result.updates, result.evals


def test_numpy_inputs_and_any_integer_labels_give_the_tensor_tables(tmp_path):
    # float64 inputs made from float32 ones convert back exactly, so the tables must be identical
    x, y = _problem()
    want = _tables((x[:200], y[:200]), (x[200:], y[200:]), tmp_path, "tensors")
    xn, yn = x.numpy().astype(np.float64), y.numpy()
    assert yn.dtype == np.int64
    for name, labels in (("numpy_int64", yn), ("numpy_int32", yn.astype(np.int32)),
                         ("torch_int32", y.to(torch.int32)), ("numpy_uint8", yn.astype(np.uint8))):
        got = _tables((xn[:200], labels[:200]), (xn[200:], labels[200:]), tmp_path, name)
        assert got[0].equals(want[0]) and got[1].equals(want[1]), name


@pytest.mark.parametrize("labels, match", [
    (np.zeros(256, dtype=np.float64), r"labels of dtype float64'; expected integer class labels 0\.\.C-1"),
    (torch.zeros(256), r"labels of dtype torch.float32'; expected integer class labels 0\.\.C-1"),
    (np.full(256, -1, dtype=np.int64), r"a label of -1'; expected integer class labels 0\.\.C-1 \(none negative\)"),
    (np.zeros(255, dtype=np.int64), r"inputs of shape \(256, 6\), labels of shape \(255,\)'; expected equally many"),
])
def test_bad_labels_are_refused_with_a_message_that_does_not_contradict_itself(labels, match):
    x, y = _problem()
    with pytest.raises(ConfigError, match=match) as err:
        api.simulate(nn.Linear(6, 2), (x.numpy(), labels), (x, y))
    assert not re.search(r"int64.*expected int64", str(err.value))


def test_train_and_test_inputs_must_share_a_sample_shape():
    x, y = _problem()
    with pytest.raises(ConfigError, match="'test'.*sample shape"):
        api.simulate(nn.Linear(6, 2), (x, y), (x[:, :5], y))


def test_simulate_documents_every_parameter_its_result_and_its_errors():
    doc = inspect.getdoc(api.simulate)
    for name in inspect.signature(api.simulate).parameters:
        assert re.search(rf"^{name} : \S", doc, re.MULTILINE), f"parameter {name!r} is not documented"
    for section in ("Returns", "Raises"):
        assert re.search(rf"^{section}\n-+$", doc, re.MULTILINE), section
    assert "ConfigError" in doc.split("Raises", 1)[1]


def test_simulate_runs_every_protocol_and_rule(tmp_path):
    """The lab through the API: sync merges each round into one row with staleness 0, ssp bounds
    how far ahead a client runs, and the staleness-aware rules train."""
    x, y = _problem()
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
    kw = dict(num_clients=4, nsync=1, num_epochs=4, lr=0.1, momentum=0.0, cost="jitter_exponential")
    sync = api.simulate(module, (x, y), (x, y), protocol="sync", backup_workers=1,
                        run_dir=tmp_path / "sync", **kw)
    assert (sync.updates.client == 0).all() and (sync.updates.staleness == 0).all()
    assert len(sync.summary["discarded_pushes"]) == len(sync.updates)
    ssp = api.simulate(module, (x, y), (x, y), protocol="ssp", staleness_bound=0, run_dir=tmp_path / "ssp", **kw)
    assert ssp.updates.staleness.max() <= 3 * 1 + 3
    for rule in ("staleness_scaled", "dcasgd"):
        result = api.simulate(module, (x, y), (x, y), server_rule=rule, run_dir=tmp_path / rule, **kw)
        assert result.summary["status"] == "completed"
        assert result.evals.test_error.iloc[-1] < result.evals.test_error.iloc[0]
    with pytest.raises(ConfigError, match="protocol.name"):
        api.simulate(module, (x, y), (x, y), protocol="bsp")


# a value of a wrong type for every argument of simulate() (issue 32 item 17): each is a
# ConfigError naming the argument, never a TypeError from deep inside that names nothing
_x = torch.zeros(8, 6)
WRONG_TYPES = {"module": "a module", "train": (_x,), "test": ("inputs", "labels"), "num_clients": 1.5,
               "nsync": 2.5, "num_epochs": "long", "eval_every": [1], "lr": "fast", "momentum": None,
               "weight_decay": "none", "batch_size": 16.5, "server_rule": 3, "lr_server": "auto",
               "dc_lambda": [0.1], "protocol": None, "backup_workers": 0.5, "staleness_bound": "3",
               "cost": 7, "seed": 1.5, "target_error": "5%", "divergence_factor": None, "loss_fn": "mse",
               "device": 0, "run_dir": 3, "force": "yes", "progress": 1}


def test_every_argument_of_the_wrong_type_is_named():
    params = list(inspect.signature(api.simulate).parameters)
    assert sorted(WRONG_TYPES) == sorted(params)   # a new argument must be added here
    x, y = _problem(64)
    good = {"module": nn.Linear(6, 2), "train": (x, y), "test": (x, y)}
    for name, value in WRONG_TYPES.items():
        args = {**good, "num_epochs": 2, "nsync": 1, "batch_size": 16, name: value}
        with pytest.raises(ConfigError) as err:
            api.simulate(args.pop("module"), args.pop("train"), args.pop("test"), **args)
        assert err.value.key == name, f"{name}={value!r}: {err.value}"
    for value in (7, None, [1], object()):
        with pytest.raises(ConfigError) as err:
            api.cost_profile(value)
        assert err.value.key == "cost", err.value


def test_the_classroom_predictions_are_the_theorys_and_load_no_analysis_on_import():
    """Issue 35: the lesson's problems and predictions are public (repro.api) and give the
    published numbers; importing repro.api does not import the analysis they come from."""
    import subprocess
    import sys

    code = ("import sys, repro.api; print(sorted(m for m in sys.modules if m.startswith('repro.analysis')"
            " or m in ('matplotlib', 'scipy')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
    # t(S) = min{t : sum floor(t / tau_i) >= S}: at t = 3, 3 + 1 + 0 = 4 pushes
    assert api.collection_time([1.0, 2.0, 4.0], 4) == 3.0 and api.collection_time([1.0, 2.0], 1) == 1.0
    response = api.theorem_response(api.QUADRATIC_CURVATURES, 0.5, 0.0, 2)   # mu 0: (1 - lr l)^t
    assert np.allclose(response[:, 2], (1 - 0.5 * np.asarray(api.QUADRATIC_CURVATURES)) ** 2)
    bound = api.ceiling(api.configure("+exp=ceiling", "num_clients=16", "nsync=1", "cost.bandwidth_Bps=1.25e8"))
    assert bound.binding == "server link" and bound.pushes_per_s < 16 / bound.cycle_s
    quad = api.load_dataset("quadratic")
    out = api.build_model("quadratic", quad.input_shape, 1)(quad.x_train)
    assert float(api.quadratic_loss(out, quad.y_train).detach()) > 0


def test_ceiling_predicts_a_fitted_profile_and_refuses_what_has_no_cost(tmp_path):
    """api.ceiling of cost=fit is the fitted clock's: a recording of 20 ms steps (cost=uniform:
    no jitter, free links, no apply) gives a cycle of 4 x 0.02 s at nsync 4 (it gave the
    uniform defaults' 4 x 0.01 s, the recording unread); a calibrated step or a replay has no
    profile to predict from: ConfigError, not a ValueError from float('calibrate')."""
    from repro.sim.driver import simulate

    simulate(api.configure("data=digits", "num_epochs=1", "num_clients=1", "nsync=1", "cost=uniform",
                           "cost.compute_s=0.02"), tmp_path / "rec")
    fitted = api.ceiling(api.configure("data=digits", "nsync=4", "cost=fit", f"cost.path={tmp_path / 'rec'}"))
    assert fitted.cycle_s == pytest.approx(0.08)
    for cost in ("cost=local", "cost=replay"):
        cfg = api.configure(cost, *(["cost.path=" + str(tmp_path / "rec")] if cost == "cost=replay" else []))
        with pytest.raises(ConfigError):
            api.ceiling(cfg)


def test_a_run_dir_holding_a_run_of_other_data_or_weights_is_refused_not_returned(tmp_path):
    # config.json's settings alone cannot tell two problems apart: it used to hand back the old run
    x, y = _problem()
    kw = dict(num_clients=2, nsync=2, num_epochs=1, cost="lan", run_dir=tmp_path)
    torch.manual_seed(0)
    api.simulate(nn.Linear(6, 2), (x, y), (x, y), **kw)
    torch.manual_seed(0)
    assert api.simulate(nn.Linear(6, 2), (x, y), (x, y), **kw).summary["status"] == "completed"
    with pytest.raises(ConfigError, match="data.name"):
        torch.manual_seed(0)
        api.simulate(nn.Linear(6, 2), (2 * x, y), (x, y), **kw)
    with pytest.raises(ConfigError, match="model.name"):
        torch.manual_seed(1)
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), **kw)
    with pytest.raises(ConfigError, match="model.name"):
        torch.manual_seed(0)
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), loss_fn=nn.functional.nll_loss, **kw)


def test_an_empty_run_dir_is_refused_not_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    x, y = _problem()
    with pytest.raises(ConfigError, match="'run_dir'"):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir="")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("under", ["", "notes.txt"])
def test_a_run_dir_holding_the_users_own_files_is_refused_not_mixed_with_a_run(tmp_path, under):
    # run_dir=home (or '/') wrote config.json, evals.csv, ... among the user's files; a file: FileExistsError
    (tmp_path / "notes.txt").write_text("mine")
    x, y = _problem()
    said = f"'run_dir': '{re.escape(str(tmp_path / under))}'.*a file or holds others"
    with pytest.raises(ConfigError, match=said):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir=tmp_path / under)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_a_run_dir_under_home_spelled_with_a_tilde_is_the_home_folder_not_a_folder_named_tilde(tmp_path, monkeypatch):
    # run_dir="~/runs/a" trained into ./~/runs/a, then pandas (which expands ~) read the
    # tables from $HOME: a FileNotFoundError after the whole run, its folder in the wrong place
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    x, y = _problem()
    result = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir="~/runs/a")
    assert result.run_dir == tmp_path / "home" / "runs" / "a"
    assert (result.run_dir / schema.SUMMARY_FILE).exists()
    assert not list((tmp_path / "cwd").iterdir())


def test_a_relative_run_dir_is_the_result_s_folder_after_a_chdir_too(tmp_path, monkeypatch):
    # result.run_dir was Path("runs/a"): after a later chdir it named a folder below the new one
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    x, y = _problem()
    result = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir="runs/a")
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert result.run_dir == tmp_path / "runs" / "a" and (result.run_dir / schema.SUMMARY_FILE).exists()


def test_a_run_dir_that_cannot_be_made_is_named_before_training(tmp_path):
    # a run_dir under a file was a NotADirectoryError from deep in the run folder's lock
    (tmp_path / "notes.txt").write_text("mine")
    x, y = _problem()
    with pytest.raises(ConfigError, match="'run_dir'.*a folder that can be made: .*notes.txt refuses a new folder"):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir=tmp_path / "notes.txt" / "run")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("target", ["nowhere", "link"])
def test_a_run_dir_that_is_a_broken_link_or_a_loop_is_named_before_training(tmp_path, target):
    # a link to nothing (or to itself) was a FileExistsError from deep in the run folder's lock
    (tmp_path / "link").symlink_to(tmp_path / target)
    x, y = _problem()
    with pytest.raises(ConfigError, match="'run_dir'.*a folder that can be made: .*link is a broken link"):
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir=tmp_path / "link")
    assert [p.name for p in tmp_path.iterdir()] == ["link"]


class _Pair(nn.Linear):
    def forward(self, x):
        return super().forward(x), x


@pytest.mark.parametrize("module, loss_fn, match", [
    (nn.Linear(5, 2), nn.functional.cross_entropy, "'module'.*mat1 and mat2.*inputs of shape \\(2, 6\\)"),
    (_Pair(6, 2), nn.functional.cross_entropy, "'loss_fn'.*TypeError"),
    (nn.Linear(6, 2), lambda out, y: 1.0, "'loss_fn'.*a result of float.*one element"),
    (nn.Linear(6, 2), lambda out, y: nn.functional.cross_entropy(out, y, reduction="none"),
     "'loss_fn'.*a result of \\(2,\\)"),
])
def test_a_module_or_loss_fn_that_fails_on_the_inputs_is_named_before_training(module, loss_fn, match):
    x, y = _problem()
    with pytest.raises(ConfigError, match=match):
        api.simulate(module, (x, y), (x, y), loss_fn=loss_fn, num_epochs=1)


class _NoParameters(nn.Module):
    def forward(self, x):
        return x[:, :2]


class _OneDouble(nn.Linear):
    def __init__(self):
        super().__init__(6, 2)
        self.scale = nn.Parameter(torch.ones(2, dtype=torch.float64))

    def forward(self, x):
        return super().forward(x) * self.scale.float()


@pytest.mark.parametrize("module, match", [
    (_NoParameters(), r"^_NoParameters has no parameters to train$"),
    (nn.Linear(6, 2).double(), r"^Linear's parameter weight is torch.float64 on cpu; every parameter must be "
                               r"torch.float32 on one device \(cpu\): module.float\(\) converts$"),
    (_OneDouble(), r"^_OneDouble's parameter scale is torch.float64"),
])
def test_a_module_without_parameters_or_with_one_not_float32_is_a_value_error_naming_it(module, match):
    """As simulate's docstring promises; the dtype's said "FlatModule needs float32 parameters
    all on one device", naming a class of ours and neither the module nor the parameter."""
    x, y = _problem()
    with pytest.raises(ValueError, match=match):
        api.simulate(module, (x, y), (x, y), num_epochs=1)


def test_a_module_with_dropout_gives_the_same_tables_whatever_the_callers_generator_and_leaves_it_be():
    # dropout drew from the caller's global generator: the same arguments gave other tables
    x, y = _problem()
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    tables = []
    for state in (1, 2):
        torch.manual_seed(state)
        before = torch.random.get_rng_state()
        tables.append(api.simulate(module, (x, y), (x, y), num_clients=2, nsync=2, num_epochs=1).updates)
        assert torch.equal(torch.random.get_rng_state(), before)
    assert tables[0].equals(tables[1])


@pytest.mark.parametrize("override, said", [("nope=1", "Could not override 'nope'"),
                                            ("data=nope", "Could not find 'data/nope'"),
                                            ("num_clients", "Error parsing override")])
def test_configure_refuses_an_unknown_key_or_option_with_a_config_error(override, said):
    # Hydra's own exceptions came through, where the docstring promises a ConfigError
    with pytest.raises(ConfigError, match=f"'overrides'.*{re.escape(said)}"):
        api.configure(override)


def test_configure_composes_on_every_call_as_its_docstring_says(monkeypatch):
    # the docstring said "Composed once per process for each list of overrides" after the cache
    # went (038ab93): a reader would expect a conf/ edit within a session to go unseen
    from repro.config import loader

    calls = []
    compose = loader.compose
    monkeypatch.setattr(loader, "compose", lambda *a, **k: calls.append(a) or compose(*a, **k))
    assert api.configure("num_clients=3") == api.configure("num_clients=3") and len(calls) == 2
    doc = " ".join(api.configure.__doc__.split())
    assert "Composed anew on every call (nothing is cached)" in doc and "once per" not in doc, doc


def test_configure_of_an_override_hydras_grammar_cannot_read_says_to_quote_it_as_the_command_line_does():
    # "mismatched input '='" with no hint, where python -m repro.run says how to quote the value
    with pytest.raises(ConfigError) as err:
        api.configure("cost.path=/x/num_epochs=100")
    assert str(err.value).startswith("invalid value for 'overrides': ['cost.path=/x/num_epochs=100']; expected "
                                     "KEY=VALUE of known keys and options (python -m repro.run --help lists them): "
                                     "mismatched input '=' expecting <EOF> (quote a value with other characters: "
                                     "KEY='VALUE'; See https://hydra.cc/docs/"), str(err.value)
    assert api.configure("cost.path='/x/num_epochs=100'").cost.path == "/x/num_epochs=100"


def test_a_run_dir_holding_an_interrupted_run_says_force_not_the_command_lines_resume(tmp_path):
    # the refusal said "resume=true continues it": simulate() has no resume
    x, y = _problem()
    kw = dict(num_clients=2, nsync=2, num_epochs=1, run_dir=tmp_path)
    torch.manual_seed(0)
    module = nn.Linear(6, 2)
    api.simulate(module, (x, y), (x, y), **kw)
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    with pytest.raises(ConfigError, match="'run_dir'.*interrupted run.*force=True starts it over") as err:
        api.simulate(module, (x, y), (x, y), **kw)
    assert "resume=true" not in str(err.value)
    assert api.simulate(module, (x, y), (x, y), force=True, **kw).summary["status"] == "completed"


def test_a_run_dir_a_command_line_run_wrote_or_a_live_run_holds_is_refused_in_the_apis_names(tmp_path):
    # only the resume refusals were rewritten: these named 'run folder' and advised force=true, or
    # another exp_name, where simulate() takes run_dir and force=True
    from repro.files.locks import FileLock
    from repro.sim.driver import simulate as sim_run
    cli = tmp_path / "cli"
    sim_run(api.configure("+problem=quadratic", "cost=uniform", "num_clients=2", "nsync=1", "num_epochs=8"), cli)
    x, y = _problem()
    with pytest.raises(ConfigError, match=r"'run_dir'.*finished \(completed\) run.*\(force=True starts it over\)") as err:
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir=cli)
    assert "run folder" not in str(err.value) and "force=true" not in str(err.value)
    with FileLock(cli / schema.LOCK_FILE), pytest.raises(ConfigError, match="'run_dir'.*choose another run_dir") as err:
        api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_epochs=1, run_dir=cli)
    assert "exp_name" not in str(err.value)


def test_configure_from_several_threads_at_once_gives_each_its_config():
    # Hydra's one GlobalHydra per process: all but one thread raised "GlobalHydra is already
    # initialized" (simulate() composes its cost profile; a sweep in a ThreadPoolExecutor)
    barrier, got = threading.Barrier(4), {}

    def configure(seed):
        barrier.wait()
        try:
            got[seed] = api.configure(f"seed={seed}").seed
        except Exception as exc:   # noqa: BLE001 (what each thread met, asserted below)
            got[seed] = exc
    threads = [threading.Thread(target=configure, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {seed: seed for seed in range(4)}


def test_run_point_with_resume_says_there_is_nothing_to_resume_not_a_temporary_folder_and_force():
    # it named /tmp/repro-.../run and advised force=True, which run_point does not take
    with pytest.raises(ConfigError) as err:
        api.run_point("+problem=quadratic", "resume=true")
    assert str(err.value) == ("invalid value for 'resume': True; expected false: run_config (and run_point) "
                              "simulate in a fresh temporary folder, which holds no run to resume"), str(err.value)


def test_run_config_refuses_a_real_backend_rather_than_simulating_it():
    with pytest.raises(ConfigError, match="'backend': 'real'.*run_config simulates"):
        api.run_config(api.configure("backend=real", "data=synthetic", "model=mlp", "num_epochs=1"))


@pytest.mark.parametrize("taus", [[], [1.0, 0.0], [-1.0]])
def test_collection_time_refuses_no_clients_or_a_segment_time_not_above_zero(taus):
    with pytest.raises(ConfigError, match="'taus'"):
        api.collection_time(taus, 3)
    assert api.collection_time([1.0, 2.0], 3) == 2.0


def test_pandas_frames_and_series_give_the_numpy_tables(tmp_path):
    # torch.as_tensor indexed a shuffled DataFrame by its labels: a raw KeyError
    pd = pytest.importorskip("pandas")
    x, y = _problem()
    order = np.random.default_rng(0).permutation(len(x))   # a shuffled index, as train_test_split leaves
    frame, labels = pd.DataFrame(x.numpy(), index=order), pd.Series(y.numpy(), index=order)
    tables = _tables((frame, labels), (x, y), tmp_path, "pandas")
    expected = _tables((x.numpy(), y.numpy()), (x, y), tmp_path, "numpy")
    assert tables[0].equals(expected[0]) and tables[1].equals(expected[1])


def test_complex_inputs_are_refused_not_cut_to_their_real_part():
    x, y = _problem()
    with pytest.raises(ConfigError, match="'train'.*inputs of dtype torch.complex64.*real inputs"):
        api.simulate(nn.Linear(6, 2), (x.to(torch.complex64), y), (x, y))


def test_weight_decay_on_a_module_with_frozen_parameters_is_refused():
    # the decay acts on the whole flat vector: the frozen layer shrank every step (torch's SGD skips it)
    x, y = _problem()
    module = nn.Sequential(nn.Linear(6, 4).requires_grad_(False), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ConfigError, match="'weight_decay'.*0 for a module with frozen parameters"):
        api.simulate(module, (x, y), (x, y), num_epochs=1, weight_decay=0.1)
    assert api.simulate(module, (x, y), (x, y), num_epochs=1).summary["status"] == "completed"


def test_a_module_with_every_parameter_frozen_is_refused_before_training():
    # backward() failed inside the first push with "element 0 of tensors does not require grad"
    x, y = _problem()
    module = nn.Linear(6, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="'module'.*every parameter frozen"):
        api.simulate(module, (x, y), (x, y), num_epochs=1)


@pytest.mark.parametrize("call, name", [
    (lambda: api.critical_lr(-1), "staleness"), (lambda: api.critical_lr([0, 1, -1]), "staleness"),
    (lambda: api.critical_lr(float("nan")), "staleness"), (lambda: api.critical_lr(float("inf")), "staleness"),
    (lambda: api.critical_lr(True), "staleness"), (lambda: api.critical_lr("3"), "staleness"),
    (lambda: api.critical_lr(1, 0), "l_max"), (lambda: api.critical_lr(1, -2.0), "l_max"),
    (lambda: api.harmonic(0), "n"), (lambda: api.harmonic(-1), "n"), (lambda: api.harmonic(2.5), "n"),
    (lambda: api.harmonic(True), "n"), (lambda: api.harmonic("3"), "n"), (lambda: api.harmonic(float("inf")), "n"),
    (lambda: api.theorem_response([1.0, float("nan")], 0.1, 0.5, 3), "curvatures"),
    (lambda: api.theorem_response("ab", 0.1, 0.5, 3), "curvatures"),
    (lambda: api.theorem_response([1.0], -0.1, 0.5, 3), "lr"),
    (lambda: api.theorem_response([1.0], 0.1, 1.0, 3), "mu"), (lambda: api.theorem_response([1.0], 0.1, True, 3), "mu"),
    (lambda: api.theorem_response([1.0], 0.1, 0.5, -1), "steps"),
    (lambda: api.theorem_response([1.0], 0.1, 0.5, 2.5), "steps"),
    (lambda: api.collection_time([1.0, float("nan")], 2), "taus"),
    (lambda: api.collection_time([1.0, float("inf")], 2), "taus"),
    (lambda: api.collection_time(["a"], 2), "taus"), (lambda: api.collection_time([1.0, 2.0], 0), "size"),
    (lambda: api.collection_time([[1, 2]], 1), "taus"),   # raveled: two clients, answered 1
    (lambda: api.theorem_response([[1.0, 2.0]], 0.1, 0.5, 3), "curvatures"),   # a (1, 4, 2) array answered
    (lambda: api.collection_time([1.0, 2.0], -1), "size"), (lambda: api.collection_time([1.0, 2.0], 2.5), "size"),
    (lambda: api.collection_time([1.0, 2.0], True), "size"),
    (lambda: api.ceiling(api.configure("cost=lan"), -10**6), "param_bytes"),   # a negative rate
    (lambda: api.ceiling(api.configure("cost=lan"), float("nan")), "param_bytes"),
    (lambda: api.ceiling(api.configure("cost=lan"), "x"), "param_bytes"),
    (lambda: api.configure(3), "overrides"), (lambda: api.configure("num_clients=4", None), "overrides"),
    (lambda: api.run_config(None), "cfg"), (lambda: api.run_config("num_clients=4"), "cfg"),
    (lambda: api.ceiling(None), "cfg"), (lambda: api.ceiling("cost=lan"), "cfg"),   # an AttributeError
    (lambda: api.ceiling(api.configure("num_clients=3").replace(num_clients=2.5)), "num_clients"),   # a TypeError
    (lambda: api.harmonic(10**12), "n"), (lambda: api.harmonic(1025), "n"),   # 10**12 looped for hours
    (lambda: api.collection_time([1.0, 2.0], 10**12), "size"),
    (lambda: api.theorem_response([1.0], 0.1, 0.5, 10**12), "steps")])   # a loop of 10**12 steps
def test_the_classroom_functions_refuse_a_bad_argument_naming_it(call, name):
    # critical_lr(-1) answered -2.0, harmonic(0) 0, collection_time(taus, 0) 0.0, theorem_response(..., -1)
    # one column, harmonic(2.5) a TypeError: now a ConfigError naming the argument and what is accepted
    with pytest.raises(ConfigError, match=f"'{name}'.*expected"):
        call()


def test_theorem_response_refuses_an_lr_whose_response_leaves_float64_without_a_numpy_warning():
    # it printed numpy's overflow warnings and returned inf, then nan, for finite inputs
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for args in (([1e300], 1e300, 0.5, 3), ([4.0], 1.0, 0.0, 10**4)):   # (1 - 4)^t passes 1e308 at t ~ 646
            with pytest.raises(ConfigError, match="'lr'.*float64"):
                api.theorem_response(*args)
        assert np.isfinite(api.theorem_response([4.0], 1.0, 0.0, 600)).all()   # 3^600 ~ 1e286: answered
        assert (api.theorem_response([1e-300], 1e-300, 0.5, 3) == 1.0).all()   # an underflow is no error


def test_the_theory_helpers_still_take_numpy_numbers_and_arrays():
    assert api.harmonic(np.int64(4)) == pytest.approx(25 / 12)
    h_1024 = np.log(1024) + np.euler_gamma + 1 / 2048 - 1 / (12 * 1024**2)   # the top: num_clients' 1024
    assert api.harmonic(1024) == pytest.approx(h_1024, rel=1e-12)
    assert api.critical_lr(np.arange(0, 3), np.float32(2.0)) == pytest.approx([1.0, 0.5, 0.3090170], rel=1e-6)
    assert api.collection_time(np.array([1.0, 2.0, 4.0]), np.int64(4)) == 3.0
    assert api.theorem_response(np.array([0.0, 1.0]), 0.5, 0.0, 0).shape == (2, 1)
    assert api.theorem_response(2.0, 0.5, 0.0, 2).tolist() == [[1.0, 0.0, 0.0]]   # a number, one mode: an AxisError


def test_replace_takes_a_numpy_number_as_its_python_value():
    # a sweep's np.arange gives np.int64: "invalid value for 'num_clients': np.int64(4); expected an integer"
    cfg = api.configure("+problem=quadratic", "cost=uniform").replace(num_clients=np.int64(2), seed=np.int32(3))
    assert (type(cfg.num_clients), type(cfg.seed)) == (int, int) and (cfg.num_clients, cfg.seed) == (2, 3)
    assert api.ceiling(cfg).pushes_per_s == api.ceiling(cfg.replace(num_clients=2)).pushes_per_s


@pytest.mark.parametrize("changes, key, said", [
    ({"num_clientz": 2}, "num_clientz", "a known key: algo, .*num_clients"),
    ({"lr": 0.1}, "lr", "algo.lr \\(a group's key\\)"),
    ({"nsync": 2, "clients_per_host": 2}, "clients_per_host", "cost.shared.clients_per_host \\(a group's key\\)")])
def test_replace_of_an_unknown_or_a_groups_key_names_it_and_its_full_spelling(changes, key, said):
    # dataclasses' TypeError: "RunConfig.__init__() got an unexpected keyword argument 'lr'"
    cfg = api.configure("+problem=quadratic", "cost=uniform")
    with pytest.raises(ConfigError, match=f"^invalid value for '{key}': (2|0.1); expected {said}"):
        cfg.replace(**changes)


def test_simulate_takes_a_numpy_number_as_replace_does():
    # simulate() had its own rule (np.generic only): a 0-d array, which replace() takes as its
    # number, was refused: "invalid value for 'num_clients': array(2); expected an integer"
    x, y = _problem()
    result = api.simulate(nn.Linear(6, 2), (x, y), (x, y), num_clients=np.array(2), nsync=np.int64(2),
                          num_epochs=1, eval_every=0.5, cost="lan")
    assert result.summary["status"] == "completed" and set(result.updates.client) == {1, 2}


def test_replace_takes_a_numpy_number_in_a_group_and_leaves_an_array_to_be_refused():
    # a group's were kept: "invalid value for 'protocol.staleness_threshold': np.int64(2); expected
    # an integer"; and an array's .item() raised ValueError ("can only convert an array of size 1")
    cfg = api.configure("+problem=quadratic", "cost=uniform", "nsync=1", "num_epochs=1")
    cfg = cfg.replace(protocol=replace(cfg.protocol, name="ringmaster", staleness_threshold=np.int64(2)),
                      cost=cfg.cost.updated(topology="shared", clients_per_host=np.int64(2)))
    assert (type(cfg.protocol.staleness_threshold), type(cfg.cost.shared.clients_per_host)) == (int, int)
    assert api.run_config(cfg).summary["status"] == "completed"
    with pytest.raises(ConfigError, match="'num_clients': array"):
        api.run_config(cfg.replace(num_clients=np.array([4, 5])))


def test_a_result_compares_and_pickles_without_a_pandas_error():
    # the dataclass's == compared the DataFrames: "The truth value of a DataFrame is ambiguous"
    import pickle

    import pandas as pd

    frame = pd.DataFrame({"version": [1, 2], "staleness": [0, 1]})
    a = api.Result(frame, frame.copy(), {"status": "completed", "time_to_target": {0.05: None}}, None)
    b = pickle.loads(pickle.dumps(a))
    assert a == a and (a == b) is False and a != b
    assert b.updates.equals(a.updates) and b.summary == a.summary and "Result(" in repr(b)


class _CtrlC:
    """cross_entropy that sends this process a SIGINT (a notebook's interrupt) at its ``at``-th call."""

    def __init__(self, at: int) -> None:
        self.calls, self.at = 0, at

    def __call__(self, outputs, labels):
        self.calls += 1
        if self.calls == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return nn.functional.cross_entropy(outputs, labels)


def test_ctrl_c_stops_the_caller_too_its_run_dir_saying_interrupted(tmp_path, ctrl_c_raises):
    # the run stopped cleanly and simulate returned its partial result: a notebook's loop went on
    # to its next point (one Ctrl-C a point), a cell's checks judged the partial tables
    x, y = _problem()
    kw = dict(num_clients=2, nsync=1, num_epochs=50, batch_size=8, cost="uniform")
    for run_dir in (tmp_path / "run", None):
        with pytest.raises(KeyboardInterrupt, match="interrupted"):
            api.simulate(nn.Linear(6, 2), (x, y), (x, y), loss_fn=_CtrlC(40), run_dir=run_dir, **kw)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert json.loads((tmp_path / "run" / schema.SUMMARY_FILE).read_text())["status"] == "interrupted"
    again = api.simulate(nn.Linear(6, 2), (x, y), (x, y), run_dir=tmp_path / "run", force=True, **{**kw, "num_epochs": 1})
    assert again.summary["status"] == "completed"
