"""Where a GPU changes behaviour: each test skips without CUDA and runs in scripts/gpu_check.sh
(``pytest -m gpu``). The check script itself is tested here on the CPU (its dry run)."""
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from repro.asgd.algorithm import Push
from repro.config.settings import BackendConfig, CostConfig, DataConfig, ModelConfig, RunConfig
from repro.real.frames import Frame, Header, Kind
from repro.sim.driver import simulate
from tests.helpers.paths import ROOT

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _sim_cfg(**kw):
    base = dict(num_clients=3, nsync=2, num_epochs=1.0, eval_every=0.5, progress=False, device="cuda",
                data=DataConfig(name="synthetic"), model=ModelConfig(name="digits_cnn"),
                cost=CostConfig(profile="j", compute_s=0.01, jitter="lognormal", jitter_sigma=0.3))
    base.update(kw)
    return RunConfig(**base)


@pytest.mark.gpu
@needs_cuda
def test_simulator_on_cuda_is_bitwise_reproducible(tmp_path):
    """Deterministic CUDA kernels (repro.runtime.deterministic): two runs, identical bytes."""
    for name in ("a", "b"):
        assert simulate(_sim_cfg(), tmp_path / name)["status"] == "completed"
    for table in ("updates.csv", "evals.csv"):
        assert (tmp_path / "a" / table).read_bytes() == (tmp_path / "b" / table).read_bytes()
    env = json.loads((tmp_path / "a" / "config.json").read_text())["environment"]
    assert env["device"].startswith("cuda") and env["gpu"]


@pytest.mark.gpu
@needs_cuda
def test_simulator_on_cuda_calibrates_its_compute_time(tmp_path):
    """cost=local times real steps on the GPU (the only torch.cuda.synchronize path)."""
    summary = simulate(_sim_cfg(cost=CostConfig(profile="local", compute_s="calibrate")), tmp_path)
    assert summary["status"] == "completed"
    measured = json.loads((tmp_path / "config.json").read_text())["cost"]["compute_s"]
    assert 0 < measured < 1.0
    first = pd.read_csv(tmp_path / "updates.csv").time_s.iloc[0]
    assert first == pytest.approx(2 * measured)


@pytest.mark.gpu
@needs_cuda
def test_pinned_frame_round_trip():
    frame = Frame(1000, pin=True)
    assert frame.buf.is_pinned()
    pushed = dict(num_steps=4, num_samples=128, train_loss=0.5, train_error=0.25, stream_position=(1, 64))
    header = Header(Kind.PUSH, 2, 17, 1000, pushed, device=0)
    on_gpu = torch.arange(1000.0, device="cuda")
    frame.payload.copy_(on_gpu)                     # D2H into the staging buffer
    back = frame.payload.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    push = Push(client=2, read_version=17, update=frame.payload, **pushed)
    assert Header.unpack(Header.pack_push(push, frame, 1000, device=0)) == header and torch.equal(back, on_gpu)


@pytest.mark.gpu
@needs_cuda
def test_server_on_cuda_is_recorded(tmp_path):
    from repro.real import run_real

    cfg = RunConfig(num_clients=2, nsync=4, num_epochs=2.0, progress=False,
                    backend=BackendConfig(name="real", server_device="cuda", client_device="cpu"))
    summary = run_real(cfg, tmp_path)
    assert summary["status"] == "completed", summary["message"]
    assert summary["server_device"].startswith("cuda")


def _gpu_check(out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(out), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)


def test_gpu_check_refuses_a_folder_that_holds_anything(tmp_path):
    """A check that could pass on old results would not be a check."""
    (tmp_path / "old.txt").write_text("x")
    proc = _gpu_check(tmp_path, "--cpu-dry-run")
    assert proc.returncode == 2 and "not an empty folder" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


@pytest.mark.slow
def test_gpu_check_dry_run_trains_every_step_and_records_it(tmp_path):
    out = tmp_path / "check"
    proc = _gpu_check(out, "--cpu-dry-run", "--no-suite")
    record = json.loads((out / "gpu_check.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert record["dry_run"] and record["passed"] and record["seconds"] < 300
    assert len(record["steps"]) == 6 and all(s["status"] == "PASS" for s in record["steps"])
    assert record["environment"]["torch"] == torch.__version__
    for exp in ("gpu_real", "gpu_server", "gpu_replay", "gpu_sim_1", "gpu_sim_2"):
        (summary,) = (out / "results" / exp).glob("*/summary.json")
        assert json.loads(summary.read_text())["status"] == "completed"   # trained now, not found
    assert "gpu_check summary" in (out / "gpu_check.log").read_text()
