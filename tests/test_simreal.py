"""+exp=sim_vs_real and python -m repro.bench simreal: the simulator's predictions held against
real runs (repro_bench/instruments/simreal.py, repro_bench/instruments/points.py).

Fast: the KS distance, and the table and figure from synthetic run folders whose numbers are
known (which side and which link each folder is comes from what it recorded, not its path).
Slow: a shrunk experiment end to end on loopback (the two-host part is tests/test_two_hosts.py's),
then the benchmark on its folders.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from repro_bench.instruments import points as lab
from repro_bench.__main__ import main
from tests.helpers.paths import ROOT


def test_ks_distance_is_the_largest_gap_between_the_two_ecdfs():
    assert lab.ks_distance([0, 0, 1, 1], [1, 1, 1, 1]) == 0.5
    assert lab.ks_distance([2, 1, 0], [0, 1, 2]) == 0.0
    assert lab.ks_distance([0, 1, 2, 3], [0, 0, 0, 3]) == 0.5   # F: 0.25 against 0.75 at 0


def fake_run(path, *, backend, clients, nsync, seed, host=None, fit_paths=None, rate=1000.0, stale=0,
             ttt=1.0, target=0.05):
    """A finished run folder: pushes of 10 samples every 10 / rate s, each of staleness ``stale``."""
    path.mkdir(parents=True)
    config = {"backend": {"name": backend}, "num_clients": clients, "nsync": nsync, "seed": seed,
              "target_error": target}
    if host is not None:
        config["host"] = host
    if fit_paths is not None:
        config["fit"] = {"paths": [str(p) for p in fit_paths]}
    (path / "config.json").write_text(json.dumps(config))
    (path / "summary.json").write_text(json.dumps({"status": "completed", "time_to_target": {f"{target:g}": ttt}}))
    n = 21
    pd.DataFrame({"version": range(1, n + 1), "time_s": [0.5 + i * 10 / rate for i in range(n)],
                  "samples_seen": [10 * (i + 1) for i in range(n)],
                  "staleness": [stale] * n}).to_csv(path / "updates.csv", index=False)
    pd.DataFrame({"time_s": [0.0, 1.0], "train_error": [0.9, 0.04]}).to_csv(path / "evals.csv", index=False)
    parts = {"to_client_s": 1e-3, "compute_s": 10 / rate - 2e-3, "to_server_s": 1e-3, "queue_s": 0.0, "apply_s": 0.0}
    pd.DataFrame([parts] * n).to_csv(path / "timings.csv", index=False)
    return path


def test_the_table_pairs_each_grid_point_by_what_its_folders_recorded(tmp_path, capsys):
    one = {"cpu_cores": 2, "torch_threads": 1}
    r1 = fake_run(tmp_path / "a", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1},
                  rate=1000.0, ttt=1.0)
    fake_run(tmp_path / "b", backend="real", clients=2, nsync=1, seed=0, host={**one, "clients_on_host": 2},
             rate=2000.0, stale=1, ttt=0.6)
    l1 = fake_run(tmp_path / "c", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 0},
                  rate=100.0, ttt=5.0)
    fake_run(tmp_path / "p" / "a", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[r1], rate=1100.0, ttt=0.9)
    fake_run(tmp_path / "p" / "b", backend="sim", clients=2, nsync=1, seed=0, fit_paths=[r1], rate=1500.0,
             stale=2, ttt=0.5)
    fake_run(tmp_path / "p" / "c", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[l1], rate=100.0, ttt=5.0)
    fake_run(tmp_path / ".hidden", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1})
    runs, stale, curves, _ = lab.read_runs(tmp_path)
    assert len(runs) == 6 and set(curves.side) == {"measured", "predicted"}
    table = lab.points_table(runs, stale).set_index(["link", "num_clients"])
    assert list(table.index) == [("link", 1), ("loopback", 1), ("loopback", 2)]
    two = table.loc[("loopback", 2)]
    assert two.measured_samples_per_s == pytest.approx(2000.0) and two.samples_error == pytest.approx(-0.25)
    assert two.staleness_error == pytest.approx(1.0) and two.ks_distance == 1.0
    assert not two.time_to_target_inside   # 0.6 measured, the simulator's only seed says 0.5
    assert table.loc[("loopback", 1)].samples_error == pytest.approx(0.1)
    assert pd.isna(table.loc[("loopback", 1)].ks_distance)   # one client: no staleness to compare
    assert table.loc[("link", 1)].time_to_target_inside
    parts = lab.parts_table(runs)   # where the round trips went, side by side, in ms
    assert parts.loc[("loopback", 1, 2), ("measured", "compute_s")] == pytest.approx(3.0)
    assert parts.loc[("loopback", 1, 2), ("predicted", "to_client_s")] == pytest.approx(1.0)
    paths = lab.write_figure(tmp_path, tmp_path / "fig")
    assert [p.name for p in paths] == ["sim_vs_real.png", "sim_vs_real.pdf", "sim_vs_real.csv"]
    assert len(pd.read_csv(paths[-1])) == 3
    # the benchmark prints each point against the targets; a missed one is exit status 1
    assert main(["simreal", "--results", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "loopback      1       2      2000      1500  -25.0% FAIL" in out and "+100.0% FAIL" in out


def simulated_run(path, *, clients, seed, sigma, real=False, fit_paths=None):
    """A run of the simulator (2 epochs of digits on the mlp, 2 ms steps, lognormal jitter
    ``sigma`` per step); with ``real`` its config.json says it is a real run on one host (a
    stand-in for a measured run whose spread is known), with ``fit_paths`` that it was fitted to
    those runs. The mlp: only the timings are read, and it trains faster than digits_cnn."""
    from repro.config.settings import CostConfig, ModelConfig, RunConfig
    from repro.sim.driver import simulate

    cfg = RunConfig(num_clients=clients, nsync=1, seed=seed, num_epochs=2.0, eval_every=2.0, progress=False,
                    model=ModelConfig(name="mlp"),
                    cost=CostConfig.of(jitter="lognormal", jitter_sigma=sigma, compute_s=0.002))
    simulate(cfg, path)
    config = json.loads((path / "config.json").read_text())
    if real:
        config["backend"] = {"name": "real"}
        config["host"] = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": clients}
    if fit_paths is not None:
        config["fit"] = {"paths": [str(p) for p in fit_paths]}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_matching_a_points_own_compute_spread_brings_its_staleness_closer(tmp_path, capsys):
    from repro_bench.instruments import spread

    assert spread.spread_sigma(0.0, 8) == 0.0
    cv, nsync = 0.3, 8   # a push of nsync steps: cv^2 = (exp(sigma^2) - 1) / nsync
    assert (math.exp(spread.spread_sigma(cv, nsync) ** 2) - 1) / nsync == pytest.approx(cv * cv)
    # "measured": wide (sigma 0.8 per step); seed 1 the very same pushes as seed 0, so the two
    # seeds' real runs are identical and the floor between them is 0
    one = simulated_run(tmp_path / "m1", clients=1, seed=0, sigma=0.8, real=True)
    wide = simulated_run(tmp_path / "m2s0", clients=2, seed=0, sigma=0.8, real=True)
    shutil.copytree(wide, tmp_path / "m2s1")
    config = json.loads((tmp_path / "m2s1" / "config.json").read_text())
    (tmp_path / "m2s1" / "config.json").write_text(json.dumps({**config, "seed": 1}))
    # "predicted": the fitted model far too narrow (sigma 0.05)
    for seed in (0, 1):
        simulated_run(tmp_path / "p" / f"s{seed}", clients=2, seed=seed, sigma=0.05, fit_paths=[one])
    table = spread.spread_table(tmp_path)
    assert list(zip(table.link, table.nsync, table.num_clients)) == [("loopback", 1, 2)]
    r = table.iloc[0]
    assert r.seeds == 2 and r.ks_floor == 0.0
    assert r.measured_compute_cv > 0.5 > 0.1 > r.predicted_compute_cv   # each side's own timings
    assert r.jitter_sigma == pytest.approx(0.05) and r.spread_jitter_sigma > 0.5
    assert r.ks_distance > 0.3 and r.ks_spread < r.ks_distance / 2
    assert main(["simreal", "--results", str(tmp_path), "--spread"]) in (0, 1)   # 1: a target missed
    out = capsys.readouterr().out
    assert "KS spread" in out and f"{r.ks_spread:9.3f}" in out and "   0.000 " in out


@pytest.mark.slow
def test_bare_loops_side_by_side_report_their_per_step_spread():
    from repro_bench.real import plain_step_cv

    cv = plain_step_cv(2, seconds=1.0)   # a property of the samples, never a time asserted
    assert math.isfinite(cv) and cv > 0


@pytest.mark.slow
def test_a_shrunk_experiment_runs_end_to_end_and_the_benchmark_reads_it(tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "repro.run", "+exp=sim_vs_real", "num_clients=1,2", "nsync=1", "seed=0",
           "num_epochs=2", "hydra.callbacks.simreal.links=[loopback]", f"results_dir={tmp_path / 'r'}",
           f"figures_dir={tmp_path / 'f'}", "progress=false"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "f" / "sim_vs_real.csv")
    assert sorted(table.num_clients) == [1, 2] and set(table.link) == {"loopback"}
    assert (table.predicted_samples_per_s > 0).all() and table.ks_distance.notna().sum() == 1
    predicted = tmp_path / "r" / "sim_vs_real" / "predicted" / "loopback" / "nsync1_num_clients2_seed0"
    fit = json.loads((predicted / "config.json").read_text())["fit"]
    assert fit["paths"] == [str(tmp_path / "r" / "sim_vs_real" / "nsync=1,num_clients=1,num_epochs=2,seed=0")]
    assert json.loads((predicted / "config.json").read_text())["cost"]["machine"]["single"] is True
    bench = subprocess.run([sys.executable, "-m", "repro.bench", "simreal", "--results", str(tmp_path / "r" / "sim_vs_real")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert bench.returncode in (0, 1), bench.stderr   # 1: a target missed, which this machine decides
    assert "loopback      1       2" in bench.stdout
    # simreal --cores re-simulates a point with what it measured: a compute twice as slow, fewer samples/s
    from repro_bench.instruments.cores import resimulated_error

    before, after = resimulated_error(tmp_path / "r" / "sim_vs_real", "loopback", 1, 2, compute_scale=2.0)
    assert after < before
    assert resimulated_error(tmp_path / "r" / "sim_vs_real", "link", 1, 2) is None   # no such point


def test_a_summary_that_is_no_json_object_is_read_as_none_not_a_crash(tmp_path):
    """A folder whose summary.json holds a list is not a finished run: the reader of the
    experiment's tree passes over it (it raised AttributeError: a list has no .get)."""
    kept = fake_run(tmp_path / "a", backend="real", clients=1, nsync=1, seed=0)
    odd = fake_run(tmp_path / "b", backend="real", clients=1, nsync=1, seed=1)
    (odd / "summary.json").write_text("[1, 2]")
    assert lab.run_dirs(tmp_path) == [kept]


def test_time_to_target_is_read_under_the_key_the_run_wrote(tmp_path):
    """The run keys time_to_target by the target's repr (0.1234567 -> "0.1234567"); the reader
    looked it up as f"{target:g}" ("0.123457") and found nothing."""
    run = fake_run(tmp_path / "a", backend="real", clients=1, nsync=1, seed=0,
                   host={"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}, target=0.1234567)
    (run / "summary.json").write_text(json.dumps({"status": "completed",
                                                  "time_to_target": {"0.1234567": 1.0}}))
    runs, _, _, _ = lab.read_runs(tmp_path)
    assert runs.time_to_target_s.tolist() == [0.5]   # from the first applied push, at 0.5 s


@pytest.mark.parametrize("damage", ["no push", "no updates.csv", "no nsync", "a time to target of text"])
def test_a_run_folder_that_does_not_read_is_named_in_one_line(tmp_path, capsys, damage):
    one = {"cpu_cores": 2, "torch_threads": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1})
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run])
    if damage == "no push":
        pd.read_csv(run / "updates.csv").iloc[:0].to_csv(run / "updates.csv", index=False)
    elif damage == "no updates.csv":
        (run / "updates.csv").unlink()
    else:
        name, drop = ("config.json", "nsync") if damage == "no nsync" else ("summary.json", None)
        record = json.loads((run / name).read_text())
        record.pop("nsync") if drop else record["time_to_target"].update({"0.05": "soon"})
        (run / name).write_text(json.dumps(record))
    assert main(["simreal", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"run folder {run} does not read" in err and err.count("\n") == 1, err


def test_a_target_met_before_the_first_push_is_reached_at_0_not_before(tmp_path, capsys):
    # the evaluation at version 0 (time 0) met target_error=0.95: the first push came 0.5 s later
    one = {"cpu_cores": 2, "torch_threads": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1},
                   ttt=0.0)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run], ttt=0.0)
    runs, stale, _, _ = lab.read_runs(tmp_path)
    assert list(runs.time_to_target_s) == [0.0, 0.0]
    assert lab.points_table(runs, stale).time_to_target_inside.all()
    main(["simreal", "--results", str(tmp_path)])
    assert "before their first push" in capsys.readouterr().out


def test_two_clients_without_staleness_on_both_sides_agree(tmp_path, capsys):
    # protocol=sync: every push of 2 clients has staleness 0, measured and predicted
    one = {"cpu_cores": 2, "torch_threads": 1}
    r1 = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host={**one, "clients_on_host": 1})
    fake_run(tmp_path / "m2", backend="real", clients=2, nsync=1, seed=0, host={**one, "clients_on_host": 2})
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[r1])
    fake_run(tmp_path / "p2", backend="sim", clients=2, nsync=1, seed=0, fit_paths=[r1])
    runs, stale, _, _ = lab.read_runs(tmp_path)
    assert lab.points_table(runs, stale).staleness_error.iloc[-1] == 0.0
    assert main(["simreal", "--results", str(tmp_path)]) == 0, capsys.readouterr().out


def test_parts_with_no_loopback_point_says_so_instead_of_a_key_error(tmp_path, capsys):
    # hydra.callbacks.simreal.links=[link]: only the two-host points have predicted runs
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 0}
    l1 = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[l1])
    main(["simreal", "--results", str(tmp_path), "--parts"])
    assert f"none: {tmp_path} has no loopback point with both a measured and a predicted run" in capsys.readouterr().out


def test_a_moved_experiment_tree_still_pairs_its_predicted_runs(tmp_path, capsys):
    """A simulated run's link came from its fit's recordings, by their absolute paths: once the
    tree was moved or copied (to another machine, another name) no predicted run had a link, and
    the report said no point had both sides. The fit records its recordings' host: read that."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    r1 = fake_run(tmp_path / "old" / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    p1 = fake_run(tmp_path / "old" / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[r1])
    config = json.loads((p1 / "config.json").read_text())
    config["fit"]["host"] = host   # as repro.sim.fit records it
    (p1 / "config.json").write_text(json.dumps(config))
    (tmp_path / "old").rename(tmp_path / "new")
    assert main(["simreal", "--results", str(tmp_path / "new")]) == 0, capsys.readouterr().err
    assert "loopback      1       1" in capsys.readouterr().out


@pytest.mark.parametrize("option", ["--parts", "--spread"])
def test_a_run_without_timings_is_named_in_one_line_by_parts_and_spread(tmp_path, capsys, option):
    """--parts and --spread read timings.csv, which read_runs does not need: a run folder without
    one (an older or edited recording) was a FileNotFoundError traceback after the table."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 2}
    run = fake_run(tmp_path / "m2", backend="real", clients=2, nsync=1, seed=0, host=host)
    fake_run(tmp_path / "p2", backend="sim", clients=2, nsync=1, seed=0, fit_paths=[run])
    (run / "timings.csv").unlink()
    assert main(["simreal", "--results", str(tmp_path), option]) == 2
    err = capsys.readouterr().err
    assert str(run / "timings.csv") in err and err.count("\n") == 1, err


def test_a_point_no_seed_brought_to_the_target_prints_never_not_nan(tmp_path, capsys):
    """The table printed 'nan in [nan, nan] no' for a point whose runs never reached the target."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host, ttt=None)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run], ttt=None)
    main(["simreal", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert " never in [never, never] no" in out and "nan" not in out, out


def test_an_experiment_that_refused_to_start_is_its_own_one_line(tmp_path, monkeypatch, capsys):
    """--results naming a file: the experiment refused it in one line (exit 2), then the benchmark
    added 'no grid point in FILE has both a measured and a predicted run', as if runs were missing."""
    stand_in = tmp_path / "experiment"   # the experiment's refusal, without its imports
    stand_in.write_text("#!/bin/sh\necho 'error: cannot make the grid folder' >&2\nexit 2\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    (tmp_path / "file").write_text("")
    assert main(["simreal", "--results", str(tmp_path / "file")]) == 2
    assert "no grid point" not in capsys.readouterr().err


def test_a_results_folder_that_does_not_exist_is_refused_not_run_into(tmp_path, monkeypatch, capsys):
    """A typo in --results ran the whole experiment (two-host runs included: minutes) into the
    typo. A named folder must exist; left out, the experiment's own folder is run into as before."""
    from repro_bench.instruments import cli

    ran = []
    monkeypatch.setattr(cli, "_experiment", lambda cmd: ran.append(cmd) or 0)
    monkeypatch.chdir(tmp_path)
    for argv in (["--results", "resluts/sim_vs_real"], ["--cores", "8:4", "--results", "typo"], ["--results", ""]):
        assert main(["simreal", *argv]) == 2   # '': a $DIR unset ran the experiment into the current folder
        assert capsys.readouterr().err == (f"python -m repro.bench simreal: --results {argv[-1] or repr('')}: "
                                           "no such folder; make it to run the experiment into it, or leave "
                                           "--results out for results/sim_vs_real\n")
    assert ran == []
    assert main(["simreal"]) == 2   # the stand-in ran nothing: no grid point
    assert ran and f"results_dir='{tmp_path / 'results'}'" in ran[0] and "exp_name='sim_vs_real'" in ran[0]


def test_a_report_whose_reader_left_ends_quietly_as_a_unix_tool(tmp_path, monkeypatch):
    """python -m repro.bench simreal | head: a BrokenPipeError traceback once head had left."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run])
    read, write = os.pipe()
    os.close(read)   # the reader has left
    with open(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert main(["simreal", "--results", str(tmp_path)]) == 141   # 128 + SIGPIPE, as a Unix tool
        monkeypatch.undo()


def test_runs_of_one_point_that_differ_in_more_than_their_seed_are_refused_naming_two(tmp_path, capsys):
    """A run of another setting left in the tree (here another lr) joined the point's medians
    over seeds in silence; the runs of one point and side may differ only in their seed."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    other = fake_run(tmp_path / "m1-lr", backend="real", clients=1, nsync=1, seed=1, host=host)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run])
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "algo": {"lr": 0.5}}))
    assert main(["simreal", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the measured loopback runs of nsync 1, 1 client(s) differ in more than their seed" in err
    assert str(other) in err and err.count("\n") == 1, err


@pytest.mark.parametrize("key, value, pooled", [("force", True, True), ("backend.client_timeout_s", 90.0, True),
                                                ("checkpoint_every", 1, False), ("backend.eval_in_thread", False, False)])
def test_runs_of_one_point_pool_over_what_shapes_neither_training_nor_the_clock(tmp_path, key, value, pooled):
    """A seed rerun with force=true (or another client_timeout_s) was refused as another setting:
    only a hand-written list of keys was left out. Now the settings that shape training, and the
    few that shape only the real server's clock (a checkpoint or an evaluation waited for stalls
    it), must agree; any other may differ."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    other = fake_run(tmp_path / "m1-rerun", backend="real", clients=1, nsync=1, seed=1, host=host)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run])
    config = json.loads((other / "config.json").read_text())
    *group, leaf = key.split(".")
    (config[group[0]] if group else config)[leaf] = value
    (other / "config.json").write_text(json.dumps(config))
    if pooled:
        runs, stale, _, _ = lab.read_runs(tmp_path)
        assert lab.points_table(runs, stale).seeds.tolist() == ["2/1"]
    else:
        with pytest.raises(ValueError, match="differ in more than their seed"):
            lab.read_runs(tmp_path)


def test_an_unfinished_run_is_said_to_be_left_out(tmp_path, capsys, monkeypatch):
    """A killed run (summary 'running') was passed over in silence: its point had a seed fewer,
    or no point was left and the report said only that none had both sides. Counted in
    read_runs' own walk: the report read each summary four times (once before, three after)."""
    host = {"cpu_cores": 2, "torch_threads": 1, "clients_on_host": 1}
    run = fake_run(tmp_path / "m1", backend="real", clients=1, nsync=1, seed=0, host=host)
    fake_run(tmp_path / "p1", backend="sim", clients=1, nsync=1, seed=0, fit_paths=[run])
    killed = fake_run(tmp_path / "m1-seed1", backend="real", clients=1, nsync=1, seed=1, host=host)
    (killed / "summary.json").write_text(json.dumps({"status": "running"}))
    reads, read_summary = [], lab.read_summary
    monkeypatch.setattr(lab, "read_summary", lambda run_dir: reads.append(run_dir) or read_summary(run_dir))
    main(["simreal", "--results", str(tmp_path)])
    assert sorted(reads) == sorted(2 * [run, tmp_path / "p1", killed])   # once to see runs are there, once read
    assert "(1 run folder(s) not finished, left out): their points have fewer seeds" in capsys.readouterr().out
    assert lab.read_runs(tmp_path)[3] == 1
    (run / "summary.json").write_text(json.dumps({"status": "running"}))
    assert main(["simreal", "--results", str(tmp_path)]) == 2
    assert "has both a measured and a predicted run (2 run folder(s) not finished, left out)\n" in capsys.readouterr().err
