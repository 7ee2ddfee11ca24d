"""Figure functions: each ``figN(frame) -> Figure`` is pure, drawing the tidy frame its
``figN_frame`` (:mod:`repro.analysis.frames`) builds, on a plain :class:`Figure` (no pyplot, no GUI
backend). Owns the style, each client count's colour, and diverged runs' drawing: a dotted curve
ending in an ``x``, never in a mean or a band.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

CLIENT_LADDER = (1, 2, 4, 8, 16, 32, 64)
_PALETTE = sns.color_palette("colorblind", 10)  # fixed: client ladder first, then the rest
DIVERGED_MARKER = dict(marker="x", markersize=7, markeredgewidth=2)
BAND_NOTE = "line: mean over seeds, band: min-max"
NSYNC_MARKERS = ("o", "s", "^", "D", "P", "*", "h")   # lines stay apart where colours blur


def style_rc() -> dict[str, Any]:
    """Our style, seaborn "paper" context on a white grid: every figure is drawn in it (``save_figure``),
    by a run and by the command line alike, and in nothing else (no global theme, no seaborn palette)."""
    return {**sns.plotting_context("paper"), **sns.axes_style("whitegrid"), "figure.dpi": 100, "savefig.dpi": 150,
            "savefig.bbox": "tight", "legend.frameon": False, "axes.titlesize": "medium"}


def client_color(num_clients: int) -> tuple[float, float, float]:
    """The colour of a client count: the same in every figure (1, 2, 4, 8, ... first)."""
    n = int(num_clients)
    return _PALETTE[CLIENT_LADDER.index(n)] if n in CLIENT_LADDER else _PALETTE[7 + n % 3]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("s" if n != 1 else "")


def client_label(num_clients: int) -> str:
    return plural(int(num_clients), "client")


def nsync_colors(values: Iterable[Any]) -> dict[int, tuple[float, float, float]]:
    """A sequential colour per nsync value, small to large: viridis short of its pale yellow (five
    levels stay apart; "crest" ran them together)."""
    levels = sorted({int(v) for v in values})
    cmap = mpl.colormaps["viridis"]
    steps = np.linspace(0.0, 0.85, max(len(levels), 2))[:max(len(levels), 1)]
    return {k: tuple(cmap(x)[:3]) for k, x in zip(levels, steps)}


def _clock(frame: pd.DataFrame) -> str:
    clocks = sorted({str(c) for c in frame["clock"].dropna()}) if "clock" in frame else []
    if len(clocks) > 1:
        warnings.warn(f"frame mixes clocks {clocks}: times are not comparable", stacklevel=4)
    return "/".join(clocks) or "unknown clock"


def _new_figure(nrows: int = 1, ncols: int = 1, panel=(4.8, 3.4), **kw) -> tuple[Figure, Any]:
    fig = Figure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def panel_grid(count: int, max_cols: int, panel: tuple[float, float], **kw) -> tuple[Figure, Any]:
    """A figure with ``count`` panels, at most ``max_cols`` to a row (the spare ones hidden)."""
    cols = min(count, max_cols)
    fig, axes = _new_figure(-(-count // cols), cols, panel=panel, **kw)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes


def _require(frame: pd.DataFrame, name: str) -> None:
    if frame.empty:
        raise ValueError(f"{name}: the frame has no rows (no usable runs)")


def ordered(values: Iterable[Any], order: Iterable[Any]) -> list:
    """The distinct ``values``: those named in ``order`` first, in its order, then the rest sorted."""
    present, order = set(values), list(order)
    return [v for v in order if v in present] + sorted(present - set(order))


def plain_log_ticks(axis, subs: tuple[float, ...] | None = None) -> None:
    """A log axis labelled in plain numbers (0.5, 2, 10), major ticks at ``subs`` of each decade
    (None: the scale's own), minor ticks unlabelled."""
    if subs is not None:
        axis.set_major_locator(mpl.ticker.LogLocator(subs=subs))
    axis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(mpl.ticker.NullFormatter())


def mean_minmax(ax, rows: pd.DataFrame, shift: float = 1.0, **style) -> None:
    """The mean ``value`` over seeds at each ``num_clients`` (times ``shift``, to set series
    apart), bars from min to max; a client count without a number is left out."""
    stats = rows.groupby("num_clients")["value"].agg(["mean", "min", "max"]).dropna()
    if len(stats):
        ax.errorbar(stats.index.to_numpy(float) * shift, stats["mean"],
                    yerr=[stats["mean"] - stats["min"], stats["max"] - stats["mean"]], **style)


def mean_band(curves: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Mean/min/max of ``y`` over runs, interpolated at the union of their ``x`` values within the
    range every run covers (so the mean never jumps when a run ends)."""
    per_run = []
    for _, run in curves.groupby("run_dir", sort=True):
        run = run[np.isfinite(run[x]) & np.isfinite(run[y])].sort_values(x, kind="stable")
        if len(run):
            per_run.append((run[x].to_numpy(float), run[y].to_numpy(float)))
    if not per_run:
        return pd.DataFrame(columns=[x, "mean", "lo", "hi", "n"])
    lo, hi = max(xs[0] for xs, _ in per_run), min(xs[-1] for xs, _ in per_run)
    grid = np.unique(np.concatenate([xs for xs, _ in per_run]))
    if lo <= hi:
        grid = grid[(grid >= lo) & (grid <= hi)]
    ys = np.vstack([np.interp(grid, xs, vs, left=np.nan, right=np.nan) for xs, vs in per_run])
    with warnings.catch_warnings():  # all-NaN columns only in the no-overlap fallback
        warnings.simplefilter("ignore", RuntimeWarning)
        return pd.DataFrame({x: grid, "mean": np.nanmean(ys, 0), "lo": np.nanmin(ys, 0),
                             "hi": np.nanmax(ys, 0), "n": np.isfinite(ys).sum(0)})


def draw_curves(ax, group: pd.DataFrame, x: str, y: str, color, label: str,
                linestyle: str = "-") -> None:
    """Mean line and min-max band of the group's finished runs; diverged runs on their own."""
    ok = group[~group["diverged"].astype(bool)]
    if len(ok):
        band = mean_band(ok, x, y)
        ax.plot(band[x], band["mean"], color=color, linestyle=linestyle, label=label)
        if ok["run_dir"].nunique() > 1:
            ax.fill_between(band[x], band["lo"], band["hi"], color=color, alpha=0.2, lw=0)
    bad = group[group["diverged"].astype(bool)]
    for i, (_, run) in enumerate(bad.groupby("run_dir", sort=True)):
        # dotted to its last finite point, an x there (at 100% when it has no finite point at all)
        run = run[np.isfinite(run[x])].sort_values(x, kind="stable")
        fin = run[np.isfinite(run[y])]
        xs, ys = (fin[x].to_numpy(), fin[y].to_numpy()) if len(fin) else (
            run[x].to_numpy()[:1] if len(run) else np.array([0.0]), np.array([100.0]))
        ax.plot(xs, ys, color=color, linestyle=":", linewidth=1.2, markevery=[len(xs) - 1],
                label=f"{label} (diverged)" if i == 0 else "_nolegend_", **DIVERGED_MARKER)


def _legend(fig: Figure, axes: Iterable, title: str | None = None, **kw) -> None:
    """One legend for the whole figure, labels de-duplicated across panels."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(lab, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), **{"title": title, "loc": "outside lower center",
                                                       "ncols": min(len(seen), 5), **kw})


def _seeds(frame: pd.DataFrame) -> str:
    return plural(frame["seed"].nunique(), "seed")


def fig1(frame: pd.DataFrame) -> Figure:
    """Single-client baseline: training and test error (%) vs epoch, mean and band over seeds."""
    _require(frame, "fig1")
    fig, axes = _new_figure()
    ax = axes[0, 0]
    color = client_color(1)
    for metric, style in (("training error", "-"), ("test error", "--")):
        draw_curves(ax, frame[frame["metric"] == metric], "epoch", "error_pct", color, metric,
                    linestyle=style)
    ax.set(xlabel="epoch", ylabel="error (%)", ylim=(0, None),
           title=f"Fig. 1: single-client baseline\n({_seeds(frame)}; {BAND_NOTE})")
    ax.legend()
    return fig


def _error_vs_time(ax, frame: pd.DataFrame, all_frame: pd.DataFrame) -> None:
    """Training error vs time of ``frame``, symlog y (errors span 90% to a fraction of a percent).
    x ends a little after the last multi-client run of ``all_frame`` (every panel): the 1-client
    runs, N times longer, would squeeze the rest to the left edge; their cut-off is annotated."""
    for n, group in frame.groupby("num_clients", sort=True):
        draw_curves(ax, group, "time_s", "train_error_pct", client_color(n), client_label(n))
    ax.set_yscale("symlog", linthresh=1.0, linscale=0.5)
    ax.set(xlabel=f"time (s, {_clock(all_frame)})", ylabel="training error (%)", ylim=(0, 100))
    ax.yaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    multi = all_frame[all_frame["num_clients"] > 1]["time_s"]
    single = all_frame[all_frame["num_clients"] == 1]["time_s"]
    if len(multi) and len(single) and multi.max() > 0 and single.max() > 1.5 * multi.max():
        right = 1.25 * multi.max()
        ax.set_xlim(0, right)
        drawn = frame[frame["num_clients"] == 1]["time_s"]
        if len(drawn) and drawn.max() > right:  # only a curve that is actually cut off
            ax.annotate(f"1 client: to {drawn.max():.0f} s", xy=(0.98, 0.97),
                        xycoords="axes fraction", ha="right", va="top", fontsize="small",
                        color=client_color(1))


def fig2(frame: pd.DataFrame) -> Figure:
    """Cold start: training error (%) vs time, one line per client count."""
    _require(frame, "fig2")
    fig, axes = _new_figure(panel=(5.2, 3.6))
    ax = axes[0, 0]
    _error_vs_time(ax, frame, frame)
    starts = "/".join(sorted({str(s) for s in frame["start"].dropna()})) or "cold"
    ax.set_title(f"Fig. 2: {starts} start, training error vs time\n"
                 f"({_seeds(frame)}; {BAND_NOTE})")
    ax.legend(title="clients")
    return fig


def fig3(frame: pd.DataFrame) -> Figure:
    """Warm start: one panel per nsync (shared y), one line per client count; a panel without a
    1-client run of its own nsync shows the smallest nsync's (as the speedup table does)."""
    _require(frame, "fig3")
    levels = sorted(frame["nsync"].unique())
    fig, axes = panel_grid(len(levels), 4, panel=(3.4, 3.3), sharey=True, sharex=True)
    ones = frame[frame["num_clients"] == 1]
    fallback = ones[ones["nsync"] == ones["nsync"].min()] if len(ones) else ones
    for ax, k in zip(axes.flat, levels):
        panel = frame[frame["nsync"] == k]
        if not (panel["num_clients"] == 1).any():
            panel = pd.concat([fallback, panel])
        _error_vs_time(ax, panel, frame)
        ax.set_title(f"nsync = {int(k)}")
    for ax in axes[:, 1:].flat:
        ax.set_ylabel("")
    starts = "/".join(sorted({str(s) for s in frame["start"].dropna()})) or "warm"
    fig.suptitle(f"Fig. 3: {starts} start, training error vs time per nsync\n"
                 f"({_seeds(frame)}; {BAND_NOTE})")
    _legend(fig, axes.flat, title="clients")
    return fig


def fig4(frame: pd.DataFrame) -> Figure:
    """Speedup vs clients, one line (mean over seeds, band min-max) per nsync; a diverged run is an
    ``x`` at 0, one that never reached the target a ``v`` at 0."""
    _require(frame, "fig4")
    fig, axes = _new_figure(panel=(7.0, 3.8))   # room for the legend beside the axes
    ax = axes[0, 0]
    counts = sorted(int(n) for n in frame["num_clients"].unique())
    ax.plot(counts, counts, color="0.3", linestyle="--", label="ideal")
    colors = nsync_colors(frame["nsync"])   # small to large nsync, as are the markers
    markers = {k: NSYNC_MARKERS[i % len(NSYNC_MARKERS)] for i, k in enumerate(colors)}
    missed = {}
    for k, group in frame.groupby("nsync", sort=True):
        color, marker = colors[int(k)], markers[int(k)]
        ok = group[group["outcome"] == "ok"]
        stats = ok.groupby("num_clients")["speedup"].agg(["mean", "min", "max"])
        ax.plot(stats.index, stats["mean"], color=color, marker=marker, label=f"nsync = {int(k)}")
        ax.fill_between(stats.index, stats["min"], stats["max"], color=color, alpha=0.15, lw=0)
        for outcome, symbol, what in (("diverged", "x", "diverged"),
                                      ("not_reached", "v", "target not reached")):
            miss = group[group["outcome"] == outcome]
            if len(miss):
                ax.plot(miss["num_clients"], np.zeros(len(miss)), linestyle="none", color=color,
                        label="_nolegend_", **{**DIVERGED_MARKER, "marker": symbol})
                missed[what] = symbol
    for what, symbol in missed.items():   # one entry each: the marker's colour is its nsync's
        ax.plot([], [], linestyle="none", color="0.4", label=f"{what} (at 0)",
                **{**DIVERGED_MARKER, "marker": symbol})
    target = float(frame["target"].iloc[0])
    ax.set(xlabel="clients", ylabel="speedup (time 1 client / time N clients)",
           xticks=counts, ylim=(-0.4, None),
           title=f"Fig. 4: speedup to {100 * target:g}% training error\n"
                 f"({_clock(frame)} time; {_seeds(frame)}; {BAND_NOTE})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return fig


def staleness(frame: pd.DataFrame) -> Figure:
    """ECDFs of staleness in server versions (top row) and local steps (middle: versions x nsync),
    a panel per nsync, a line per client count with equal-speed clients' mean marked; bottom: the
    final test error per client count."""
    _require(frame, "staleness")
    pushes = frame[frame["quantity"] == "staleness"]
    levels = sorted(int(k) for k in frame["nsync"].unique())
    fig, axes = _new_figure(3, len(levels), panel=(3.4, 2.6))
    for col, k in enumerate(levels):
        for row, unit in enumerate(("server versions", "local steps")):
            ax = axes[row, col]
            scale = 1 if row == 0 else k
            for n, group in pushes[pushes["nsync"] == k].groupby("num_clients", sort=True):
                hist = group.groupby("value")["count"].sum()   # sorted by value: its ECDF, from 0
                xs, counts = hist.index.to_numpy(float) * scale, hist.to_numpy(float)
                cum = np.cumsum(counts) / max(counts.sum(), 1)
                color = client_color(n)
                ax.step(np.concatenate([[xs[0]], xs]), np.concatenate([[0.0], cum]), where="post", color=color,
                        label=client_label(n))
                ax.axvline((int(n) - 1) * scale, color=color, linestyle="--", linewidth=0.9)
            ax.set(xlabel=f"staleness ({unit})", ylim=(0, 1.02),
                   ylabel="fraction of pushes <= x" if col == 0 else "",
                   title=f"nsync = {k}" if row == 0 else "")
    axes[0, 0].plot([], [], color="0.4", linestyle="--",
                    label="expected mean, equal speeds: N - 1 versions = (N - 1) x nsync steps")
    final = frame[frame["quantity"] == "final_test_error_pct"]
    top = np.nanmax(np.where(np.isfinite(final["value"]), final["value"], np.nan)) if len(final) else 1.0
    for col, k in enumerate(levels):
        ax = axes[2, col]
        group = final[(final["nsync"] == k) & ~final["diverged"].astype(bool)]
        mean_minmax(ax, group, color="0.2", marker="o", capsize=3)
        bad = final[(final["nsync"] == k) & final["diverged"].astype(bool)]
        if len(bad):
            ax.plot(bad["num_clients"], bad["value"].where(np.isfinite(bad["value"]), 100.0),
                    linestyle="none", color="0.2", label="diverged", **DIVERGED_MARKER)
        counts = sorted(int(n) for n in final["num_clients"].unique())
        ax.set(xlabel="clients", xticks=counts, ylim=(0, 1.1 * top),   # one scale: panels compare
               ylabel="final test error (%)" if col == 0 else "")
    _legend(fig, axes.flat, title=None)
    fig.suptitle(f"Staleness of applied pushes, and what it costs ({_seeds(frame)}; dashed: the "
                 "expected mean with equally fast clients)")
    return fig
