"""Churn in the simulator (issue 20 part 4): a schedule and a seeded preemption process, carried
out through the run core with the real driver's event records; deterministic, and bit for bit
the same across a mid-run resume."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from repro.config.checks import validate
from repro.errors import ConfigError
from repro.sim.churn import Churn
from repro.sim.driver import simulate
from tests.helpers.invariants import check_run_folder
from tests.helpers.paths import ROOT
from tests.helpers.runs import sim_cfg
from tests.helpers.tables import table_bytes, table_frames


def churn_cfg(churn=None, **cost):
    from repro.config.cost import ChurnConfig

    cfg = sim_cfg()
    churn = ChurnConfig(**{**dict(preempt_rate=5.0, preempt_down_s=0.05, leave=(1, 0.01, 0.05), join=(0.02,)),
                           **(churn or {})})
    return cfg.replace(cost=dataclasses.replace(cfg.cost, churn=churn, **cost))


def test_churn_events_follow_the_schedule_and_the_seed(tmp_path):
    """The schedule's leave, return and join happen at their times; a joiner gets the next id
    and fetches then (staleness never negative); two runs of one seed are byte-identical."""
    cfg = churn_cfg()
    a = simulate(cfg, tmp_path / "a")
    b = simulate(cfg, tmp_path / "b")
    assert table_bytes(tmp_path / "a") == table_bytes(tmp_path / "b")
    assert a["events"] == b["events"]
    ev = a["events"]
    left = next(e for e in ev if e["type"] == "client_lost" and e["client"] == 1)
    assert left["lost_time_s"] == 0.01 and "cost.churn.leave" in left["reason"]
    back = next(e for e in ev if e["type"] == "client_rejoined" and e["client"] == 1)
    assert back["joined_time_s"] == 0.05
    joined = next(e for e in ev if e["type"] == "client_joined")
    assert joined == {**joined, "client": 4, "joined_time_s": 0.02}
    assert any(e["type"] == "client_lost" and "preempt_rate" in e["reason"] for e in ev)
    import pandas as pd

    upd = pd.read_csv(tmp_path / "a" / "updates.csv")
    assert (upd.staleness >= 0).all() and 4 in set(upd.client)
    assert not (upd[(upd.client == 1) & (upd.time_s > 0.01) & (upd.time_s < 0.05)]).shape[0]
    check_run_folder(tmp_path / "a")
    assert simulate(cfg.replace(seed=1), tmp_path / "c")["events"] != a["events"]


@pytest.mark.parametrize("protocol", ["async", "sync", "ssp", "ringmaster", "rennala"])
def test_churn_resumes_bit_for_bit(tmp_path, protocol):
    from repro.config.settings import ProtocolConfig

    cfg = churn_cfg().replace(protocol=ProtocolConfig(name=protocol))
    versions = simulate(cfg, tmp_path / "whole")["version"]
    cut = simulate(cfg, tmp_path / "cut", stop_at_version=versions // 2)   # mid-run, amid churn
    assert cut["status"] == "interrupted"
    summary = simulate(cfg.replace(resume=True), tmp_path / "cut")
    assert summary["status"].startswith("completed")
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
    whole = simulate(cfg, tmp_path / "whole")["events"]   # (skipped: the finished summary)
    assert [e for e in summary["events"] if e["type"] != "resumed"] == whole


@pytest.mark.parametrize("rule", ["delta", "easgd"])
def test_a_client_back_from_churn_starts_afresh_as_the_real_drivers_does(tmp_path, rule):
    """A client lost and back (the schedule's leave and return, preemptions) is a fresh client,
    as the real driver's rejoiner is a new process: no momentum buffer, its data order from the
    start, the server's parameters taken (EASGD: not its own moved toward them). So cost=replay
    of the run, whose rejoiners are built as the real driver's (tests/test_elastic.py::
    test_restarted_client_rejoins_under_its_id), applies the same pushes, byte for byte; a
    client back from churn kept its momentum and its data position before."""
    from repro.config.settings import AlgoConfig
    from tests.test_elastic import assert_replay_reproduces

    cfg = churn_cfg().replace(algo=AlgoConfig(server_rule=rule, lr=0.05, momentum=0.5))
    summary = simulate(cfg, tmp_path / "churn")
    upd = table_frames(tmp_path / "churn")[0]
    back = {(e["client"], e["version"]) for e in summary["events"] if e["type"] == "client_rejoined"}
    assert back & set(zip(upd.client, upd.read_version))   # a rejoiner pushed from its rejoin's fetch
    assert_replay_reproduces(tmp_path / "churn", tmp_path / "replay")
    assert table_bytes(tmp_path / "replay")[0] == table_bytes(tmp_path / "churn")[0]


@pytest.mark.parametrize("protocol", [dict(name="ringmaster", staleness_threshold=4, cancel_stale=True),
                                      dict(name="rennala")])
def test_ringmaster_and_rennala_serve_a_joiner_from_its_joins_fetch(tmp_path, protocol):
    """Joiner 4 (0.02 s) and client 1, lost (0.01 s) and back (0.05 s): each computes from the
    version it fetched as it joined (the policies' on_join), so no push or stop of it names an
    older one (without on_join, ringmaster stops client 1 at once as stale since version 0, and
    rennala's step records its segment as read from version 0), and each is served to the end."""
    import pandas as pd

    from repro.config.settings import ProtocolConfig

    cfg = churn_cfg(dict(preempt_rate=0.0)).replace(protocol=ProtocolConfig(**protocol))
    summary = simulate(cfg, tmp_path / "run")
    assert summary["status"] == "completed", summary["message"]
    joined = {e["client"]: e["version"] for e in summary["events"] if e["type"] in ("client_joined", "client_rejoined")}
    assert sorted(joined) == [1, 4]
    pushed = pd.read_csv(tmp_path / "run" / "timings.csv")   # every push the server handled
    for k, version in joined.items():
        mine = pushed[pushed.client == k]
        read = [*mine.read_version, *(v for v, j in summary["discarded_pushes"] if j == k)]
        assert min(read) == version, (k, read)
        assert mine.version.max() > 0.9 * summary["version"], k   # still pushing at the end


@pytest.mark.parametrize("protocol, churn", [
    (dict(name="ringmaster"), dict(preempt_rate=0.0)),
    (dict(name="ringmaster", cancel_stale=True), dict(preempt_rate=0.0)),
    (dict(name="ringmaster"), dict(leave=None, join=None)),   # losses only: segments in flight
    (dict(name="rennala"), dict(preempt_rate=0.0))])
def test_ringmaster_and_rennalas_default_r_and_s_follow_the_live_clients(tmp_path, protocol, churn):
    """Three equally fast clients, then four live (joiner 4 at 0.02 s, client 1 back at 0.05 s):
    R unset must follow them, each push then being about 3 stale; at the start's R = 3 client 1
    (back last) had all 14 of its pushes discarded. Under preemptions alone (no joins) nothing
    is discarded either: a segment a loss catches in flight keeps the R of its fetch. S unset is
    one push per live client: every collection after the joins holds one of each of the four,
    where S = 3 collected 2 of the joiner's 17 pushes."""
    from repro.config.settings import ProtocolConfig

    summary = simulate(churn_cfg(churn).replace(protocol=ProtocolConfig(**protocol)), tmp_path / "run")
    assert summary["status"] == "completed", summary["message"]
    if protocol["name"] == "ringmaster":
        assert summary["discarded_pushes"] == []
        return
    joins = [e["version"] for e in summary["events"] if e["type"] in ("client_joined", "client_rejoined")]
    steps: dict[int, list[int]] = {}
    for version, k in summary["collected_pushes"]:
        steps.setdefault(version, []).append(k)
    after = [sorted(ks) for v, ks in steps.items() if v > max(joins)]
    assert after and all(ks == [1, 2, 3, 4] for ks in after), steps


def test_a_joiner_computes_at_its_slots_speed(tmp_path):
    """Joiner 4 of 3 clients takes slot 1's pace (as the real driver's does): with cost.speeds
    (2, 1, 1), 2 steps x 0.01 s x 2 = 0.04 s a push, where it raised IndexError; with
    speed_law=sqrt and client 1 the straggler (3x), 2 x 0.01 x 1 x 3 = 0.06 s, where it computed
    at 1 + sqrt(3) and unslowed (0.055 s)."""
    import pandas as pd

    for name, cost, mine, twos in (("speeds", dict(speeds=(2.0, 1.0, 1.0)), 0.04, 0.02),
                                   ("law", dict(speed_law="sqrt", straggler_client=1, straggler_factor=3.0), 0.06, 0.04)):
        simulate(churn_cfg(dict(preempt_rate=0.0, leave=None, join=(0.02,)), **cost), tmp_path / name)
        timings = pd.read_csv(tmp_path / name / "timings.csv")
        assert set(timings[timings.client == 4].compute_s) == {mine}, name
        assert set(timings[timings.client == 2].compute_s) == {twos}, name


def started(run_dir):
    """Each timings.csv row's push: when its client began fetching the version it read (the row's
    time less its parts), beside the time that version was applied (updates.csv)."""
    import pandas as pd

    upd, rows = pd.read_csv(run_dir / "updates.csv"), pd.read_csv(run_dir / "timings.csv")
    applied = {0: 0.0, **dict(zip(upd.version, upd.time_s))}
    rows["start"] = rows.time_s - rows[["apply_s", "queue_s", "to_server_s", "compute_s", "to_client_s"]].sum(axis=1)
    rows["made"] = rows.read_version.map(applied)
    return rows


@pytest.mark.parametrize("protocol", ["async", "sync", "ssp"])
def test_churn_events_wait_for_the_busy_server(tmp_path, protocol):
    """A churn event that falls while the server applies (cost.server_apply_s 0.01 s) is carried
    out once the server is free, as the real server takes a loss or a join under its lock: a
    (re)joiner fetches a version no earlier than it was applied, and a sync round that a loss
    closes is applied after the push before it. The simulator carried the event out at its own
    time: joiners fetched versions from their future, pushes started before what they read
    existed, and updates.csv's time went back."""
    from repro.config.settings import ProtocolConfig

    cfg = churn_cfg(dict(preempt_rate=10.0), server_apply_s=0.01).replace(
        num_clients=4, protocol=ProtocolConfig(name=protocol, backup_workers=1 if protocol == "sync" else 0))
    simulate(cfg, tmp_path / "run")
    rows = started(tmp_path / "run")
    early = rows[rows.start < rows.made - 1e-12]
    assert early.empty, early[["client", "read_version", "start", "made"]].to_dict("records")
    check_run_folder(tmp_path / "run")
    times = table_frames(tmp_path / "run")[0].time_s
    assert (times.diff().dropna() >= 0).all()   # updates.csv's time never goes back


def test_a_client_back_before_its_sync_round_closed_computes_one_segment(tmp_path):
    """Client 1 pushes into round 0, is lost (0.025 s) and back (0.045 s) before the slow
    clients 3 and 4 close the round (0.06 s): the client back is a new process computing from
    its join's fetch, like any joiner; the reply its lost self's push was owed is not its. The
    round replied to it all the same, so the simulator computed its join's segment from the
    round's result (fetched at 0.06 s, pushed at 0.065 s) while a second segment of it ran: two
    pushes of client 1 from version 1. Now its push leaves the round as it joins; the round
    preempts it as a joiner still computing, and it pushes once from version 1."""
    from repro.config.settings import ProtocolConfig

    cfg = churn_cfg(dict(preempt_rate=0.0, leave=(1, 0.025, 0.045), join=None), speeds=(1.0, 1.0, 3.0, 3.0))
    summary = simulate(cfg.replace(num_clients=4, protocol=ProtocolConfig(name="sync")), tmp_path / "run")
    rows = started(tmp_path / "run")
    assert len(rows[(rows.client == 1) & (rows.read_version == 1)]) == 1
    assert [0, 1] in summary["discarded_pushes"]   # its join's segment, dropped by the round
    assert (rows.start >= rows.made - 1e-12).all()   # (it took the round's result at 0.06 s)


def test_a_held_sync_push_dropped_as_its_client_is_back_is_listed_as_discarded(tmp_path):
    """The run above: client 1's push into round 0, held when it was lost, is dropped as it is
    back (a joiner); the summary lists it in discarded_pushes, as each push a protocol drops,
    beside its join's segment that the round preempted. It listed only the segment: the push
    the server handled (its timings.csv row) was neither merged nor listed."""
    import pandas as pd
    from repro.config.settings import ProtocolConfig

    cfg = churn_cfg(dict(preempt_rate=0.0, leave=(1, 0.025, 0.045), join=None), speeds=(1.0, 1.0, 3.0, 3.0))
    summary = simulate(cfg.replace(num_clients=4, protocol=ProtocolConfig(name="sync")), tmp_path)
    updates, timings = (pd.read_csv(tmp_path / name) for name in ("updates.csv", "timings.csv"))
    merged = updates.num_samples.sum() // (cfg.nsync * cfg.algo.batch_size)
    assert len(timings) - merged == 1   # the held push: handled, never merged
    assert summary["discarded_pushes"] == [[0, 1], [0, 1]]


def test_a_sync_round_with_a_joiners_push_does_not_pass_the_budget(tmp_path):
    """3 clients, 6 epochs of 512 samples: 48 pushes of 64 samples, 16 rounds of 3, the budget
    held exactly. A joiner at 0.02 s makes the rounds after it 4 pushes each (its push is merged
    but takes no one's place), so the last round passed the budget by 3 pushes (3264 samples):
    now the round that reaches the budget closes there, under async's rule."""
    from repro.config.settings import ProtocolConfig

    for join in (None, (0.02,), (0.02, 0.03, 0.04)):
        cfg = churn_cfg(dict(preempt_rate=0.0, leave=None, join=join)).replace(protocol=ProtocolConfig(name="sync"))
        summary = simulate(cfg, tmp_path / f"join{len(join or ())}")
        assert (summary["status"], summary["samples_seen"]) == ("completed", 6 * 512), join


def test_a_client_away_but_due_back_at_the_end_does_not_degrade_the_run(tmp_path):
    """A client lost for good degrades the run (as a dead process does the real driver's); one
    away when the budget ends, due back (the schedule's return, a preemption's), is not lost:
    the run is completed, where it ended completed_degraded ("clients [1] were lost"), and
    summary.json's lost_clients names only the clients lost at the end, as the real driver's
    does (it named the ones away too)."""
    from repro.config.settings import ProtocolConfig

    for back, status, lost in ((100.0, "completed", []), (0.0, "completed_degraded", [1])):
        summary = simulate(churn_cfg(dict(preempt_rate=0.0, leave=(1, 0.05, back), join=None)),
                           tmp_path / f"leave{back:g}")
        assert (summary["status"], summary["lost_clients"]) == (status, lost), summary["message"]
    cfg = churn_cfg(dict(preempt_rate=20.0, leave=None, join=None)).replace(protocol=ProtocolConfig(name="sync"))
    summary = simulate(cfg, tmp_path / "preempted")
    last = {e["client"]: e["type"] for e in summary["events"] if e["type"].startswith("client_")}
    away = [k for k, kind in last.items() if kind == "client_lost"]
    assert away and summary["lost_clients"] == [] and summary["status"] == "completed", summary["message"]


def test_a_version_a_loss_applies_is_evaluated_and_checkpointed_as_a_pushed_one(tmp_path, monkeypatch):
    """Sync, 2 clients: client 2 (3x slower) leaves at 0.03 s, after client 1 pushed into round 0,
    so the loss closes the round: version 1. With an evaluation and a checkpoint due at every
    version, version 1 gets both at its apply, as a version a push applies does; both waited for
    the next push's cadence check, which saw version 2 (no row, no checkpoint at version 1).
    Resumed mid-run, the run is byte-identical to an uninterrupted one."""
    import pandas as pd

    from repro.config.settings import ProtocolConfig
    from repro.runs.core import RunCore

    saved, save = [], RunCore.save_checkpoint
    monkeypatch.setattr(RunCore, "save_checkpoint", lambda core: (saved.append(core.server.version), save(core)))
    cfg = churn_cfg(dict(preempt_rate=0.0, leave=(2, 0.03, 0.0), join=None), speeds=(1.0, 3.0)).replace(
        num_clients=2, protocol=ProtocolConfig(name="sync"), checkpoint_every=1, eval_every=0.01)
    summary = simulate(cfg, tmp_path / "whole")
    lost = next(e for e in summary["events"] if e["type"] == "client_lost")
    assert (lost["client"], lost["version"]) == (2, 0)
    evals, versions = pd.read_csv(tmp_path / "whole" / "evals.csv"), set(range(summary["version"] + 1))
    assert set(evals.version) == versions and versions - {0} <= set(saved)
    assert evals[evals.version == 1].time_s.item() == pytest.approx(0.03)   # at the loss's apply
    simulate(cfg, tmp_path / "cut", stop_at_version=2)
    simulate(cfg.replace(resume=True), tmp_path / "cut")
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")


@pytest.mark.timeout(120)
def test_churn_that_leaves_no_push_time_to_arrive_fails_the_run(tmp_path):
    """At cost.churn.preempt_rate=1e4 (back after 1e-4 s) a client is lost about every 0.1 ms
    and a push takes 20 ms: none arrives (e^-200). The run fails after 100 churn events per
    client without a push, saying why, as a protocol that makes no progress does; it looped
    for good, its events filling memory, deaf to Ctrl-C and SIGTERM (a stop request was read
    only between pushes)."""
    cfg = churn_cfg(dict(preempt_rate=1e4, preempt_down_s=1e-4, leave=None, join=None))
    summary = simulate(cfg, tmp_path / "run")
    assert summary["status"] == "failed" and summary["version"] == 0
    assert "cost.churn.preempt_rate" in summary["message"] and "no push" in summary["message"]
    assert len(summary["events"]) <= 100 * 3 + 3


def test_a_stop_is_honoured_between_churn_events(tmp_path, monkeypatch):
    """A stop request (Ctrl-C, SIGTERM) that comes while churn events follow one another ends
    the run interrupted after the event it came in, not at the next push."""
    from repro.sim import driver

    seen, membership = [], driver.Simulation.membership

    def stopping(self, *event):
        membership(self, *event)
        seen.append(event)
        if len(seen) == 10:
            self.stop.set("test")

    monkeypatch.setattr(driver.Simulation, "membership", stopping)
    cfg = churn_cfg(dict(preempt_rate=1e4, preempt_down_s=1e-4, leave=None, join=None))
    assert simulate(cfg, tmp_path / "run")["status"] == "interrupted" and len(seen) == 10


def test_preemption_draws_do_not_depend_on_their_order():
    cost = churn_cfg(dict(leave=None, join=None)).cost
    one, two = Churn(cost, 0, [1, 2]), Churn(cost, 0, [2, 1])
    assert sorted(e[0] for e in one.events) == sorted(e[0] for e in two.events)


@pytest.mark.parametrize("cost, key", [
    (dict(churn=dict(leave=(1, 0.5))), "cost.churn.leave"),
    (dict(churn=dict(leave=(9, 0.1, 0.2))), "cost.churn.leave"),
    (dict(churn=dict(leave=(1, 0.3, 0.2))), "cost.churn.leave"),
    (dict(topology="shared"), "cost.topology"),
])
def test_bad_churn_input_is_refused(cost, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(churn_cfg(**cost))


@pytest.mark.slow   # the fast guarantee is test_bad_churn_input_is_refused; this is the CLI's path to it
def test_bad_churn_input_exits_2_on_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "repro.run", "cost.churn_leave=[1,0.5]"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "cost.churn_leave" in proc.stderr   # the old spelling: named, and
    assert "'cost.churn.leave'" in proc.stderr                          # its new one in the error
