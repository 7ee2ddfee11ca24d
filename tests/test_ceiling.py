"""Where speedup stops: the ceiling predicted from a cost profile alone (repro/sim/ceiling.py)
against hand-computed bounds and against the shared clock's measured throughput, the lab's
+exp=ceiling grid (shrunk: measured within 5% of the bound where a resource saturates), and
the paper-regime experiment on the 2013 network."""
import dataclasses
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from tests.helpers.configs import composed
from tests.helpers.grids import sweep_grid

from repro.analysis.lab.ceiling import ceiling_frame, draw_ceiling, steady_samples_per_s, table
from repro.analysis.render import build_figure
from repro.analysis.load import load_runs
from repro.config.settings import CostConfig
from repro.run import compose, parse
from repro.sim.ceiling import ceiling
from repro.sim.cost import CostModel, CostScheduler
from repro.sim.driver import simulate
from repro.sim.resources import ContendedScheduler

from tests.helpers.paths import ROOT  # noqa: E402
TRANSFER = 1e-4 + 244e6 / 1e9     # paper2013: 61M float32 over 1 GB/s, plus 100 us


def speedup_ceiling(cost, num_clients: int, nsync: int, param_bytes: int) -> float:
    """Predicted throughput of N clients / that of one client, at the same nsync."""
    one = ceiling(cost, 1, nsync, param_bytes).pushes_per_s
    return ceiling(cost, num_clients, nsync, param_bytes).pushes_per_s / one


# ---------------------------------------------------------------------------------------------
# The bounds, by hand
# ---------------------------------------------------------------------------------------------

def test_paper2013_shared_bounds_by_hand():
    """One exchange cycle at nsync 1: 0.5 + 2 x 0.2441 + 0.07 = 1.0582 s. The server's link
    finishes 1 / 0.2441 = 4.097 transfers a second each way, so 8 clients (7.56 pushes/s if
    nothing were shared) get 4.097, a speedup ceiling of 4.097 x 1.0582 = 4.335; 2 hosts of 4
    have twice that on their own links; the apply carries 1 / 0.07 = 14.3."""
    cost = parse(composed(["cost=paper2013_shared"])).cost
    c = ceiling(cost, 8, 1, param_bytes=0)
    cycle = 0.5 + 2 * TRANSFER + 0.07
    assert c.cycle_s == pytest.approx(cycle, rel=1e-12)
    assert c.bounds == pytest.approx({"clients": 8 / cycle, "server apply": 1 / 0.07,
                                      "server link": 1 / TRANSFER, "host links": 2 / TRANSFER,
                                      "host devices": 2 * 4 / 0.5}, rel=1e-12)
    assert c.binding == "server link" and c.pushes_per_s == pytest.approx(1 / TRANSFER)
    assert speedup_ceiling(cost, 8, 1, 0) == pytest.approx(cycle / TRANSFER, rel=1e-12)
    assert speedup_ceiling(cost, 1, 1, 0) == 1.0
    sixteen = 16 * 0.5 + 2 * TRANSFER + 0.07      # 8 clients at nsync 16: 0.93 pushes/s, unlimited
    assert ceiling(cost, 8, 16, 0).binding == "clients"
    assert speedup_ceiling(cost, 8, 16, 0) == pytest.approx(8.0)
    assert speedup_ceiling(cost, 32, 16, 0) == pytest.approx(32.0)   # 3.74 pushes/s: still unlimited
    assert speedup_ceiling(cost, 64, 16, 0) == pytest.approx(sixteen / TRANSFER, rel=1e-12)


def test_dedicated_links_leave_only_the_apply():
    """Today's clock: nothing is shared but the server's apply (test_sim measures the 200/s)."""
    c = ceiling(CostConfig.of(compute_s=0.01, server_apply_s=0.005), 8, 1, param_bytes=4000)
    assert set(c.bounds) == {"clients", "server apply"} and c.binding == "server apply"
    assert c.pushes_per_s == pytest.approx(200.0)


def rate(cost: CostConfig, clients: int, nsync: int = 1, pushes: int = 2000) -> float:
    """Pushes per virtual second over the second half of ``pushes`` on the shared clock."""
    s = ContendedScheduler(CostModel(cost, 7, 4, cost.compute_s), list(range(1, clients + 1)), nsync)
    times = []
    for _ in range(pushes):
        k, _, t = s.next()
        t = s.handled(t, False)
        times.append(t)
        s.served(k, t)
    half = len(times) // 2
    return (len(times) - 1 - half) / (times[-1] - times[half])


JITTERED = dict(profile="t", compute_s=1.0, jitter="lognormal", jitter_sigma=0.1, comm_params=1.0, topology="shared")


@pytest.mark.parametrize("what,cost", [
    # 32 clients would push 32/3 a second; the server's link carries 1 (a transfer = 1 s alone)
    ("server link", CostConfig.of(**JITTERED, bandwidth_Bps=4.0, clients_per_host=4)),
    # one host's link (1 s a transfer), the server's far faster: 1 transfer a second each way
    ("host links", CostConfig.of(**JITTERED, bandwidth_Bps=4.0, server_bandwidth_Bps=1e15, clients_per_host=32)),
    # 16 clients a host on 2 devices, free links: 2 hosts x 2 devices / 1 s = 4 pushes/s
    ("host devices", CostConfig.of(**JITTERED, bandwidth_Bps=None, clients_per_host=16, devices_per_host=2)),
    # free links, an apply of 0.25 s: 4 pushes/s whatever 32 clients could do
    ("server apply", CostConfig.of(**JITTERED, bandwidth_Bps=None, server_apply_s=0.25)),
])
def test_each_saturated_resource_carries_what_the_ceiling_says(what, cost):
    """Far beyond the knee (32 clients; 3 to 8 times the clients the bound needs) the binding
    resource hardly idles, so the shared clock's throughput is the bound within 5% (lognormal
    jitter, sigma 0.1; the second half of 2000 pushes). A link's two ways are two equally loaded
    bottlenecks in series: each idles while every client waits on the other, so the bound is
    approached more slowly than with one (about N / (N + 1) for two processor-sharing queues)."""
    bound = ceiling(cost, 32, 1, param_bytes=4)
    assert bound.binding == what
    assert rate(cost, 32) == pytest.approx(bound.pushes_per_s, rel=0.05)
    # one client alone goes at its own pace: a push every cycle
    assert rate(cost, 1, pushes=400) == pytest.approx(ceiling(cost, 1, 1, 4).pushes_per_s, rel=0.02)


def test_one_machines_transfers_take_its_cores():
    """cost.machine.single: the server and 8 clients on 2 cores, where a loopback push or fetch
    (10 ms) takes two shares of them for its time. A push needs 10 ms of compute and 4 x 10 ms of
    copies: 2 / 0.05 = 40 pushes/s, which the clock runs within 2% (the bound was 200/s, the
    compute's alone). Across a limited link (4 B at 400 B/s: a transfer of 20 ms) a transfer takes
    the kernels' 1e-4 s per byte at 400 B/s for 20 ms: 2 / (0.01 + 2 x 0.0008) = 172.4/s."""
    cost = CostConfig.of(profile="m", compute_s=0.01, jitter="lognormal", jitter_sigma=0.1, latency_s=0.01,
                         topology="shared", clients_per_host=8, devices_per_host=2, one_machine=True)
    bound = ceiling(cost, 8, 1, param_bytes=4)
    assert bound.binding == "host devices" and bound.pushes_per_s == pytest.approx(40.0)
    assert rate(cost, 8) == pytest.approx(40.0, rel=0.02)
    linked = cost.updated(server_bandwidth_Bps=400.0, link_cpu_s_per_byte=1e-4)
    assert ceiling(linked, 8, 1, param_bytes=4).bounds["host devices"] == pytest.approx(2 / 0.0116)


def test_a_client_alone_gets_the_server_links_burst():
    """cost.shared.server_burst_bytes: a transfer that finds the server's link idle sends that
    many bytes at once. One client (step 1 s, a 4 B message at 4 B/s: 1 s a transfer) with a
    4 B burst finds the link idle every time, so its cycle is 1 s, not 3 s: the clock runs about
    1 push/s (0.96: a jittered step shorter than 1 s leaves the bucket short), which a bound of
    1/3 must not undercut. A 2 B burst leaves half of each transfer: a cycle of 2 s."""
    cost = CostConfig.of(profile="b", compute_s=1.0, comm_params=1.0, topology="shared", bandwidth_Bps=4.0,
                         server_burst_bytes=4.0, jitter="lognormal", jitter_sigma=0.1)
    bound = ceiling(cost, 1, 1, param_bytes=4)
    assert bound.cycle_s == 1.0 and bound.pushes_per_s == 1.0
    assert 0.9 <= rate(cost, 1, pushes=400) <= bound.pushes_per_s
    assert ceiling(cost.updated(server_burst_bytes=2.0), 1, 1, 4).cycle_s == 2.0


def test_an_uneven_hosts_devices_carry_its_fast_clients_more_often():
    """8 clients on one host of 2 devices, four with steps of 10 ms and four 8x slower, free
    links: the busy devices give each client a quarter of one, so a fast client pushes every
    40 ms and a slow one every 320 ms: 4 x 25 + 4 x 3.125 = 112.5 pushes/s, which the clock runs
    within 2%. The bound was 2 / (10 ms x mean f = 45 ms) = 44.4/s: under what the clock ran."""
    cost = CostConfig.of(profile="d", compute_s=0.01, jitter="lognormal", jitter_sigma=0.1, topology="shared",
                         clients_per_host=8, devices_per_host=2, speeds=(1, 1, 1, 1, 8, 8, 8, 8))
    bound = ceiling(cost, 8, 1, param_bytes=4)
    assert bound.binding == "host devices" and bound.pushes_per_s == pytest.approx(112.5)
    assert rate(cost, 8, pushes=4000) == pytest.approx(112.5, rel=0.02)


def test_the_cycle_is_the_lone_clients_own():
    """cost=straggler: client 1 computes 4x slower, so one client alone (client 1) cycles in
    4 x 4 x 10 ms + 2 transfers + the apply, and pushes once a cycle: cycle_s x pushes_per_s = 1
    (cycle_s was a 10 ms client's, 4x shorter than the one client's cycle it claims)."""
    cost = parse(composed(["cost=straggler"])).cost
    one = ceiling(cost, 1, 4, param_bytes=4000)
    transfer = 1e-4 + 4000 / 1e9
    assert one.cycle_s == pytest.approx(0.16 + 2 * transfer + 1e-4)
    assert one.cycle_s * one.pushes_per_s == pytest.approx(1.0)


def test_the_bound_needs_clients_out_of_step():
    """16 clients on a shared server link (step and transfer 1 s each: the link carries 1 push a
    second, the clients alone would push 16 / 3): with no jitter they start together and stay
    together, so the link's two ways take turns and each idles half the time: about half the
    bound. Lognormal jitter (sigma 0.1) puts them out of step: the bound within 10%."""
    lockstep = CostConfig.of(profile="t", compute_s=1.0, comm_params=1.0, topology="shared", bandwidth_Bps=4.0)
    jittered = dataclasses.replace(lockstep, jitter="lognormal", jitter_sigma=0.1)
    bound = ceiling(lockstep, 16, 1, param_bytes=4)
    assert bound.binding == "server link" and bound.pushes_per_s == ceiling(jittered, 16, 1, 4).pushes_per_s == 1.0
    assert 0.45 <= rate(lockstep, 16) / bound.pushes_per_s <= 0.55
    assert rate(jittered, 16) / bound.pushes_per_s >= 0.9


def _dedicated_rate(cost: CostConfig, step_s: float, clients: int) -> float:
    """Pushes a second of the dedicated clock (CostScheduler) over its second thousand pushes."""
    s = CostScheduler(CostModel(cost, 7, 4, step_s), list(range(1, clients + 1)), 1)
    times = []
    for _ in range(2000):
        k, _, t = s.next()
        t = s.handled(t, False)
        times.append(t)
        s.served(k, t)
    return 999 / (times[-1] - times[1000])


def test_the_dedicated_clock_meets_its_bound_too():
    cost = CostConfig.of(profile="d", compute_s=1.0, jitter="lognormal", jitter_sigma=0.1, server_apply_s=0.25)
    assert _dedicated_rate(cost, 1.0, 16) == pytest.approx(ceiling(cost, 16, 1, 4).pushes_per_s, rel=0.01)


def test_a_reply_that_holds_the_server_lowers_its_bound():
    """cost.reply_holds_server (cost=fit sets it for a real recording): the server is busy for
    the apply and the reply's transfer, 5 + 10 ms a push, so it carries 1 / 0.015 = 66.7 pushes/s
    whatever 8 clients (8 / (10 + 2 x 10 + 5 ms) = 229/s alone) could push; the clock measures
    that within 1% (the bound was 200/s, the apply's alone: 3x what the clock runs)."""
    cost = CostConfig.of(profile="r", compute_s=0.01, jitter="lognormal", jitter_sigma=0.1,
                         latency_s=0.01, server_apply_s=0.005, reply_holds_server=True)
    bound = ceiling(cost, 8, 1, param_bytes=4)
    assert bound.binding == "server apply" and bound.pushes_per_s == pytest.approx(1 / 0.015)
    assert _dedicated_rate(cost, 0.01, 8) == pytest.approx(bound.pushes_per_s, rel=0.01)


# ---------------------------------------------------------------------------------------------
# The lab's experiment
# ---------------------------------------------------------------------------------------------

def test_grid_expands_to_the_intended_runs():
    expected = {"num_clients": ["1", "2", "4", "8", "16", "32"], "nsync": ["1", "4", "16"],
                "cost.bandwidth_Bps": ["1.25e8", "1e9", "5e9"], "cost.jitter": ["lognormal", "none"]}
    grid = sweep_grid("ceiling")
    number = lambda v: v if str(v).isalpha() else float(v)  # noqa: E731
    as_key = lambda d: tuple(sorted((k, number(v)) for k, v in d.items()))  # noqa: E731
    want = [dict(zip(expected, v)) for v in itertools.product(*expected.values())]
    assert sorted(map(as_key, grid)) == sorted(map(as_key, want)) and len(grid) == 108
    for point in (grid[0], grid[-1]):
        cfg = parse(compose(["+exp=ceiling"] + [f"{k}={v}" for k, v in point.items()]))
        assert (cfg.cost.profile, cfg.cost.topology, cfg.cost.shared.clients_per_host) == ("paper2013_shared", "shared", 4)
        assert (cfg.data.name, cfg.exp_name, cfg.num_threads) == ("quadratic", "ceiling", 1)


def test_shrunk_ceiling_grid_measures_the_bound_where_a_resource_saturates(tmp_path):
    """+exp=ceiling at 32 clients, nsync 1, 1000 pushes: at 1 GB/s the server's link binds
    (4.1 pushes/s), at 5 GB/s the apply (14.3/s); the lab's frame measures each within 5%.
    Virtual time depends on the seeded jitter, not on what is trained: no thread count moves it."""
    for bw in ("1e9", "5e9"):
        cfg = parse(compose(["+exp=ceiling", "num_clients=32", "nsync=1", f"cost.bandwidth_Bps={bw}",
                             "num_epochs=1000", "eval_every=1000", "progress=false", f"results_dir={tmp_path}"]))
        assert simulate(cfg, tmp_path / "ceiling" / f"bw={bw}")["status"] == "completed"
    frame = ceiling_frame(load_runs(tmp_path, "ceiling"))
    rows = frame[(frame["quantity"] == "samples_per_s") & (frame["num_clients"] == 32)]
    measured = rows[rows["kind"] == "measured"].set_index("cost.bandwidth_Bps")["value"]
    predicted = rows[rows["kind"] == "predicted"].set_index("cost.bandwidth_Bps")
    assert dict(predicted["binding"]) == {1e9: "server link", 5e9: "server apply"}
    for bw in (1e9, 5e9):
        assert measured[bw] == pytest.approx(predicted.loc[bw, "value"], rel=0.05), bw
    fig = draw_ceiling(frame)   # one column per bandwidth, rows: samples/s and speedup
    assert [ax.get_title() for ax in fig.axes[:2]] == ["every link 1 GB/s each way", "every link 5 GB/s each way"]


def test_the_lab_frame_and_figure_show_lockstep_clients_beside_the_bound(tmp_path):
    """+exp=ceiling shrunk to 1 and 8 clients at nsync 16 (1 GbE), with and without jitter: the
    runs without are kind 'lockstep', their speedup taken over the lockstep single client; the
    table has their columns and the figure a series of its own, named in its legend. Jitter is
    one of the figure's axes: one figure from both (+exp=ceiling cost.jitter=lognormal,none)."""
    for n, jitter in itertools.product((1, 8), ("lognormal", "none")):
        cfg = parse(compose(["+exp=ceiling", f"num_clients={n}", "nsync=16", "cost.bandwidth_Bps=1.25e8",
                             f"cost.jitter={jitter}", "num_epochs=1600", "eval_every=1600", "progress=false",
                             f"results_dir={tmp_path}"]))
        assert simulate(cfg, tmp_path / "ceiling" / f"n={n},j={jitter}")["status"] == "completed"
    paths = build_figure("ceiling", tmp_path, tmp_path / "figures")
    assert [p.name for p in paths] == ["ceiling.png", "ceiling.pdf", "ceiling.csv"]
    frame = ceiling_frame(load_runs(tmp_path, "ceiling"))
    ran = frame[frame["kind"] != "predicted"]
    assert dict(zip(ran["cost.jitter"], ran["kind"])) == {"lognormal": "measured", "none": "lockstep"}
    alone = ran[(ran["num_clients"] == 1) & (ran["quantity"] == "speedup")]
    assert (alone["value"] == 1.0).all() and len(alone) == 2
    rows = table(frame).set_index("num_clients")
    assert {"speedup_measured", "speedup_lockstep", "speedup_predicted"} <= set(rows.columns)
    assert rows.loc[8, "speedup_lockstep"] < rows.loc[8, "speedup_measured"] <= rows.loc[8, "speedup_predicted"] * 1.01
    fig = draw_ceiling(frame)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("lockstep" in t for t in legend) and any("out of step" in t for t in legend)


def test_steady_state_skips_the_start():
    """Samples per second over the second half of the pushes, by version."""
    up = pd.DataFrame({"run_dir": "r", "version": [4, 1, 2, 3, 5, 6], "time_s": [9.0, 1.0, 2.0, 5.0, 11.0, 13.0],
                       "samples_seen": [40, 10, 20, 30, 50, 60]})
    assert steady_samples_per_s(up)["r"] == pytest.approx((60 - 40) / (13.0 - 9.0))


@pytest.mark.slow
def test_shrunk_sweep_draws_measured_beside_predicted_and_redraws_from_logs(tmp_path):
    cmd = [sys.executable, "-m", "repro.run", "+exp=ceiling", f"results_dir={tmp_path / 'r'}",
           f"figures_dir={tmp_path / 'f'}", "num_epochs=400", "eval_every=400", "progress=false",
           "num_clients=1,8", "nsync=1,4", "cost.bandwidth_Bps=1e9"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert (tmp_path / "f" / "ceiling.png").stat().st_size > 20_000
    frame = pd.read_csv(tmp_path / "f" / "ceiling.csv")
    measured = frame[frame["kind"] == "measured"]
    assert len(measured) == 4 * 2 and set(measured["num_clients"]) == {1, 8}
    assert "server link" in set(frame["binding"].dropna())
    redraw = subprocess.run([sys.executable, "-m", "repro.analysis", "ceiling", "--results", str(tmp_path / "r"),
                             "--out", str(tmp_path / "g")], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "MPLBACKEND": "Agg"})
    assert redraw.returncode == 0, redraw.stderr[-3000:]
    again = pd.read_csv(tmp_path / "g" / "ceiling.csv")
    pd.testing.assert_frame_equal(frame, again)


# ---------------------------------------------------------------------------------------------
# The paper's regime on the 2013 network
# ---------------------------------------------------------------------------------------------

def test_paper_regime_on_the_2013_network_is_fig4_papers_grid_under_paper2013_shared():
    from repro.config.settings import to_dict
    shared, plain = (composed([f"+exp={e}"], hydra=True) for e in ("fig4_paper_shared", "fig4_paper"))
    assert shared.hydra.sweeper.params == plain.hydra.sweeper.params
    a, b = (to_dict(parse(composed([f"+exp={e}"]))) for e in ("fig4_paper_shared", "fig4_paper"))
    assert {k for k in a if a[k] != b[k]} == {"exp_name", "cost"}
    assert {k for k in a["cost"] if a["cost"][k] != b["cost"][k]} == {"profile", "topology", "shared"}
    assert {k for k in a["cost"]["shared"] if a["cost"]["shared"][k] != b["cost"]["shared"][k]} == {
        "clients_per_host", "devices_per_host"}
    cbs = shared.hydra.callbacks
    assert [(cbs[c].figure, cbs[c].name) for c in ("figure", "figure3")] == [("fig4", "fig4_paper_shared"),
                                                                            ("fig3", "fig3_paper_shared")]


def test_the_lab_counts_a_networks_bytes_from_its_run_folder_as_the_real_model_does(tmp_path):
    """The ceiling's message size is the network's own, read from config.json
    (``network.param_bytes``) instead of building the model: equal to the real model's 4 bytes a
    parameter, and a folder that does not record it is refused, never guessed."""
    from repro.analysis.lab.ceiling import predict
    from repro.analysis.load import NoRunsError
    from repro.workload.models import build_model, num_parameters

    cost = ["cost=paper2013_shared", "cost.comm_params=null", "cost.bandwidth_Bps=1e6"]
    cfg = parse(compose([*cost, "num_epochs=0.1", "eval_every=0.1", "progress=false", "exp_name=exp"]))
    assert simulate(cfg, tmp_path / "exp" / "run")["status"] == "completed"
    run = load_runs(tmp_path, "exp").runs.iloc[0]
    real_bytes = 4 * num_parameters(build_model(cfg.model.name, (1, 8, 8), 10))
    assert run["network.param_bytes"] == real_bytes
    assert predict(run, [8]) == [ceiling(cfg.cost, 8, cfg.nsync, real_bytes)]
    with pytest.raises(NoRunsError, match="network.param_bytes"):
        predict(run.drop("network.param_bytes"), [8])


def test_the_lab_reads_per_client_speeds_back_from_their_json_cell():
    """cost.speeds is a list: one JSON cell in the runs' table (load.flatten). The lab's bound is
    the one the recorded profile gives, the clients' own speeds included."""
    from repro.analysis.lab.ceiling import predict
    from repro.analysis.load import flatten
    from repro.config.settings import to_dict

    cost = CostConfig.of(speeds=(1.0, 2.0, 4.0), comm_params=1000, straggler_client=2, straggler_factor=3.0)
    run = pd.Series(flatten({"nsync": 2, "cost": to_dict(cost)}))
    assert predict(run, [3]) == [ceiling(cost, 3, 2, 0)]
