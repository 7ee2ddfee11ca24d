"""One resolve step at the entry point (:func:`repro.run.resolve`): ``cost=replay``, ``cost=fit``
and a torchrun world become a plain frozen config before any driver runs; no driver rewrites it."""
import dataclasses
import inspect
from pathlib import Path

import pytest

from repro import run as entry
from repro.config.settings import BackendConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.errors import ConfigError
from repro.real import launch
from repro.sim import driver

CFG = RunConfig(num_clients=2, nsync=2, num_epochs=1.0, eval_every=1.0, progress=False,
                data=DataConfig(name="synthetic", num_train=64, num_test=32), model=ModelConfig(name="mlp"))


def test_a_replay_is_resolved_once_and_the_driver_runs_it_as_it_is(tmp_path, monkeypatch):
    assert driver.simulate(CFG, tmp_path / "rec")["status"] == "completed"
    asked = CFG.replace(num_clients=3, seed=7, cost=CostConfig(profile="replay", schedule="replay",
                                                                path=str(tmp_path / "rec")))
    resolved = entry.resolve(asked, tmp_path / "rep")
    assert isinstance(resolved, driver.Resolved) and resolved.fit is None
    assert (resolved.cfg.num_clients, resolved.cfg.seed) == (2, 0)   # the recording's settings
    assert resolved.cfg.cost == asked.cost                          # replayed by its schedule

    def again(*args, **kwargs):
        raise AssertionError("the driver rewrote a resolved config")
    monkeypatch.setattr(driver, "replay_config", again)
    monkeypatch.setattr(driver, "fit_config", again)
    assert driver.simulate(resolved, tmp_path / "rep")["status"] == "completed"
    assert (tmp_path / "rep" / "updates.csv").read_bytes() == (tmp_path / "rec" / "updates.csv").read_bytes()


def test_a_bad_recording_is_refused_by_the_resolve_step(tmp_path):
    with pytest.raises(ConfigError, match="'cost.path'"):
        entry.resolve(CFG.replace(cost=CostConfig(profile="replay", schedule="replay", path=str(tmp_path))))


def test_the_torchrun_world_decides_the_clients_on_every_rank_before_the_driver(monkeypatch):
    real = CFG.replace(backend=BackendConfig(name="real"))
    assert entry.resolve(real) is real   # no torchrun: nothing to resolve
    for rank in ("0", "2"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "5")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", "29500")
        assert entry.resolve(real).num_clients == 4
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="'WORLD_SIZE'"):
        entry.resolve(real)


@pytest.mark.parametrize("typed,torchruns,refused", [
    ({"master_addr": "10.9.9.9"}, {"MASTER_ADDR": "localhost"}, "'backend.master_addr': '10.9.9.9'"),
    ({"master_port": 4242}, {"MASTER_PORT": "29500"}, "'backend.master_port': 4242"),
    ({"master_addr": "localhost", "master_port": 29500}, {"MASTER_ADDR": "127.0.0.1"}, None),   # the same host
    ({}, {"MASTER_ADDR": "10.0.0.1"}, None)])   # left at the defaults: nothing typed to disagree
def test_a_master_address_torchrun_does_not_use_is_refused_naming_both(monkeypatch, typed, torchruns, refused):
    """Under torchrun the world meets at torchrun's MASTER_ADDR:MASTER_PORT: a backend.master_addr
    or master_port typed to another was ignored in silence (and config.json recorded it as the
    run's). Refused on every rank, naming the key, its value and torchrun's."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                       **torchruns}.items():
        monkeypatch.setenv(key, value)
    asked = CFG.replace(backend=BackendConfig(name="real", **typed))
    if refused is None:
        assert entry.resolve(asked).num_clients == 2
        return
    with pytest.raises(ConfigError, match=refused) as err:
        entry.resolve(asked)
    theirs = torchruns.get("MASTER_ADDR", torchruns.get("MASTER_PORT"))
    assert f"torchrun's" in str(err.value) and theirs in str(err.value), err.value


def test_no_driver_replaces_the_config_it_was_handed():
    """The real driver's entry points take the config as resolved (they used to replace
    num_clients from the torchrun world, each on its own)."""
    for fn in (launch.run_real, launch.run_torchrun_worker):
        assert "cfg.replace(" not in inspect.getsource(fn) and "cfg = " not in inspect.getsource(fn), fn.__name__


def test_a_warm_start_baseline_config_is_derived_where_the_warm_start_is_built(tmp_path):
    """The single-client baseline's config is a pure function of the run's config, derived in
    one place (repro.workload.start, where the warm start is built): no step hands it down and
    nothing falls back to deriving it (issue 31: it was both). Its cache key (the baseline's
    training-shaping values) is what it was: d99f04bcf1df for this config."""
    from repro.config.settings import Resolved
    from repro.workload import start

    for fn in (start.build_problem, start.warm_start_state, start.cache_dir, start.train_baseline,
               launch.run_real):
        assert "baseline" not in inspect.signature(fn).parameters, fn.__name__
    assert [f.name for f in dataclasses.fields(Resolved)] == ["cfg", "fit"]
    warm = CFG.replace(start="warm", warm_start_epochs=0.5, results_dir=str(tmp_path))
    assert start.cache_dir(warm).name == "d99f04bcf1df"
    assert driver.simulate(entry.resolve(warm), tmp_path / "warm")["status"] == "completed"
    assert (tmp_path / "_warmstart" / "d99f04bcf1df" / "server.pt").is_file()


def _rank0_run(tmp_path, monkeypatch, world_size: int, *overrides: str):
    """Rank 0's command line of a torchrun world up to the run (in process; the run itself not
    run): the composed config with Hydra's node, its RunConfig and the run folder Hydra names."""
    import signal
    import sys

    from omegaconf import OmegaConf

    for key, value in {"RANK": "0", "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["repro.run", "backend=real", *overrides, f"results_dir={tmp_path}"])
    ran = []
    monkeypatch.setattr(entry, "run_composed", lambda dcfg, cfg: ran.append((dcfg, cfg)))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)}
    try:
        entry.cli()
    finally:   # the command line's own signal handling is for its process, not for pytest's
        for s, handler in handlers.items():
            signal.signal(s, handler)
    [(dcfg, cfg)] = ran
    return cfg, Path(str(OmegaConf.select(dcfg, "hydra.run.dir")))


def test_rank_0_names_its_run_folder_by_the_clients_the_torchrun_world_gives(tmp_path, monkeypatch):
    """torchrun --nproc-per-node=3 ... num_clients=1 runs 2 clients (the world decides): the run
    folder, named by the command line's overrides, says num_clients=2 as config.json does; it
    said num_clients=1 (rank 0's command line up to the run, in process; the run itself not run)."""
    cfg, folder = _rank0_run(tmp_path, monkeypatch, 3, "num_clients=1")
    assert "num_clients=2" in str(folder) and "num_clients=1" not in str(folder), folder
    assert entry.resolve(cfg).num_clients == 2


@pytest.mark.parametrize("world_size,name", [(3, "backend=real,num_clients=2"), (5, "backend=real")])
def test_a_torchrun_run_folder_is_the_plain_run_folder_of_the_resolved_config(tmp_path, monkeypatch,
                                                                              world_size, name):
    """torchrun --nproc-per-node=3 ... with no num_clients=N ran 2 clients in the folder ``backend=real``,
    the plain run's of 4 clients (the default): that run was then refused as another run's folder,
    or with resume=auto continued the 2-client run. The folder is the one a plain run of the
    resolved config names: num_clients=2 for a world of 3, none for a world of 5 (4 clients,
    the default's own folder)."""
    cfg, folder = _rank0_run(tmp_path, monkeypatch, world_size)
    assert folder.name == name and entry.resolve(cfg).num_clients == world_size - 1, folder


def test_the_torchrun_worlds_num_clients_line_is_in_the_run_log_once(tmp_path, monkeypatch, caplog):
    """torchrun --nproc-per-node=3 ... with no num_clients=N runs 2 clients where the config said
    4: the line saying so was logged once on rank 0's command line before the job, so it never
    reached the run folder's run.log (a run folder records what changed its config). Now the job's
    resolve step logs it, once, into run.log (the run itself not run: its resolve step only)."""
    from tests.helpers.grids import cli_in_process

    for key, value in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    resolved, before = [], []
    line = "torchrun world size 3: num_clients = 2 (config said 4)"

    def resolve_only(cfg, run_dir, typed=()):
        before.extend(r for r in caplog.records if line in r.getMessage())   # logged before the job
        resolved.append(entry.resolve(cfg, run_dir, typed))
        return {"status": "completed", "version": 0, "epoch": 0.0, "final": {}, "clock": "wall",
                "time_s": 0.0, "wall_time_s": 0.0}

    monkeypatch.setattr(entry, "run", resolve_only)
    with caplog.at_level("INFO", logger="repro"):
        assert cli_in_process(monkeypatch, "backend=real", f"results_dir={tmp_path}") == 0
    assert [r.num_clients for r in resolved] == [2]
    assert before == []
    [run_log] = tmp_path.rglob("run.log")
    assert run_log.parent.name == "backend=real,num_clients=2"
    assert run_log.read_text().count(line) == 1, run_log.read_text()


def test_a_typed_setting_a_replay_takes_from_its_recording_must_say_the_recordings_value(tmp_path):
    """The job's typed overrides (Hydra's overrides.task) against what the replay trains: num_clients=3
    on a 2-client recording trained 2 clients in a folder named num_clients=3."""
    assert driver.simulate(CFG, tmp_path / "rec")["status"] == "completed"
    asked = CFG.replace(num_clients=3, cost=CostConfig(profile="replay", schedule="replay", path=str(tmp_path / "rec")))
    with pytest.raises(ConfigError, match="'num_clients': 3; expected the recording's num_clients 2"):
        entry.resolve(asked, tmp_path / "rep", ["cost=replay", "num_clients=3"])
    assert entry.resolve(asked, tmp_path / "rep", ["cost=replay", "progress=false"]).cfg.num_clients == 2
