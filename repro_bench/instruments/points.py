"""The simulator held against reality: the figure and table of ``+exp=sim_vs_real``.

Owns reading the experiment's tree (``results/sim_vs_real/``: real runs on loopback and across
two hosts, and the simulator's runs fitted to them, :mod:`repro_bench.instruments.simreal` makes them) into
tidy frames, the comparison of each grid point (measured against predicted), and the figure
``figures/sim_vs_real.{png,pdf,csv}``. It never trains.

Which side and which link a run folder is comes from what it recorded, never from its path: a
real run is on the limited link when its server's host held none of its clients (config.json's
``host``, written by the real driver); a simulated run belongs to the link of the recording its
cost model was fitted to (config.json's ``fit``: the ``host`` its recordings share, else its first path's).

Samples per second are counted from the first applied push to the last, and time to target from
the first applied push, on both sides: a real run's first push comes after its processes'
start-up (its first steps take tens of milliseconds longer: no part of the clock the simulator
models), which in runs of a second would otherwise weigh on both.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from repro.analysis.load import find_run_dirs
from repro.config.renames import read_recorded
from repro.config.settings import get, shaping_keys
from repro.files import schema
from repro.runs.runlog import read_summary

KEYS = ["link", "nsync", "num_clients"]
# a point's runs (one side) agree on every setting but the seed that shapes training, and on these, that shape the
# clock: its loop waits for a checkpoint (checkpoint_every=1 halved samples/s) or an evaluation (at most timeout_s)
CLOCK = ("checkpoint_every", "backend.eval_in_thread", "backend.timeout_s")
SAMPLES_TARGET, STALENESS_TARGET, KS_TARGET = 0.15, 0.10, 0.1   # the targets (REPRODUCE.md)
COLUMNS = [*KEYS, "measured_samples_per_s", "predicted_samples_per_s", "samples_error",
           "measured_staleness", "predicted_staleness", "staleness_error", "ks_distance",
           "measured_time_to_target_s", "predicted_time_to_target_min_s", "predicted_time_to_target_max_s",
           "time_to_target_inside", "seeds"]


def _config(run_dir: Path) -> dict:
    """``run_dir``'s config.json through its one reader ({} when unreadable)."""
    try:
        return read_recorded(run_dir)
    except (OSError, ValueError):
        return {}


def link_of(run_dir: Path, config: dict | None = None) -> str | None:
    """'loopback' or 'link' (two hosts) of a real run from its ``host`` record; a simulated run's
    is its fit's (the ``host`` its recordings share, else its first recording's); None: neither
    (no record)."""
    config = config if config is not None else _config(run_dir)
    real, fit = config.get("backend", {}).get("name") == "real", config.get("fit") or {}
    # the fit's own copy first: its recordings' paths are absolute, gone once the tree is moved
    host = config.get("host") if real else fit.get("host")
    if real or host:
        return None if not host else ("link" if int(host["clients_on_host"]) == 0 else "loopback")
    paths = fit.get("paths") or []
    return link_of(Path(paths[0])) if paths else None


def run_dirs(root: Path) -> list[Path]:
    """Every finished run folder below ``root`` (hidden folders, the harness's logs, skipped)."""
    return [run_dir for run_dir in find_run_dirs(Path(root))[0]
            if (read_summary(run_dir) or {}).get("status") in schema.FINISHED_STATUSES]


def samples_per_s(updates: pd.DataFrame) -> float:
    """Samples per second of a run's updates.csv, from its first applied push to its last."""
    span = updates.time_s.iloc[-1] - updates.time_s.iloc[0]
    return float((updates.samples_seen.iloc[-1] - updates.samples_seen.iloc[0]) / span) if span > 0 else math.nan


def _read_run(run_dir: Path, summary: dict) -> tuple[dict, pd.DataFrame, pd.DataFrame] | None:
    """:func:`read_runs`' three parts of one run folder; None: neither side of the experiment."""
    config = _config(run_dir)
    link = link_of(run_dir, config)
    if link is None:
        return None
    side = "measured" if config["backend"]["name"] == "real" else "predicted"
    key = {"side": side, "link": link, "nsync": int(config["nsync"]),
           "num_clients": int(config["num_clients"]), "seed": int(config["seed"])}
    updates = pd.read_csv(run_dir / schema.UPDATES_FILE)
    evals = pd.read_csv(run_dir / schema.EVALS_FILE)
    target = config.get("target_error")
    ttt = (summary.get("time_to_target") or {}).get(schema.target_key(target)) if target is not None else None
    start = float(updates.time_s.iloc[0])   # both sides' clocks from their first applied push
    # a target the evaluation at version 0 met was reached before the first push: at 0, not before it
    run = {**key, "samples_per_s": samples_per_s(updates), "staleness": float(updates.staleness.mean()),
           "time_to_target_s": math.nan if ttt is None else max(0.0, float(ttt) - start), "run_dir": str(run_dir),
           "setting": json.dumps({k: get(config, k, None) for k in (*shaping_keys(), *CLOCK) if k != "seed"},
                                 default=str)}
    return (run, pd.DataFrame({**key, "staleness": updates.staleness.to_numpy()}),
            pd.DataFrame({**key, "time_s": evals.time_s.to_numpy(), "train_error": evals.train_error.to_numpy()}))


def read_runs(root: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, int]:
    """(runs, staleness, curves, unfinished): one row per run (its side, link, grid point, seed, samples
    per second, mean staleness, time to target); one row per applied push (its staleness); one row per
    evaluation (train error against time); the run folders not finished (killed, interrupted, failed)."""
    runs, stale, curves, unfinished = [], [], [], 0
    for run_dir in find_run_dirs(Path(root))[0]:
        if (summary := read_summary(run_dir) or {}).get("status") not in schema.FINISHED_STATUSES:
            unfinished += 1   # left out, as run_dirs leaves it
            continue
        try:
            read = _read_run(run_dir, summary)
        except (OSError, LookupError, ValueError, TypeError) as exc:   # a folder cut short or edited
            raise ValueError(f"run folder {run_dir} does not read ({type(exc).__name__}: {exc}); a finished run "
                             "has config.json, summary.json, updates.csv with a push or more, and evals.csv") from None
        if read is not None:
            for out, part in zip((runs, stale, curves), read):
                out.append(part)
    cat, runs = (lambda parts: pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()), pd.DataFrame(runs)
    for key, g in runs.groupby(["side", *KEYS]) if not runs.empty else ():   # medians over seeds of one setting
        if g.setting.nunique() > 1:
            a, b = g.drop_duplicates("setting").run_dir.iloc[:2]
            raise ValueError(f"the {' '.join(map(str, key[:2]))} runs of nsync {key[2]}, {key[3]} client(s) differ in "
                             f"more than their seed ({a} and {b}): a point's medians are over seeds of one setting")
    return runs.drop(columns="setting", errors="ignore"), cat(stale), cat(curves), unfinished


def parts_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Where a round trip went, column by column (timings.csv): per grid point and side, the
    mean of each part and of their sum in milliseconds (median over seeds), measured beside
    predicted."""
    rows = []
    for _, r in runs.iterrows():
        t = pd.read_csv(Path(r.run_dir) / schema.TIMINGS_FILE)
        means = (t[list(schema.TIMING_PARTS)].mean() * 1000).to_dict()
        rows.append({**{k: r[k] for k in (*KEYS, "side", "seed")}, **means, "round_trip": sum(means.values())})
    if not rows:
        return pd.DataFrame()
    columns = [*schema.TIMING_PARTS, "round_trip"]
    means = pd.DataFrame(rows).groupby([*KEYS, "side"])[columns].median()
    wide = means.unstack("side").swaplevel(axis=1)
    return wide.reindex(columns=pd.MultiIndex.from_product([["measured", "predicted"], columns]))


def ks_distance(a, b) -> float:
    """Two-sample Kolmogorov-Smirnov distance: the largest gap between the empirical CDFs."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    if not len(a) or not len(b):
        return math.nan
    grid = np.union1d(a, b)
    cdf = lambda x: np.searchsorted(x, grid, "right") / len(x)
    return float(np.max(np.abs(cdf(a) - cdf(b))))


def points_table(runs: pd.DataFrame, stale: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point (link, nsync, clients) with both sides: medians over seeds of
    samples per second and mean staleness and their relative errors, the median over seeds of
    the KS distance between the two sides' staleness of the same seed, and the measured
    (median) time to target against the simulator's range over seeds."""
    if runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for (link, nsync, n), g in runs.groupby(KEYS):
        m, p = g[g.side == "measured"], g[g.side == "predicted"]
        if m.empty or p.empty:
            continue
        ms, ps = m.samples_per_s.median(), p.samples_per_s.median()
        mst, pst = m.staleness.median(), p.staleness.median()
        ks = []
        for seed in sorted(set(m.seed) & set(p.seed)):
            at = (stale.link == link) & (stale.nsync == nsync) & (stale.num_clients == n) & (stale.seed == seed)
            ks.append(ks_distance(stale[at & (stale.side == "measured")].staleness,
                                  stale[at & (stale.side == "predicted")].staleness))
        mt, lo, hi = m.time_to_target_s.median(), p.time_to_target_s.min(), p.time_to_target_s.max()
        rows.append({"link": link, "nsync": nsync, "num_clients": n, "measured_samples_per_s": ms,
                     "predicted_samples_per_s": ps, "samples_error": ps / ms - 1,
                     "measured_staleness": mst, "predicted_staleness": pst,
                     # both 0 (protocol=sync) agree: no error, where NaN read as a FAIL
                     "staleness_error": (pst / mst - 1) if mst > 0 else (0.0 if pst == 0 else math.nan),
                     "ks_distance": float(np.median(ks)) if ks and n >= 2 else math.nan,
                     "measured_time_to_target_s": mt, "predicted_time_to_target_min_s": lo,
                     "predicted_time_to_target_max_s": hi,
                     "time_to_target_inside": bool(lo <= mt <= hi) if not math.isnan(mt + lo + hi) else False,
                     "seeds": f"{len(m)}/{len(p)}"})
    return pd.DataFrame(rows, columns=COLUMNS)


def draw(table: pd.DataFrame, stale: pd.DataFrame, curves: pd.DataFrame):
    """Predicted against measured samples/s (y = x), staleness ECDFs of both sides per link
    (2+ clients, seeds pooled), and train error against time of both sides (seed 0, nsync 1)."""
    from repro.analysis.figures import _new_figure

    if table.empty:
        raise ValueError("sim_vs_real: no grid point has both a measured and a predicted run")
    links = sorted(table.link.unique())
    fig, axes = _new_figure(2, 1 + len(links), panel=(4.2, 3.3))
    ax = axes[0, 0]
    for (link, nsync), d in table.groupby(["link", "nsync"]):
        ax.scatter(d.measured_samples_per_s, d.predicted_samples_per_s, marker="o" if link == "loopback" else "s",
                   label=f"{link}, nsync {nsync}")
        for _, r in d.iterrows():
            ax.annotate(str(r.num_clients), (r.measured_samples_per_s, r.predicted_samples_per_s), fontsize=7)
    both = table[["measured_samples_per_s", "predicted_samples_per_s"]].to_numpy()
    lo, hi = np.nanmin(both) * 0.8, np.nanmax(both) * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="y = x")
    ax.fill_between([lo, hi], [lo * 0.85, hi * 0.85], [lo * 1.15, hi * 1.15], color="0.9", label="±15%")
    ax.set(xscale="log", yscale="log", xlabel="measured samples/s", ylabel="predicted samples/s",
           title="throughput (label: clients)")
    ax.legend(fontsize="x-small")
    axes[1, 0].axis("off")
    for j, link in enumerate(links, start=1):
        ax = axes[0, j]
        s = stale[(stale.link == link) & (stale.num_clients >= 2)]
        for i, ((nsync, n), d) in enumerate(s.groupby(["nsync", "num_clients"])):
            for side, style in (("measured", "-"), ("predicted", "--")):
                v = np.sort(d[d.side == side].staleness.to_numpy())
                if len(v):
                    ax.step(v, np.arange(1, len(v) + 1) / len(v), style, where="post", color=f"C{i}",
                            label=f"nsync {nsync}, {n} clients, {side}")
        ax.set(xlabel="staleness", ylabel="fraction of pushes", title=f"staleness ECDF, {link}")
        _legend(ax)
        ax = axes[1, j]
        c = curves[(curves.link == link) & (curves.nsync == curves.nsync.min()) & (curves.seed == curves.seed.min())]
        for i, (n, d) in enumerate(c.groupby("num_clients")):
            for side, style in (("measured", "-"), ("predicted", "--")):
                e = d[d.side == side]
                ax.plot(e.time_s, e.train_error, style, color=f"C{i}", label=f"{n} clients, {side}")
        ax.set(xlabel="seconds (wall, or virtual)", ylabel="train error", yscale="log",
               title=f"error against time, {link}, nsync {int(c.nsync.min()) if len(c) else ''}")
        _legend(ax)
    fig.suptitle("The simulator against reality: fitted to each setting's one-client runs, predicting the rest")
    return fig


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:   # a panel with no line (no point of 2+ clients) has none
        ax.legend(fontsize="xx-small")


def write_figure(root: str | Path, out_dir: str | Path, stem: str = "sim_vs_real") -> list[Path]:
    """``out_dir/<stem>.png``, ``.pdf`` and ``.csv`` (the grid points' table) from ``root``."""
    from repro.analysis.render import save_figure

    runs, stale, curves, _ = read_runs(root)
    table = points_table(runs, stale)
    return save_figure(lambda: draw(table, stale, curves), table, Path(out_dir), stem)
