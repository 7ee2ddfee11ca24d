"""Each setting written once: the dataclasses are the schema every option merges onto.

A new setting is a field of its dataclass (repro/config/settings.py) and nothing else: it then
composes under every option of its group. An option YAML states only what it changes, and the
experiment grids share their progress callback from one file (conf/exp/shared/grid.yaml).
"""
import dataclasses
import re

import pytest
import yaml

from repro.config import settings
from repro.config.loader import CONF_DIR, GROUPS, group_options
from repro.errors import ConfigError
from repro.run import compose, parse
from tests.helpers.configs import composed

SCHEMAS = {"data": settings.DataConfig, "model": settings.ModelConfig, "algo": settings.AlgoConfig,
           "cost": settings.CostConfig, "backend": settings.BackendConfig, "protocol": settings.ProtocolConfig}
# an option's identity: the one key it always states, even where it equals the default
NAMING_KEYS = {"name", "profile", "server_rule"}
REQUIRED = {"cifar10": ["data.root=/nowhere"], "replay": ["cost.path=/nowhere"], "fit": ["cost.path=/nowhere"]}


def _fields(group):
    return [f.name for f in dataclasses.fields(SCHEMAS[group])]


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_composes_with_every_key_of_its_dataclass(group):
    """An option that does not write a key still has it, at the dataclass's default: a new field
    needs no YAML edit (before the schema, cost.schedule composed only under cost=replay)."""
    for option in group_options(group):
        node = composed([f"{group}={option}", *REQUIRED.get(option, [])])[group]
        keys = set(_fields(group)) if (group, option) != ("backend", "sim") else {"name"}
        assert keys <= set(node), f"{group}={option} lacks {sorted(keys - set(node))}"


def test_every_protocol_setting_is_settable_under_every_protocol():
    """``protocol=X protocol.F=v`` composes and parses for every option X and field F: what a
    new protocol setting must do, with no option YAML edited."""
    values = {"backup_workers": 1, "staleness_bound": 5, "staleness_threshold": 2, "cancel_stale": True, "stop_once": True,
              "collection_size": 3}
    assert set(values) | {"name"} == set(_fields("protocol")), "a new protocol field: give it a test value"
    for option in group_options("protocol"):
        for key, value in values.items():
            cfg = parse(compose([f"protocol={option}", f"protocol.{key}={str(value).lower()}"]))
            assert getattr(cfg.protocol, key) == value, (option, key)


@pytest.mark.parametrize("group", GROUPS)
def test_an_option_yaml_states_only_what_it_changes(group):
    """No default is written twice: every value an option YAML sets (beside its name) differs
    from its dataclass's default."""
    defaults = dataclasses.asdict(SCHEMAS[group]())
    for option in group_options(group):
        tree = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()) or {}
        for key, value in tree.items():
            if key == "defaults" or key in NAMING_KEYS:
                continue
            default = defaults[key]
            default = list(default) if isinstance(default, tuple) else default
            assert value != default or isinstance(value, bool) != isinstance(default, bool), \
                f"conf/{group}/{option}.yaml restates {key}: {value!r}, the default of {SCHEMAS[group].__name__}"


def test_an_option_that_requires_a_value_still_requires_it():
    """``cost=replay`` needs a run folder, ``data=cifar10`` a data folder: without one the config
    is refused naming the key, as Hydra's '???' did before the options merged onto the schema."""
    for override, key in (("cost=replay", "cost.path"), ("data=cifar10", "data.root")):
        with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
            parse(compose([override]))


def test_every_grid_shares_its_progress_callback_and_ends_with_it():
    """One file holds the progress callback (the grid's Ctrl-C, its progress line); it comes
    last so that Hydra, ending callbacks in reverse, ends it before any figure is drawn."""
    grids = [p for p in sorted((CONF_DIR / "exp").glob("*.yaml")) if "MULTIRUN" in p.read_text()]
    assert len(grids) >= 17
    for path in grids:
        assert "repro.grid.Grid" not in path.read_text(), f"{path.name} writes the shared grid block"
        callbacks = composed([f"+exp={path.stem}"], hydra=True).hydra.callbacks
        assert list(callbacks)[-1] == "grid" and callbacks.grid._target_ == "repro.grid.Grid", path.stem
        assert len(callbacks) >= 2, path.stem   # the experiment's own figure or pipeline first
