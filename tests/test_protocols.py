"""The staleness lab's machinery: protocols (async, sync with backup workers, ssp), the
staleness-aware server rules, and divergence a teacher would call divergence."""
import json

import pandas as pd
import pytest
import torch

from repro.asgd.algorithm import Push
from repro.asgd.rules import DCASGDRule, StalenessScaledRule
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.workload.build import build_net, load_data
from repro.workload.data import ClientStream
from repro.workload.start import build_problem
from repro.runs.core import RunCore
from repro.runs.folder import run_folder
from repro.sim.driver import simulate

UNIFORM = CostConfig(profile="uniform", compute_s=0.01)


def cfg_for(**kw) -> RunConfig:
    base = dict(num_clients=4, nsync=1, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.0), cost=UNIFORM)
    base.update(kw)
    return RunConfig(**base)


def _push(update, client=1, read_version=0):
    return Push(client=client, read_version=read_version, update=update, num_steps=1, num_samples=32,
                train_loss=1.0, train_error=0.5, stream_position=(0, 0))


# ---------------------------------------------------------------------------------------------
# rules, on hand-computed examples
# ---------------------------------------------------------------------------------------------

def test_staleness_scaled_rule_divides_the_step_by_staleness():
    g = torch.tensor([1.0, -2.0])
    rule, w = StalenessScaledRule(0.5), torch.zeros(2)
    rule.apply(w, g, staleness=0)                 # fresh: full step, -0.5 * g
    assert torch.equal(w, torch.tensor([-0.5, 1.0]))
    rule.apply(w, g, staleness=4)                 # 4 updates behind: a quarter, -0.125 * g
    assert torch.equal(w, torch.tensor([-0.625, 1.25]))


def test_dcasgd_compensates_with_the_fetched_parameters():
    """w <- w - lr (g + lambda g*g*(w - w_bak)): w_bak = [1, 1] (fetched), w = [2, 0] now,
    g = [1, 2], lambda = 0.5, lr = 0.1: g~ = [1 + .5*1*1, 2 + .5*4*(-1)] = [1.5, 0];
    w = [2 - .15, 0 - 0] = [1.85, 0]."""
    rule = DCASGDRule(0.1, dc_lambda=0.5)
    rule.fetched(3, torch.tensor([1.0, 1.0]))
    w = torch.tensor([2.0, 0.0])
    rule.apply(w, torch.tensor([1.0, 2.0]), staleness=2, client=3)
    assert torch.allclose(w, torch.tensor([1.85, 0.0]))
    rule.fetched(3, w)                           # a fresh fetch: no compensation
    before = w.clone()
    rule.apply(w, torch.tensor([1.0, 2.0]), staleness=0, client=3)
    assert torch.allclose(w, before - 0.1 * torch.tensor([1.0, 2.0]))
    again = DCASGDRule(0.1, dc_lambda=0.5)
    again.load_state_dict(rule.state_dict())     # the backups survive a checkpoint
    assert torch.equal(again.backups["3"], before)


# ---------------------------------------------------------------------------------------------
# sync: a round is large-batch SGD; backup workers
# ---------------------------------------------------------------------------------------------

def test_sync_is_large_batch_sgd_on_the_union_of_the_minibatches(tmp_path):
    """N clients, nsync 1, momentum 0, uniform costs: each round every client computes
    -lr * g_k(w) on its own minibatch from the same w, and the server adds their mean, which is
    -lr times the gradient of the union of the minibatches (equal sizes: the mean of means).
    Tolerance: the two sum the same products in a different order (a per-batch mean then a mean
    over clients, against one mean over the union): float32 rounding, ~1e-7 relative per round,
    allowed 1e-5 absolute over 8 rounds; one client's batch left out moves them by > 1e-3."""
    cfg = cfg_for(num_clients=4, num_epochs=2.0, protocol=ProtocolConfig(name="sync"))
    summary = simulate(cfg, tmp_path)
    rounds = summary["version"]
    assert summary["status"] == "completed" and rounds == 8            # 512 samples, 128 a round
    ds = load_data(cfg)
    net = build_net(cfg, ds)
    streams = [ClientStream(ds.x_train, ds.y_train, 32, cfg.seed, k) for k in range(1, 5)]
    for _ in range(rounds):
        batches = [s.next_batch() for s in streams]
        net.backward(torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
        net.params.add_(net.grad, alpha=-cfg.algo.lr)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.allclose(ckpt["server"]["params"], net.params, rtol=0, atol=1e-5)
    up = pd.read_csv(tmp_path / "updates.csv")
    assert (up.staleness == 0).all() and (up.client == 0).all() and (up.num_samples == 128).all()


def test_ssp_with_bound_0_follows_sync(tmp_path):
    """ssp at s = 0 makes every client wait for the slowest after each push: rounds in which
    every push is applied (their sum). With lr_server = 1/N the delta rule's round adds the mean
    of the deltas, which is sync's update: the same trajectory, to float rounding (N sequential
    adds of delta/N against one add of sum/N)."""
    n = 4
    sync = simulate(cfg_for(num_clients=n, protocol=ProtocolConfig(name="sync")), tmp_path / "sync")
    ssp = simulate(cfg_for(num_clients=n, protocol=ProtocolConfig(name="ssp", staleness_bound=0),
                           algo=AlgoConfig(lr=0.05, momentum=0.0, lr_server=1 / n)), tmp_path / "ssp")
    assert ssp["version"] == n * sync["version"]
    a = torch.load(tmp_path / "sync" / "checkpoint.pt", weights_only=True)["server"]["params"]
    b = torch.load(tmp_path / "ssp" / "checkpoint.pt", weights_only=True)["server"]["params"]
    assert torch.allclose(a, b, rtol=0, atol=1e-6)
    ev_a, ev_b = pd.read_csv(tmp_path / "sync" / "evals.csv"), pd.read_csv(tmp_path / "ssp" / "evals.csv")
    pd.testing.assert_series_equal(ev_a.test_error, ev_b.test_error)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_never_lets_a_client_run_more_than_s_pushes_ahead(tmp_path, seed, bound):
    """A client pushes only while it is at most s pushes ahead of the slowest live client, so
    after any push max(count) - min(count) <= s + 1, under heavy seeded jitter; staleness is
    bounded accordingly, and the bound is reached (the protocol does bind)."""
    jitter = CostConfig(profile="j", compute_s=0.01, jitter="exponential", jitter_sigma=1.0,
                        straggler_client=1, straggler_factor=3.0)
    simulate(cfg_for(seed=seed, num_epochs=4.0, cost=jitter,
                     protocol=ProtocolConfig(name="ssp", staleness_bound=bound)), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    counts, gaps = {k: 0 for k in range(1, 5)}, []
    for k in up.client:
        counts[k] += 1
        gaps.append(max(counts.values()) - min(counts.values()))
    assert max(gaps) <= bound + 1
    assert max(gaps) == bound + 1          # the slow client makes the others reach the bound
    assert up.staleness.max() <= (bound + 1) * 4


def test_backup_workers_discard_exactly_b_pushes_per_round(tmp_path):
    """With b backups a round closes at N - b pushes, and the b clients still computing are
    told to drop their segment and start from the new parameters (listed in the summary as
    [round, client]): every round discards exactly b, and every round starts with all N."""
    n, b = 6, 2
    jitter = CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.5)
    summary = simulate(cfg_for(num_clients=n, num_epochs=6.0, cost=jitter,
                               protocol=ProtocolConfig(name="sync", backup_workers=b)), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    assert (up.num_samples == (n - b) * 32).all() and len(up) > 20
    per_round = pd.Series([r for r, _ in summary["discarded_pushes"]]).value_counts()
    assert sorted(per_round.index) == sorted(up.read_version)    # every closed round ...
    assert (per_round == b).all()                                 # ... dropped exactly b
    late = {}
    for r, k in summary["discarded_pushes"]:
        late.setdefault(r, set()).add(k)
    assert any(late[r] != late[r + 1] for r in list(late)[:-1])   # not always the same clients


def test_a_late_push_is_discarded_and_its_client_starts_from_the_new_parameters(tmp_path):
    """The protocol, driven by hand through the run core: N = 3, b = 1. Clients 1 and 2 close
    round 0 (version 1): they fetch, and client 3, still computing from version 0, is sent the
    new parameters at once (preempted: its segment is dropped). A push it sent before it saw
    them (a race in the real driver) is ignored; its next push reads version 1 and counts."""
    cfg = cfg_for(num_clients=3, protocol=ProtocolConfig(name="sync", backup_workers=1))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="virtual", backend="sim")
        core.begin([1, 2, 3])
        delta = torch.full_like(core.server.params, 0.01)
        assert core.on_push(_push(delta, 1), 1.0).replies == ()   # waits for the round
        replies = core.on_push(_push(3 * delta, 2), 1.0).replies   # N - b = 2: round closes
        assert sorted((r.client, r.preempt) for r in replies) == [(1, False), (2, False), (3, True)]
        assert core.server.version == 1
        assert torch.allclose(core.server.params, problem.init_params + 2 * delta)   # the mean
        assert core.on_push(_push(delta, 3, read_version=0), 1.5).replies == ()  # sent before it knew
        assert core.server.version == 1
        assert core.on_push(_push(delta, 3, read_version=1), 2.0).replies == ()  # counts in round 1
        assert core.discarded == [[0, 3]]
        core.finish("interrupted")


# ---------------------------------------------------------------------------------------------
# divergence
# ---------------------------------------------------------------------------------------------

def test_a_loss_beyond_the_divergence_factor_ends_the_run_diverged(tmp_path):
    """The factor rule, not a NaN: with divergence_factor just above 1 the first push whose loss
    exceeds the reference (the larger of the version-0 loss and ln 10) ends the run."""
    summary = simulate(cfg_for(divergence_factor=1.0001, algo=AlgoConfig(lr=2.0, momentum=0.9)),
                       tmp_path)
    assert summary["status"] == "diverged"
    assert "divergence_factor" in summary["message"]
    event = next(e for e in summary["events"] if e["type"] == "diverged")
    up = pd.read_csv(tmp_path / "updates.csv")
    assert event["version"] == len(up)                       # stopped at the offending push
    ref = max(pd.read_csv(tmp_path / "evals.csv").train_loss.iloc[0], torch.log(torch.tensor(10.0)).item())
    assert (up.train_loss <= 1.0001 * ref).all()             # no applied push broke the rule


def test_async_protocol_rows_say_which_protocol_ran(tmp_path):
    summary = simulate(cfg_for(num_epochs=0.5), tmp_path)
    assert summary["protocol"] == "async"
    assert json.loads((tmp_path / "config.json").read_text())["protocol"]["name"] == "async"


def test_a_protocol_key_the_protocol_does_not_read_is_warned_of(tmp_path, caplog):
    """protocol=async protocol.backup_workers=2 ran as plain async without a word: the run says
    which key it ignores; a key the protocol reads (sync's backup workers), a default, or a
    protocol registered by a user (which may read any key) says nothing."""
    import logging

    def warned(name, **keys):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="repro"):
            simulate(cfg_for(num_epochs=0.2, protocol=ProtocolConfig(name=name, **keys)), tmp_path / f"{name}{len(keys)}")
        return [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]

    assert warned("async", backup_workers=2, collection_size=3) == [
        "protocol.backup_workers=2 is ignored: protocol=async does not read it",
        "protocol.collection_size=3 is ignored: protocol=async does not read it"]
    assert warned("ssp", stop_once=True) == ["protocol.stop_once=True is ignored: protocol=ssp does not read it"]
    assert warned("sync", backup_workers=2) == [] and warned("rennala", collection_size=3) == []
    assert warned("ssp") == []
