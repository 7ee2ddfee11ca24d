"""The paper's regime: an epoch of thousands of minibatches, so nsync can take the paper's
fraction of an epoch (nsync 300 of ~10,000 ImageNet minibatches = 3%).

The data is MNIST-1D generated offline (``mnist1d.data.make_dataset``, never its downloader) at a
configured size; the generated arrays are cached inside the results tree (``data.root``), written
atomically under a lock and read back without unpickling anything.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch

import repro.workload.datacache as datacache
from repro.workload.data import load_dataset
from repro.run import compose, parse
from tests.helpers.paths import ROOT

PAPER = ("fig3_paper", "fig4_paper")


def sweep(exp: str) -> dict[str, list[int]]:
    """{key: values} of an experiment's sweep."""
    full = compose([f"+exp={exp}"], return_hydra_config=True)
    return {k: [int(v) for v in str(vals).split(",")] for k, vals in full.hydra.sweeper.params.items()}


@pytest.mark.parametrize("exp", PAPER)
def test_paper_experiments_put_nsync_at_the_papers_fractions_of_an_epoch(exp):
    cfg = parse(compose([f"+exp={exp}"]))
    grid = sweep(exp)
    assert (cfg.data.name, cfg.model.name, cfg.data.num_train) == ("mnist1d", "mnist1d_cnn", 40000)
    per_epoch = cfg.data.num_train // cfg.algo.batch_size
    assert per_epoch >= 1000                                   # thousands of minibatches an epoch
    fractions = sorted(n / per_epoch for n in grid["nsync"])
    assert fractions[0] < 0.001 and 0.025 <= fractions[-2] <= 0.035   # up to about 3% (the paper's 300/10,000)
    assert fractions[-1] > 0.05 and all(f <= 0.035 for f in fractions[:-1])   # and one point beyond
    assert max(grid["num_clients"]) == 16 and min(grid["num_clients"]) == 1
    assert len(grid["seed"]) >= 2
    # the same protocol as the digits figures: warm start from the single-client baseline,
    # paper2013 costs, DistBelief's Adagrad on the server
    assert (cfg.start, cfg.cost.profile, cfg.algo.server_rule, cfg.cost.comm_params) == \
        ("warm", "paper2013", "adagrad", 6.1e7)
    assert cfg.data.root == f"{cfg.results_dir}/_data"        # the data cache is in the results tree
    assert cfg.num_threads == 1


def test_paper_experiments_draw_their_own_files():
    for exp, figure in (("fig3_paper", "fig3"), ("fig4_paper", "fig4")):
        full = compose([f"+exp={exp}"], return_hydra_config=True)
        cb = full.hydra.callbacks.figure
        assert (cb.figure, cb.name) == (figure, exp)           # figures/fig3_paper.png, not fig3.png
        assert full.hydra.launcher._target_.endswith("JoblibLauncher")


# ---------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------

def test_mnist1d_sizes_are_as_configured(tmp_path):
    ds = load_dataset("mnist1d", num_train=310, num_test=90, root=str(tmp_path / "results" / "_data"))
    assert ds.x_train.shape == (310, 1, 40) and ds.x_test.shape == (90, 1, 40)
    assert ds.y_train.shape == (310,) and ds.y_test.shape == (90,) and ds.num_classes == 10
    assert set(ds.y_train.tolist()) == set(range(10))
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64


def test_mnist1d_is_deterministic_and_the_cache_holds_exactly_the_generated_samples(tmp_path):
    root = str(tmp_path / "results" / "_data")
    fresh = load_dataset("mnist1d", num_train=300, num_test=100)                  # no cache
    first = load_dataset("mnist1d", num_train=300, num_test=100, root=root)      # generates, writes
    path = datacache.mnist1d_cache_path(root, 400)
    stamp = path.stat().st_mtime_ns
    again = load_dataset("mnist1d", num_train=300, num_test=100, root=root)   # reads
    assert path.stat().st_mtime_ns == stamp
    for ds in (first, again):
        for name in ("x_train", "y_train", "x_test", "y_test"):
            assert torch.equal(getattr(ds, name), getattr(fresh, name)), name
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["args"]["seed"] == 42 and meta["args"]["num_samples"] == 400
    other = load_dataset("mnist1d", num_train=500, num_test=100, root=root)     # another size: its own file
    assert datacache.mnist1d_cache_path(root, 600).exists() and other.num_train == 500


def test_mnist1d_cache_is_read_without_unpickling_and_a_bad_file_is_made_again(tmp_path, caplog):
    root = tmp_path / "results" / "_data"
    path = datacache.mnist1d_cache_path(root, 400)
    path.parent.mkdir(parents=True)
    reference = load_dataset("mnist1d", num_train=300, num_test=100)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    np.savez(buf, x=np.array([Evil()], dtype=object), y=np.zeros(3), x_test=np.zeros(3), y_test=np.zeros(3))
    for content in (buf.getvalue(), b"PK\x03\x04 truncated", b""):
        path.write_bytes(content)
        ds = load_dataset("mnist1d", num_train=300, num_test=100, root=str(root))
        assert torch.equal(ds.x_train, reference.x_train) and torch.equal(ds.y_test, reference.y_test)
        assert not marker.exists()                               # nothing in the file was executed
        with np.load(path, allow_pickle=False) as f:             # and it was replaced by plain arrays
            assert f["x"].dtype == np.float64
    assert "generating it again" in caplog.text


def test_jobs_loading_together_generate_the_data_once(tmp_path, monkeypatch):
    calls = []
    generate = datacache._generate_mnist1d

    def slow(n):
        calls.append(n)
        time.sleep(0.5)
        return generate(n)

    monkeypatch.setattr(datacache, "_generate_mnist1d", slow)
    root = str(tmp_path / "results" / "_data")
    start = threading.Barrier(3)
    out = []

    def job():
        start.wait()
        out.append(load_dataset("mnist1d", num_train=200, num_test=50, root=root))

    threads = [threading.Thread(target=job) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert calls == [250] and len(out) == 3
    assert all(torch.equal(ds.x_train, out[0].x_train) for ds in out)


OFFLINE = textwrap.dedent("""
    import socket, sys
    def refuse(*a, **k):
        raise AssertionError("network access")
    socket.socket.connect = refuse
    socket.create_connection = refuse
    import requests
    requests.get = requests.post = requests.Session.request = refuse
    from repro.workload.data import load_dataset
    ds = load_dataset("mnist1d", num_train=int(sys.argv[1]), num_test=int(sys.argv[2]), root="results/_data")
    print(tuple(ds.x_train.shape), tuple(ds.x_test.shape))
""")


def test_mnist1d_writes_nothing_outside_the_results_tree_and_fetches_nothing(tmp_path):
    """In a fresh process with the network refused, from an empty working folder and an empty
    home: the only files written are the cache's, under results/_data."""
    import matplotlib

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "MPLBACKEND": "Agg",
           # matplotlib (imported by mnist1d) reads its font cache where it is: nothing to write
           "MPLCONFIGDIR": matplotlib.get_cachedir(),
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", OFFLINE, "120", "30"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[0] == "(120, 1, 40) (30, 1, 40)"
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written and all(w.startswith(os.path.join("work", "results", "_data", "mnist1d", "n150-"))
                           for w in written), written
    assert not list(home.iterdir())


@pytest.mark.slow
def test_paper_regime_data_at_full_size(tmp_path):
    cfg = parse(compose(["+exp=fig3_paper", f"results_dir={tmp_path}"]))
    start = time.perf_counter()
    ds = load_dataset("mnist1d", num_train=cfg.data.num_train, num_test=cfg.data.num_test, root=cfg.data.root)
    generated_s = time.perf_counter() - start
    assert ds.x_train.shape == (40000, 1, 40) and ds.x_test.shape == (2000, 1, 40)
    start = time.perf_counter()
    again = load_dataset("mnist1d", num_train=40000, num_test=2000, root=cfg.data.root)
    assert time.perf_counter() - start < generated_s / 10           # the cache is what makes grids cheap
    assert hashlib.sha1(again.x_train.numpy().tobytes()).digest() == \
        hashlib.sha1(ds.x_train.numpy().tobytes()).digest()
    counts = torch.bincount(ds.y_train, minlength=10)
    assert counts.min() > 3500                                      # ~4000 a class


@pytest.mark.slow
@pytest.mark.parametrize("exp,outputs", [("fig3_paper", ["fig3_paper.png", "fig3_paper.csv"]),
                                         ("fig4_paper", ["fig4_paper.png", "fig4_paper.csv",
                                                         "fig4_paper_speedup.csv"])])
def test_a_shrunk_paper_grid_trains_and_draws_its_own_figure(tmp_path, exp, outputs):
    cmd = [sys.executable, "-m", "repro.run", f"+exp={exp}", f"results_dir={tmp_path / 'results'}",
           f"figures_dir={tmp_path / 'figures'}", "data.num_train=2000", "data.num_test=500",
           # 0.7 epochs of 2000 samples = 44 minibatches: one push of nsync 40 fits the budget
           "num_epochs=0.7", "warm_start_epochs=0.2", "eval_every=0.1", "progress=false",
           "hydra.sweeper.params.num_clients='1,16'", "hydra.sweeper.params.nsync='1,40'",
           "hydra.sweeper.params.seed='0'"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(outputs + [outputs[0].replace(".png", ".pdf")])
    summaries = list((tmp_path / "results" / exp).glob("*/summary.json"))
    assert len(summaries) == 4
    assert len(list((tmp_path / "results" / "_data" / "mnist1d").glob("*.npz"))) == 1
    assert (proc.stdout + proc.stderr).count("mnist1d: generating") == 1
