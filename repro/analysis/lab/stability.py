"""Staleness lab, ``stability`` (``python -m repro.run +exp=stability``): learning rate x staleness
-> converges or diverges. Owns the figure's tidy frame, drawing, outcome rule and the boundary
formula of Levin & May (1976); the theory, the outcomes and the measured boundary: docs/lab.md,
"stability"."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from repro.analysis.render import register_figure
from repro.analysis.figures import _PALETTE, _legend, _new_figure, _require
from repro.analysis.configs import one_run_each
from repro.analysis.load import Runs, finite, recorded

CONVERGED_FACTOR = 10.0   # converged: the loss fell at least this many times
STALLED_FRACTION = 0.5    # stalled: the loss ended above this fraction of the initial one
STABLE = ("converged", "slow")
OUTCOMES = ("converged", "slow", "stalled", "diverged")
LR_TICKS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
COLUMNS = ("kind", "problem", "model", "batch_size", "num_clients", "tau", "lr", "lr_lo", "lr_hi",
           "outcome", "status", "initial_loss", "final_loss", "staleness", "source", "run_dir")
THEORY = "theory: lr * l_max < 2 sin(pi / (4 tau + 2)) (Levin & May 1976)"
ANCHORED = "theory's shape, anchored at N = 1 (Levin & May 1976)"
LABELS = {THEORY: r"theory: $lr \cdot l_{max} < 2 \sin(\pi / (4\tau + 2))$ (Levin & May 1976)",
          ANCHORED: r"theory's shape $\propto \sin(\pi / (4\tau + 2))$, anchored at N = 1 (Levin & May 1976)"}
STYLE = {"converged": dict(marker="o", color=_PALETTE[2],
                           label=f"converged (final loss $\\leq$ initial / {CONVERGED_FACTOR:g})"),
         "slow": dict(marker="o", color=_PALETTE[2], mfc="none",
                      label=f"slow (loss fell, to between 1/{CONVERGED_FACTOR:g} and "
                            f"{STALLED_FRACTION:g} of the initial)"),
         "stalled": dict(marker="s", color="0.45",
                         label=f"stalled (final loss above {STALLED_FRACTION:g} x the initial)"),
         "diverged": dict(marker="X", color=_PALETTE[3], label="diverged (stopped: loss > 10 x the initial)")}


def critical_lr(tau, l_max: float = 1.0):
    """Levin & May (1976): w_{t+1} = w_t - lr l w_{t-tau} is stable iff lr l < 2 sin(pi/(4 tau+2))."""
    return 2.0 * np.sin(np.pi / (4.0 * np.asarray(tau, float) + 2.0)) / l_max


def outcome(status: str, initial_loss: float, final_loss: float) -> str:
    """One run's outcome (docs/lab.md, "stability")."""
    if status == "diverged" or not (finite(initial_loss) and finite(final_loss)):
        return "diverged"
    ratio = final_loss / initial_loss
    if ratio <= 1.0 / CONVERGED_FACTOR:
        return "converged"
    return "slow" if ratio <= STALLED_FRACTION else "stalled"


def measured_boundary(lrs, outcomes) -> tuple[float, float, float]:
    """(lr_lo, lr_hi, estimate) of the measured boundary (docs/lab.md); NaN where the ladder does not bracket it."""
    lrs, outs = np.asarray(lrs, float), np.asarray(outcomes, object)
    unstable = lrs[~np.isin(outs, STABLE)]
    hi = unstable.min() if len(unstable) else np.nan
    stable = lrs[np.isin(outs, STABLE) & ~(lrs >= hi)]
    lo = stable.max() if len(stable) else np.nan
    return float(lo), float(hi), float(np.sqrt(lo * hi))


def stability_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Runs, measured and predicted boundaries, and the theory curve, one long table (``kind``)."""
    if runs.runs.empty:
        return pd.DataFrame(columns=COLUMNS)
    one_run_each(runs.runs, ["data.name", "num_clients", "algo.lr", "seed"], "problem, client count, lr and seed")
    info = runs.runs.set_index("run_dir")
    ev = runs.evals.sort_values(["run_dir", "version"], kind="stable").groupby("run_dir")
    losses = pd.DataFrame({"initial_loss": ev["train_loss"].first(), "final_loss": ev["train_loss"].last()})
    steady = runs.updates[runs.updates["version"] > runs.updates["num_clients"]]   # after the start-up pushes
    cells = pd.DataFrame({
        "kind": "run", "problem": info["data.name"], "model": info["model.name"],
        "batch_size": info["algo.batch_size"], "num_clients": info["num_clients"].astype(int),
        "tau": info["num_clients"].astype(int) - 1, "lr": info["algo.lr"].astype(float),
        "status": info["status"]}).join(losses).join(steady.groupby("run_dir")["staleness"].mean())
    odd = cells[cells["staleness"].notna() & (cells["staleness"] != cells["tau"])]
    if len(odd):
        warnings.warn(f"stability: {len(odd)} runs are not exactly N - 1 stale (e.g. {odd.index[0]}): "
                      "the delay theory assumes cost=uniform and nsync=1", stacklevel=2)
    short = info[(info["data.name"] == "quadratic") & (info["status"] != "diverged")
                 & (info["final_version"] < 100)]
    if len(short):   # near the bound the quadratic needs ~100 steps to show which side it is on
        warnings.warn(f"stability: {len(short)} quadratic runs ended after fewer than 100 updates "
                      "(num_epochs is one step there): cells near the bound may read 'slow'",
                      stacklevel=2)
    cells["outcome"] = [outcome(s, a, b) for s, a, b in
                        zip(cells["status"], cells["initial_loss"], cells["final_loss"])]
    cells = cells.reset_index().sort_values(["problem", "num_clients", "lr"], kind="stable")
    rows = [cells]
    for problem, group in cells.groupby("problem", sort=True):
        ident = dict(problem=problem, model=group["model"].iloc[0], batch_size=group["batch_size"].iloc[0])
        bounds = []
        for n, g in group.groupby("num_clients", sort=True):
            lo, hi, est = measured_boundary(g["lr"], g["outcome"])
            bounds.append(dict(kind="boundary", **ident, num_clients=n, tau=n - 1, lr=est, lr_lo=lo,
                               lr_hi=hi, source="measured"))
        bounds = pd.DataFrame(bounds)
        taus = np.round(np.linspace(0, max(group["tau"].max(), 1), 141), 3)
        if problem == "quadratic":   # its curvatures are recorded by the runs (config.json)
            quadratic = runs.runs[runs.runs["data.name"] == "quadratic"]
            scale, source = 1.0 / max(recorded(quadratic, "dataset.curvatures")), THEORY
        else:   # the same shape through the measured 1-client boundary: 2 / l_max := lr*(N = 1)
            anchor = bounds.loc[bounds["tau"] == 0, "lr"]
            scale, source = (anchor.iloc[0] / 2.0 if len(anchor) else np.nan), ANCHORED
        predicted = bounds[["num_clients", "tau"]].assign(
            kind="boundary", **ident, lr=critical_lr(bounds["tau"]) * scale, source=source)
        theory = pd.DataFrame(dict(kind="theory", **ident, tau=taus, lr=critical_lr(taus) * scale,
                                   source=source))
        rows += [bounds, predicted, theory if np.isfinite(scale) else theory.iloc[:0]]
    return pd.concat(rows, ignore_index=True).reindex(columns=list(COLUMNS))


def draw_stability(frame: pd.DataFrame) -> Figure:
    """One panel per problem: each cell's outcome, the measured boundary (bracketed), the predicted (dashed)."""
    _require(frame, "stability")
    problems = sorted(frame["problem"].dropna().unique(), key=lambda p: (p != "quadratic", p))
    fig, axes = _new_figure(1, len(problems), panel=(4.6, 4.0), sharey=True)
    for ax, problem in zip(axes[0], problems):
        part = frame[frame["problem"] == problem]
        cells = part[part["kind"] == "run"]
        for name in OUTCOMES:
            sel = cells[cells["outcome"] == name]
            ax.plot(sel["tau"], sel["lr"], ls="none", ms=8, mew=1.5, **STYLE[name])
        theory = part[part["kind"] == "theory"]
        if len(theory):   # exact for the quadratic (dashed); only its shape elsewhere (dash-dot)
            source = theory["source"].iloc[0]
            ax.plot(theory["tau"], theory["lr"], "k--" if source == THEORY else "k-.", lw=1.5,
                    label=LABELS.get(source, source))
        b = part[(part["kind"] == "boundary") & (part["source"] == "measured")]
        ok = b[np.isfinite(b["lr"])]
        ax.errorbar(ok["tau"] + 0.25, ok["lr"], yerr=[ok["lr"] - ok["lr_lo"], ok["lr_hi"] - ok["lr"]],
                    fmt="D", color="k", ms=5, capsize=3, lw=1,
                    label="measured boundary (bar: last stable .. first unstable lr)")
        counts = sorted(int(n) for n in cells["num_clients"].unique())
        ax.set(yscale="log", yticks=LR_TICKS, yticklabels=[f"{t:g}" for t in LR_TICKS],
               xticks=[n - 1 for n in counts],
               xticklabels=[f"{n - 1}\n(N={n})" for n in counts],
               xlabel=r"staleness $\tau$ = N $-$ 1 (server versions)",
               title="quadratic $\\frac{1}{2}\\Sigma_i\\, l_i w_i^2$\n($l_i$ = 0.01 .. 1, exact gradients)"
               if problem == "quadratic" else
               f"{part['model'].iloc[0]} on {problem}\n(minibatch {int(part['batch_size'].iloc[0])}, plain SGD)")
    axes[0, 0].set_ylabel("learning rate lr (log scale)")
    axes[0, 0].yaxis.set_minor_formatter(NullFormatter())
    _legend(fig, axes.flat, ncols=2, fontsize="small")
    fig.suptitle("Stable or not: learning rate x staleness (uniform costs, nsync = 1: every push "
                 "is N - 1 versions stale)")
    return fig


# its axes: +problem chooses data, model, batch size and budget
register_figure("stability", stability_frame, draw_stability, exps=("stability",),
                axes=("num_clients", "algo.lr", "algo.batch_size", "data.", "model.", "num_epochs"))
