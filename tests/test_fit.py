"""cost=fit: a cost model fitted to recorded runs' timings.csv (repro/sim/fit.py).

Recordings are simulator runs with known costs (two message sizes, so latency and bandwidth
separate): the fit must recover step time, latency, bandwidth and apply time within 10%.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from repro.config.checks import validate
from repro.config.settings import CostConfig, ProtocolConfig
from repro.errors import ConfigError
from repro.sim.driver import simulate
from repro.sim.fit import fit_config
from tests.helpers.grids import cli_run
from tests.helpers.runs import CLI_ARGS, sim_cfg

KNOWN = CostConfig.of(profile="known", compute_s=0.01, jitter="lognormal", jitter_sigma=0.2,
                   latency_s=0.002, bandwidth_Bps=2e6, server_apply_s=0.001)


def record(tmp_path, name: str, comm_params: float | None, epochs: float = 12.0):
    cost = dataclasses.replace(KNOWN, comm_params=comm_params)
    run_dir = tmp_path / name
    simulate(sim_cfg(cost=cost, num_epochs=epochs, checkpoint_every=0), run_dir)
    return run_dir


def test_fit_recovers_known_costs(tmp_path):
    small, large = record(tmp_path, "small", None), record(tmp_path, "large", 40000.0)
    cfg = sim_cfg(cost=CostConfig.of(profile="fit", path=f"{small}:{large}"), checkpoint_every=0)
    summary = simulate(cfg, tmp_path / "fitted")
    fit = summary["fit"]
    assert fit["pushes"] >= 2 * 80
    for key in ("compute_s", "latency_s", "bandwidth_Bps", "server_apply_s"):
        assert fit[key] == pytest.approx(getattr(KNOWN, key), rel=0.10), key
    assert fit["jitter_sigma"] == pytest.approx(KNOWN.jitter_sigma, rel=0.3)
    recorded = json.loads((tmp_path / "fitted" / "config.json").read_text())
    assert recorded["fit"] == fit   # where the values came from, beside the values simulated
    assert recorded["cost"]["compute_s"] == fit["compute_s"]
    assert recorded["cost"]["bandwidth_Bps"] == fit["bandwidth_Bps"]


def test_a_barriers_wait_is_not_fitted_as_transit(tmp_path):
    """A sync recording's clients wait at the barrier between two pushes: that wait is no
    transit. KNOWN's costs (2 ms latency, 2 MB/s) recorded under sync with a straggler 3x slower
    (the others wait ~2 segments a round), beside the same under async: the fitted latency and
    bandwidth are KNOWN's from both, within 10% (the sync recording's latency came out 7x)."""
    runs = []
    for protocol in ("sync", "async"):
        for name, comm in (("small", None), ("large", 40000.0)):
            cost = dataclasses.replace(KNOWN, comm_params=comm, straggler_client=1, straggler_factor=3.0)
            simulate(sim_cfg(cost=cost, checkpoint_every=0, protocol=ProtocolConfig(name=protocol)),
                     tmp_path / protocol / name)
        runs.append(f"{tmp_path / protocol / 'small'}:{tmp_path / protocol / 'large'}")
    for path in runs:
        fit = fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=path)))[1]
        for key in ("latency_s", "bandwidth_Bps"):
            assert fit[key] == pytest.approx(getattr(KNOWN, key), rel=0.10), (path, key)


def test_a_discarded_push_is_not_fitted_as_an_apply(tmp_path):
    """A Ringmaster recording (R = 1: two pushes in three discarded) spends no apply on a push it
    discards, in the simulator as in the real server (their apply_s is 0): the fitted apply
    time is KNOWN's, where the mean over every push came out a third of it (0.00034 s)."""
    run_dir = tmp_path / "ringmaster"
    summary = simulate(sim_cfg(cost=KNOWN, checkpoint_every=0,
                               protocol=ProtocolConfig(name="ringmaster", staleness_threshold=1)), run_dir)
    assert len(summary["discarded_pushes"]) > 20
    fit = fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(run_dir))))[1]
    assert fit["server_apply_s"] == pytest.approx(KNOWN.server_apply_s, rel=1e-9)


def test_a_refused_push_of_a_diverged_recording_is_not_fitted_as_an_apply(tmp_path):
    """A recording that diverged: its last push was refused (no apply; apply_s 0 in the simulator,
    the check's own time in the real server), but the summary did not list it as dropped, so the
    fit averaged it in as an apply (0.000952 s where KNOWN's is 0.001). Now it is listed."""
    run_dir = tmp_path / "diverged"
    summary = simulate(sim_cfg(cost=KNOWN, checkpoint_every=0, divergence_factor=5.0,
                               algo=dataclasses.replace(sim_cfg().algo, lr=1.0)), run_dir)
    assert summary["status"] == "diverged", summary["message"]
    assert len(summary["discarded_pushes"]) == 1
    fit = fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(run_dir))))[1]
    assert fit["server_apply_s"] == pytest.approx(KNOWN.server_apply_s, rel=1e-9)


def test_fit_refuses_too_few_pushes(tmp_path):
    short = record(tmp_path, "short", None, epochs=0.5)
    cfg = sim_cfg(cost=CostConfig.of(profile="fit", path=str(short)))
    with pytest.raises(ConfigError, match="at least 20 pushes") as err:
        simulate(cfg, tmp_path / "fitted")
    assert err.value.key == "cost.path" and not (tmp_path / "fitted").exists()


def test_a_simulators_recording_is_fitted_with_a_warning_naming_it(tmp_path, caplog):
    """A simulator's recording gives back the costs it was simulated with (what these tests
    check the fit by), never a machine's: the fit says so, naming cost.path's folder; it was
    fitted silently, as if it were a real run's."""
    rec = record(tmp_path, "rec", None, epochs=3.0)
    with caplog.at_level("WARNING"):
        fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(rec))))
    assert f"cost.path {rec} is a simulator's recording" in caplog.text
    caplog.clear()
    _edit_config(rec, backend__name="real")
    with caplog.at_level("WARNING"):
        fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(rec))))
    assert "simulator's recording" not in caplog.text


def test_a_recorded_machine_puts_the_fitted_clients_on_it(tmp_path):
    """A recording whose config.json says its clients shared the server's host (a single-node
    run's ``host`` record) is simulated on one machine of its cores, its evaluations' CPU time
    (summary ``eval_cpu_s``) taking their share; one whose clients were on another node, on one
    host of its cores beside the server's. A known link rate leaves the latency as the rest."""
    rec = record(tmp_path, "rec", None)
    config, summary = json.loads((rec / "config.json").read_text()), json.loads((rec / "summary.json").read_text())
    config["host"] = {"cpu_cores": 4, "torch_threads": 2, "clients_on_host": 1}
    config["backend"]["name"] = "real"   # its server sent each reply before the next push
    (rec / "config.json").write_text(json.dumps(config))
    (rec / "summary.json").write_text(json.dumps({**summary, "eval_cpu_s": 0.03}))
    cfg, fit = fit_config(sim_cfg(num_clients=4, cost=CostConfig.of(profile="fit", path=str(rec))))
    cost = cfg.cost
    assert (cost.topology, cost.shared.clients_per_host, cost.shared.devices_per_host, cost.machine.single) == ("shared", 4, 2, True)
    assert cost.machine.eval_s == pytest.approx(0.03) and "one machine of 2 cores" in fit["machine"]
    assert cost.reply_holds_server and fit["reply_holds_server"]
    config["host"]["clients_on_host"] = 0   # torchrun: rank 0 alone on its node
    (rec / "config.json").write_text(json.dumps(config))
    link = CostConfig.of(profile="fit", path=str(rec), topology="shared", server_bandwidth_Bps=KNOWN.bandwidth_Bps)
    cfg, fit = fit_config(sim_cfg(num_clients=2, cost=link))
    assert (cfg.cost.machine.single, cfg.cost.machine.eval_s, cfg.cost.shared.clients_per_host) == (False, 0.0, 2)
    assert cfg.cost.shared.server_bandwidth_Bps == KNOWN.bandwidth_Bps and cfg.cost.bandwidth_Bps is None
    assert cfg.cost.latency_s == pytest.approx(KNOWN.latency_s, rel=0.10)


def test_a_known_burst_is_not_latency_and_a_stated_machine_shares_its_cores(tmp_path):
    """A one-client recording over a limited server link with a token bucket (each transfer finds
    it idle and sends its burst at once): given the link's rate and burst, the fit recovers the
    latency; without the burst the transit looks shorter than the bytes' time and the latency is
    lost (0). A cross-node recording with cost.machine.single on the command (its nodes were network
    namespaces of one machine) is simulated on that machine, its evaluations taking their share."""
    rate, burst = 2e6, 20000.0
    link = dict(topology="shared", server_bandwidth_Bps=rate, server_burst_bytes=burst, bandwidth_Bps=None,
                comm_params=40000.0)
    rec = tmp_path / "rec"
    simulate(sim_cfg(cost=KNOWN.updated(**link), num_clients=1, num_epochs=12.0, checkpoint_every=0), rec)
    config = json.loads((rec / "config.json").read_text())
    config["host"] = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 0}   # across nodes
    (rec / "config.json").write_text(json.dumps(config))
    summary = json.loads((rec / "summary.json").read_text())
    (rec / "summary.json").write_text(json.dumps({**summary, "eval_cpu_s": 0.03}))
    given = CostConfig.of(profile="fit", path=str(rec), topology="shared", server_bandwidth_Bps=rate,
                          server_burst_bytes=burst)
    cfg, fit = fit_config(sim_cfg(num_clients=2, cost=given))
    assert cfg.cost.latency_s == pytest.approx(KNOWN.latency_s, rel=0.10)
    assert (cfg.cost.machine.single, cfg.cost.machine.eval_s) == (False, 0.0)
    no_burst, _ = fit_config(sim_cfg(num_clients=2, cost=given.updated(server_burst_bytes=0.0)))
    assert no_burst.cost.latency_s == 0.0   # 160 KB at 2 MB/s is 80 ms; the transit was 72 ms
    stated = given.updated(one_machine=True, clients_per_host=2, devices_per_host=2)
    cfg, fit = fit_config(sim_cfg(num_clients=2, cost=stated))
    assert (cfg.cost.machine.single, cfg.cost.shared.devices_per_host, cfg.cost.machine.eval_s) == (True, 2, pytest.approx(0.03))
    assert "limited link" in fit["machine"]


# ---------------------------------------------------------------------------------------------
# What a fit refuses (issue 32, items 5, 7 and 15): exit 2 naming cost.path, the file and the line
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["", None, ":"])
def test_a_fit_without_a_recording_is_refused(path):
    """Without a path nothing was fitted and the run went on the uniform profile's costs."""
    with pytest.raises(ConfigError) as err:
        validate(sim_cfg(cost=CostConfig.of(profile="fit", path=path)))
    assert err.value.key == "cost.path" and "RUN_DIR" in str(err.value)


def test_the_command_line_refuses_a_fit_without_a_recording(tmp_path, monkeypatch, capsys):
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    done = cli_run(monkeypatch, capsys, *CLI_ARGS, "cost=fit", "cost.path=''", f"results_dir={tmp_path / 'r'}")
    assert done.returncode == 2 and "'cost.path'" in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


def _edit_config(run_dir, **changes):
    config = json.loads((run_dir / "config.json").read_text())
    for key, value in changes.items():
        group, _, leaf = key.partition("__")
        if value is None:
            config[group].pop(leaf) if leaf else config.pop(group)
        elif leaf:
            config[group][leaf] = value
        else:
            config[group] = value
    (run_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("key,change,named", [
    ("model.name", {"model__name": "digits_cnn"}, "model.name=digits_cnn, this run model.name=mlp"),
    ("data.name", {"data__name": "digits"}, "data.name=digits, this run data.name=synthetic"),
    ("algo.batch_size", {"algo__batch_size": 16}, "algo.batch_size=16, this run algo.batch_size=32")])
def test_a_recording_of_another_model_data_or_batch_is_refused(tmp_path, key, change, named):
    """Its step time is another problem's: the run would simulate mlp with digits_cnn's steps."""
    rec = record(tmp_path, "rec", None, epochs=3.0)
    _edit_config(rec, **change)
    with pytest.raises(ConfigError) as err:
        fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(rec))))
    assert err.value.key == "cost.path" and named in str(err.value), str(err.value)
    assert str(rec / "config.json") in str(err.value)


def test_another_models_recording_beside_the_runs_own_gives_only_its_transit(tmp_path, caplog):
    """Two model sizes separate latency from bandwidth: the other model's recording gives its
    transit point (with a warning naming both models), never its step or apply times."""
    own, other = record(tmp_path, "own", None, epochs=3.0), record(tmp_path, "other", 40000.0, epochs=3.0)
    _edit_config(other, model__name="digits_cnn")
    timings = (other / "timings.csv").read_text().splitlines()
    head = timings[0].split(",")
    slow = [",".join(str(10 * float(v)) if head[i] in ("compute_s", "apply_s") else v
                     for i, v in enumerate(row.split(","))) for row in timings[1:]]
    (other / "timings.csv").write_text("\n".join([timings[0], *slow]) + "\n")
    alone = fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=str(own))))[1]
    with caplog.at_level("WARNING"):
        _, fit = fit_config(sim_cfg(cost=CostConfig.of(profile="fit", path=f"{own}:{other}")))
    assert (fit["compute_s"], fit["server_apply_s"]) == (alone["compute_s"], alone["server_apply_s"])
    assert fit["transit_only"] == [str(other)] and len(fit["transit"]) == 2 and fit["bandwidth_Bps"]
    assert "model.name=digits_cnn (this run: mlp)" in caplog.text


def _bad_cell(rec):
    lines = (rec / "timings.csv").read_text().splitlines()
    cells = lines[4].split(",")
    cells[6] = "fast"   # compute_s of line 5
    lines[4] = ",".join(cells)
    (rec / "timings.csv").write_text("\n".join(lines) + "\n")
    return "timings.csv line 5 has compute_s 'fast'"


def _no_network(rec):
    _edit_config(rec, network=None)
    return "config.json has network.param_bytes"


def _bad_host(rec):
    _edit_config(rec, host={"cpu_cores": "four", "clients_on_host": 1})
    return "config.json has host, null or the real driver's record"


def _short_row(rec):
    with open(rec / "timings.csv", "a") as f:
        f.write("99,1.0,virtual\n")
    return f"line {len((rec / 'timings.csv').read_text().splitlines())} has client ''"


def _a_replay(rec):
    simulate(sim_cfg(cost=CostConfig.of(profile="replay", schedule="replay", path=str(rec)), checkpoint_every=0),
             rec.parent / "replay")
    return "a replay records no timings"


def _fifo_timings(rec):
    (rec / "timings.csv").unlink()
    os.mkfifo(rec / "timings.csv")   # its read would wait for a writer for good: the old code hung
    return "timings.csv is not a regular file"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spoil", [_bad_cell, _no_network, _bad_host, _short_row, _a_replay, _fifo_timings])
def test_a_malformed_recording_is_refused_naming_the_file_and_line(tmp_path, spoil):
    rec = record(tmp_path, "rec", None, epochs=6.0)
    said = spoil(rec)
    path = tmp_path / "replay" if spoil is _a_replay else rec
    with pytest.raises(ConfigError) as err:
        simulate(sim_cfg(cost=CostConfig.of(profile="fit", path=str(path))), tmp_path / "fitted")
    assert err.value.key == "cost.path" and said in str(err.value), str(err.value)
    assert not (tmp_path / "fitted").exists()


def test_the_command_line_refuses_a_malformed_recording_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    rec = record(tmp_path, "rec", None, epochs=6.0)
    said = _bad_cell(rec)
    # in the test's process (what the refusal says and leaves: tests/helpers/grids.cli_run)
    done = cli_run(monkeypatch, capsys, *CLI_ARGS, "cost=fit", f"cost.path={rec}", f"results_dir={tmp_path / 'r'}")
    assert done.returncode == 2 and "'cost.path'" in done.stderr and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list((tmp_path / "r").rglob("*"))   # no .hydra_incoming_*


def test_a_fitted_run_is_simulated_again_from_its_config_without_a_refit(tmp_path):
    """simreal's re-simulations read a fitted run's config.json with cost.path dropped: a fit
    without a path is refused, so the values come back as the profile ``fitted``."""
    from repro_bench.instruments.spread import predicted_config

    rec = record(tmp_path, "rec", None, epochs=3.0)
    simulate(sim_cfg(cost=CostConfig.of(profile="fit", path=str(rec)), checkpoint_every=0), tmp_path / "fitted")
    cfg = predicted_config(tmp_path / "fitted")
    recorded = json.loads((tmp_path / "fitted" / "config.json").read_text())["cost"]
    assert (cfg.cost.profile, cfg.cost.path, cfg.cost.compute_s) == ("fitted", None, recorded["compute_s"])


def test_a_fitted_run_replays(tmp_path):
    """config.json records the fit beside the settings ("fit"): a replay of a cost=fit run was
    refused with "invalid value for 'fit': {...}; expected a known key"."""
    rec = record(tmp_path, "rec", None, epochs=3.0)
    fit = CostConfig.of(profile="fit", path=str(rec))
    fitted = simulate(sim_cfg(cost=fit, checkpoint_every=0), tmp_path / "fitted")
    replay = CostConfig.of(profile="replay", schedule="replay", path=str(tmp_path / "fitted"))
    again = simulate(sim_cfg(cost=replay, checkpoint_every=0), tmp_path / "replay")
    assert (again["status"], again["final"]) == (fitted["status"], fitted["final"])
