"""The descendants of Downpour, their arithmetic on hand-computed cases: Ringmaster ASGD and
Rennala SGD (protocols), asynchronous EASGD and the outer Nesterov step of DiLoCo / asynchronous
local SGD (server rules); what each reduces to with one client; their config names and bad
input. (Both drivers running them: tests/test_methods_drivers.py.)"""
from __future__ import annotations


import pandas as pd
import pytest
import torch

from repro.asgd.algorithm import Push
from repro.asgd.optimal import Rennala, Ringmaster
from repro.asgd.protocols import NOTHING, PROTOCOLS, View
from repro.asgd.rules import ElasticExchange, ElasticRule, OuterNesterovRule
from repro.config.loader import compose, parse
from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, ProtocolConfig, RunConfig
from repro.errors import ConfigError
from repro.workload.build import build_net, load_data
from repro.workload.data import ClientStream
from repro.sim.driver import simulate
from tests.helpers.grids import cli_run
from tests.helpers.tables import table_bytes

UNIFORM = CostConfig(profile="uniform", compute_s=0.01)
JITTER = CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.5)


def cfg_for(**kw) -> RunConfig:
    base = dict(num_clients=3, nsync=1, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.0), cost=UNIFORM)
    base.update(kw)
    return RunConfig(**base)


def push(client, update, read_version=0, loss=1.0, samples=32):
    return Push(client=client, read_version=read_version, update=update, num_steps=1,
                num_samples=samples, train_loss=loss, train_error=0.5, stream_position=(0, 0))


LIVE = frozenset({1, 2, 3})

# ---------------------------------------------------------------------------------------------
# Ringmaster ASGD
# ---------------------------------------------------------------------------------------------


def test_ringmaster_discards_a_push_whose_staleness_reaches_r():
    """R = 2: staleness 0 and 1 are applied, staleness 2 is discarded (not applied, listed) and
    its client fetches; its next push, from the current version, is applied."""
    ring = Ringmaster(cfg_for(protocol=ProtocolConfig(name="ringmaster", staleness_threshold=2)), [1, 2, 3], 0)
    p1, p2, p3 = push(1, torch.ones(2)), push(2, torch.ones(2)), push(3, torch.ones(2))
    d = ring.on_push(p1, View(0, LIVE))
    assert (d.apply, d.reply, d.discarded) == (p1, (1,), ())
    assert ring.on_push(p2, View(1, LIVE)).apply is p2                    # staleness 1 < 2
    d = ring.on_push(p3, View(2, LIVE))                                   # staleness 2 >= 2
    assert (d.apply, d.reply, d.preempt, d.discarded) == (None, (3,), (), ((0, 3),))
    again = push(3, torch.ones(2), read_version=2)
    assert ring.on_push(again, View(2, LIVE)).apply is again
    assert not Ringmaster.preempts(cfg_for(protocol=ProtocolConfig(name="ringmaster")))


def test_ringmaster_with_stops_preempts_again_at_every_apply_as_the_paper_does():
    """R = 1 with calculation stops, the paper's Algorithm 5: every apply stops every other
    computing client (its segment is R applies old), a client stopped a moment ago included."""
    cfg = cfg_for(protocol=ProtocolConfig(name="ringmaster", staleness_threshold=1, cancel_stale=True))
    ring = Ringmaster(cfg, [1, 2, 3], 0)
    d = ring.on_push(push(1, torch.ones(2)), View(0, LIVE))
    assert d.apply is not None and (d.preempt, d.discarded) == ((2, 3), ((0, 2), (0, 3)))
    d = ring.on_push(push(1, torch.ones(2), read_version=1), View(1, LIVE))
    assert d.apply is not None and (d.preempt, d.discarded) == ((2, 3), ((1, 2), (1, 3)))
    assert ring.on_push(push(2, torch.ones(2), read_version=1), View(2, LIVE)) is NOTHING   # before its stop
    assert (ring.fetched, ring.restarting) == ({1: 2, 2: 2, 3: 2}, set())


def test_ringmaster_stop_once_preempts_clients_that_can_no_longer_arrive_in_time():
    """R = 1 with calculation stops and protocol.stop_once (our departure from the paper, for the
    real driver): an apply preempts every other computing client (its push could only be
    discarded); one preemption at a time: a client restarting is not preempted again until it
    has pushed from its new parameters (then, stale, it is discarded at once)."""
    cfg = cfg_for(protocol=ProtocolConfig(name="ringmaster", staleness_threshold=1, cancel_stale=True,
                                          stop_once=True))
    assert Ringmaster.preempts(cfg)
    ring = Ringmaster(cfg, [1, 2, 3], 0)
    d = ring.on_push(push(1, torch.ones(2)), View(0, LIVE))
    assert d.apply is not None and (d.reply, d.preempt, d.discarded) == ((1,), (2, 3), ((0, 2), (0, 3)))
    d = ring.on_push(push(1, torch.ones(2), read_version=1), View(1, LIVE))
    assert d.apply is not None and d.preempt == ()                  # 2 and 3 are restarting
    assert ring.on_push(push(2, torch.ones(2), read_version=0), View(2, LIVE)) is NOTHING   # sent before its stop
    d = ring.on_push(push(2, torch.ones(2), read_version=1), View(2, LIVE))
    assert (d.apply, d.reply, d.discarded) == (None, (2,), ((1, 2),))   # stale on arrival
    restored = Ringmaster(cfg, [1, 2, 3], 0)
    restored.load_state_dict(ring.state_dict())
    assert (restored.fetched, restored.restarting) == (ring.fetched, ring.restarting) == ({1: 2, 2: 2, 3: 1}, {3})


# ---------------------------------------------------------------------------------------------
# Rennala SGD
# ---------------------------------------------------------------------------------------------

def rennala(size, clients=(1, 2, 3), version=0):
    return Rennala(cfg_for(num_clients=len(clients), protocol=ProtocolConfig(name="rennala", collection_size=size)),
                   list(clients), version)


def test_rennala_collects_s_fresh_pushes_a_fast_client_several_then_restarts_everyone():
    """S = 3 with 3 clients: client 1 pushes twice (each time fetching the same version and
    computing again), client 2 once: their mean is applied, client 2 (the last) fetches, 1 and 3
    are preempted (their segments from version 4 dropped). A push of client 1 computed before
    its restart is ignored; the collection's size and makers are listed."""
    ren, live = rennala(3, version=4), LIVE
    d = ren.on_push(push(1, torch.full((2,), 1.0), read_version=4, loss=0.5), View(4, live))
    assert (d.apply, d.reply, d.preempt) == (None, (1,), ())
    assert ren.on_push(push(1, torch.full((2,), 2.0), read_version=4, loss=1.0), View(4, live)).reply == (1,)
    d = ren.on_push(push(2, torch.full((2,), 6.0), read_version=4, loss=3.0), View(4, live))
    assert torch.equal(d.apply.update, torch.full((2,), 3.0))          # (1 + 2 + 6) / 3
    assert (d.apply.client, d.apply.read_version, d.apply.num_samples) == (0, 4, 96)
    assert d.apply.train_loss == pytest.approx(1.5)
    assert (d.reply, d.preempt, d.discarded) == ((2,), (1, 3), ((4, 1), (4, 3)))
    assert d.collected == ((4, 1), (4, 1), (4, 2))
    assert ren.step_start == 5 and ren.collected() == 0
    assert ren.on_push(push(1, torch.ones(2), read_version=4), View(5, live)) is NOTHING
    assert Rennala.preempts(cfg_for()) and ren.waiting() == ()


def test_rennala_preempts_a_slow_client_once_and_discards_its_stale_push():
    """One preemption at a time: client 3, restarted at version 1, has not pushed when the next
    step closes: it is not preempted again; its push from version 1 arrives stale and is
    discarded, and it fetches the current parameters."""
    ren, live = rennala(1, clients=(1, 2, 3)), LIVE
    assert ren.on_push(push(1, torch.ones(2)), View(0, live)).preempt == (2, 3)
    assert ren.on_push(push(2, torch.ones(2), read_version=1), View(1, live)).preempt == (1,)
    d = ren.on_push(push(3, torch.ones(2), read_version=1), View(2, live))
    assert (d.apply, d.reply, d.preempt, d.discarded) == (None, (3,), (), ((1, 3),))
    restored = rennala(1, clients=(1, 2, 3))
    restored.load_state_dict(ren.state_dict())
    assert (restored.given, restored.restarting, restored.step_start) == (ren.given, ren.restarting, 2)


# float32: (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1: summed in arrival order these differ
UPDATES = {1: 1e8, 2: 1.0, 3: -1e8}


@pytest.mark.parametrize("half_way_checkpoint", [False, True])
def test_a_collection_does_not_depend_on_the_arrival_order(half_way_checkpoint):
    """The same pushes in two arrival orders give the same bits (summed per client, then in
    client order), also across a checkpoint of a half-full collection."""
    def collect(order):
        ren = rennala(4)
        for i, k in enumerate(order):
            if half_way_checkpoint and i == 2:
                state, ren = ren.state_dict(), rennala(4)
                ren.load_state_dict(state)
            d = ren.on_push(push(k, torch.full((3,), UPDATES[k]), loss=0.1 * k), View(0, LIVE))
        return d.apply
    a, b = collect((1, 2, 3, 1)), collect((3, 1, 1, 2))
    assert torch.equal(a.update, b.update) and a.train_loss == b.train_loss
    assert torch.equal(a.update, torch.full((3,), 1e8 / 4))   # ((1e8 + 1e8) + 1) - 1e8, / 4


def test_rennala_with_one_client_is_minibatch_sgd_with_batch_s(tmp_path):
    """Tyurin & Richtarik: with one worker, Rennala SGD is SGD on minibatches of S gradients at
    the same point. One client, S = 3, nsync 1, no momentum: each step is -lr times the mean of
    the gradients of three consecutive minibatches at w. Tolerance: a mean of three deltas
    against a delta of the mean gradient, float32 rounding over 6 steps."""
    cfg = cfg_for(num_clients=1, num_epochs=1.125, protocol=ProtocolConfig(name="rennala", collection_size=3))
    summary = simulate(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["version"] == 6
    assert summary["collected_pushes"] == [[v, 1] for v in range(6) for _ in range(3)]
    assert summary["discarded_pushes"] == []
    ds = load_data(cfg)
    net = build_net(cfg, ds)
    stream = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1)
    for _ in range(6):
        grads = []
        for _ in range(3):
            net.backward(*stream.next_batch())
            grads.append(net.grad.clone())
        net.params.add_(torch.stack(grads).mean(0), alpha=-cfg.algo.lr)
    final = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["server"]["params"]
    assert torch.allclose(final, net.params, rtol=0, atol=1e-6)


@pytest.mark.parametrize("protocol", [ProtocolConfig(name="ringmaster", staleness_threshold=1),
                                      ProtocolConfig(name="rennala", collection_size=1)])
def test_with_one_client_ringmaster_and_rennala_of_one_push_are_sgd(tmp_path, protocol):
    """One client's push is never stale (Ringmaster applies it) and a collection of one push is
    that push (Rennala's mean of one): both are sequential SGD, byte for byte the async run
    (Rennala's rows say client 0, a step's merged pushes, as sync's rounds)."""
    simulate(cfg_for(num_clients=1, cost=JITTER), tmp_path / "async")
    summary = simulate(cfg_for(num_clients=1, cost=JITTER, protocol=protocol), tmp_path / "method")
    assert summary["discarded_pushes"] == []
    (ours, our_evals), (theirs, their_evals) = table_bytes(tmp_path / "method"), table_bytes(tmp_path / "async")
    assert our_evals == their_evals
    if protocol.name == "rennala":
        ours = ours.replace(b",virtual,0,", b",virtual,1,")
    assert ours == theirs


@pytest.mark.parametrize("size, step_s", [(3, 0.02), (5, 0.025), (7, 0.03)])
def test_a_rennala_step_takes_the_exact_collection_time(tmp_path, size, step_s):
    """Fixed segment times tau = (1, 1, 2.5) x 10 ms, no latency: every step takes
    t(S) = min{t : sum_i floor(t / tau_i) >= S} (Tyurin & Richtarik 2023): t(3) = 2 (clients 1 and
    2 twice; client 3, slower than a step, never counts), t(5) = 2.5, t(7) = 3 (ms x 10)."""
    cost = CostConfig(profile="s", compute_s=0.01, straggler_client=3, straggler_factor=2.5)
    summary = simulate(cfg_for(num_epochs=4.0, cost=cost,
                               protocol=ProtocolConfig(name="rennala", collection_size=size)), tmp_path)
    up = pd.read_csv(tmp_path / "updates.csv")
    assert summary["status"] == "completed" and len(up) >= 10
    assert up.time_s.diff().fillna(up.time_s.iloc[0]).tolist() == pytest.approx([step_s] * len(up), rel=1e-9)
    assert (up.num_samples == size * 32).all()
    per_step = pd.Series([v for v, _ in summary["collected_pushes"]]).value_counts()
    assert (per_step == size).all() and len(per_step) == len(up)


# ---------------------------------------------------------------------------------------------
# EASGD
# ---------------------------------------------------------------------------------------------

def test_an_elastic_exchange_moves_centre_and_client_by_alpha():
    """alpha = 1/4, centre c = (0, 4), client x = (2, 0): c <- c + (x - c)/4 = (0.5, 3) on the
    server; the client, reading c' from its reply, moves x <- x - (x - c)/4 = (1.5, 1)."""
    rule = ElasticRule(elastic_alpha=0.25)
    centre, x = torch.tensor([0.0, 4.0]), torch.tensor([2.0, 0.0])
    rule.apply(centre, x.clone())
    assert torch.equal(centre, torch.tensor([0.5, 3.0]))
    rule.exchange.receive(x, centre)
    assert torch.allclose(x, torch.tensor([1.5, 1.0]), rtol=0, atol=1e-6)
    assert rule.push_kind == "params" and isinstance(rule.exchange, ElasticExchange)


def test_easgd_with_one_client_is_algorithm_1(tmp_path):
    """Zhang, Choromanska, LeCun (2015), Algorithm 1 with p = 1 worker: tau = nsync local SGD
    steps on the worker's own x, then x <- x - alpha (x - c), c <- c + alpha (x - c), both with
    the same c. alpha = 0.9 / 1 (the default). Both the centre (the server) and the client's own
    parameters (kept across exchanges; the last exchange's reply is STOP, so it stays where its
    last segment took it) match the loop written out. Tolerance: the client reads its move back
    from the new centre (x - c' = (1 - alpha)(x - c)), float32 rounding."""
    cfg = cfg_for(num_clients=1, nsync=3, num_epochs=1.5, algo=AlgoConfig(lr=0.05, momentum=0.0, server_rule="easgd"))
    summary = simulate(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["version"] == 8
    ds = load_data(cfg)
    net = build_net(cfg, ds)
    stream = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1)
    alpha, x = 0.9, net.params
    centre = x.detach().clone()
    for _ in range(8):
        for _ in range(3):
            net.backward(*stream.next_batch())
            x.add_(net.grad, alpha=-cfg.algo.lr)
        last = x.detach().clone()
        elastic = alpha * (x - centre)
        x.sub_(elastic)
        centre.add_(elastic)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.allclose(ckpt["server"]["params"], centre, rtol=0, atol=1e-5)
    assert torch.allclose(ckpt["driver"]["clients"]["1"]["params"], last, rtol=0, atol=1e-5)
    assert not torch.allclose(last, centre, rtol=0, atol=1e-3)   # the client keeps its own


# ---------------------------------------------------------------------------------------------
# the outer Nesterov step
# ---------------------------------------------------------------------------------------------

def test_outer_nesterov_is_torchs_nesterov_on_the_outer_gradient():
    """Hand-computed, lr 0.5, mu 0.5, outer gradients g = -delta = 1 then 2: m = 1, w = -0.5 (1 +
    0.5) = -0.75; m = 0.5 + 2 = 2.5, w = -0.75 - 0.5 (2 + 1.25) = -2.375. Then on random changes
    it follows torch.optim.SGD(nesterov=True) fed the same outer gradients (DiLoCo's outer
    optimiser); the momentum buffer survives a checkpoint."""
    rule, w = OuterNesterovRule(outer_lr=0.5, outer_momentum=0.5), torch.zeros(1)
    rule.apply(w, torch.tensor([-1.0]))
    assert w.item() == -0.75
    rule.apply(w, torch.tensor([-2.0]))
    assert w.item() == -2.375
    gen = torch.Generator().manual_seed(0)
    deltas = [torch.randn(5, generator=gen) for _ in range(6)]
    ours, theirs = torch.zeros(5), torch.zeros(5, requires_grad=True)
    rule = OuterNesterovRule(outer_lr=0.7, outer_momentum=0.9)
    opt = torch.optim.SGD([theirs], lr=0.7, momentum=0.9, nesterov=True)
    for i, delta in enumerate(deltas):
        if i == 3:
            again = OuterNesterovRule(outer_lr=0.7, outer_momentum=0.9)
            again.load_state_dict(rule.state_dict())
            rule = again
        rule.apply(ours, delta)
        theirs.grad = -delta
        opt.step()
    assert torch.allclose(ours, theirs.detach(), rtol=1e-6, atol=1e-6)


def test_delayed_nesterov_moves_the_momentum_once_every_d_applies():
    """Liu et al. (2024), delayed Nesterov, d = 2, lr 1, mu 0.5, outer gradients 1, 3, 1, 1:
    w = -1/2; then m = 0 + (1 + 3)/2 = 2, w = -0.5 - (3/2 + 0.5 x 2) = -3; w = -3.5; then
    m = 1 + (1 + 1)/2 = 2, w = -3.5 - (1/2 + 1) = -5. Over each pair the step is Nesterov's on
    the pair's mean gradient: -(mean + mu m)."""
    rule, w, seen = OuterNesterovRule(outer_lr=1.0, outer_momentum=0.5, outer_delay=2), torch.zeros(1), []
    for g in (1.0, 3.0, 1.0, 1.0):
        rule.apply(w, torch.tensor([-g]))
        seen.append(w.item())
    assert seen == [-0.5, -3.0, -3.5, -5.0]
    assert rule.state_dict()["count"] == 4 and rule.state_dict()["pending"].item() == 0.0


def test_outer_step_of_lr_1_without_momentum_is_the_delta_rule(tmp_path):
    """DiLoCo's outer optimiser at lr 1 without momentum is plain averaging (local SGD,
    FedAvg): w - 1 x (-delta - 0 x m) is w + delta to the last bit, so 3 asynchronous clients
    give the delta rule's tables byte for byte."""
    algo = AlgoConfig(lr=0.05, momentum=0.5, server_rule="outer_nesterov", outer_lr=1.0, outer_momentum=0.0)
    simulate(cfg_for(nsync=2, cost=JITTER, algo=algo), tmp_path / "outer")
    simulate(cfg_for(nsync=2, cost=JITTER, algo=AlgoConfig(lr=0.05, momentum=0.5)), tmp_path / "delta")
    assert table_bytes(tmp_path / "outer") == table_bytes(tmp_path / "delta")


# ---------------------------------------------------------------------------------------------
# config: names, published defaults, bad input
# ---------------------------------------------------------------------------------------------

def test_the_methods_compose_with_their_published_defaults():
    ring = parse(compose(["protocol=ringmaster"]))
    protocol = ring.protocol
    assert (protocol.name, protocol.staleness_threshold, protocol.cancel_stale) == ("ringmaster", None, False)
    assert not protocol.stop_once          # with cancel_stale: the paper's stops (Algorithm 5)
    real = parse(compose(["protocol=ringmaster", "protocol.cancel_stale=true", "protocol.stop_once=true",
                          "backend=real"]))
    assert (real.protocol.cancel_stale, real.protocol.stop_once) == (True, True)
    assert ring.protocol.resolved_staleness_threshold(ring.num_clients) == ring.num_clients
    ren = parse(compose(["protocol=rennala", "num_clients=8"]))
    assert ren.protocol.resolved_collection_size(8) == 8
    easgd = parse(compose(["algo=easgd", "num_clients=8"]))
    assert (easgd.algo.server_rule, easgd.algo.momentum, easgd.algo.elastic_alpha) == ("easgd", 0.0, None)
    assert easgd.algo.resolved_elastic_alpha(8) == 0.9 / 8        # beta = p alpha = 0.9
    outer = parse(compose(["algo=outer_nesterov", "protocol=sync"]))
    assert (outer.algo.outer_lr, outer.algo.outer_momentum, outer.algo.outer_delay) == (0.7, 0.9, 1)
    assert {"ringmaster", "rennala"} <= set(PROTOCOLS)


@pytest.mark.parametrize("overrides, key, expected", [
    (["protocol=ringmaster", "protocol.staleness_threshold=0"], "protocol.staleness_threshold", "1..1000000"),
    (["protocol=rennala", "protocol.collection_size=0"], "protocol.collection_size", "1..1000000"),
    (["protocol=rennala", "num_clients=2", "protocol.collection_size=201"], "protocol.collection_size", "1..200"),
    (["algo=easgd", "algo.elastic_alpha=1"], "algo.elastic_alpha", "(0, 1)"),
    (["algo=easgd", "algo.elastic_alpha=0"], "algo.elastic_alpha", "(0, 1)"),
    (["algo=easgd", "protocol=sync"], "protocol.name", "async with algo.server_rule=easgd"),
    (["algo=easgd", "protocol=ringmaster"], "protocol.name", "async with algo.server_rule=easgd"),
    (["algo=easgd", "algo.lr_server=0.5"], "algo.lr_server", "algo.elastic_alpha"),
    (["algo=outer_nesterov", "algo.lr_server=0.5"], "algo.lr_server", "algo.outer_lr"),
    (["algo=outer_nesterov", "algo.outer_delay=0"], "algo.outer_delay", "1..1000000"),
    (["algo=outer_nesterov", "algo.outer_momentum=1"], "algo.outer_momentum", "[0, 0.999999]"),
    (["protocol=ringmaster", "protocol.cancel_stale=true", "backend=real"], "protocol.stop_once",
     "true with backend=real and protocol.cancel_stale=true"),
])
def test_bad_input_names_the_key_before_any_work(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        parse(compose(overrides))
    assert f"'{key}'" in str(err.value) and expected in str(err.value), str(err.value)


def test_the_command_line_refuses_easgd_with_rounds_with_exit_2_and_no_folder(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, f"results_dir={tmp_path}", "algo=easgd", "protocol=sync")
    assert proc.returncode == 2, proc.stderr
    assert "'protocol.name': 'sync'; expected async with algo.server_rule=easgd" in proc.stderr
    assert not list(tmp_path.iterdir())
