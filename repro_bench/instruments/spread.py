"""The simulator against reality, its staleness spread: ``python -m repro.bench simreal --spread``.

Owns the measurement behind the staleness KS misses of ``+exp=sim_vs_real`` (issue 18): the
simulator's compute jitter is fitted from each setting's one-client runs, where a client has a
core to itself, but with 2-4 clients on the machine's cores the OS time-slices them and a push's
compute time spreads wider; the simulator shares its cores evenly (processor sharing) and cannot
show it. Per grid point with 2+ clients this measures, median over seeds:

- the KS distance with the fitted model (what :func:`repro_bench.instruments.points.points_table` says);
- the KS distance when the point is re-simulated (in a temporary folder) with a lognormal jitter
  whose per-push compute CV is the point's own measured one: how much of the miss the spread is;
- the measured per-push compute CV beside the fitted model's (its simulated runs' timings.csv);
- the measurement's own noise floor: the KS distance between the real runs of two seeds of the
  same point (median over seed pairs), below which no model can be told apart from reality.

Unlike :mod:`repro_bench.instruments.points` (which only reads), this module runs the simulator.
"""
from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from repro.config.renames import read_recorded
from repro.files import schema
from repro_bench.instruments.points import KEYS, ks_distance, points_table, read_runs

COLUMNS = [*KEYS, "ks_distance", "ks_spread", "ks_floor", "measured_compute_cv", "predicted_compute_cv",
           "jitter_sigma", "spread_jitter_sigma", "seeds"]


def compute_cv(run_dir: str | Path) -> float:
    """Coefficient of variation of a run's per-push compute time (timings.csv ``compute_s``),
    each client's first push left out: it carries the process's start-up, not the steady spread."""
    t = pd.read_csv(Path(run_dir) / schema.TIMINGS_FILE)
    x = t[t.duplicated("client")].compute_s
    return float(x.std() / x.mean()) if len(x) > 1 and x.mean() > 0 else math.nan


def spread_sigma(cv: float, nsync: int) -> float:
    """The per-step lognormal ``cost.jitter_sigma`` whose push of ``nsync`` steps has compute CV
    ``cv``: a push sums nsync mean-1 factors of variance exp(sigma^2) - 1 (repro.sim.cost), so
    cv^2 = (exp(sigma^2) - 1) / nsync."""
    return math.sqrt(math.log(1 + nsync * cv * cv))


def predicted_config(run_dir: str | Path):
    """The RunConfig a simulated run of the experiment ran with: its config.json with the fitted
    values as recorded (no refit from the recordings: ``cost.path`` dropped, and the profile
    ``fitted``, since ``fit`` without a path is refused)."""
    from repro.config.checks import from_dict

    tree = read_recorded(run_dir)
    tree.pop("fit", None)
    profile = "fitted" if tree["cost"].get("profile") == "fit" else tree["cost"].get("profile")
    return from_dict({**tree, "cost": {**tree["cost"], "path": None, "profile": profile}})


def resimulate(run_dir: str | Path, out_dir: Path, **cost) -> Path:
    """A simulated run of the experiment run again into ``out_dir`` with ``cost`` changed."""
    from repro.sim.driver import simulate

    cfg = predicted_config(run_dir)
    simulate(cfg.replace(cost=cfg.cost.updated(**cost)), out_dir)   # old flat names taken
    return out_dir


def noise_floor(real: pd.Series) -> float:
    """Median over pairs of seeds of the KS distance between the staleness of the real runs of
    one grid point (``real``: staleness indexed by seed); NaN with fewer than two seeds."""
    seeds = sorted(set(real.index))
    gaps = [ks_distance(real.loc[[a]], real.loc[[b]]) for a, b in itertools.combinations(seeds, 2)]
    return float(np.median(gaps)) if gaps else math.nan


def spread_table(root: str | Path) -> pd.DataFrame:
    """One row per grid point with 2+ clients that has both sides (see the module docstring)."""
    runs, stale, _, _ = read_runs(root)
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    fitted = points_table(runs, stale).set_index(KEYS).ks_distance
    rows = []
    with tempfile.TemporaryDirectory(prefix="simreal_spread_") as tmp:
        for (link, nsync, n), g in runs[runs.num_clients >= 2].groupby(KEYS):
            m, p = g[g.side == "measured"].set_index("seed"), g[g.side == "predicted"].set_index("seed")
            seeds = sorted(set(m.index) & set(p.index))
            if not seeds:
                continue
            at = (stale.link == link) & (stale.nsync == nsync) & (stale.num_clients == n)
            real = stale[at & (stale.side == "measured")].set_index("seed").staleness
            per_seed = []
            for seed in seeds:
                cv = compute_cv(m.run_dir[seed])
                if math.isnan(cv):   # under two steady pushes: no spread to match
                    continue
                sigma = spread_sigma(cv, nsync)
                run_dir = resimulate(p.run_dir[seed], Path(tmp) / f"{link}-{nsync}-{n}-{seed}",
                                     jitter="lognormal", jitter_sigma=sigma)
                wide = pd.read_csv(run_dir / schema.UPDATES_FILE).staleness
                per_seed.append({"ks_spread": ks_distance(real.loc[[seed]], wide), "measured_compute_cv": cv,
                                 "predicted_compute_cv": compute_cv(p.run_dir[seed]), "spread_jitter_sigma": sigma,
                                 "jitter_sigma": predicted_config(p.run_dir[seed]).cost.jitter_sigma})
            if per_seed:   # medians over seeds, NaN when one seed's is (as numpy's median)
                medians = pd.DataFrame(per_seed).median(skipna=False).astype(float).to_dict()
                rows.append({"link": link, "nsync": nsync, "num_clients": n, **medians, "seeds": len(per_seed),
                             "ks_distance": fitted.get((link, nsync, n)), "ks_floor": noise_floor(real)})
    return pd.DataFrame(rows, columns=COLUMNS)
