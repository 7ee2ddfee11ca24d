"""Contention in the simulator's clock (cost.topology=shared, repro/sim/resources.py): each shared
resource's queueing on schedules computed by hand, one user = the dedicated clock's times bit for
bit, determinism and resume with contention on, replay unaffected, and bad input refused.

Every expected time below is a sum of dyadic fractions (1, 0.5, 0.25), exact in binary floating
point, so the comparisons are exact at any thread count and on any machine.
"""
import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from repro.config.settings import AlgoConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.errors import ConfigError
from repro.run import compose, parse
from repro.sim.cost import CostModel, CostScheduler
from repro.sim.driver import simulate
from repro.sim.resources import ContendedScheduler, max_min_shares

from tests.helpers.grids import cli_run


def shared(**kw) -> CostConfig:
    """Steps of 1 s; a transfer of 4 bytes at 4 B/s = 1 s alone (comm_params=1: one float32)."""
    base = dict(profile="t", compute_s=1.0, bandwidth_Bps=4.0, comm_params=1.0, topology="shared")
    return CostConfig.of(**{**base, **kw})


def schedule(cost: CostConfig, clients: int, pushes: int, nsync: int = 1, seed: int = 0,
             clock=ContendedScheduler) -> list[tuple[int, float]]:
    """(client, apply-finished time) of the first ``pushes`` pushes, every client served at once."""
    s = clock(CostModel(cost, seed, param_bytes=4, step_s=cost.compute_s), list(range(1, clients + 1)), nsync)
    out = []
    for _ in range(pushes):
        k, _, t = s.next()
        t = s.handled(t, False)
        out.append((k, t))
        s.served(k, t)
    return out


# ---------------------------------------------------------------------------------------------
# Each resource, by hand
# ---------------------------------------------------------------------------------------------

def test_two_clients_share_the_servers_link_and_queue_for_its_apply():
    """Two hosts of one client, one server link (1 s per transfer alone), apply 0.25 s.
    Both compute [0, 1]; both pushes share the inbound link at half speed: both arrive at 3.
    Applies: client 1 [3, 3.25], client 2 [3.25, 3.5]. Client 1's fetch runs alone from 3.25,
    shares the outbound link from 3.5 (0.75 s of work left at half speed: done at 5); client 2's
    fetch has 0.25 left at 5: done at 5.25. Computes [5, 6] and [5.25, 6.25]; client 1's push
    runs alone to 6.25 (0.75 left), then at half speed: arrives 7.75, applied [7.75, 8]; client 2's
    push has 0.25 left at 7.75: arrives 8, applied [8, 8.25]."""
    assert schedule(shared(server_apply_s=0.25), 2, 4) == [(1, 3.25), (2, 3.5), (1, 8.0), (2, 8.25)]


def test_two_clients_on_one_host_share_its_link():
    """One host of two clients; the server's link unlimited in effect (1e15 B/s). Pushes share
    the host's uplink: both arrive at 3; fetches share its downlink [3, 5]; computes [5, 6];
    pushes [6, 8]. With hosts of one client each, nothing is shared: a push every 3 s."""
    cost = shared(clients_per_host=2, server_bandwidth_Bps=1e15)
    assert schedule(cost, 2, 4) == [(1, 3.0), (2, 3.0), (1, 8.0), (2, 8.0)]
    alone = shared(clients_per_host=1, server_bandwidth_Bps=1e15)
    assert schedule(alone, 2, 4) == [(1, 2.0), (2, 2.0), (1, 5.0), (2, 5.0)]


def test_links_are_full_duplex_a_push_and_a_fetch_do_not_slow_each_other():
    """Client 2 computes 3x slower (one host, one server link). Client 1: compute [0, 1], push
    [1, 2], applied 2; fetch [2, 3], compute [3, 4], push [4, 5]. Client 2: compute [0, 3], push
    [3, 4] (client 1 fetched then, the other way), applied 4; its fetch [4, 5] runs down while
    client 1's push runs up: both at full speed, so client 1's push is applied at 5 (6 if the
    link were shared both ways)."""
    cost = shared(clients_per_host=2, straggler_client=2, straggler_factor=3.0)
    assert schedule(cost, 2, 3) == [(1, 2.0), (2, 4.0), (1, 5.0)]


def test_clients_on_one_device_share_it_by_processor_sharing():
    """Two clients, one device, free communication, apply 0.5 s. Both compute at half speed:
    both arrive at 2; applies [2, 2.5] and [2.5, 3]. Client 1 computes alone from 2.5 (0.5 of
    work done by 3), then at half speed: arrives 4, applied [4, 4.5]; client 2 from 3 at half
    speed (0.5 done by 4), then alone: arrives 4.5, applied [4.5, 5]."""
    cost = shared(clients_per_host=2, devices_per_host=1, bandwidth_Bps=None, server_apply_s=0.5)
    assert schedule(cost, 2, 4) == [(1, 2.5), (2, 3.0), (1, 4.5), (2, 5.0)]
    two = shared(clients_per_host=2, devices_per_host=2, bandwidth_Bps=None, server_apply_s=0.5)
    assert schedule(two, 2, 2) == [(1, 1.5), (2, 2.0)]   # a device each: nothing shared


def machine(**kw) -> CostConfig:
    """cost.machine.single: steps of 1 s, a transfer of 1 s alone (latency only, no link), two
    cores for the server, two clients and their transfers."""
    base = dict(profile="t", compute_s=1.0, latency_s=1.0, topology="shared", clients_per_host=2,
                devices_per_host=2, one_machine=True)
    return CostConfig.of(**{**base, **kw})


def test_one_machine_transfers_take_two_shares_of_the_cores():
    """Two clients on two cores compute [0, 1] at full speed. Their two pushes are a weight of 4
    (both ends of each copy) on 2 cores: half speed, both arrive at 3 (at 2 with the cores shared
    by the computes alone). Fetches [3, 5] the same way, computes [5, 6], pushes [6, 8]."""
    assert schedule(machine(), 2, 4) == [(1, 3.0), (2, 3.0), (1, 8.0), (2, 8.0)]
    cores_only = machine(one_machine=False)
    assert schedule(cores_only, 2, 4) == [(1, 2.0), (2, 2.0), (1, 5.0), (2, 5.0)]


def test_one_client_on_a_machine_of_two_cores_is_the_dedicated_clock():
    """A compute (weight 1) or a transfer (weight 2) alone never exceeds two cores."""
    dedicated = CostConfig.of(profile="t", compute_s=1.0, latency_s=1.0, server_apply_s=0.25,
                           jitter="lognormal", jitter_sigma=0.5)
    one = machine(server_apply_s=0.25, jitter="lognormal", jitter_sigma=0.5).updated(clients_per_host=1)
    assert schedule(one, 1, 20) == schedule(dedicated, 1, 20, clock=CostScheduler)


def test_an_evaluation_takes_a_share_of_the_machine():
    """One client on one core, free transfers. An evaluation of 1 s starts at 0: it and the
    compute share the core, both end at 2; the next compute runs alone [2, 3]. Without
    cost.machine.single an evaluation takes no time."""
    def pushes(cost, evaluations=1):
        s = ContendedScheduler(CostModel(cost, 0, param_bytes=4, step_s=1.0), [1], 1)
        for _ in range(evaluations):
            s.evaluated(0.0)
        out = []
        for _ in range(2):
            k, _, t = s.next()
            t = s.handled(t, False)
            out.append((k, t))
            s.served(k, t)
        return out
    assert pushes(machine(latency_s=0.0, devices_per_host=1, clients_per_host=1, eval_s=1.0)) == [(1, 2.0), (1, 3.0)]
    # evaluations due while one runs are one more after it (the real evaluator's): [2, 4] beside
    # the second compute, which ends at 4
    busy = machine(latency_s=0.0, devices_per_host=1, clients_per_host=1, eval_s=1.0)
    assert pushes(busy, evaluations=3) == [(1, 2.0), (1, 4.0)]
    assert pushes(machine(latency_s=0.0, devices_per_host=1, clients_per_host=1)) == [(1, 1.0), (1, 2.0)]
    assert pushes(shared(bandwidth_Bps=None, comm_params=None)) == [(1, 1.0), (1, 2.0)]


def test_the_server_links_burst_sends_part_of_a_transfer_found_idle_at_once():
    """One client, a transfer of 4 bytes at 4 B/s (1 s alone), a burst of 2 bytes each way:
    compute [0, 1]; the push finds the inbound link idle since 0, its bucket full (2 bytes at
    once): [1, 1.5]; the fetch finds the outbound bucket full: [1.5, 2]; compute [2, 3]; the push
    finds the inbound bucket refilled for 1.5 s (at 4 B/s, capped at 2): [3, 3.5]."""
    burst = shared(server_burst_bytes=2.0)
    assert schedule(burst, 1, 2) == [(1, 1.5), (1, 3.5)]
    assert schedule(shared(), 1, 2) == [(1, 2.0), (1, 5.0)]   # no burst: 1 s per transfer


def test_a_transfer_that_finds_the_link_in_use_gets_no_burst():
    """Two clients on hosts of their own computing [0, 1]: client 1's push finds the link idle (2
    bytes at once, 0.5 s of work), client 2's finds it in use (1 s of work); shared at half speed
    until 2, client 2's last 0.5 s alone: arrivals 2 and 2.5. The bucket refilled from 2.5 is
    full again when the next push comes: as a pause long enough makes it."""
    burst = shared(server_burst_bytes=2.0)
    first = schedule(burst, 2, 2)
    assert first[0] == (1, 2.0) and first[1] == (2, 2.5)
    # a checkpoint of the clock mid-run carries the buckets: the rest is the same pushes
    s = ContendedScheduler(CostModel(burst, 0, param_bytes=4, step_s=1.0), [1, 2], 1)
    k, _, t = s.next()
    t = s.handled(t, False)
    s.served(k, t)
    state = s.state_dict()
    again = ContendedScheduler(CostModel(burst, 0, param_bytes=4, step_s=1.0), [1, 2], 1)
    again.load_state_dict(state)
    rest = []
    for clock in (s, again):
        out = []
        for _ in range(4):
            k, _, t = clock.next()
            t = clock.handled(t, False)
            out.append((k, t))
            clock.served(k, t)
        rest.append(out)
    assert rest[0] == rest[1] and state["bucket"]


def test_on_one_machine_a_transfer_across_a_limited_link_takes_no_core():
    """Two clients on one core (cost.machine.single), transfers of 1 s across a limited server link
    (4 B/s): the computes share the core [0, 2]; the pushes, sharing the inbound link, take 2 s
    and no share of the core: arrive 4 (a loopback copy, two shares of the core, would be slower)."""
    limited = machine(latency_s=0.0, devices_per_host=1, bandwidth_Bps=4.0, comm_params=1.0)
    assert schedule(limited, 2, 2) == [(1, 4.0), (2, 4.0)]


def test_the_kernels_work_of_a_transfer_across_a_limited_link_takes_its_share_of_the_core():
    """One core, client 1's step 1 s of work, client 2's 3 s; transfers of 1 s across a limited
    link (4 B at 4 B/s), no core unless cost.machine.link_cpu_s_per_byte: 0.125 s per byte is a weight of
    0.5 for a transfer at full rate. Both compute at 1/2: client 1 done at 2 (client 2 has 1 s of
    its 3). Client 1's push [2, 3] and fetch [3, 4] cross the link: without the kernels' work
    client 2 runs at full speed and is done at 4, its push applied at 5; with it client 2 runs at
    1 / 1.5 through [2, 4] (done 2 1/3 of 3), then shares the core with client 1's next step at
    1/2: done at 4 + 4/3 (client 1 has 2/3 of its step). Client 2's push then takes its 0.5, so
    client 1 finishes its step at 2/3 speed at 5 5/6, and its push shares the inbound link: client
    2's push, half done by then, is applied at 5 5/6 + 1 = 6 5/6."""
    base = dict(latency_s=0.0, devices_per_host=1, bandwidth_Bps=4.0, comm_params=1.0, speeds=(1.0, 3.0))
    assert schedule(machine(**base), 2, 2) == [(1, 3.0), (2, 5.0)]
    (first, second) = schedule(machine(**base, link_cpu_s_per_byte=0.125), 2, 2)
    assert first == (1, 3.0)
    assert second[0] == 2 and second[1] == pytest.approx(5 + 5 / 6 + 1)


@pytest.mark.parametrize("clock", [CostScheduler, ContendedScheduler])
def test_a_reply_that_holds_the_server_delays_the_next_push(clock):
    """Two clients, steps of 1 s, transfers of 1 s, an instant apply. Both pushes arrive at 2.
    With cost.reply_holds_server the server sends client 1's reply [2, 3] before it serves client
    2 (applied at 3, reply [3, 4]); client 1 is back at 5, its reply keeps the server to 6, when
    client 2's push arrives. Without it both are applied at 2, and at 5 again."""
    cost = CostConfig.of(profile="t", compute_s=1.0, latency_s=1.0, reply_holds_server=True)
    cost = dataclasses.replace(cost, topology="shared") if clock is ContendedScheduler else cost
    assert schedule(cost, 2, 4, clock=clock) == [(1, 2.0), (2, 3.0), (1, 5.0), (2, 6.0)]
    free = dataclasses.replace(cost, reply_holds_server=False)
    assert schedule(free, 2, 4, clock=clock) == [(1, 2.0), (2, 2.0), (1, 5.0), (2, 5.0)]


@pytest.mark.parametrize("clock", [CostScheduler, ContendedScheduler])
def test_a_rounds_replies_hold_the_server_one_after_another(clock):
    """A sync round of three clients (steps and transfers of 1 s): the pushes arrive at 2 and
    the round closes; with cost.reply_holds_server the server sends the three replies in turn,
    as the real Dispatcher does under its lock: [2, 3], [3, 4], [4, 5], so the clients are back
    at 5, 6 and 7 (all at 5 when the three replies went at once), and the last one's to_client_s
    holds its 2 s of waiting and its 1 s transfer."""
    cost = CostConfig.of(profile="t", compute_s=1.0, latency_s=1.0, reply_holds_server=True)
    cost = dataclasses.replace(cost, topology="shared") if clock is ContendedScheduler else cost
    s = clock(CostModel(cost, 0, param_bytes=4, step_s=1.0), [1, 2, 3], 1)
    first = [s.next() for _ in range(3)]
    assert [t for _, _, t in first] == [2.0, 2.0, 2.0]
    for k, _, _ in first:
        s.served(k, 2.0)
    assert [s.next()[::2] for _ in range(3)] == [(1, 5.0), (2, 6.0), (3, 7.0)]
    assert s.timing()["to_client_s"] == 3.0


def test_max_min_shares_give_what_a_bottleneck_leaves_to_the_others():
    """Links a (capacity 4) and b (capacity 12): x crosses a and b, y and z cross b only. x is held
    to 2 on a (shared with w); b's 10 left go to y and z, 5 each; w gets a's other 2."""
    paths = {"x": ("a", "b"), "w": ("a",), "y": ("b",), "z": ("b",), "free": ()}
    shares = max_min_shares(paths, {"a": 4.0, "b": 12.0})
    assert shares == {"x": 2.0, "w": 2.0, "y": 5.0, "z": 5.0, "free": float("inf")}


# ---------------------------------------------------------------------------------------------
# One user = today's times, bit for bit
# ---------------------------------------------------------------------------------------------

JITTER = dict(compute_s=0.01, jitter="lognormal", jitter_sigma=0.3, bandwidth_Bps=1e6, latency_s=1e-4,
              server_apply_s=1e-3)


def test_resources_that_never_bind_give_exactly_the_dedicated_clock():
    """A host per client and a server link no transfer can fill: every transfer is alone on what
    limits it, so the shared clock computes every time as the dedicated one does (same sums in the
    same order), ties included: 2000 pushes of 4 jittered clients, equal as floats."""
    dedicated = CostConfig.of(profile="d", **JITTER)
    roomy = CostConfig.of(profile="s", topology="shared", server_bandwidth_Bps=1e15, **JITTER)
    assert schedule(roomy, 4, 2000, nsync=3, seed=3) == schedule(dedicated, 4, 2000, nsync=3, seed=3,
                                                                  clock=CostScheduler)


def run_cfg(**kw) -> RunConfig:
    base = dict(num_clients=3, nsync=2, num_epochs=2.0, eval_every=0.5, progress=False,
                data=DataConfig(name="synthetic"), model=ModelConfig(name="mlp"),
                algo=AlgoConfig(lr=0.05, momentum=0.5))
    return RunConfig(**{**base, **kw})


def tables(run_dir: Path) -> tuple[bytes, bytes]:
    return (run_dir / "updates.csv").read_bytes(), (run_dir / "evals.csv").read_bytes()


def test_one_client_alone_on_every_shared_resource_gives_todays_tables(tmp_path):
    """paper2013-like costs (a transfer 0.24 s, apply 0.07 s): one client on a host with one
    device and links of paper2013's bandwidth runs byte for byte as under dedicated links."""
    costs = dict(compute_s=0.5, jitter="lognormal", jitter_sigma=0.1, latency_s=1e-4, bandwidth_Bps=1e9,
                 comm_params=6.1e7, server_apply_s=0.07)
    simulate(run_cfg(num_clients=1, cost=CostConfig.of(profile="p", **costs)), tmp_path / "dedicated")
    simulate(run_cfg(num_clients=1, cost=CostConfig.of(profile="p", topology="shared", clients_per_host=4,
                                                     devices_per_host=1, **costs)), tmp_path / "shared")
    assert tables(tmp_path / "shared") == tables(tmp_path / "dedicated")
    # and the shared clock's parts of each round trip are the dedicated clock's (to rounding:
    # a stage's part is its end less its start)
    timings = [pd.read_csv(tmp_path / side / "timings.csv") for side in ("shared", "dedicated")]
    pd.testing.assert_frame_equal(*timings, rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# Determinism, resume, replay, protocols, with contention on
# ---------------------------------------------------------------------------------------------

# every resource binds sometimes: 2 clients a host on 1 device, a transfer about a segment long
CONTENDED = CostConfig.of(profile="c", compute_s=0.01, jitter="lognormal", jitter_sigma=0.3, latency_s=1e-4,
                       bandwidth_Bps=4e5, comm_params=1000.0, server_apply_s=2e-3, topology="shared",
                       clients_per_host=2, devices_per_host=1, server_bandwidth_Bps=6e5)


def test_contended_runs_are_deterministic_and_differ_from_dedicated(tmp_path):
    cfg = run_cfg(num_clients=4, seed=1, cost=CONTENDED)
    for name in ("a", "b"):
        assert simulate(cfg, tmp_path / name)["status"] == "completed"
    assert tables(tmp_path / "a") == tables(tmp_path / "b")
    dedicated = CONTENDED.updated(topology="dedicated", clients_per_host=1, devices_per_host=None,
                                  server_bandwidth_Bps=None)
    simulate(cfg.replace(cost=dedicated), tmp_path / "d")
    assert tables(tmp_path / "a")[0] != tables(tmp_path / "d")[0]


def test_interrupt_then_resume_with_contention_is_bitwise_identical(tmp_path):
    cfg = run_cfg(num_clients=4, nsync=2, num_epochs=6.0, checkpoint_every=7, cost=CONTENDED)
    simulate(cfg, tmp_path / "whole")
    assert simulate(cfg, tmp_path / "cut", stop_at_version=25)["status"] == "interrupted"
    resumed = simulate(cfg.replace(resume=True), tmp_path / "cut")
    assert resumed["status"] == "completed"
    assert tables(tmp_path / "cut") == tables(tmp_path / "whole")


def test_a_run_killed_after_a_checkpoint_that_an_evaluation_shares_resumes_bitwise(tmp_path):
    """cost.machine.single charges an evaluation the machine's time: a checkpoint written at the
    version of an evaluation (here every 4th) holds the charge, so a run killed after it resumes
    bit for bit (the checkpoint was written before the clock was told of the evaluation: the
    resumed run's clock ran that evaluation in no time, 0.005 s ahead of the whole run's)."""
    from tests.helpers.runs import sim_killed_at

    cost = machine(compute_s=0.01, latency_s=0.0, clients_per_host=3, eval_s=0.01)
    cfg = run_cfg(num_epochs=6.0, checkpoint_every=4, cost=cost)
    simulate(cfg, tmp_path / "whole")
    sim_killed_at(cfg, tmp_path / "cut", 10)   # resumes from version 8's checkpoint
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    assert tables(tmp_path / "cut") == tables(tmp_path / "whole")


def test_replay_of_a_contended_run_reproduces_it(tmp_path):
    import pandas as pd
    simulate(run_cfg(num_clients=4, cost=CONTENDED), tmp_path / "rec")
    replay = CostConfig.of(profile="replay", schedule="replay", path=str(tmp_path / "rec"))
    assert simulate(run_cfg(num_clients=1, cost=replay), tmp_path / "rep")["status"] == "completed"
    cols = ["version", "time_s", "client", "read_version", "staleness", "train_loss", "train_error"]
    a, b = (pd.read_csv(tmp_path / d / "updates.csv") for d in ("rec", "rep"))
    pd.testing.assert_frame_equal(a[cols], b[cols])


@pytest.mark.parametrize("protocol", ["sync_backup", "ssp"])
def test_protocols_that_hold_or_preempt_clients_run_on_the_shared_clock(tmp_path, protocol):
    """sync with a backup worker cancels the late client's push in flight (its resources freed);
    ssp holds replies: both finish their budget under contention."""
    cfg = parse(compose([f"protocol={protocol}", "data=synthetic", "model=mlp", "num_clients=4", "num_epochs=2",
                         "progress=false", "cost.topology=shared", "cost.shared.clients_per_host=2",
                         "cost.shared.devices_per_host=1", "cost.comm_params=1e5"]))
    assert simulate(cfg, tmp_path)["status"] == "completed"


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------

BAD = [
    (["cost.bandwidth_Bps=0"], "cost.bandwidth_Bps", "(0, 1e+15]"),
    (["cost=paper2013_shared", "cost.shared.server_bandwidth_Bps=-1e9"], "cost.shared.server_bandwidth_Bps", "(0, 1e+15]"),
    (["cost=paper2013_shared", "cost.shared.host_bandwidth_Bps=0"], "cost.shared.host_bandwidth_Bps", "(0, 1e+15]"),
    (["cost=paper2013_shared", "cost.shared.clients_per_host=0"], "cost.shared.clients_per_host", "1..1024"),
    (["cost=paper2013_shared", "cost.shared.devices_per_host=0"], "cost.shared.devices_per_host", "1..1024"),
    (["cost=paper2013_shared", "cost.latency_s=-0.1"], "cost.latency_s", "[0, 1e+06]"),
    (["cost.topology=ring"], "cost.topology", "'dedicated', 'shared'"),
    # hosts are filled in order and must be equal: 6 clients on hosts of 4 leave one half full
    (["cost=paper2013_shared", "num_clients=6"], "cost.shared.clients_per_host", "a divisor of num_clients=6"),
    # a topology key that would be ignored is refused, naming the setting that makes it act
    (["cost.shared.clients_per_host=4"], "cost.shared.clients_per_host", "cost.topology=shared"),
    (["cost.shared.server_bandwidth_Bps=1e9"], "cost.shared.server_bandwidth_Bps", "cost.topology=shared"),
    (["cost.machine.single=true"], "cost.machine.single", "cost.topology=shared"),
    (["cost.topology=shared", "cost.machine.single=true"], "cost.shared.devices_per_host", "cost.machine.single=true"),
    (["cost.topology=shared", "cost.machine.single=true", "cost.shared.devices_per_host=2", "num_clients=4",
      "cost.shared.clients_per_host=2"], "cost.shared.clients_per_host", "at least num_clients=4"),
    (["cost.topology=shared", "cost.machine.eval_s=0.1"], "cost.machine.eval_s", "cost.machine.single=true"),
    (["cost.shared.server_burst_bytes=32768"], "cost.shared.server_burst_bytes", "cost.topology=shared"),
    (["cost=uniform", "cost.topology=shared", "cost.shared.server_burst_bytes=32768"], "cost.shared.server_burst_bytes", "limited"),
    (["cost.machine.link_cpu_s_per_byte=1e-8"], "cost.machine.link_cpu_s_per_byte", "cost.topology=shared"),
    (["cost.topology=shared", "cost.shared.server_bandwidth_Bps=1e7", "cost.machine.link_cpu_s_per_byte=1e-8"],
     "cost.machine.link_cpu_s_per_byte", "cost.machine.single=true"),
    (["cost=uniform", "cost.topology=shared", "cost.machine.single=true", "cost.shared.devices_per_host=2", "num_clients=1",
      "cost.machine.link_cpu_s_per_byte=1e-8"], "cost.machine.link_cpu_s_per_byte", "limited"),
]


@pytest.mark.parametrize("overrides,key,expected", BAD)
def test_bad_topology_values_name_key_value_and_what_is_valid(overrides, key, expected):
    with pytest.raises(ConfigError) as err:
        parse(compose(overrides))
    assert f"'{key}'" in str(err.value) and expected in str(err.value), str(err.value)


@pytest.mark.parametrize("num_clients", [1, 2, 4, 8, 16, 32])
def test_hosts_of_four_take_fewer_clients_than_a_host_or_any_multiple(num_clients):
    assert parse(compose(["cost=paper2013_shared", f"num_clients={num_clients}"])).cost.shared.clients_per_host == 4


def test_cli_refuses_a_host_size_that_does_not_divide_before_any_work(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    proc = cli_run(monkeypatch, capsys, "cost=paper2013_shared", "num_clients=6", f"results_dir={tmp_path / 'r'}")
    assert proc.returncode == 2, proc.stderr
    assert "cost.shared.clients_per_host" in proc.stderr and "6" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
