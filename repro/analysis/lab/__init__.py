"""The staleness lab's figures, each registering itself on import, and the steps that several of
them share: a run's message bytes, a list cell of the runs' table, a frame's last step, a legend sample, a heat map."""
from __future__ import annotations

import json
from typing import Callable

import numpy as np
import pandas as pd

from repro.analysis.load import recorded
from repro.sim.cost import path_bandwidth


def message_bytes(run: pd.Series, cost) -> int:
    """The network's bytes as the run's config.json records them (``network.param_bytes``), for the
    cost model to send; 0 where ``cost.comm_params`` sets the size, or links are free."""
    if cost.comm_params is not None or path_bandwidth(cost) is None:
        return 0
    return int(recorded(pd.DataFrame([run]), "network.param_bytes"))


def listed(cell) -> list:
    """A list that flattening config.json or summary.json left as JSON text ([]: any other)."""
    return json.loads(cell) if isinstance(cell, str) and cell.startswith("[") else []


def tidy(frame: pd.DataFrame, columns, by: list[str], **ranks) -> pd.DataFrame:
    """``frame``'s ``columns``, stably sorted by ``by``; a column named in ``ranks`` by its values' place
    in that list (the unlisted last)."""
    keys = {f"_{c}": frame[c].map({v: i for i, v in enumerate(order)}).fillna(len(order)) for c, order in ranks.items()}
    by = [f"_{c}" if c in ranks else c for c in by]
    return frame.assign(**keys).sort_values(by, kind="stable")[list(columns)].reset_index(drop=True)


def legend_key(color="0.3", **style):
    """A legend's sample of ``style`` (a line with no data), grey unless ``color`` says otherwise."""
    from matplotlib.lines import Line2D
    return Line2D([], [], color=color, **style)


def heat_map(ax, grid: pd.DataFrame, text: Callable[[float], str], dark: float, fontsize: str, **style):
    """``grid`` (rows x integer columns) as a labelled image, each cell's ``text`` in it (white above ``dark``)."""
    values = grid.to_numpy()
    image = ax.imshow(values, aspect="auto", **style)
    for (i, j), v in np.ndenumerate(values):
        if text(v):
            ax.text(j, i, text(v), ha="center", va="center", fontsize=fontsize,
                    color="white" if v > dark else "black")
    ax.set_xticks(range(values.shape[1]), [str(int(c)) for c in grid.columns], fontsize="small")
    ax.set_yticks(range(values.shape[0]), [str(k) for k in grid.index], fontsize="small")
    ax.grid(False)
    return image
