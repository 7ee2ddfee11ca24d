"""Protocols as policies: told a push and who is live, a protocol returns a decision (what to
apply, who fetches, who is preempted, what was discarded) and holds no run core; the core checks,
applies, logs and delivers. A sync round is merged in client-id order, whatever the arrival
order, so its numbers do not depend on timing."""
import os
import signal

import pandas as pd
import pytest
import torch

from repro.asgd.algorithm import Push
from repro.asgd.flatnet import FlatNet
from repro.asgd.protocols import NOTHING, PROTOCOLS, SSP, Async, Decision, Policy, Sync, View
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.workload.start import build_problem
from repro.runs import core as core_module
from repro.runs.core import STALL_PUSHES, RunCore
from repro.runs.folder import run_folder
from repro.sim.driver import simulate

UNIFORM = CostConfig(profile="uniform", compute_s=0.01)
JITTER = CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.5)


def cfg_for(**kw) -> RunConfig:
    base = dict(num_clients=3, nsync=1, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.0), cost=UNIFORM)
    base.update(kw)
    return RunConfig(**base)


def push(client, update, loss=1.0, read_version=0, samples=32):
    return Push(client=client, read_version=read_version, update=update, num_steps=1,
                num_samples=samples, train_loss=loss, train_error=0.5, stream_position=(0, 0))


# ---------------------------------------------------------------------------------------------
# decisions
# ---------------------------------------------------------------------------------------------

def test_async_applies_each_push_and_replies_to_its_client():
    p = push(2, torch.ones(3))
    d = Async(cfg_for(), [1, 2, 3], 0).on_push(p, View(0, frozenset({1, 2, 3})))
    assert d == Decision(apply=p, reply=(2,))


def test_a_sync_round_is_one_merged_apply_replies_and_preemptions():
    """N = 3, b = 1: nothing until N - b pushes; then their mean, the two reply, the third is
    preempted and its segment listed as discarded; the next round starts at version + 1."""
    cfg = cfg_for(protocol=ProtocolConfig(name="sync", backup_workers=1))
    sync, live = Sync(cfg, [1, 2, 3], 5), frozenset({1, 2, 3})
    assert sync.on_push(push(2, torch.full((3,), 4.0), read_version=5), View(5, live)) is NOTHING
    assert sync.waiting() == (2,)
    d = sync.on_push(push(1, torch.full((3,), 2.0), read_version=5), View(5, live))
    assert torch.equal(d.apply.update, torch.full((3,), 3.0))
    assert (d.apply.client, d.apply.read_version, d.apply.num_samples) == (0, 5, 64)
    assert (d.reply, d.preempt, d.discarded) == ((1, 2), (3,), ((5, 3),))
    assert sync.round_start == 6 and sync.waiting() == ()
    # the preempted client's push computed from version 5 arrives late: ignored
    assert sync.on_push(push(3, torch.ones(3), read_version=5), View(6, live)) is NOTHING
    assert sync.waiting() == ()


def test_ssp_holds_a_client_ahead_of_the_slowest_and_releases_it():
    cfg = cfg_for(protocol=ProtocolConfig(name="ssp", staleness_bound=0))
    ssp, live = SSP(cfg, [1, 2], 0), frozenset({1, 2})
    d = ssp.on_push(push(1, torch.ones(2)), View(0, live))
    assert d.apply is not None and d.reply == () and ssp.waiting() == (1,)
    d = ssp.on_push(push(2, torch.ones(2)), View(1, live))
    assert d.apply is not None and d.reply == (1, 2)
    ssp.on_push(push(1, torch.ones(2), read_version=2), View(2, live))
    assert ssp.on_lost(2, View(3, frozenset({1}))).reply == (1,)   # the slowest left


def test_protocols_hold_no_core_and_declare_whether_they_preempt():
    cfg = cfg_for(protocol=ProtocolConfig(name="sync", backup_workers=1))
    for name in PROTOCOLS:
        policy = PROTOCOLS[name](cfg, [1, 2, 3], 0)
        assert isinstance(policy, Policy)
        assert not any(isinstance(v, RunCore) for v in vars(policy).values()), name
    assert Sync.preempts(cfg) and not Sync.preempts(cfg_for(protocol=ProtocolConfig(name="sync")))
    assert not Async.preempts(cfg) and not SSP.preempts(cfg)


# ---------------------------------------------------------------------------------------------
# a sync round merged in client order
# ---------------------------------------------------------------------------------------------

# float32: (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1; float64: (0.3 + 0.1) + 0.2 differs
# from (0.2 + 0.3) + 0.1 in the last bit. Summed in arrival order, the two orders below differ.
UPDATES = {1: 1e8, 2: 1.0, 3: -1e8}
LOSSES = {1: 0.3, 2: 0.1, 3: 0.2}


def _round_in_order(tmp_path, order) -> tuple[torch.Tensor, list[str]]:
    cfg = cfg_for(protocol=ProtocolConfig(name="sync"))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="virtual", backend="sim")
        core.begin([1, 2, 3])
        for k in order:
            update = torch.full_like(core.server.params, UPDATES[k])
            replies = core.on_push(push(k, update, loss=LOSSES[k], samples=1), 1.0).replies
        assert sorted(r.client for r in replies) == [1, 2, 3] and core.server.version == 1
        params = core.server.params.clone()
        core.finish("interrupted")
    row = (tmp_path / "updates.csv").read_text().splitlines()[1].split(",")
    return params, row


def test_a_sync_round_does_not_depend_on_the_arrival_order(tmp_path):
    a_params, a_row = _round_in_order(tmp_path / "a", (1, 2, 3))
    b_params, b_row = _round_in_order(tmp_path / "b", (3, 1, 2))
    assert torch.equal(a_params, b_params)    # bitwise: the same sum in the same order
    assert a_row == b_row                     # the logged row, train_loss to the last digit
    init = build_problem(cfg_for(), torch.device("cpu")).init_params
    assert torch.equal(a_params, init + 0.0)  # (1e8 + 1) - 1e8 in float32, divided by 3


def test_a_half_full_round_survives_a_checkpoint():
    """Sync's state keeps each held push: a round restored from it merges to the same bits."""
    cfg, live = cfg_for(protocol=ProtocolConfig(name="sync")), frozenset({1, 2, 3})
    whole, cut = Sync(cfg, [1, 2, 3], 0), Sync(cfg, [1, 2, 3], 0)
    for k in (3, 1):
        whole.on_push(push(k, torch.full((4,), UPDATES[k]), loss=LOSSES[k]), View(0, live))
        cut.on_push(push(k, torch.full((4,), UPDATES[k]), loss=LOSSES[k]), View(0, live))
    restored = Sync(cfg, [1, 2, 3], 0)
    restored.load_state_dict(cut.state_dict())
    last = push(2, torch.full((4,), UPDATES[2]), loss=LOSSES[2])
    a, b = whole.on_push(last, View(0, live)), restored.on_push(last, View(0, live))
    assert torch.equal(a.apply.update, b.apply.update) and a.apply.train_loss == b.apply.train_loss
    assert a.reply == b.reply == (1, 2, 3)


def test_each_push_of_a_sync_round_is_checked_before_it_is_merged(tmp_path):
    """The core checks every push once: a round's first push with a non-finite loss ends the
    run diverged at once, nothing applied, and the client waiting in the round is told STOP."""
    cfg = cfg_for(protocol=ProtocolConfig(name="sync"))
    with run_folder(cfg, tmp_path) as run:
        problem = build_problem(cfg, torch.device("cpu"))
        run.core = core = RunCore(cfg, problem, tmp_path, clock="virtual", backend="sim")
        core.begin([1, 2, 3])
        delta = torch.zeros_like(core.server.params)
        assert core.on_push(push(2, delta), 1.0).replies == ()
        replies = core.on_push(push(1, delta, loss=float("nan")), 1.0).replies
        assert sorted((r.client, r.stop) for r in replies) == [(1, True), (2, True)]
        assert core.server.version == 0 and "client 1" in core.state.diverged
        summary = core.finish(*core.final_status(interrupted=False))
    assert summary["status"] == "diverged"


def test_sim_sync_resumes_a_half_full_round_and_a_half_computed_push_bitwise(tmp_path, monkeypatch):
    """A stop request in the middle of a push of a half-full round: the push is abandoned (its
    client rewound), the round's held pushes and the pending push go into the checkpoint, and
    the resumed run's tables are byte-identical to an uninterrupted run's."""
    cfg = cfg_for(num_clients=3, nsync=4, num_epochs=3.0, cost=JITTER,
                  algo=AlgoConfig(lr=0.05, momentum=0.5), protocol=ProtocolConfig(name="sync"))
    assert simulate(cfg, tmp_path / "whole")["status"] == "completed"
    calls, backward = [0], FlatNet.backward

    def interrupt_at_step_30(self, x, y):
        calls[0] += 1
        if calls[0] == 30:     # 12 steps a round: the 2nd local step of round 3's 2nd push
            os.kill(os.getpid(), signal.SIGINT)
        return backward(self, x, y)

    monkeypatch.setattr(FlatNet, "backward", interrupt_at_step_30)
    cut = simulate(cfg, tmp_path / "cut")
    monkeypatch.setattr(FlatNet, "backward", backward)
    assert cut["status"] == "interrupted" and calls[0] == 30          # not one step more
    ckpt = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)
    assert ckpt["driver"]["pending"] is not None and ckpt["protocol"]["pushes"]   # half full
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    for table in ("updates.csv", "evals.csv"):
        assert (tmp_path / "cut" / table).read_bytes() == (tmp_path / "whole" / table).read_bytes()


# ---------------------------------------------------------------------------------------------
# no loop without progress
# ---------------------------------------------------------------------------------------------

class _DiscardsAll(Policy):
    """A broken protocol: every push discarded, its client fetches and goes on."""

    def on_push(self, push, view):
        return Decision(reply=(push.client,), discarded=((push.read_version, push.client),))


class _HoldsAll(Policy):
    """A broken protocol: every client waits for a reply that never comes."""

    def __init__(self, cfg, clients, version):
        self.held = []

    def on_push(self, push, view):
        self.held.append(push.client)
        return NOTHING

    def waiting(self):
        return tuple(self.held)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy, why", [(_DiscardsAll, "makes no progress"), (_HoldsAll, "deadlock")])
def test_a_protocol_that_makes_no_progress_fails_the_run(tmp_path, monkeypatch, policy, why):
    monkeypatch.setattr(core_module, "make_protocol", lambda cfg, clients, version: policy(cfg, clients, version))
    summary = simulate(cfg_for(), tmp_path)
    assert summary["status"] == "failed" and why in summary["message"], summary["message"]
    assert summary["version"] == 0
    if policy is _DiscardsAll:
        assert len(summary["discarded_pushes"]) == STALL_PUSHES * 3 + 1
    assert pd.read_csv(tmp_path / "updates.csv").empty
