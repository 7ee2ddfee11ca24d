"""timings.csv: where each push's round trip went, written by both drivers in one schema.

The simulator's rows come from its virtual clock, so they are exact functions of the cost
model (fetch and push transit = latency + bytes / bandwidth, apply = server_apply_s, compute =
nsync x compute_s without jitter); the real driver's come from the processes' monotonic clocks,
so test_real's completed run asks only what holds on any machine (one row per handled push, the versions of
updates.csv, every part finite and not negative), never a duration.
"""
from __future__ import annotations

import math

import pandas as pd
import pytest

from repro.config.settings import CostConfig, ProtocolConfig
from repro.files import schema
from repro.sim.driver import simulate
from tests.helpers.runs import real_cfg, sim_cfg, sim_killed_at
from tests.helpers.tables import table_bytes

PARTS = ["to_client_s", "compute_s", "to_server_s", "queue_s", "apply_s"]


def test_sim_timings_are_the_cost_model(tmp_path):
    cost = CostConfig(profile="uniform", compute_s=0.01, latency_s=0.002, bandwidth_Bps=1e6,
                      server_apply_s=0.003)
    cfg = sim_cfg(cost=cost)
    simulate(cfg, tmp_path)
    t = pd.read_csv(tmp_path / schema.TIMINGS_FILE)
    upd = pd.read_csv(tmp_path / schema.UPDATES_FILE)
    assert tuple(t.columns) == schema.TIMING_COLUMNS
    assert len(t) == len(upd) and (t.version == upd.version).all() and (t.time_s == upd.time_s).all()
    assert (t.client == upd.client).all() and (t.read_version == upd.read_version).all()
    transfer = t.to_server_s.iloc[0]
    assert transfer > 0.002 and (t.to_server_s == transfer).all()
    assert t.compute_s.to_numpy() == pytest.approx(cfg.nsync * 0.01) and (t.apply_s == 0.003).all()
    first = t.groupby("client").head(1)
    assert (first.to_client_s == 0).all()            # clients start with version 0 at t = 0
    assert (t.drop(first.index).to_client_s == transfer).all()
    assert (t.queue_s >= 0).all() and (t.queue_s > 0).any()   # 3 clients in lockstep queue
    # the parts add up: apply finished = fetched + compute + transit + queue + apply
    for _, rows in t.groupby("client"):
        fetched = rows.time_s.shift(1).fillna(0.0).to_numpy() + rows.to_client_s.to_numpy()
        done = fetched + rows.compute_s + rows.to_server_s + rows.queue_s + rows.apply_s
        assert done.to_numpy() == pytest.approx(rows.time_s.to_numpy())


def check_real_timings(run_dir) -> None:
    """A real run's timings.csv (called from test_real's completed run: no run of its own)."""
    t = pd.read_csv(run_dir / schema.TIMINGS_FILE)
    upd = pd.read_csv(run_dir / schema.UPDATES_FILE)
    assert tuple(t.columns) == schema.TIMING_COLUMNS
    assert len(t) >= len(upd) > 0 and (t.clock == "wall").all()
    assert set(upd.version) <= set(t.version)
    for part in PARTS:
        assert t[part].map(math.isfinite).all() and (t[part] >= 0).all(), part
    assert (t.compute_s > 0).all()


@pytest.mark.parametrize("protocol", [ProtocolConfig(), ProtocolConfig(name="sync", backup_workers=1)])
def test_a_resume_after_a_kill_neither_duplicates_nor_loses_a_timing(tmp_path, protocol):
    """issue 32 item 3: a run killed (SIGKILL) past its last checkpoint left timings.csv rows the
    resumed run wrote again. Now timings.csv is cut back to the checkpoint like the other tables:
    the resumed run's timings.csv is the uninterrupted run's, byte for byte (sync: the pushes of
    a round handled after the checkpoint share its version, so a cut by version is not enough)."""
    cfg = sim_cfg(protocol=protocol)   # a checkpoint every 5 versions
    simulate(cfg, tmp_path / "whole")
    sim_killed_at(cfg, tmp_path / "cut", 23)   # the last checkpoint: version 20
    whole = (tmp_path / "whole" / schema.TIMINGS_FILE).read_bytes()
    cut = (tmp_path / "cut" / schema.TIMINGS_FILE).read_bytes()
    assert whole.startswith(cut) and cut.count(b"\n") > 21   # rows past the checkpoint
    assert simulate(cfg.replace(resume=True), tmp_path / "cut")["status"] == "completed"
    assert (tmp_path / "cut" / schema.TIMINGS_FILE).read_bytes() == whole
    assert table_bytes(tmp_path / "cut") == table_bytes(tmp_path / "whole")
