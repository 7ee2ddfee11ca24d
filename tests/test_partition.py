"""Clients with their own data (issue 19, part 2): data.partition (iid, shards, by_class,
dirichlet), data.slow_client_classes; seeded, the same indices in both drivers, recorded in the
run folder and drawn by the analysis; bad input refused before any work.

numpy's default generator (PCG64) gives the same draws on every platform, so the partitions below
are exact everywhere; no assertion depends on float reductions of training."""
import json

import numpy as np
import pandas as pd
import pytest
import torch

from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.errors import ConfigError
from repro.workload.build import check_components, load_data, make_clients
from repro.workload.data import load_dataset
from repro.workload.partition import class_counts, split
from repro.workload.start import baseline_config
from repro.run import compose, parse
from repro.sim.driver import simulate
from tests.helpers.grids import cli_run

DIGITS = load_dataset("digits")
LABELS = DIGITS.y_train.numpy()


def cfg_of(*overrides: str) -> RunConfig:
    return parse(compose(list(overrides)))


def assert_disjoint_cover(parts, n=len(LABELS)):
    every = np.concatenate(parts)
    assert len(every) == n and len(np.unique(every)) == n


def test_iid_is_todays_default_every_client_the_whole_set():
    cfg = cfg_of()
    assert cfg.data.partition == "iid" and split(cfg, LABELS) is None
    clients = make_clients(cfg, DIGITS)
    assert all(c.stream.x is DIGITS.x_train for c in clients)   # not even a copy: the same tensors
    assert "client_class_counts" not in load_data(cfg).facts     # config.json of an iid run unchanged


def test_shards_are_disjoint_equal_and_seeded():
    parts = split(cfg_of("data.partition=shards"), LABELS)
    assert_disjoint_cover(parts)
    assert {len(p) for p in parts} <= {len(LABELS) // 4, len(LABELS) // 4 + 1}
    again = split(cfg_of("data.partition=shards"), LABELS)
    other = split(cfg_of("data.partition=shards", "seed=1"), LABELS)
    assert all((a == b).all() for a, b in zip(parts, again))
    assert not all((a == b).all() for a, b in zip(parts, other))


def test_by_class_deals_classes_in_turn():
    parts = split(cfg_of("data.partition=by_class", "num_clients=3"), LABELS)
    assert_disjoint_cover(parts)
    assert [sorted(set(LABELS[p])) for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    # more clients than classes: the clients of one class share its samples
    many = split(cfg_of("data.partition=by_class", "num_clients=20"), LABELS)
    assert_disjoint_cover(many)
    assert [set(LABELS[p]) for p in many] == [{k % 10} for k in range(20)]
    assert abs(len(many[0]) - len(many[10])) <= 1


def test_dirichlet_skews_labels_as_alpha_falls():
    def skew(alpha: float) -> float:   # mean over clients of the largest class share
        counts = np.array(class_counts(cfg_of("data.partition=dirichlet", f"data.alpha={alpha}"), LABELS, 10))
        assert counts.sum() == len(LABELS) and (counts.sum(axis=0) == np.bincount(LABELS)).all()
        return float((counts.max(axis=1) / counts.sum(axis=1)).mean())
    assert skew(0.1) > 0.5 > 0.2 > skew(100.0)   # iid: about 0.1 per class
    parts = split(cfg_of("data.partition=dirichlet", "data.alpha=0.1"), LABELS)
    assert_disjoint_cover(parts)
    assert min(map(len, parts)) >= 32   # every client a minibatch (a short draw is drawn again)


@pytest.mark.parametrize("partition", ["iid", "by_class", "dirichlet"])
def test_the_slow_clients_classes_are_its_alone(partition):
    for cost, slow in ((["cost=straggler"], 1), (["cost.speed_law=sqrt"], 4)):
        cfg = cfg_of(f"data.partition={partition}", "data.slow_client_classes=[0,7]", *cost)
        parts = split(cfg, LABELS)
        assert set(LABELS[parts[slow - 1]]) == {0, 7}
        assert len(parts[slow - 1]) == (np.isin(LABELS, [0, 7])).sum()
        for k, p in enumerate(parts, start=1):
            if k != slow:
                assert not np.isin(LABELS[p], [0, 7]).any() and len(p)


def test_client_k_holds_the_same_samples_however_its_process_builds_it():
    """The simulator builds every client in one process, a real client only its own: the same
    function of (labels, settings, seed) gives client k the same samples."""
    cfg = cfg_of("data.partition=dirichlet", "data.alpha=0.3", "data.slow_client_classes=[3]", "cost=straggler")
    everyone = make_clients(cfg, load_data(cfg))
    for k in (1, 2, 4):
        alone = make_clients(cfg, load_data(cfg), client_ids=[k])[0]
        assert torch.equal(alone.stream.y, everyone[k - 1].stream.y)
        assert torch.equal(alone.stream.x, everyone[k - 1].stream.x)


def test_the_warm_start_baseline_reads_the_whole_set():
    cfg = cfg_of("data.partition=by_class", "data.slow_client_classes=[1]", "cost=straggler", "start=warm")
    base = baseline_config(cfg)
    assert (base.data.partition, base.data.slow_client_classes) == ("iid", None)
    assert baseline_config(cfg_of("start=warm")) == base.replace(cost=base.cost)


def small(partition: str, **kw) -> RunConfig:
    return RunConfig(num_clients=3, nsync=2, num_epochs=2.0, eval_every=1.0, progress=False, checkpoint_every=5,
                     data=DataConfig(name="digits", partition=partition, **kw), model=ModelConfig(name="mlp"),
                     algo=AlgoConfig(lr=0.05, momentum=0.5), cost=CostConfig(profile="uniform", compute_s=0.01))


def test_a_partitioned_run_records_its_counts_resumes_bit_for_bit_and_is_drawn(tmp_path):
    from repro.analysis.render import build_figure

    cfg = small("dirichlet", alpha=0.5)
    exp = tmp_path / "results" / "own"
    assert simulate(cfg, exp / "a")["status"] == "completed"
    recorded = json.loads((exp / "a" / "config.json").read_text())
    counts = recorded["dataset"]["client_class_counts"]
    assert counts == class_counts(cfg, LABELS, 10) and recorded["data"]["partition"] == "dirichlet"
    cut = tmp_path / "elsewhere" / "cut"   # a copy of run a: not in the folder the figure reads
    assert simulate(cfg, cut, stop_at_version=9)["status"] == "interrupted"
    assert simulate(cfg.replace(resume=True), cut)["status"] == "completed"
    for table in ("updates.csv", "evals.csv"):
        assert (exp / "a" / table).read_bytes() == (cut / table).read_bytes()
    assert simulate(small("by_class"), exp / "b")["status"] == "completed"
    paths = build_figure("partition", tmp_path / "results", tmp_path / "figs", exp_name="own")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".csv"}
    drawn = pd.read_csv(tmp_path / "figs" / "partition.csv")
    assert drawn.panel.nunique() == 2
    mine = drawn[drawn.panel.str.contains("dirichlet")].pivot(index="client", columns="class", values="count")
    assert mine.to_numpy().tolist() == counts


def test_a_partition_runs_on_both_drivers_with_the_same_counts(tmp_path, no_children):
    """Both drivers: a short real run with clients of their own data (and an uneven cluster:
    client 2 paced 4x slower, holding class 0 alone) completes and records what the simulator
    records; the paced client pushes less often."""
    from repro.config.settings import BackendConfig
    from repro.real import run_real

    backend = BackendConfig(name="real", timeout_s=30.0, client_timeout_s=10.0, client_device="cpu")
    cfg = RunConfig(num_clients=2, nsync=4, num_epochs=2.0, eval_every=1.0, progress=False,
                    data=DataConfig(partition="by_class", slow_client_classes=(0,)),
                    cost=CostConfig(speeds=(1.0, 4.0)), algo=AlgoConfig(lr=0.2, momentum=0.0), backend=backend)
    summary = run_real(cfg, tmp_path / "real")
    assert summary["status"] == "completed", summary["message"]
    simulate(cfg.replace(backend=BackendConfig()), tmp_path / "sim")
    real, sim = (json.loads((tmp_path / d / "config.json").read_text())["dataset"] for d in ("real", "sim"))
    assert real["client_class_counts"] == sim["client_class_counts"]
    assert [bool(n) for n in real["client_class_counts"][1]] == [True] + [False] * 9
    pushes = pd.read_csv(tmp_path / "real" / "updates.csv").client.value_counts()
    assert pushes.get(1, 0) > pushes.get(2, 0) > 0


@pytest.mark.parametrize("overrides,key,expected", [
    (["data.partition=dirichlet", "data.alpha=0"], "data.alpha", "(0, 1e+06]"),
    (["data.partition=dirichlet", "data.alpha=-0.5"], "data.alpha", "(0, 1e+06]"),
    (["data.alpha=2"], "data.alpha", "only with data.partition=dirichlet"),
    (["data.partition=random"], "data.partition", "by_class"),
    (["data.slow_client_classes=[0]"], "data.slow_client_classes", "cost.straggler_client"),
    (["data.slow_client_classes=[0]", "num_clients=4", "cost.speeds=[1,2,2,1]"], "data.slow_client_classes",
     "one slowest client"),
    (["data.slow_client_classes=[0]", "num_clients=1", "cost=straggler"], "data.slow_client_classes",
     "num_clients=1"),
    (["data.slow_client_classes=[0,0]", "cost=straggler"], "data.slow_client_classes", "distinct"),
])
def test_bad_partition_settings_name_the_key(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        parse(compose(overrides))
    assert f"'{key}'" in str(err.value) and expected in str(err.value)


@pytest.mark.parametrize("overrides,key,expected", [
    (["data.partition=by_class", "num_clients=500"], "data.partition", "client 1 would hold 3"),
    (["data.partition=shards", "algo.batch_size=400"], "data.partition", "algo.batch_size=400"),
    (["data.partition=dirichlet", "data.alpha=0.001", "num_clients=40"], "data.alpha", "a larger data.alpha"),
    (["data.slow_client_classes=[10]", "cost=straggler"], "data.slow_client_classes", "0..9"),
    # issue 32 item 17: every class to the slow client blamed data.partition
    (["data.slow_client_classes=[0,1,2,3,4,5,6,7,8,9]", "cost=straggler"], "data.slow_client_classes", "not all"),
    (["data.slow_client_classes=[0,1,2,3,4,5,6,7,8]", "cost=straggler", "algo.batch_size=200"],
     "data.slow_client_classes", "name fewer classes"),
    (["data.partition=shards", "data.slow_client_classes=[0,1,2,3,4,5,6,7,8]", "cost=straggler",
      "algo.batch_size=100", "num_clients=3"], "data.partition", "or fewer data.slow_client_classes"),
])
def test_a_split_that_starves_a_client_is_refused_before_any_work(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        check_components(cfg_of(*overrides))
    assert f"'{key}'" in str(err.value) and expected in str(err.value)


def test_a_bad_partition_exits_2_on_the_command_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "data.partition=by_class", "num_clients=500", f"results_dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "'data.partition'" in proc.stderr and "algo.batch_size" in proc.stderr
    assert not any(tmp_path.iterdir())
