"""The ``partition`` figure (``python -m repro.analysis partition --exp own_data``): which classes
each client holds, read from the runs' ``config.json`` record (``dataset.client_class_counts``),
never the data; one heat map of clients by classes per partition found (the lowest seed's)."""
from __future__ import annotations

import pandas as pd

from repro.analysis.figures import panel_grid
from repro.analysis.lab import heat_map, listed
from repro.analysis.render import register_figure
from repro.analysis.load import Runs

COUNTS = "dataset.client_class_counts"
# what decides a partition (besides the labels): one panel for each of their combinations
PANEL_KEYS = ("data.name", "data.partition", "data.alpha", "data.slow_client_classes", "num_clients")


def partition_of(run: pd.Series) -> str:
    """``iid``, ``dirichlet alpha=0.1``, ...: the partition's name with what parametrises it."""
    part = str(run["data.partition"])
    return f"dirichlet alpha={float(run['data.alpha']):g}" if part == "dirichlet" else part


def partition_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Tidy rows (panel, client, class, count) of every distinct partition recorded in ``runs`` (iid: none)."""
    table = runs.runs
    if COUNTS not in table:
        return pd.DataFrame(columns=["panel", "client", "class", "count"])
    table = table[table[COUNTS].apply(lambda v: bool(listed(v)))]
    keys = [k for k in PANEL_KEYS if k in table]
    rows = []
    firsts = table.sort_values("seed").astype({k: str for k in keys}).drop_duplicates(keys)
    # panels in the settings' order, Dirichlet alpha as a number (0.1, 1, 100)
    alpha = pd.to_numeric(table.loc[firsts.index, "data.alpha"], errors="coerce") if "data.alpha" in table else 0
    firsts = firsts.assign(_alpha=alpha).sort_values([k for k in ("data.name", "data.partition") if k in keys]
                                                      + ["_alpha"], kind="stable")
    for idx in firsts.index:
        run = table.loc[idx]
        part, slow = partition_of(run), run.get("data.slow_client_classes")
        if isinstance(slow, str) and slow.startswith("["):
            part += f", classes {slow} on the slow client"
        label = f"{run['data.name']}: {part}, {int(run['num_clients'])} clients, seed {int(run['seed'])}"
        for client, counts in enumerate(listed(run[COUNTS]), start=1):
            rows += [{"panel": label, "client": client, "class": c, "count": int(n)}
                     for c, n in enumerate(counts)]
    return pd.DataFrame(rows, columns=["panel", "client", "class", "count"])


def draw_partition(frame: pd.DataFrame):
    """One heat map per partition: clients x classes, each cell the samples the client holds."""
    if frame.empty:
        raise ValueError("partition: no run records a partition (iid runs read the whole set)")
    panels = list(dict.fromkeys(frame["panel"]))
    fig, axes = panel_grid(len(panels), 3, panel=(4.2, 1.2 + 0.32 * frame["client"].max()))
    for ax, panel in zip(axes.flat, panels):
        grid = frame[frame["panel"] == panel].pivot(index="client", columns="class", values="count")
        heat_map(ax, grid, lambda n: str(int(n)) if n else "", grid.to_numpy().max() / 2, "xx-small", cmap="Blues",
                 vmin=0)
        head, *tail = panel.rsplit(", ", 2)   # two lines: neighbouring titles would touch on one
        ax.set(xlabel="class", ylabel="client", title=head + "\n" + ", ".join(tail))
        ax.title.set_fontsize("small")
    fig.suptitle("Clients with their own data: training samples of each class per client")
    return fig


# its axes: whatever a grid of clients with their own data sweeps (the partition and the methods
# compared on it); the figure draws one panel per partition among them
AXES = ("data.", "num_clients", "nsync", "num_epochs", "model.", "algo.", "protocol.", "cost.")
register_figure("partition", partition_frame, draw_partition, exps=("own_data",), axes=AXES)
