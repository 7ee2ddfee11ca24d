"""The algorithm's arithmetic: local optimiser, server rules, staleness, and the reduction
"one client = sequential SGD"."""
import pytest
import torch

from repro.algorithm import AdagradRule, DeltaRule, DownpourRule, LocalSGD, Push, Server, make_rule
from repro.components import build_worker, load_data, make_clients, make_server
from repro.config import AlgoConfig, DataConfig, ModelConfig, RunConfig
from repro.data import ClientStream
from repro.models import build_model


def _push(update, read_version=0, client=1):
    return Push(client=client, read_version=read_version, update=update, num_steps=1, num_samples=1,
                train_loss=0.0, train_error=0.0, stream_position=(0, 0))


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.5, 5e-4)])
def test_local_sgd_matches_torch_sgd_bitwise(momentum, wd):
    torch.manual_seed(0)
    w = torch.randn(50)
    ref = w.clone().requires_grad_(True)
    opt = torch.optim.SGD([ref], lr=0.1, momentum=momentum, weight_decay=wd)
    ours = LocalSGD(0.1, momentum, wd)
    for _ in range(5):
        g = torch.randn(50)
        ref.grad = g.clone()
        opt.step()
        ours.step(w, g.clone())
    assert torch.equal(w, ref.detach())


def test_server_rules_arithmetic():
    u = torch.tensor([1.0, -2.0, 0.5])
    p = torch.zeros(3)
    DeltaRule(1.0).apply(p, u)
    assert torch.equal(p, u)
    p = torch.ones(3)
    DownpourRule(0.1).apply(p, u)
    assert torch.allclose(p, torch.tensor([0.9, 1.2, 0.95]))
    p, rule = torch.zeros(3), AdagradRule(0.1, eps=0.0)
    rule.apply(p, u)                       # first step: -lr * u / |u| = -lr * sign(u)
    assert torch.allclose(p, -0.1 * torch.sign(u))
    rule.apply(p, u)                       # second: sum_sq = 2u^2 -> step lr/sqrt(2)
    assert torch.allclose(p, -0.1 * torch.sign(u) * (1 + 2 ** -0.5))
    assert make_rule("delta", 1.0).push_kind == "delta"
    assert make_rule("adagrad", 0.1).push_kind == make_rule("downpour", 0.1).push_kind == "gradient"


def test_server_counts_versions_and_staleness():
    server = Server(torch.zeros(2), DeltaRule())
    assert server.apply(_push(torch.ones(2), read_version=0)).staleness == 0
    assert server.apply(_push(torch.ones(2), read_version=0)).staleness == 1
    applied = server.apply(_push(torch.ones(2), read_version=1))
    assert (applied.version, applied.staleness) == (3, 1)
    assert torch.equal(server.params, torch.full((2,), 3.0))
    with pytest.raises(ValueError, match="never had"):
        server.apply(_push(torch.ones(2), read_version=7))


def _sequential_sgd(cfg, ds, num_steps):
    """A plain training loop: torch.optim.SGD on an ordinary module, client 1's data order."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.algo.lr, momentum=cfg.algo.momentum,
                          weight_decay=cfg.algo.weight_decay)
    stream = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1)
    for _ in range(num_steps):
        x, y = stream.next_batch()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


@pytest.mark.parametrize("nsync", [1, 3, 8])
@pytest.mark.parametrize("rule", ["delta", "downpour"])
def test_one_client_is_sequential_sgd(nsync, rule):
    """One client, any nsync: the server's trajectory is the plain loop's.

    Tolerance: with the delta rule the server computes w + (w' - w), which rounds to w' only up
    to one float32 ulp per exchange; downpour without momentum replays lr * g exactly but sums g
    over the segment first. Both are ~1e-7 relative per exchange, and the loop below keeps them
    far below atol=1e-5 over 48 steps; a wrong data order or a missed step is off by > 1e-2.
    """
    momentum = 0.9 if rule == "delta" else 0.0   # downpour's server has no momentum
    cfg = RunConfig(seed=3, num_clients=1, nsync=nsync, data=DataConfig(name="synthetic"),
                    model=ModelConfig(name="digits_cnn"),
                    algo=AlgoConfig(lr=0.05, momentum=momentum, weight_decay=1e-4, server_rule=rule))
    ds = load_data(cfg)
    worker = build_worker(cfg, ds)
    server = make_server(cfg, worker.params)
    (client,) = make_clients(cfg, ds)
    client.fetch(server.params, server.version)
    num_steps = 48 // nsync * nsync
    for _ in range(num_steps // nsync):
        push = client.compute_push(worker, nsync)
        assert server.apply(push).staleness == 0
        client.fetch(server.params, server.version)
    expected = _sequential_sgd(cfg, ds, num_steps)
    assert torch.allclose(server.params, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(server.params, _sequential_sgd(cfg, ds, num_steps - 1), rtol=0, atol=1e-3)
