"""Staleness lab, ``momentum`` (``python -m repro.run +exp=momentum``): asynchrony acts like added
momentum (Mitliagkas, Zhang, Hadjis, Re 2016), measured on the quadratic. Owns the figure's tidy
frame, its drawing and the estimator behind them; how the implicit momentum is measured and why
so: docs/lab.md, "momentum"."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from repro.analysis.render import register_figure
from repro.analysis.figures import _new_figure, _require, client_color, client_label
from repro.analysis.load import Runs, is_diverged, recorded

WINDOW = 100          # server versions compared (the experiment's whole budget)
MU_GRID = np.round(np.arange(0.0, 0.9951, 0.0025), 4)   # theorem-form candidates
PREDICTION = "Mitliagkas et al. 2016"
COLUMNS = ("kind", "num_clients", "seed", "momentum", "version", "quantity", "source", "value",
           "diverged")


def momentum_response(curvatures, lr: float, momentum: float, steps: int) -> np.ndarray:
    """Per-mode responses w_i(t) / w_i(0), shape (modes, steps + 1), under torch's SGD momentum (our clients')."""
    l = np.asarray(curvatures, float)
    w, b, out = np.ones_like(l), 0.0, [np.ones_like(l)]
    for _ in range(steps):
        b = momentum * b + l * w   # torch's first buffer is the gradient itself: momentum * 0 + g
        w = w - lr * b
        out.append(w)
    return np.stack(out, 1)


def theorem_response(curvatures, lr: float, mu: float, steps: int) -> np.ndarray:
    """Per-mode responses of asynchronous SGD's expected dynamics at implicit momentum mu (Mitliagkas et al. 2016)."""
    l = np.atleast_1d(np.asarray(curvatures, float))   # a number: one mode
    w = np.ones_like(l)
    u, out = l * w, [w]
    for _ in range(steps):
        w = w - lr * u
        out.append(w)
        u = mu * u + (1 - mu) * l * w
    return np.stack(out, 1)


def fit_mode_energies(curvatures, curves) -> tuple[np.ndarray, float]:
    """(c, worst relative error): mode energies c >= 0 with ``loss(t) = sum_i c_i r_i(t)^2`` for each
    1-client curve (lr, momentum, versions, losses) of ``curves``, least squares on relative errors."""
    from scipy.optimize import nnls  # scikit-learn's dependency; loaded only when fitting
    rows = []
    for lr, m, versions, losses in curves:
        versions = np.asarray(versions, int)
        r = momentum_response(curvatures, lr, m, int(versions.max()))[:, versions]
        rows.append((r ** 2).T / np.asarray(losses)[:, None])
    a = np.vstack(rows)
    y = np.ones(len(a))
    c, _ = nnls(a, y, maxiter=50 * a.shape[1])
    return c, float(np.max(np.abs(a @ c - y)))


def refine_minimum(ms, distances) -> float:
    """The minimising momentum, parabola-refined through the best point's neighbours (at an end: that point)."""
    ms, d = np.asarray(ms, float), np.asarray(distances, float)
    ok = np.isfinite(d)
    ms, d = ms[ok], d[ok]
    if not len(ms):
        return float("nan")
    order = np.argsort(ms)
    ms, d = ms[order], d[order]
    i = int(np.argmin(d))
    if i == 0 or i == len(ms) - 1:
        return float(ms[i])
    x = -np.log1p(-ms[i - 1:i + 2])   # 1 - 1/N maps to ln N
    a, b, _ = np.polyfit(x, d[i - 1:i + 2], 2)
    vertex = -b / (2 * a) if a > 0 else x[1]
    return float(-np.expm1(-np.clip(vertex, x[0], x[2])))


def log_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared difference of log loss (NaN if either curve is not positive and finite)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(np.asarray(a, float)) - np.log(np.asarray(b, float))
    return float(np.mean(d ** 2)) if np.isfinite(d).all() else float("nan")


def implicit_momentum(curvatures, c, lr: float, versions, losses, response=theorem_response) -> float:
    """The mu whose ``response`` curve (mode energies ``c``, step ``lr``) best matches (versions, losses)."""
    versions = np.asarray(versions, int)
    steps = int(versions.max())
    dist = [log_distance(np.asarray(c) @ response(curvatures, lr, mu, steps)[:, versions] ** 2, losses)
            for mu in MU_GRID]
    return refine_minimum(MU_GRID, dist)


def direct_momentum(versions, losses, references: dict) -> float:
    """The momentum of the ``references`` curve closest to ``losses``, parabola-refined."""
    target = pd.Series(np.asarray(losses, float), index=np.asarray(versions, int))
    dist = {}
    for m, (v, l) in references.items():
        ref = pd.Series(np.asarray(l, float), index=np.asarray(v, int))
        common = target.index.intersection(ref.index)
        dist[m] = log_distance(target[common], ref[common]) if len(common) else float("nan")
    return refine_minimum(list(dist), list(dist.values()))


def momentum_frame(runs: Runs, target: float | None = None) -> pd.DataFrame:
    """Loss curves, implicit momentum per (N, seed), loss after the window per explicit momentum,
    and the best explicit momentum per N: measured and predicted, one long table (``kind``)."""
    info = runs.runs[runs.runs.get("data.name", pd.Series(dtype=object)) == "quadratic"]
    if info.empty:
        return pd.DataFrame(columns=COLUMNS)
    curvatures = tuple(recorded(info, "dataset.curvatures"))   # the runs' config.json records them
    ev = runs.evals.sort_values(["run_dir", "version"], kind="stable")
    ev = ev[ev["version"] <= WINDOW]
    curves = {d: (g["version"].to_numpy(int), g["train_loss"].to_numpy(float))
              for d, g in ev.groupby("run_dir", sort=False)}
    rows = []
    info = info.assign(diverged=is_diverged(info["status"]).to_numpy(),
                       momentum=info["algo.momentum"].astype(float), lr=info["algo.lr"].astype(float))

    def add(kind, n, seed, quantity, source, value, momentum=np.nan, version=np.nan, diverged=False):
        rows.append(dict(kind=kind, num_clients=int(n), seed=seed, momentum=momentum, version=version,
                         quantity=quantity, source=source, value=float(value), diverged=diverged))

    # 1. implicit momentum: every N-client run without explicit momentum, per seed
    first_seed = info.loc[info["num_clients"] == 1, "seed"].min()
    for seed, group in info.groupby("seed", sort=True):
        ones = group[(group["num_clients"] == 1) & ~group["diverged"] & group["run_dir"].isin(curves)]
        if ones.empty:
            continue
        c, worst = fit_mode_energies(curvatures, [
            (r.lr, r.momentum, *curves[r.run_dir]) for r in ones.itertuples()])
        add("fit", 1, seed, "worst_relative_error", "1-client runs vs mode model", worst)
        if worst > 0.05:
            warnings.warn(f"momentum: the quadratic's mode model fits seed {seed}'s 1-client runs "
                          f"only to {worst:.0%}; the implicit momentum is unreliable", stacklevel=2)
        refs = {r.momentum: curves[r.run_dir] for r in ones.itertuples()}
        plain = pd.Series(refs[0.0][1], index=refs[0.0][0]) if 0.0 in refs else None   # plain SGD
        for r in group[(group["momentum"] == 0) & group["run_dir"].isin(curves)].itertuples():
            n, (v, loss) = r.num_clients, curves[r.run_dir]
            add("implicit", n, seed, "implicit_momentum", PREDICTION, 1 - 1 / n)
            if r.diverged:
                continue
            add("implicit", n, seed, "implicit_momentum", "measured", implicit_momentum(
                curvatures, c, r.lr, v, loss))
            add("implicit", n, seed, "implicit_momentum", "direct match to 1-client runs",
                direct_momentum(v, loss, refs))
            if seed != first_seed or n == 1 or plain is None:
                continue   # panel (a) draws one seed's curves
            model = c @ theorem_response(curvatures, r.lr, 1 - 1 / n, int(v.max())) ** 2
            for source, values in (("measured", loss), (PREDICTION, model[v])):
                for ver, value in zip(v, values):   # the curves differ by a few %: show ratios
                    if ver in plain.index:
                        add("curve", n, seed, "relative_to_1_client_sgd", source, value / plain[ver],
                            version=ver)

    # 2. explicit momentum: loss after the window relative to the start, per run
    for r in info.itertuples():
        v, loss = curves.get(r.run_dir, (np.array([0]), np.array([np.nan])))
        done = not r.diverged and v.max() >= WINDOW
        ratio = loss[v == WINDOW][0] / loss[v == 0][0] if done and (v == 0).any() else np.nan
        add("explicit", r.num_clients, r.seed, "loss_ratio_after_window", "measured", ratio,
            momentum=r.momentum, diverged=bool(r.diverged))
    explicit = pd.DataFrame([row for row in rows if row["kind"] == "explicit"])
    best = {}
    for n, group in explicit.groupby("num_clients", sort=True):
        mean = group.groupby("momentum")["value"].apply(
            lambda s: np.mean(np.log10(s)) if s.notna().all() else np.nan)   # any seed diverged: out
        best[n] = refine_minimum(mean.index, mean.to_numpy())
        add("best", n, np.nan, "best_explicit_momentum", "measured", best[n])
    if 1 in best and np.isfinite(best[1]):
        for n in best:
            add("best", n, np.nan, "best_explicit_momentum", PREDICTION,
                max(0.0, best[1] - (1 - 1 / n)))
    return pd.DataFrame(rows, columns=COLUMNS)


def draw_momentum(frame: pd.DataFrame) -> Figure:
    """(a) loss of N plain-SGD clients and of the predicted momentum-SGD curve over one plain-SGD client's;
    (b) implicit momentum against 1 - 1/N; (c) loss after the window per explicit momentum, with the best."""
    _require(frame, "momentum")
    fig, axes = _new_figure(1, 3, panel=(4.8, 3.8))
    ax_curve, ax_mu, ax_exp = axes[0]
    counts = sorted(int(n) for n in frame["num_clients"].dropna().unique())

    rel = frame[(frame["kind"] == "curve") & (frame["quantity"] == "relative_to_1_client_sgd")]
    seed0 = rel["seed"].min() if len(rel) else float("nan")
    for n in [n for n in counts if n > 1]:
        for source, style, label in (("measured", "-", f"{client_label(n)}, plain SGD (measured)"),
                                     (PREDICTION, "--", f"1 client, momentum $\\mu$ = {1 - 1 / n:.3g} (prediction)")):
            c = rel[(rel["num_clients"] == n) & (rel["seed"] == seed0) & (rel["source"] == source)]
            if len(c):
                ax_curve.plot(c["version"], c["value"], linestyle=style, color=client_color(n), label=label)
    ax_curve.axhline(1.0, color="0.5", lw=0.8)
    ax_curve.set(xlabel="server version (updates applied)",
                 ylabel="training loss / that of 1 plain-SGD client",
                 title=f"(a) N asynchronous clients look like momentum\n(seed {seed0:g}; dashed: "
                       f"prediction, {PREDICTION})")
    ax_curve.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)

    grid = np.linspace(1, max(counts), 200)
    ax_mu.plot(grid, 1 - 1 / grid, "k--", label=f"prediction: $\\mu = 1 - 1/N$ ({PREDICTION})")
    part = frame[(frame["kind"] == "implicit") & (frame["source"] == "measured")]
    if len(part):
        ax_mu.plot(part["num_clients"], part["value"], "o", ms=4, alpha=0.4, color="C0",
                   label="measured, one per seed")
        mean = part.groupby("num_clients")["value"].mean()
        ax_mu.plot(mean.index, mean.to_numpy(), "o", ms=8, mfc="none", mew=1.5, color="C0",
                   label="measured, mean over seeds")
        for n, value in mean.items():
            ax_mu.annotate(f"{value:.3f}", (n, value), xytext=(6, -12), textcoords="offset points",
                           fontsize="small", color="C0")
    ax_mu.set(xlabel="clients N (exponential step times)", ylabel="implicit momentum $\\mu$",
              xticks=counts, ylim=(-0.05, 1.0), title="(b) implicit momentum of asynchrony\n"
              f"(closest theorem-form curve, {WINDOW} versions)")
    ax_mu.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.2))

    exp = frame[frame["kind"] == "explicit"]
    best = frame[frame["kind"] == "best"].set_index(["num_clients", "source"])["value"]
    top = np.nanmax(exp["value"].to_numpy()) * 3 if exp["value"].notna().any() else 1.0
    for n in counts:
        part, color = exp[exp["num_clients"] == n], client_color(n)
        stats = part.groupby("momentum")["value"].agg(["min", "max"])
        geo = part.groupby("momentum")["value"].apply(lambda s: 10 ** np.mean(np.log10(s)))
        ax_exp.plot(geo.index, geo.to_numpy(), marker="o", ms=3, color=color, label=client_label(n))
        ax_exp.fill_between(stats.index, stats["min"], stats["max"], color=color, alpha=0.15, lw=0)
        bad = part[part["diverged"].astype(bool)]
        ax_exp.plot(bad["momentum"], np.full(len(bad), top), "x", color=color, ls="none",
                    label="a seed diverged" if n == counts[-1] else "_nolegend_")
        m, predicted = best.get((n, "measured"), np.nan), best.get((n, PREDICTION), np.nan)
        if np.isfinite(m):
            y = 10 ** np.interp(m, geo.dropna().index, np.log10(geo.dropna().to_numpy()))
            ax_exp.plot([m], [y], "*", ms=12, color=color, mec="k",
                        label="measured best (parabola through 3 best)" if n == counts[-1] else "_nolegend_")
        if np.isfinite(predicted):
            ax_exp.axvline(predicted, color=color, ls="--", lw=1)
    ax_exp.plot([], [], color="0.4", ls="--", lw=1,   # one legend entry for the N coloured lines
                label=f"predicted best: max(0, $\\mu^*_{{1\\ client}} - (1 - 1/N)$) ({PREDICTION})")
    ax_exp.set(yscale="log", xlabel="explicit momentum m (each client's buffer)",
               ylabel=f"loss after {WINDOW} updates / initial loss (log)",
               title="(c) the best explicit momentum shrinks with N\n(line: geometric mean over "
                     "seeds, band: min-max)")
    ax_exp.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    fig.suptitle("Asynchrony begets momentum: quadratic $\\frac{1}{2}\\Sigma_i\\, l_i w_i^2$ (exact "
                 "gradients), exponential step times: staleness geometric with mean N $-$ 1")
    return fig


register_figure("momentum", momentum_frame, draw_momentum, exps=("momentum",), axes=("num_clients", "algo.momentum"))
