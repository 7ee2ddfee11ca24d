"""Where the package finds its Hydra configuration folder, however it was installed.

``conf/`` lives at the top of the repository (where Hydra users look for it). A wheel installs it
as the package data folder ``repro/conf`` (see pyproject.toml); a checkout or an editable install
reads the repository's own ``conf/``. Everything that opens a YAML file asks :data:`CONF_DIR`.
"""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _find_conf_dir() -> Path:
    for candidate in (_HERE / "conf", _HERE.parent / "conf"):   # wheel, then checkout
        if (candidate / "config.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no Hydra configuration (conf/config.yaml) beside {_HERE}: "
                            "reinstall the package (pip install gpu-asgd-repro or pip install -e .)")


CONF_DIR = _find_conf_dir()


def group_options(group: str) -> list[str]:
    """The option names of one config group (``conf/<group>/*.yaml``), sorted."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
