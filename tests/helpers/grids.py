"""A figure's grid as its Hydra sweep declares it, expanded into the runs it launches, and the
launcher override that runs a shrunk grid's points inside its command's own process."""
from __future__ import annotations

import itertools

from hydra.core.override_parser.overrides_parser import OverridesParser

from repro.run import CONF_DIR

# A shrunk grid whose test checks its figure, not its launcher, runs its points one after another
# in the command's process (Hydra's basic launcher), sparing the two worker processes (each
# importing torch) of the experiments' default joblib launcher. The numbers are the same:
# tests/test_grids.py holds joblib workers' tables and figure byte-equal to the basic launcher's.
IN_PROCESS = ("hydra/launcher=basic",)


def sweep_grid(exp: str) -> list[dict]:
    """The runs a figure's sweep launches, expanded as Hydra's basic sweeper does."""
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        full = hcompose(config_name="config", overrides=[f"+exp={exp}"], return_hydra_config=True)
    params = full.hydra.sweeper.params
    assert full.hydra.mode.name == "MULTIRUN"
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    axes = [[(o.key_or_group, v) for v in o.sweep_iterator()] for o in parsed]
    return [dict(point) for point in itertools.product(*axes)]
