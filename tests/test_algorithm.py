"""The algorithm's arithmetic: local optimiser, server rules, staleness, and the reduction
"one client = sequential SGD"."""
import pytest
import torch

from repro.asgd.algorithm import LocalSGD, Push, ParameterServer
from repro.asgd.rules import AdagradRule, DeltaRule, DownpourRule, make_rule
from repro.config.settings import AlgoConfig, DataConfig, ModelConfig, RunConfig
from repro.workload.build import build_net, load_data, make_clients, make_server
from repro.workload.data import ClientStream
from repro.workload.models import build_model


def _push(update, read_version=0, client=1):
    return Push(client=client, read_version=read_version, update=update, num_steps=1, num_samples=1,
                train_loss=0.0, train_error=0.0, stream_position=(0, 0))


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 0.0), (0.5, 5e-4)])
def test_local_sgd_matches_torch_sgd_bitwise(momentum, wd):
    """Bitwise on any CPU and thread count: both apply the same elementwise kernels (mul, add
    with alpha) in the same order to tensors of the same size; there is no reduction, so each
    element goes through the same IEEE operations whatever splits the work across threads."""
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
    server = ParameterServer(torch.zeros(2), DeltaRule())
    assert server.apply(_push(torch.ones(2), read_version=0)).staleness == 0
    assert server.apply(_push(torch.ones(2), read_version=0)).staleness == 1
    applied = server.apply(_push(torch.ones(2), read_version=1))
    assert (applied.version, applied.staleness) == (3, 1)
    assert torch.equal(server.params, torch.full((2,), 3.0))
    with pytest.raises(ValueError, match="never had"):
        server.apply(_push(torch.ones(2), read_version=7))


def _sequential_sgd(cfg, ds, num_steps):
    """Sequential SGD with no server: the same network object (a FlatNet, the flat-parameter network) and the
    same LocalSGD arithmetic the client uses, one minibatch after another, client 1's data order."""
    net = build_net(cfg, ds)
    opt = LocalSGD(cfg.algo.lr, cfg.algo.momentum, cfg.algo.weight_decay)
    stream = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1)
    for _ in range(num_steps):
        net.backward(*stream.next_batch())
        opt.step(net.params, net.grad)
    return net.params.detach().clone()


def _one_client_cfg(rule, nsync):
    momentum = 0.9 if rule == "delta" else 0.0   # downpour's server has no momentum
    return RunConfig(seed=3, num_clients=1, nsync=nsync, data=DataConfig(name="synthetic"),
                     model=ModelConfig(name="digits_cnn"),
                     algo=AlgoConfig(lr=0.05, momentum=momentum, weight_decay=1e-4, server_rule=rule))


@pytest.mark.parametrize("nsync", [1, 3, 8])
@pytest.mark.parametrize("rule", ["delta", "downpour"])
def test_one_client_is_sequential_sgd(nsync, rule):
    """One client, any nsync: the server's trajectory is sequential SGD's.

    Why the comparison is exact up to the server's own rounding, on any CPU and thread count:
    both sides run the *same* net (the same kernels on the same memory layout, in one process
    at one thread count) on the same minibatches, so their gradients are bitwise equal as long as
    their parameters are. The only difference is the server's arithmetic. Downpour at nsync 1
    computes ``w - lr*g`` exactly as the client does (lr_server = lr): bitwise equal. At nsync > 1
    it sums the segment's gradients before applying; the delta rule computes ``w + (w' - w)``,
    which rounds to ``w'`` within one float32 ulp. Those roundings (~1e-7 relative per exchange)
    are what atol=1e-5 allows for over 48 steps; a missed step or a wrong data order is off by
    more than 1e-3 (asserted below). That the net itself computes torch's SGD is a separate
    claim: ``test_local_sgd_matches_torch_sgd_bitwise`` and
    ``test_flat_worker_gradient_is_the_plain_module_gradient``.
    """
    cfg = _one_client_cfg(rule, nsync)
    ds = load_data(cfg)
    net = build_net(cfg, ds)
    server = make_server(cfg, net.params)
    (client,) = make_clients(cfg, ds)
    client.fetch(server.params, server.version)
    num_steps = 48 // nsync * nsync
    for _ in range(num_steps // nsync):
        push = client.compute_push(net, nsync)
        assert server.apply(push).staleness == 0
        client.fetch(server.params, server.version)
    expected = _sequential_sgd(cfg, ds, num_steps)
    if rule == "downpour" and nsync == 1:
        assert torch.equal(server.params, expected)
    assert torch.allclose(server.params, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(server.params, _sequential_sgd(cfg, ds, num_steps - 1), rtol=0, atol=1e-3)


def test_flat_worker_gradient_is_the_plain_module_gradient():
    """The FlatNet computes the gradient an ordinary module computes.

    Compared after ONE step, to float rounding (rtol 1e-5): the two hold their parameters in
    different memory (views of one flat vector vs separate tensors), and a BLAS or oneDNN kernel
    may split a reduction differently for different layouts or thread counts. Over many steps
    such last-bit differences may grow, which is why no test compares whole trajectories of the
    two across kernels.
    """
    cfg = _one_client_cfg("delta", 1)
    ds = load_data(cfg)
    net = build_net(cfg, ds)
    torch.manual_seed(cfg.seed)
    plain = build_model(cfg.model.name, ds.input_shape, ds.num_classes)
    x, y = ClientStream(ds.x_train, ds.y_train, cfg.algo.batch_size, cfg.seed, 1).next_batch()
    net.backward(x, y)
    torch.nn.functional.cross_entropy(plain(x), y).backward()
    assert torch.equal(net.params, torch.nn.utils.parameters_to_vector(plain.parameters()))
    plain_grad = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
    assert torch.allclose(net.grad, plain_grad, rtol=1e-5, atol=1e-7)
    assert net.grad.abs().max() > 1e-3   # a real gradient, not two zeros
