"""Which runs of a results tree one figure may draw (or compare) together: a run's configuration
(:func:`settings`, :func:`fingerprint`), choosing runs (:func:`only_jobs`, ``--config``:
:func:`choose`) and the refusal of what is not one grid (:func:`one_grid`). What a configuration
is: docs/paper.md, 'One figure, one configuration'.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from repro.analysis.load import Runs
from repro.config.settings import RunConfig, shaping_keys, shaping_values
from repro.errors import ConfigError

COLUMN = "config_id"
# Where a run ran, not what it trained (the duplicate check still tells such runs apart).
ENVIRONMENT = ("device", "num_threads", "backend.server_device", "backend.client_device")
CHOICE_HELP = "KEY=VALUE pairs separated by commas, e.g. num_epochs=3,algo.lr=0.01"
SHOWN = 6   # run folders named in a message before "and N more"


def is_axis(key: str, axes: Iterable[str]) -> bool:
    """``seed`` and the figure's axes (an axis ending in ``.`` is a group: ``cost.``)."""
    return key == "seed" or any(key == a or (a.endswith(".") and key.startswith(a)) for a in axes)


def _norm(value: Any) -> Any:
    """One form per value whatever its source (JSON, pandas, numpy): None, bool, float or str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    return str(value)


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    return {k: _norm(v) for k, v in shaping_values(RunConfig()).items()}


def _value(row: pd.Series | dict, key: str) -> Any:
    """The run's value of ``key``; a missing one is the declared default."""
    value = _norm(row.get(key))
    return _defaults().get(key) if value is None else value


def settings(row: pd.Series | dict, axes: Iterable[str] = ()) -> dict[str, Any]:
    """{key: value} of the run's settings that make its configuration, defaults left out."""
    local = row.get("cost.profile") == "local"   # calibrated: cost.compute_s differs in every run
    values = {k: _value(row, k) for k in shaping_keys()
              if not (is_axis(k, axes) or k in ENVIRONMENT or (local and k == "cost.compute_s"))}
    return {k: v for k, v in values.items() if v is not None and v != _defaults().get(k)}


def fingerprint(config: dict[str, Any]) -> str:
    """A short stable name of a configuration (:func:`settings`)."""
    return hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def fmt(value: Any) -> str:
    """A value as a user types it back: ``30`` for 30.0, ``0.001``, ``null``."""
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def annotate(runs: Runs, axes: tuple[str, ...]) -> Runs:
    """``runs`` with :data:`COLUMN` on the runs, evals and updates tables."""
    ids = {r["run_dir"]: fingerprint(settings(r, axes)) for _, r in runs.runs.iterrows()}
    add = lambda f: f.assign(**{COLUMN: f["run_dir"].map(ids) if len(f) else pd.Series(dtype=object)})  # noqa: E731
    return Runs(add(runs.runs), add(runs.evals), add(runs.updates), runs.skipped)


def subset(runs: Runs, run_dirs: Iterable[str]) -> Runs:
    """The runs whose folder is in ``run_dirs`` (all four tables)."""
    keep = set(run_dirs)
    pick = lambda f: f[f["run_dir"].isin(keep)].reset_index(drop=True)  # noqa: E731
    return Runs(pick(runs.runs), pick(runs.evals), pick(runs.updates), runs.skipped)


def list_folders(jobs: Iterable[str]) -> str:
    jobs = sorted(jobs)
    shown = "; ".join(jobs[:SHOWN])
    return shown + (f"; and {len(jobs) - SHOWN} more" if len(jobs) > SHOWN else "")


def only_jobs(runs: Runs, jobs: Iterable[str]) -> tuple[Runs, list[str]]:
    """The runs whose folder name is one of ``jobs`` (a grid's points, and of the skipped folders
    only theirs), and the names of the others."""
    jobs = set(jobs)
    inside = runs.runs["job"].isin(jobs)
    kept = subset(runs, runs.runs.loc[inside, "run_dir"])
    skipped = runs.skipped[runs.skipped["job"].isin(jobs)].reset_index(drop=True)
    return Runs(kept.runs, kept.evals, kept.updates, skipped), sorted(runs.runs.loc[~inside, "job"])


def parse_choice(text: str) -> dict[str, str]:
    """``"num_epochs=3,algo.lr=0.01"`` -> {key: value text}; :class:`ConfigError` if malformed."""
    pairs = {}
    # not at a comma inside brackets: a list's value ("[0, 1]", as a refusal prints it) is one value
    for part in (p.strip() for p in re.split(r",(?![^\[]*\])", str(text))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError("config", text, CHOICE_HELP)
        key = key.strip().lstrip("+")
        if key in pairs:   # else the last value wins, under a file name that shows both
            raise ConfigError("config", text, f"{CHOICE_HELP}, each key once ('{key}' is given twice)")
        pairs[key] = value.strip()
    return pairs


def _matches(value: Any, wanted: str) -> bool:
    if value is None:
        return wanted.lower() in ("null", "none")
    if isinstance(value, bool):
        return wanted.lower() == str(value).lower()
    if isinstance(value, float):
        try:
            return float(wanted) == value
        except ValueError:
            return False
    if wanted.startswith("["):   # a list column holds its JSON text, "[0, 1]": typed with or without spaces
        return str(value).replace(" ", "") == wanted.replace(" ", "")
    return str(value) == wanted


def choose(runs: Runs, text: str | None) -> Runs:
    """The runs whose settings match every ``KEY=VALUE`` of ``text`` (None: all of them)."""
    if text is None:
        return runs
    pairs = parse_choice(text)
    key = next((k for k in pairs if k not in shaping_keys()), None)
    if key is not None:
        raise ConfigError("config", text, f"{CHOICE_HELP}, of keys that shape training "
                                          f"('{key}' is not one; python -m repro.run --help lists them)")
    mask = [all(_matches(_value(r, k), v) for k, v in pairs.items()) for _, r in runs.runs.iterrows()]
    return subset(runs, runs.runs.loc[mask, "run_dir"]) if len(runs.runs) else runs


def differing(rows: list[pd.Series], keys: Iterable[str]) -> list[str]:
    """The ``keys`` in which ``rows`` do not all agree, in declaration order."""
    return [k for k in keys if len({json.dumps(_value(r, k)) for r in rows}) > 1]


def one_grid(runs: Runs, axes: tuple[str, ...], where: str, choice: str | None = None,
             each: bool = False) -> list[tuple[str, Runs]]:
    """(label, runs) per configuration, in run-folder order, if ``runs`` are one (``each``: any
    number), each with one run per grid point and seed; else :class:`ConfigError` naming them and how
    to choose. A label: the settings that differ between them (``KEY=VALUE,...``; ``""`` for one)."""
    runs = annotate(runs, axes)
    rows = [r for _, r in runs.runs.drop_duplicates(COLUMN).iterrows()]
    keys = differing(rows, [k for k in shaping_keys() if not is_axis(k, axes) and k not in ENVIRONMENT])
    names = {r[COLUMN]: ",".join(f"{k}={fmt(_value(r, k))}" for k in keys) for r in rows}
    parts = [(names[cid], subset(runs, g["run_dir"]))
             for cid, g in runs.runs.sort_values("run_dir").groupby(COLUMN, sort=False)]
    if len(parts) > 1 and not each:
        lines = [f"  {label or '(the rest)'}: {len(p.runs)} run(s) ({list_folders(p.runs['job'])})"
                 for label, p in parts]
        raise _refusal(choice, where, f"one configuration to draw: {where} holds runs of "
                          f"{len(parts)} configurations (settings that shape training differ), "
                          "and a figure never pools them:\n" + "\n".join(lines)
                          + f"\nchoose one with --config {parts[0][0]}")
    point = [c for c in runs.runs.columns if is_axis(c, axes)]   # a grid point and seed
    copies = [g for _, part in parts if point
              for _, g in part.runs.groupby(point, dropna=False, sort=True) if len(g) > 1]
    if copies:
        raise _refusal(choice, where, f"one run per grid point and seed; {where} holds "
                          f"{len(copies[0])} for one of them {_told_apart(copies[0])}")
    return parts


def _refusal(choice: str | None, where: str, expected: str) -> ConfigError:
    """The refusal blames ``--config`` when one was chosen, else the folder ``where`` (a
    ``--config`` never given read "invalid value for 'config': None")."""
    return ConfigError("config", choice, expected) if choice else ConfigError("exp", where, expected)


def _told_apart(group: pd.DataFrame) -> str:
    """``(their folders); how to choose one`` of runs that a figure would take for one."""
    rows = [row for _, row in group.iterrows()]
    keys = differing(rows, shaping_keys())
    how = (f"they differ in {', '.join(keys)}: choose with --config "
           f"{keys[0]}={fmt(_value(rows[0], keys[0]))}" if keys else
           "they are copies of one run: remove all but one, e.g. rm -r "
           + " ".join(shlex.quote(str(d)) for d in sorted(group["run_dir"])[1:]))
    return f"({list_folders(group['job'])}); {how}"


def one_run_each(runs: pd.DataFrame, keys: list[str], what: str) -> None:
    """Refuse two runs that a lab frame knows as one by ``keys``: a figure's broad axes (``cost.``,
    ``data.``) let a sweep within one profile through, and the frame would average the two."""
    for _, group in runs.groupby(keys, sort=True, dropna=False):
        if len(group) > 1:
            where = str(Path(group["run_dir"].iloc[0]).parent)   # no --config is chosen here
            raise ConfigError("exp", where, f"one run per {what}; {len(group)} runs share one "
                                           f"{_told_apart(group)}")
