"""Keys moved into nested groups (``cost.churn.*``) keep their old flat spellings: on the command
line, in the Python API's overrides, in a YAML tree and in an old run folder's config.json, each
read through the one table (repro.config.renames.RENAMED), a user's with one line naming the new
spelling."""
import dataclasses
import json
import re

import pytest

from repro.config import renames
from repro.config.checks import from_dict
from repro.config.loader import compose, parse
from repro.config.settings import all_keys, differences, shaping_keys, to_dict, with_operational

OLD = ["cost.preempt_rate=2", "cost.preempt_down_s=0.5", "cost.churn_leave=[1,0.1,0.2]", "cost.churn_join=[0.3]"]
NEW = ["cost.churn.preempt_rate=2", "cost.churn.preempt_down_s=0.5", "cost.churn.leave=[1,0.1,0.2]",
       "cost.churn.join=[0.3]"]


def test_every_old_spelling_names_a_key_that_exists_and_none_is_still_a_key():
    keys = set(all_keys())
    assert set(renames.RENAMED.values()) <= keys and not set(renames.RENAMED) & keys
    assert set(renames.RENAMED.values()) <= set(shaping_keys())


def test_old_overrides_compose_the_same_config_with_one_line_each(capsys):
    new = parse(compose(NEW))
    assert capsys.readouterr().err == ""
    assert parse(compose(OLD)) == new and new.cost.churn.leave == (1, 0.1, 0.2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and err[0] == ("deprecated: 'cost.preempt_rate' is now 'cost.churn.preempt_rate' "
                                        "(the old spelling still works, for now)")
    assert renames.modern_override("+cost.churn_join=[1]", quiet=True) == "+cost.churn.join=[1]"
    assert renames.modern_override("cost.preempt_rate=0,3", quiet=True) == "cost.churn.preempt_rate=0,3"


def test_an_old_tree_loads_as_the_new_one(capsys):
    """A YAML tree (or a hand-written config.json) with the flat keys: the loader moves them,
    with one line each; the tree it was given is not changed."""
    cfg = parse(compose(NEW))
    tree = to_dict(cfg)
    old = {**tree, "cost": {k: v for k, v in tree["cost"].items() if k != "churn"}}
    old["cost"].update(preempt_rate=2.0, preempt_down_s=0.5, churn_leave=[1, 0.1, 0.2], churn_join=[0.3])
    before = json.dumps(old, sort_keys=True)
    capsys.readouterr()
    assert from_dict(old) == cfg and json.dumps(old, sort_keys=True) == before
    assert len(capsys.readouterr().err.splitlines()) == 4


def _old_run_folder(folder):
    """A config.json as a run folder recorded it before the move (churn's flat keys); returns
    the config it holds and its churn group."""
    cfg = parse(compose(NEW))
    tree = to_dict(cfg)
    churn = tree["cost"].pop("churn")
    tree["cost"].update(preempt_rate=churn["preempt_rate"], preempt_down_s=churn["preempt_down_s"],
                        churn_leave=churn["leave"], churn_join=churn["join"])
    (folder / "config.json").write_text(json.dumps(tree))
    return cfg, churn


def test_an_old_run_folders_config_reads_silently_for_replay_resume_and_analysis(tmp_path, capsys):
    """What a run folder recorded before the move: a replay trains its settings, the resume
    check finds no difference, the analysis has the new columns; no deprecation lines (the
    user wrote nothing old)."""
    from repro.analysis.load import flatten

    cfg, churn = _old_run_folder(tmp_path)
    capsys.readouterr()
    tree = renames.read_recorded(tmp_path)   # the one reader of a run folder's config.json
    assert differences(tree, cfg) == [] and differences(tree, cfg.replace(
        cost=cfg.cost.__class__(churn=cfg.cost.churn.__class__(preempt_rate=3.0)))) != []
    assert with_operational(tree, cfg)["cost"]["churn"] == churn
    assert flatten(renames.modern_tree(tree, quiet=True))["cost.churn.preempt_rate"] == 2.0
    assert capsys.readouterr().err == ""


def test_a_run_folders_config_json_has_one_reader_and_it_prints_nothing(tmp_path, capsys):
    """Issue 31: a recorded config.json with the old flat keys, read through the one reader
    (and the instruments' re-simulation, which used to print the deprecation lines), gives the
    new keys and prints nothing; nothing else in the package parses a config.json itself."""
    from repro_bench.instruments.spread import predicted_config
    from tests.helpers.paths import ROOT

    cfg, churn = _old_run_folder(tmp_path)
    capsys.readouterr()
    recorded = renames.read_recorded(tmp_path)
    assert recorded["cost"]["churn"] == churn and "preempt_rate" not in recorded["cost"]
    assert predicted_config(tmp_path).cost.churn == cfg.cost.churn
    assert capsys.readouterr().err == ""
    modules = [*(ROOT / "repro").rglob("*.py"), *(ROOT / "repro_bench").rglob("*.py")]
    readers = [p.relative_to(ROOT) for p in modules
               if re.search(r'(CONFIG_FILE|config\.json")\)\.read_text|read_regular\(.*(CONFIG_FILE|config\.json")',
                            p.read_text())]   # read itself, or through the guard against a FIFO
    assert [str(p) for p in readers] == ["repro/config/renames.py"]


def test_the_warm_start_cache_key_keeps_the_old_spellings():
    values = {"cost.jitter": "none", "cost.churn.preempt_rate": 0.0, "cost.churn.leave": None}
    assert list(renames.legacy_keys(values)) == ["cost.jitter", "cost.preempt_rate", "cost.churn_leave"]


@pytest.mark.slow   # a command line in a process of its own
def test_the_command_line_takes_the_old_spelling(tmp_path):
    import subprocess
    import sys

    from tests.helpers.paths import ROOT
    from tests.helpers.runs import CLI_ARGS

    args = [*CLI_ARGS, "cost.preempt_rate=0.5", f"results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, "-m", "repro.run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("deprecated: 'cost.preempt_rate' is now 'cost.churn.preempt_rate'") == 1
    (run_dir,) = tmp_path.glob("*/*")
    assert "cost.churn.preempt_rate=0.5" in run_dir.name   # one folder, whichever spelling
    assert json.loads((run_dir / "config.json").read_text())["cost"]["churn"]["preempt_rate"] == 0.5


def test_the_shared_topology_and_one_machine_keys_read_in_both_spellings(capsys):
    """cost.shared.* and cost.machine.*: the old flat overrides compose the same config, and
    code that changes a few cost keys by their old names (CostConfig.updated) sets the new ones."""
    from repro.config.settings import CostConfig

    new = parse(compose(["cost=paper2013_shared", "cost.shared.clients_per_host=2", "cost.machine.single=true",
                         "cost.shared.devices_per_host=2", "num_clients=2"]))
    old = parse(compose(["cost=paper2013_shared", "cost.clients_per_host=2", "cost.one_machine=true",
                         "cost.devices_per_host=2", "num_clients=2"]))
    assert old == new and (new.cost.shared.clients_per_host, new.cost.machine.single) == (2, True)
    assert "'cost.one_machine' is now 'cost.machine.single'" in capsys.readouterr().err
    cost = CostConfig.of(topology="shared", clients_per_host=4, eval_s=0.5, preempt_rate=1.0)
    assert (cost.shared.clients_per_host, cost.machine.eval_s, cost.churn.preempt_rate) == (4, 0.5, 1.0)
    assert cost.updated(devices_per_host=2).shared == dataclasses.replace(cost.shared, devices_per_host=2)
    given = dataclasses.replace(cost.shared, clients_per_host=3)   # a group given whole, an old key onto it
    assert cost.updated(shared=given, devices_per_host=2).shared == dataclasses.replace(given, devices_per_host=2)
    from repro.api import cost_profile   # the API's dict of cost fields: the loader's table too

    assert cost_profile({"profile": "p", "topology": "shared", "clients_per_host": 4}).shared.clients_per_host == 4
