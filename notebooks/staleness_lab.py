# %% [markdown]
# # The staleness lab, through the Python API
#
# It tells TEACHING.md's story with `repro.api.simulate`: what staleness is, why it hurts (a
# smaller stable step, added momentum), what synchrony costs, and what helps. Every measurement
# is printed beside the published prediction, and each `check(...)` line fails loudly if a
# measurement leaves the range the lesson promises.
#
# Two forms of one lesson: `notebooks/staleness_lab.ipynb`, a Jupyter notebook (committed with
# its outputs), and `notebooks/staleness_lab.py`, its percent-format twin, which runs as a plain
# script (figures saved to `figures/notebook/`):
#
#     python notebooks/staleness_lab.py                       # the whole lab, a few minutes
#     REPRO_LAB_QUICK=1 python notebooks/staleness_lab.py     # shrunk budgets, under a minute
#
# The script is the source: after editing it, `python notebooks/build_notebook.py` rebuilds and
# runs the notebook (the test suite fails when the two differ).

# %%
# Set-up: install the package when this kernel cannot import it (a fresh Jupyter or Colab
# kernel). Already installed, this cell does nothing and needs no network.
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

if importlib.util.find_spec("repro") is None:
    # a checkout above or beside this notebook (Jupyter started inside it, or a clone in Colab's
    # /content), else what REPRO_SOURCE names: a folder, a wheel or a git URL, as pip takes it
    here = [Path.cwd(), *Path.cwd().parents, *sorted(Path.cwd().glob("*/"))]
    checkout = next((p for p in here if (p / "pyproject.toml").is_file() and (p / "repro").is_dir()), None)
    source = os.environ.get("REPRO_SOURCE") or (str(checkout) if checkout else None)
    if source is None:
        raise SystemExit("cannot import repro: clone gpu-asgd-repro next to this notebook, or set "
                         "REPRO_SOURCE to a checkout, a wheel or a git URL of it")
    subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", source])
    importlib.invalidate_caches()

# %%
import math

import numpy as np
import torch

import repro.api as asgd
from repro.analysis.lab.stability import critical_lr
from repro.analysis.lab.sync import harmonic
from repro.problem.data import QUADRATIC_CURVATURES, load_dataset
from repro.problem.models import build_model
from repro.asgd.flatnet import quadratic_loss

QUICK = os.environ.get("REPRO_LAB_QUICK") == "1"
IN_NOTEBOOK = "ipykernel" in sys.modules   # a notebook shows its figures; a script saves them
SCALE = 0.25 if QUICK else 1.0          # budgets shrink in the quick mode; conclusions must hold
OUT = Path(os.environ.get("REPRO_LAB_OUT", "figures/notebook"))
torch.set_num_threads(1)                # tiny models: one thread is fastest, and bitwise stable


def check(ok: bool, what: str) -> None:
    print(("  ok    " if ok else "  FAIL  ") + what)
    if not ok:
        # a script stops with the message alone; a notebook marks the cell failed
        raise (AssertionError if IN_NOTEBOOK else SystemExit)(f"the lab's claim failed: {what}")


def digits_net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("digits_cnn", (1, 8, 8), 10)


digits = load_dataset("digits")
train, test = (digits.x_train, digits.y_train), (digits.x_test, digits.y_test)

# %% [markdown]
# ## 1. What staleness is
# A push's staleness is the number of server updates applied between the client's fetch and its
# push. With N equally fast clients (`cost="uniform"`) every push after the first round has
# staleness exactly N - 1 server versions, that is (N - 1) x nsync local steps of other clients.

# %%
print("1. staleness with N equally fast clients (uniform costs)")
for n in (1, 2, 4, 8):
    r = asgd.simulate(digits_net(), train, test, num_clients=n, nsync=2, num_epochs=0.5 * SCALE + 0.5,
                      cost="uniform", lr=0.05, momentum=0.0, server_rule="downpour")
    steady = r.updates.staleness.iloc[n:]
    print(f"   N={n}: staleness after the first round {sorted(set(steady))} (expected {n - 1}),"
          f" in local steps {(n - 1) * 2}")
    check(set(steady) == {n - 1}, f"N={n}: every push is N-1 = {n - 1} versions stale")

# %% [markdown]
# ## 2. Why staleness hurts: the stable step shrinks
# On a quadratic with largest curvature l_max, gradient descent whose gradients are tau updates
# old is stable iff lr * l_max < 2 sin(pi / (4 tau + 2)) (Levin & May 1976): 2 at tau = 0, 1 at
# tau = 1, about 0.45 at tau = 3. The `quadratic` data set has curvatures 0.01 .. 1 and exact
# gradients (batch 10 = the whole set), so theory and measurement meet exactly.

# %%
quad = load_dataset("quadratic")
qtrain = (quad.x_train, quad.y_train)


def quadratic_run(n: int, lr: float, momentum: float = 0.0, cost: str = "uniform", seed: int = 0,
                  steps: int = 300, rule: str = "downpour"):
    torch.manual_seed(seed)
    module = build_model("quadratic", quad.input_shape, 1)
    return asgd.simulate(module, qtrain, qtrain, num_clients=n, nsync=1, num_epochs=steps,
                         eval_every=steps / 50, batch_size=10, lr=lr, momentum=momentum,
                         server_rule=rule, cost=cost, loss_fn=quadratic_loss, seed=seed)


print("2. stability on the quadratic: just below and just above the predicted boundary")
for n in (1, 2, 4):
    tau, bound = n - 1, float(critical_lr(n - 1))
    below = quadratic_run(n, 0.85 * bound, steps=int(300 * SCALE) + 100)
    above = quadratic_run(n, 1.2 * bound, steps=int(300 * SCALE) + 100)
    first, last = below.evals.train_loss.iloc[0], below.evals.train_loss.iloc[-1]
    print(f"   tau={tau}: predicted boundary lr = {bound:.3f}; at 0.85x loss {first:.2e} -> {last:.2e}, "
          f"at 1.2x status {above.summary['status']}")
    check(last < first and below.summary["status"] == "completed", f"tau={tau}: 0.85x the boundary converges")
    check(above.summary["status"] == "diverged", f"tau={tau}: 1.2x the boundary diverges")

# %% [markdown]
# ## 3. Asynchrony begets momentum
# With exponentially distributed step times, staleness is geometric with mean N - 1, and in
# expectation N plain-SGD clients at step size lr follow momentum SGD with mu = 1 - 1/N whose
# update direction is the running average u <- mu u + (1 - mu) g (Mitliagkas et al. 2016).
# On the quadratic we know every curvature and the initial weights, so the prediction for each
# mu is exact arithmetic; the measured curve of 4 async clients sits near mu = 0.75 and far from
# plain gradient descent (mu = 0). (+exp=momentum measures mu for N = 2, 4, 8 over seeds.)

# %%
from repro.analysis.lab.momentum import theorem_response  # noqa: E402

print("3. asynchrony begets momentum: 4 async plain-SGD clients against the theorem's curves")
n, lr, steps = 4, 0.2, 100
asyn = quadratic_run(n, lr, cost="jitter_exponential", steps=steps)
torch.manual_seed(0)
w0 = build_model("quadratic", quad.input_shape, 1).weight.detach().double().squeeze().numpy()
energy = 0.5 * np.asarray(QUADRATIC_CURVATURES) * w0 ** 2          # loss = sum_i energy_i r_i(t)^2
versions = asyn.evals.version.to_numpy()
measured = asyn.evals.train_loss.to_numpy()


def predicted(mu: float) -> np.ndarray:
    return energy @ theorem_response(QUADRATIC_CURVATURES, lr, mu, steps)[:, versions] ** 2


def log_gap(a, b) -> float:
    return float(np.mean((np.log(a) - np.log(b)) ** 2))


mu_theorem = 1 - 1 / n   # kept for the plot below (step 4 reuses the name n)
gaps = {mu: log_gap(measured, predicted(mu)) for mu in (0.0, 0.5, mu_theorem, 0.9)}
for mu, gap in gaps.items():
    print(f"   mu={mu:.3f}: mean squared log-loss gap {gap:.4f}")
check(min(gaps, key=gaps.get) == mu_theorem, "the closest curve is the predicted mu = 1 - 1/N = 0.75")

# %% [markdown]
# ## 4. What synchrony costs: a barrier waits for the slowest
# Sync rounds wait for every client; async pushes never wait. With exponential step times the
# slowest of N takes H_N = 1 + 1/2 + ... + 1/N times a mean step, so sync processes samples
# 1/H_N as fast as async (nsync = 1, free communication).

# %%
print("4. sync vs async: applied samples per virtual second under exponential step times")
for n in (2, 4, 8):
    kw = dict(num_clients=n, nsync=1, num_epochs=1.0 * SCALE + 0.5, lr=0.05, momentum=0.0,
              server_rule="adagrad", lr_server=0.01, cost="jitter_exponential")
    rates = {}
    for protocol in ("async", "sync"):
        r = asgd.simulate(digits_net(), train, test, protocol=protocol, **kw)
        rates[protocol] = r.updates.samples_seen.iloc[-1] / r.updates.time_s.iloc[-1]
    ratio, expected = rates["sync"] / rates["async"], 1 / harmonic(n)
    print(f"   N={n}: sync/async {ratio:.3f}, predicted 1/H_N = {expected:.3f}")
    check(abs(ratio - expected) < 0.15, f"N={n}: sync's throughput is about 1/H_N of async's")

# %% [markdown]
# ## 5. What helps: divide the step by the staleness
# With 8 clients and nsync 4 a push is about 28 local steps stale; at a learning rate that one
# client handles easily, plain async Downpour falls apart while staleness-scaled steps
# (Zhang et al. 2016) keep training (+exp=mitigation compares five fixes over nsync and seeds).

# %%
print("5. mitigation at 8 clients, nsync 4: plain async vs staleness-scaled steps")
errors = {}
for rule in ("downpour", "staleness_scaled"):
    r = asgd.simulate(digits_net(), train, test, num_clients=8, nsync=4, num_epochs=6 * SCALE + 2,
                      lr=0.1, momentum=0.0, server_rule=rule, cost="jitter_lognormal", seed=0)
    err = r.summary["final"].get("test_error", 1.0) if r.summary["status"] != "diverged" else 1.0
    errors[rule] = err
    print(f"   {rule:17}: status {r.summary['status']}, final test error {100 * err:.1f}%")
check(errors["staleness_scaled"] < errors["downpour"], "staleness-scaled steps beat plain async here")

# %% [markdown]
# ## Plots (shown in the notebook; saved as files when run as a script)

# %%
if IN_NOTEBOOK or not QUICK:
    import io

    from matplotlib.figure import Figure

    def show(fig: Figure, name: str) -> None:
        if IN_NOTEBOOK:   # PNG bytes: shown by any kernel, whatever its matplotlib backend
            from IPython.display import Image, display
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png")
            display(Image(buffer.getvalue()))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            fig.savefig(OUT / name)

    fig = Figure(figsize=(5, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.plot(versions, measured, label="4 async clients (measured)")
    for mu in (0.0, mu_theorem):
        ax.plot(versions, predicted(mu), "--", label=f"theorem, mu = {mu:.2f}")
    ax.set(yscale="log", xlabel="server version", ylabel="training loss", title="Asynchrony begets momentum")
    ax.legend()
    show(fig, "momentum.png")
    taus = np.arange(0, 8)
    fig = Figure(figsize=(5, 3.4), layout="constrained")
    ax = fig.subplots()
    ax.plot(taus, critical_lr(taus, max(QUADRATIC_CURVATURES)), "k--", label="2 sin(pi/(4 tau+2)) / l_max")
    ax.set(xlabel="staleness tau", ylabel="largest stable lr", title="The stable step shrinks with staleness")
    ax.legend()
    show(fig, "stability.png")
    if not IN_NOTEBOOK:
        print(f"figures in {OUT}/")
print("the lab's claims all held" + (" (quick mode)" if QUICK else ""))
