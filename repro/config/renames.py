"""Keys that moved into a nested group: :data:`RENAMED` (old dotted key -> new), the one table every
reader of a key goes through, and :func:`read_recorded`, the one reader of a run folder's config.json.
See docs/configuration.md, "Renamed keys".
"""
from __future__ import annotations

import copy
import functools
import json
import sys
from pathlib import Path

from repro.files.schema import CONFIG_FILE
from repro.files.storage import read_regular

RENAMED = {
    "cost.clients_per_host": "cost.shared.clients_per_host",
    "cost.devices_per_host": "cost.shared.devices_per_host",
    "cost.host_bandwidth_Bps": "cost.shared.host_bandwidth_Bps",
    "cost.server_bandwidth_Bps": "cost.shared.server_bandwidth_Bps",
    "cost.server_burst_bytes": "cost.shared.server_burst_bytes",
    "cost.one_machine": "cost.machine.single",
    "cost.link_cpu_s_per_byte": "cost.machine.link_cpu_s_per_byte",
    "cost.eval_s": "cost.machine.eval_s",
    "cost.preempt_rate": "cost.churn.preempt_rate",
    "cost.preempt_down_s": "cost.churn.preempt_down_s",
    "cost.churn_leave": "cost.churn.leave",
    "cost.churn_join": "cost.churn.join",
}
OLD_SPELLING = {new: old for old, new in RENAMED.items()}


def _deprecated(old: str) -> None:
    print(f"deprecated: '{old}' is now '{RENAMED[old]}' (the old spelling still works, for now)",
          file=sys.stderr, flush=True)


def modern_override(arg: str, quiet: bool = False) -> str:
    """``cost.preempt_rate=3`` -> ``cost.churn.preempt_rate=3`` (a ``+``/``~`` prefix and a
    sweep's values kept); any other argument as it is."""
    key, sep, value = arg.partition("=")
    bare = key.lstrip("+~")
    if not sep or bare not in RENAMED:
        return arg
    if not quiet:
        _deprecated(bare)
    return key[:len(key) - len(bare)] + RENAMED[bare] + sep + value


def modern_tree(tree: dict, quiet: bool = False, prefix: str = "") -> dict:
    """A copy of a nested config dict with every old flat key moved to its new place; ``prefix``: where
    ``tree`` sits in the whole config (``cost.`` for the cost group's dict alone)."""
    out = copy.deepcopy(tree)
    for old, new in RENAMED.items():
        if not old.startswith(prefix):
            continue
        *path, leaf = old.removeprefix(prefix).split(".")
        node = functools.reduce(lambda parent, part: parent.get(part) if isinstance(parent, dict) else None, path, out)
        if not isinstance(node, dict) or leaf not in node:
            continue
        if not quiet:
            _deprecated(old)
        # the old spelling wins: in a composed tree the new key is always there (the schema's
        # default), so the old one is what was written
        value = node.pop(leaf)
        *path, leaf = new.removeprefix(prefix).split(".")
        node = out
        for part in path:   # a group absent or null: made
            node[part] = dict(node.get(part) or {})
            node = node[part]
        node[leaf] = value
    return out


def read_recorded(run_dir: str | Path) -> dict:
    """``run_dir``'s config.json with every old spelling moved to its new key, silently. Raises OSError
    (unreadable) or ValueError (not a regular file, not JSON, or not a JSON object)."""
    tree = json.loads(read_regular(Path(run_dir) / CONFIG_FILE))   # the one reader (test_config_renames)
    if not isinstance(tree, dict):
        raise ValueError(f"{CONFIG_FILE} holds a {type(tree).__name__}, not a JSON object")
    return modern_tree(tree, quiet=True)


def legacy_keys(values: dict) -> dict:
    """``{dotted key: value}`` with each moved key under its old flat spelling, in the same
    order: what a key computed before the move was computed from."""
    return {OLD_SPELLING.get(key, key): value for key, value in values.items()}
