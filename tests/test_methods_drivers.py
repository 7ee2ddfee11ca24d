"""The descendants of Downpour on both drivers: Ringmaster ASGD, Rennala SGD, asynchronous EASGD
and the outer Nesterov step run in the simulator and on real processes with their logged
semantics (discarded pushes, collection sizes, the elastic exchange in each client process);
the simulator resumes each of them bitwise; replay takes the asynchronous ones and refuses
Ringmaster's. (Their arithmetic: tests/test_methods.py.)

Real runs are quick CPU runs on loopback (tests.helpers.runs.real_cfg): start-up, a fresh
interpreter per client, dominates. Their push order depends on timing, so they assert what holds
in every order; EASGD's are replayed by the simulator, which must give the same numbers.
"""
from __future__ import annotations

import os
import signal

import pandas as pd
import pytest
import torch

from repro.asgd.flatnet import FlatNet
from repro.asgd.protocols import PROTOCOLS
from repro.asgd.rules import RULES
from repro.config.settings import (AlgoConfig, BackendConfig, CostConfig, DataConfig, ModelConfig,
                                   ProtocolConfig, RunConfig)
from repro.errors import ConfigError
from repro.real import run_real
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.runs import real_cfg, sim_killed_at
from tests.helpers.tables import check_same_evaluations, table_bytes, table_frames

JITTER = CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.5,
                    straggler_client=3, straggler_factor=3.0)
RINGMASTER = ProtocolConfig(name="ringmaster", staleness_threshold=2)
RINGMASTER_STOPS = ProtocolConfig(name="ringmaster", staleness_threshold=2, cancel_stale=True)
RINGMASTER_STOP_ONCE = ProtocolConfig(name="ringmaster", staleness_threshold=2, cancel_stale=True, stop_once=True)
RENNALA = ProtocolConfig(name="rennala", collection_size=4)
EASGD = AlgoConfig(lr=0.05, momentum=0.5, server_rule="easgd")
DELAYED_NESTEROV = AlgoConfig(lr=0.05, momentum=0.5, server_rule="outer_nesterov", outer_delay=3)


def sim_cfg(**kw) -> RunConfig:
    """3 clients (the third 3x slower, with jitter), nsync 2, 3 epochs of 512 synthetic samples."""
    base = dict(num_clients=3, nsync=2, num_epochs=3.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5), cost=JITTER)
    base.update(kw)
    return RunConfig(**base)


def check_ringmaster(upd: pd.DataFrame, summary: dict, threshold: int) -> None:
    """Every applied push was less than R stale; some were dropped, each from a version the
    server had."""
    assert (upd.staleness < threshold).all()
    assert summary["discarded_pushes"] and all(0 <= v <= len(upd) for v, _ in summary["discarded_pushes"])


def check_rennala(upd: pd.DataFrame, summary: dict, size: int, samples_per_push: int) -> None:
    """One row per step (client 0, staleness 0) merging exactly S pushes from that step's
    version; the collection listed per step (beside check_run_folder, which takes client 0 as
    a merging protocol's)."""
    assert summary["status"] == "completed", summary["message"]
    assert upd.version.tolist() == list(range(1, len(upd) + 1)) and summary["version"] == len(upd)
    assert (upd.samples_seen == upd.num_samples.cumsum()).all()
    assert (upd.client == 0).all() and (upd.staleness == 0).all()
    assert (upd.read_version == upd.version - 1).all()
    assert (upd.num_samples == size * samples_per_push).all()
    per_step = pd.Series([v for v, _ in summary["collected_pushes"]]).value_counts().sort_index()
    assert per_step.index.tolist() == upd.read_version.tolist() and (per_step == size).all()


# ---------------------------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("protocol", [RINGMASTER, RINGMASTER_STOPS, RINGMASTER_STOP_ONCE])
def test_sim_ringmaster_applies_only_pushes_fresher_than_r(tmp_path, protocol):
    summary = simulate(sim_cfg(protocol=protocol), tmp_path)
    check_run_folder(tmp_path, "completed")
    upd, _, _ = table_frames(tmp_path)
    check_ringmaster(upd, summary, 2)
    async_run = simulate(sim_cfg(), tmp_path / "async")
    assert pd.read_csv(tmp_path / "async" / "updates.csv").staleness.max() >= 2   # async's are staler
    assert async_run["status"] == "completed"


def uneven_quadratic(protocol: ProtocolConfig, updates: int) -> RunConfig:
    """3 clients of fixed step times 1, 1.75 and 5 virtual seconds, no jitter, free communication,
    nsync 1: one push per epoch of the 10-sample quadratic (the full set, exact gradients)."""
    return RunConfig(num_clients=3, nsync=1, num_epochs=float(updates), eval_every=float(updates), progress=False,
                     data=DataConfig(name="quadratic"), model=ModelConfig(name="quadratic"),
                     algo=AlgoConfig(lr=0.1, momentum=0.0, batch_size=10), protocol=protocol,
                     cost=CostConfig(profile="uneven", compute_s=1.0, speeds=(1.0, 1.75, 5.0)))


def test_sim_ringmaster_stops_follow_the_papers_algorithm_5_by_hand(tmp_path):
    """R = 2, step times 1, 1.75, 5, worked out by hand with Algorithm 5 (an apply makes version v;
    every other client whose segment started at v - 2 or earlier is stopped and starts again from
    v at once; "c3 <- v2" below: client 3 restarts from version 2):

      t=1     c1 (read 0) applied -> v1; c1 computes from v1 (done at 2)
      t=1.75  c2 (read 0) -> v2; c2 from v2 (3.5); c3's segment from v0 is 2 old: stopped, c3 <- v2 (6.75)
      t=2     c1 (read 1) -> v3; c1 from v3 (3)
      t=3     c1 (read 3) -> v4; c2 (from v2) and c3 (from v2, stopped at 1.75) stopped: both <- v4 (4.75, 8)
      t=4     c1 (read 4) -> v5
      t=4.75  c2 (read 4) -> v6; c2 from v6 (6.5); c3 (v4) stopped <- v6 (9.75)
      t=5     c1 (read 5) -> v7
      t=6     c1 (read 7) -> v8; c2 (v6) and c3 (v6) stopped <- v8 (7.75, 11)
      t=7     c1 (read 8) -> v9
      t=7.75  c2 (read 8) -> v10; c3 (v8) stopped <- v10 (12.75)
      t=8     c1 (read 9) -> v11

    Client 3 (5 s a step, slower than 2 applies of the others) is stopped at every second apply
    and never applied. With protocol.stop_once (the old rule) it is not stopped again at t=3: it
    computes on from v2, its push arrives stale at 6.75 and is discarded there, and it restarts
    then: the same applies here, another list of dropped segments."""
    summary = simulate(uneven_quadratic(RINGMASTER_STOPS, 11), tmp_path / "paper")
    assert summary["status"] == "completed", summary["message"]
    upd = pd.read_csv(tmp_path / "paper" / "updates.csv")
    assert list(zip(upd.client, upd.read_version, upd.time_s)) == [
        (1, 0, 1.0), (2, 0, 1.75), (1, 1, 2.0), (1, 3, 3.0), (1, 4, 4.0), (2, 4, 4.75), (1, 5, 5.0),
        (1, 7, 6.0), (1, 8, 7.0), (2, 8, 7.75), (1, 9, 8.0)]
    assert summary["discarded_pushes"] == [[0, 3], [2, 2], [2, 3], [4, 3], [6, 2], [6, 3], [8, 3]]
    once = simulate(uneven_quadratic(RINGMASTER_STOP_ONCE, 11), tmp_path / "once")
    assert table_bytes(tmp_path / "once") == table_bytes(tmp_path / "paper")
    assert once["discarded_pushes"] == [[0, 3], [2, 2], [6, 2], [2, 3], [8, 3]]


@pytest.mark.parametrize("topology", ["dedicated", "shared"])
def test_sim_a_discarded_push_costs_the_server_no_apply_time(tmp_path, topology):
    """R = 1, step times 1 and 2.125, an apply of 0.25, free communication: client 2's push is
    always stale on arrival, so discarded, and the real server spends no apply on it (it only
    replies). Client 1 then runs as if alone, applied every 1.25; charging the discard an apply
    held the server when client 1's push arrived (its second, 2.25, waited for 2.375)."""
    cost = CostConfig(profile="uneven", compute_s=1.0, speeds=(1.0, 2.125), server_apply_s=0.25, topology=topology)
    cfg = uneven_quadratic(ProtocolConfig(name="ringmaster", staleness_threshold=1), 8)
    summary = simulate(cfg.replace(num_clients=2, cost=cost), tmp_path)
    assert summary["status"] == "completed", summary["message"]
    upd = pd.read_csv(tmp_path / "updates.csv")
    assert list(zip(upd.client, upd.time_s)) == [(1, 1.25 * v) for v in range(1, 9)]
    timings = pd.read_csv(tmp_path / "timings.csv")
    dropped = timings[timings.client == 2]
    # arrivals at 2.125, 4.25 (fetched at 2.125), 6.375, 8.5: taken at once, replied at once
    assert list(zip(dropped.time_s, dropped.queue_s, dropped.apply_s)) == [(2.125 * i, 0.0, 0.0) for i in (1, 2, 3, 4)]
    assert summary["discarded_pushes"] == [[0, 2], [1, 2], [3, 2], [5, 2]]


@pytest.mark.parametrize("topology", ["dedicated", "shared"])
def test_sim_resumes_bitwise_from_a_pending_push_that_is_discarded(tmp_path, monkeypatch, topology):
    """A stop while the slow client computes a push the server will discard: the checkpoint's
    clock has not charged its apply (the server is free from when it takes the push until it
    applies one), so the resumed run frees the server then too: the same tables and times. The
    checkpoint keeps the pending push's timings.csv parts, which the schedule gave as it chose
    the push (the resumed run wrote nan for each)."""
    cfg = sim_cfg(protocol=RINGMASTER, cost=JITTER.updated(server_apply_s=0.004, topology=topology))
    simulate(cfg, tmp_path / "whole")
    assert simulate_cut_at(monkeypatch, cfg, tmp_path / "cut", 28)["status"] == "interrupted"
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["driver"]["pending"][:2] == [3, 2]
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
    whole, cut = (pd.read_csv(tmp_path / run / "timings.csv") for run in ("whole", "cut"))
    assert whole.time_s.tolist() == cut.time_s.tolist()
    assert whole[(whole.client == 3) & (whole.read_version == 4)].apply_s.tolist() == [0.0]   # the one cut
    assert (tmp_path / "cut" / "timings.csv").read_bytes() == (tmp_path / "whole" / "timings.csv").read_bytes()


def test_sim_rennala_steps_merge_s_fresh_pushes_the_fast_clients_more(tmp_path):
    summary = simulate(sim_cfg(protocol=RENNALA), tmp_path)
    check_run_folder(tmp_path, "completed")
    upd, _, _ = table_frames(tmp_path)
    check_rennala(upd, summary, 4, 2 * 32)
    made = pd.Series([k for _, k in summary["collected_pushes"]]).value_counts()
    assert made[1] > made.get(3, 0) and made[2] > made.get(3, 0)   # the slow client contributes least
    assert summary["discarded_pushes"]                            # its stale segments are dropped


SIM_METHODS = {
    "ringmaster_stops": dict(protocol=RINGMASTER_STOPS),
    "ringmaster_stop_once": dict(protocol=RINGMASTER_STOP_ONCE),
    "rennala": dict(protocol=RENNALA),
    "easgd": dict(algo=EASGD),
    "delayed_nesterov": dict(algo=DELAYED_NESTEROV),
}


def simulate_cut_at(monkeypatch, cfg: RunConfig, run_dir, step: int) -> dict:
    """``cfg`` simulated into ``run_dir`` with a stop request (SIGINT) at its ``step``-th local step."""
    calls, backward = [0], FlatNet.backward

    def interrupt(self, x, y):
        calls[0] += 1
        if calls[0] == step:
            os.kill(os.getpid(), signal.SIGINT)
        return backward(self, x, y)

    monkeypatch.setattr(FlatNet, "backward", interrupt)
    try:
        return simulate(cfg, run_dir)
    finally:
        monkeypatch.setattr(FlatNet, "backward", backward)


@pytest.mark.parametrize("name", sorted(SIM_METHODS))
def test_sim_resumes_each_method_bitwise(tmp_path, monkeypatch, name):
    """A stop request in the middle of a push (a half-full Rennala collection, Ringmaster's
    restarting clients, EASGD's clients holding their own parameters, the outer momentum and its
    pending sum in the rule): the resumed run's tables and summary lists are byte for byte an
    uninterrupted run's."""
    cfg = sim_cfg(**SIM_METHODS[name])
    whole = simulate(cfg, tmp_path / "whole")
    assert whole["status"] == "completed"
    cut = simulate_cut_at(monkeypatch, cfg, tmp_path / "cut", 30)   # the 2nd local step of the 15th push
    assert cut["status"] == "interrupted"
    ckpt = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert ckpt["driver"]["pending"] is not None
    held = {"ringmaster_stops": lambda: len(set(ckpt["protocol"]["fetched"].values())) > 1,  # what the cut holds
            "ringmaster_stop_once": lambda: ckpt["protocol"]["restarting"],
            "rennala": lambda: ckpt["protocol"]["clients"],
            "easgd": lambda: not torch.equal(ckpt["driver"]["clients"]["1"]["params"], ckpt["server"]["params"]),
            "delayed_nesterov": lambda: ckpt["server"]["rule"]["count"] % 3}
    assert held[name]()
    resumed = simulate(cfg.replace(resume=True), tmp_path / "cut")
    assert resumed["status"] == "completed"
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
    for key in ("discarded_pushes", "collected_pushes"):
        assert resumed.get(key) == whole.get(key)


# Each registered server rule (with async) and protocol (with the delta rule), with the settings
# that make it do what sets it apart; a name registered later runs with its defaults.
RULE_SETTINGS = {"easgd": EASGD, "outer_nesterov": DELAYED_NESTEROV}
PROTOCOL_SETTINGS = {"ringmaster": RINGMASTER_STOPS, "rennala": RENNALA,
                     "sync": ProtocolConfig(name="sync", backup_workers=1),
                     "ssp": ProtocolConfig(name="ssp", staleness_bound=1)}
EVERY_METHOD = ([f"algo.server_rule={name}" for name in RULES]
                + [f"protocol={name}" for name in PROTOCOLS])


def method_cfg(method: str) -> RunConfig:
    """sim_cfg running ``method`` (``algo.server_rule=NAME`` or ``protocol=NAME``), a checkpoint
    every 2 versions (of 24; of 6 where a step merges 4 pushes)."""
    key, _, name = method.partition("=")
    if key == "protocol":
        return sim_cfg(protocol=PROTOCOL_SETTINGS.get(name, ProtocolConfig(name=name)), checkpoint_every=2)
    algo = RULE_SETTINGS.get(name, AlgoConfig(lr=0.05, momentum=0.5, server_rule=name))
    return sim_cfg(algo=algo, checkpoint_every=2)


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_sim_resumes_every_registered_rule_and_protocol_bitwise(tmp_path, method):
    """issue 32 item 6 (DC-ASGD's backups were overwritten on resume): a run killed (SIGKILL)
    half way, one version past a checkpoint, resumes from that checkpoint, and a run stopped
    (Ctrl-C) there from where it stopped; both end with the uninterrupted run's updates, evals
    and timings, byte for byte. The methods come from the registries, so a new rule or
    protocol is in this test."""
    cfg = method_cfg(method)
    whole = simulate(cfg, tmp_path / "whole")
    cut_at = whole["version"] // 2 | 1
    assert whole["status"] == "completed" and whole["version"] > cut_at > 1, whole["message"]
    sim_killed_at(cfg, tmp_path / "killed", cut_at)
    assert simulate(cfg, tmp_path / "stopped", stop_at_version=cut_at)["status"] == "interrupted"
    for cut in ("killed", "stopped"):
        resumed = simulate(cfg.replace(resume=True), tmp_path / cut)
        assert resumed["status"] == "completed", (cut, resumed["message"])
        for table in ("updates.csv", "evals.csv", "timings.csv"):
            assert (tmp_path / cut / table).read_bytes() == (tmp_path / "whole" / table).read_bytes(), (cut, table)
        for key in ("discarded_pushes", "collected_pushes"):
            assert resumed.get(key) == whole.get(key), (cut, key)


def test_replay_takes_asynchronous_easgd_and_refuses_ringmaster(tmp_path):
    """Ringmaster's discarded pushes are not in updates.csv (a replay could not recompute what
    they consumed): refused, naming the recorded protocol. EASGD is asynchronous: its replay
    reproduces the recorded run."""
    simulate(sim_cfg(protocol=RINGMASTER), tmp_path / "ring")
    replay = CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "ring"))
    with pytest.raises(ConfigError, match="protocol=ringmaster"):
        simulate(sim_cfg(cost=replay), tmp_path / "ring_replay")
    assert not (tmp_path / "ring_replay").exists()
    simulate(sim_cfg(algo=EASGD), tmp_path / "easgd")
    replay = CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "easgd"))
    assert simulate(sim_cfg(cost=replay), tmp_path / "easgd_replay")["status"] == "completed"
    assert table_bytes(tmp_path / "easgd_replay") == table_bytes(tmp_path / "easgd")


# ---------------------------------------------------------------------------------------------
# the real driver
# ---------------------------------------------------------------------------------------------

def test_real_easgd_clients_exchange_as_the_simulator_does(tmp_path, no_children):
    """Two client processes, each keeping its own parameters and moving toward the centre with
    every reply: the simulator, replaying the recorded order, gives the same per-push numbers
    (same kernels, one thread, float32 bytes over gloo: we expect bitwise, allow 1e-6)."""
    cfg = real_cfg(num_epochs=2.0, algo=AlgoConfig(lr=0.2, momentum=0.0, server_rule="easgd"))
    summary = run_real(cfg, tmp_path / "real")
    assert summary["status"] == "completed", summary["message"]
    replay = CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "real"))
    assert simulate(cfg.replace(cost=replay), tmp_path / "replay")["status"] == "completed"
    (a, a_evals, _), (b, b_evals, _) = table_frames(tmp_path / "real"), table_frames(tmp_path / "replay")
    assert len(a) == len(b) > 10 and set(a.client) == {1, 2}
    exact = ["version", "client", "read_version", "staleness", "num_samples"]
    pd.testing.assert_frame_equal(a[exact], b[exact])
    pd.testing.assert_series_equal(a.train_loss, b.train_loss, rtol=1e-6, atol=0)
    pd.testing.assert_series_equal(a_evals.test_loss, b_evals.test_loss, rtol=1e-6, atol=0)


def test_real_ringmaster_with_stops(tmp_path, no_children):
    """R = 1 with calculation stops on 3 client processes: only fresh pushes are applied, every
    apply stops the others (they drop their segment and start from the new parameters)."""
    cfg = real_cfg(num_clients=3, protocol=ProtocolConfig(name="ringmaster", staleness_threshold=1,
                                                          cancel_stale=True, stop_once=True))
    summary = run_real(cfg, tmp_path)
    assert summary["status"] == "completed", summary["message"]
    check_run_folder(tmp_path, "completed")
    upd, _, _ = table_frames(tmp_path)
    check_ringmaster(upd, summary, 1)


def test_real_rennala_steps(tmp_path, no_children):
    """S = 3 on 2 client processes: each step merges exactly 3 pushes from its version (a client
    may make two of them), whoever finishes first."""
    cfg = real_cfg(protocol=ProtocolConfig(name="rennala", collection_size=3))
    summary = run_real(cfg, tmp_path)
    check_run_folder(tmp_path, "completed")
    upd, _, _ = table_frames(tmp_path)
    check_rennala(upd, summary, 3, 4 * 32)
    assert len(upd) >= 8


@pytest.mark.slow
def test_real_ringmaster_discards_stale_pushes_on_arrival(tmp_path, no_children):
    cfg = real_cfg(num_clients=3, protocol=ProtocolConfig(name="ringmaster", staleness_threshold=1))
    summary = run_real(cfg, tmp_path)
    assert summary["status"] == "completed", summary["message"]
    check_run_folder(tmp_path, "completed")
    upd, _, _ = table_frames(tmp_path)
    check_ringmaster(upd, summary, 1)


@pytest.mark.slow
def test_real_diloco_is_the_simulators(tmp_path, no_children):
    """protocol=sync with the outer Nesterov step (DiLoCo) on 3 client processes: a round does not
    depend on timing (merged in client order) and the rule's momentum lives on the server, so the
    real run is the simulator's, losses to the last digit."""
    cfg = real_cfg(num_clients=3, protocol=ProtocolConfig(name="sync"),
                   algo=AlgoConfig(lr=0.2, momentum=0.0, server_rule="outer_nesterov"))
    summary = run_real(cfg, tmp_path / "real")
    assert summary["status"] == "completed", summary["message"]
    simulate(cfg.replace(backend=BackendConfig()), tmp_path / "sim")
    (a, a_evals, _), (b, b_evals, _) = table_frames(tmp_path / "real"), table_frames(tmp_path / "sim")
    pd.testing.assert_series_equal(a.train_loss, b.train_loss, check_exact=True)
    check_same_evaluations(a_evals, b_evals)
    real_momentum = torch.load(tmp_path / "real" / "checkpoint.pt", weights_only=True)["server"]["rule"]["momentum"]
    assert torch.count_nonzero(real_momentum) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_methods_on_cuda(tmp_path, no_children):
    """GPU clients read their replies from pinned CPU frames (EASGD's exchange moves the centre
    onto the client's device first); the simulator on cuda runs every method; Rennala's
    collection and the outer momentum live beside a server on cuda."""
    for name, kw in sorted(SIM_METHODS.items()):
        assert simulate(sim_cfg(device="cuda", **kw), tmp_path / name)["status"] == "completed", name
    gpu = BackendConfig(name="real", timeout_s=60.0, client_timeout_s=30.0, client_device="cuda",
                        server_device="cuda")
    for name, kw in (("easgd", dict(algo=AlgoConfig(lr=0.2, momentum=0.0, server_rule="easgd"))),
                     ("rennala", dict(protocol=ProtocolConfig(name="rennala", collection_size=3))),
                     ("outer", dict(algo=AlgoConfig(lr=0.2, momentum=0.0, server_rule="outer_nesterov")))):
        summary = run_real(real_cfg(backend=gpu, **kw), tmp_path / f"real_{name}")
        assert summary["status"] == "completed", (name, summary["message"])
        assert all(d.startswith("cuda") for d in summary["client_devices"].values())
