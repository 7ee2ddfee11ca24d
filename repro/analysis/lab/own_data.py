"""Staleness lab, ``own_data`` (``python -m repro.run +exp=own_data``): clients with their own data,
one of them slow; does a method that drops stale work stop learning the slow client's classes
(TEACHING.md, step 8)? Owns the figure's tidy frame (per run and class the final test error from
``summary.json``'s ``final_class_test_error``; the means over the slow client's classes and the
others), drawing and table. The partition itself is the ``partition`` figure's."""
from __future__ import annotations

import numpy as np
import pandas as pd

from repro.analysis.render import printed_table, register_figure
from repro.analysis.lab import heat_map, listed, tidy
from repro.analysis.lab.partition import partition_of
from repro.analysis.lab.uneven import method_of, method_order
from repro.analysis.load import Runs

COLUMNS = ["partition", "method", "family", "seed", "run_dir", "status", "diverged", "quantity",
           "class", "slow_class", "value", "num_clients", "nsync", "slow_client", "cost.straggler_factor",
           "algo.lr", "num_epochs"]


def own_data_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Rows per run: one per class (``class_test_error_pct``), the means over the slow client's
    classes and over the others, and the final test error."""
    rows = []
    for _, run in runs.runs.iterrows():
        method, family = method_of(run)
        slow = set(listed(run.get("data.slow_client_classes")))
        base = {"partition": partition_of(run), "method": method, "family": family, "seed": run["seed"],
                "run_dir": run["run_dir"], "status": run["status"], "diverged": run["status"] == "diverged",
                "num_clients": run["num_clients"], "nsync": run["nsync"], "num_epochs": run["num_epochs"],
                "slow_client": run.get("cost.straggler_client"),
                "cost.straggler_factor": run.get("cost.straggler_factor"), "algo.lr": run["algo.lr"]}
        errors = listed(run.get("final_class_test_error"))
        for c, e in enumerate(errors):
            rows.append({**base, "quantity": "class_test_error_pct", "class": c, "slow_class": c in slow,
                         "value": np.nan if e is None else 100.0 * e})
        for quantity, theirs in (("slow_classes_error_pct", True), ("other_classes_error_pct", False)):
            values = [100.0 * e for c, e in enumerate(errors) if (c in slow) == theirs and e is not None]
            rows.append({**base, "quantity": quantity, "class": np.nan, "slow_class": theirs,
                         "value": float(np.mean(values)) if values else np.nan})
        rows.append({**base, "quantity": "final_test_error_pct", "class": np.nan, "slow_class": False,
                     "value": 100.0 * float(run["final_test_error"])})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return tidy(frame, COLUMNS, ["partition", "method", "seed", "quantity", "class"],
                partition=partition_order(frame["partition"]), method=method_order(frame["method"]))


def partition_order(parts) -> list[str]:
    return sorted(set(parts), key=lambda p: (1, float(p.rsplit("=", 1)[-1])) if p.startswith("dirichlet") else (0, 0.0))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per partition and method (mean over seeds): test error on the slow client's classes, the others', overall."""
    rows = []
    for (part, method), g in frame.groupby(["partition", "method"], sort=False):
        q = lambda name: g[g["quantity"] == name]["value"].mean()   # noqa: E731
        runs = g[g["quantity"] == "final_test_error_pct"]
        rows.append({"partition": part, "method": method, "runs": len(runs),
                     "diverged": int(runs["diverged"].astype(bool).sum()),
                     "slow_classes_err_pct": q("slow_classes_error_pct"),
                     "other_classes_err_pct": q("other_classes_error_pct"),
                     "test_err_pct": q("final_test_error_pct")})
    return pd.DataFrame(rows)


def draw_own_data(frame: pd.DataFrame):
    """Per partition, a heat map of methods (rows) x classes (columns): final test error, mean
    over seeds; the slow client's classes framed."""
    import matplotlib as mpl
    from repro.analysis.figures import _require, _seeds, panel_grid
    _require(frame, "own_data")
    classes = frame[frame["quantity"] == "class_test_error_pct"]
    parts = partition_order(frame["partition"])
    methods = method_order(frame["method"])
    fig, axes = panel_grid(len(parts), 2, panel=(6.0, 0.9 + 0.42 * len(methods)))
    norm = mpl.colors.Normalize(0, 100)
    image = None
    for ax, part in zip(axes.flat, parts):
        g = classes[classes["partition"] == part]
        grid = g.pivot_table(index="method", columns="class", values="value", aggfunc="mean")
        grid = grid.reindex([m for m in methods if m in grid.index])
        image = heat_map(ax, grid, lambda v: f"{v:.0f}" if np.isfinite(v) else "", 60, "x-small", cmap="Reds",
                         norm=norm)
        slow = sorted({int(c) for c in g.loc[g["slow_class"].astype(bool), "class"]})
        for c in slow:   # the slow client's classes, framed
            j = list(grid.columns).index(c)
            ax.add_patch(mpl.patches.Rectangle((j - 0.5, -0.5), 1, len(grid), fill=False, lw=1.8,
                                               edgecolor="0.1"))
        ax.set(xlabel="class (framed: held by the slow client alone)", title=part)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.6, label="final test error of the class (%)")
    first = frame.iloc[0]
    fig.suptitle(f"Clients with their own data: {int(first['num_clients'])} clients, client "
                 f"{int(first['slow_client'])} {first['cost.straggler_factor']:g}x slower and alone holding "
                 f"its classes\nper-class test error after {first['num_epochs']:g} epochs (client SGD lr "
                 f"{first['algo.lr']:g}, nsync {int(first['nsync'])}; mean of {_seeds(frame)}); no "
                 "closed-form prediction")
    return fig


# its axes are what a row's partition and method name: another data or algo setting (algo.lr)
# has no column and was pooled as if over seeds
register_figure("own_data", own_data_frame, draw_own_data, exps=("own_data",), extra=printed_table(table),
                axes=("data.partition", "data.alpha", "algo.server_rule", "algo.momentum", "protocol."))
