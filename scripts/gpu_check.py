"""The GPU check: every step trains afresh, within 5 minutes, and leaves a record.

    bash scripts/gpu_check.sh OUT_DIR [--cpu-dry-run] [--no-suite]

OUT_DIR must not exist or be empty (a check never passes on old results). Steps:

1. the machine: GPU model, driver, CUDA, cuDNN, torch (recorded, nothing trained);
2. a real run whose clients train on cuda:k (summary.json client_devices says where);
3. a real run with the server's parameters on the GPU too (summary.json server_device);
4. the first run replayed by the simulator on the GPU: the same versions, errors side by side;
5. the simulator on the GPU twice: byte-identical tables (deterministic CUDA kernels);
6. ``pytest -m gpu`` (server on CUDA, calibration on CUDA, pinned frames, GPU clients);
7. the default test suite (``--no-suite`` leaves it out).

Everything printed goes to OUT_DIR/gpu_check.log as well, and OUT_DIR/gpu_check.json records
the environment and each step's status (PASS, FAIL, SKIP), seconds, command and last lines. The
whole check has 300 s: a step gets at most what is left, so the worst case (every step timing
out) still ends in 5 minutes, with the steps not reached recorded as SKIP. ``--cpu-dry-run``
runs every step on the CPU (client_device, server_device and device cpu), to exercise the
script without a GPU. Exit code 0 when every step passed, 1 otherwise, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 300.0
RUN = ["num_clients=2", "nsync=4", "num_epochs=3", "algo.lr=0.2", "algo.momentum=0", "progress=false",
       "force=true"]


class Check:
    def __init__(self, out: Path, dry_run: bool):
        self.out, self.dry_run = out, dry_run
        self.results = out / "results"
        self.started = time.monotonic()
        self.log = open(out / "gpu_check.log", "w")
        self.record: dict = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                             "dry_run": dry_run, "budget_s": BUDGET_S, "steps": []}

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def left(self) -> float:
        return BUDGET_S - (time.monotonic() - self.started)

    def step(self, name: str, cmd: list[str], limit_s: float, check=None) -> bool:
        """Run ``cmd`` (then ``check(output)`` -> (ok, detail)) within min(limit, time left)."""
        entry = {"name": name, "command": " ".join(cmd)}
        self.say(f"\n=== {name}\n$ {entry['command']}")
        budget = min(limit_s, self.left())
        if budget < 5:
            entry.update(status="SKIP", detail="no time left in the 300 s budget", seconds=0.0)
            return self._done(entry)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget,
                                  env={**os.environ, "MPLBACKEND": "Agg"})
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            code, entry["detail"] = None, f"timed out after {budget:.0f} s"
        entry["seconds"] = round(time.monotonic() - t0, 1)
        self.log.write(output)
        entry["tail"] = output.strip().splitlines()[-8:]
        if code is None:
            entry["status"] = "FAIL"
        elif code != 0:
            entry.update(status="FAIL", detail=f"exit code {code}")
        else:
            ok, detail = check(output) if check else (True, "")
            entry.update(status="PASS" if ok else "FAIL", detail=detail)
        return self._done(entry)

    def _done(self, entry: dict) -> bool:
        self.record["steps"].append(entry)
        self.say(f"--- {entry['status']}  {entry['name']}  ({entry.get('seconds', 0):.1f} s)"
                 + (f": {entry['detail']}" if entry.get("detail") else ""))
        return entry["status"] == "PASS"

    def summary(self, exp: str) -> dict:
        paths = sorted((self.results / exp).glob("*/summary.json"))
        return json.loads(paths[0].read_text()) if paths else {}

    def finish(self) -> int:
        self.record["seconds"] = round(time.monotonic() - self.started, 1)
        statuses = [s["status"] for s in self.record["steps"]]
        self.record["passed"] = all(s == "PASS" for s in statuses)
        (self.out / "gpu_check.json").write_text(json.dumps(self.record, indent=2) + "\n")
        self.say("\n=== gpu_check summary")
        for s in self.record["steps"]:
            self.say(f"{s['status']:5} {s['name']}  ({s.get('seconds', 0):.1f} s)")
        self.say(f"record: {self.out / 'gpu_check.json'}; log: {self.out / 'gpu_check.log'}")
        self.log.close()
        return 0 if self.record["passed"] else 1


def environment(dry_run: bool) -> dict:
    import torch

    env = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
           "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
           "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        env["nvidia_smi"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        env["nvidia_smi"] = None
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        env["git_commit"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bash scripts/gpu_check.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="a new or empty folder for the results, log and record")
    p.add_argument("--cpu-dry-run", action="store_true", help="every step on the CPU")
    p.add_argument("--no-suite", action="store_true", help="leave out the default test suite")
    args = p.parse_args(argv)
    out: Path = args.out.resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: {out} exists and is not an empty folder: a check trains afresh into a new "
              "one (name another folder)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    check = Check(out, args.cpu_dry_run)
    env = environment(args.cpu_dry_run)
    check.record["environment"] = env
    check.say(f"gpu_check into {out}\n" + json.dumps(env, indent=2))
    dev = "cpu" if args.cpu_dry_run else "cuda"
    if not args.cpu_dry_run and not env["gpus"]:
        check._done({"name": "a CUDA device is visible", "status": "FAIL", "seconds": 0.0,
                     "detail": f"torch {env['torch']} sees no CUDA device (torch_cuda={env['torch_cuda']})"})
        return check.finish()
    py, res = [sys.executable, "-m", "repro.run"], f"results_dir={check.results}"

    def completed_on(exp: str, key: str):
        def verify(_: str):
            s = check.summary(exp)
            devices = s.get("client_devices", {}) if key == "clients" else {"server": s.get("server_device", "")}
            ok = s.get("status") == "completed" and devices and all(d.startswith(dev) for d in devices.values())
            return ok, f"status {s.get('status')}, {key} on {devices}, test error {s.get('final', {}).get('test_error')}"
        return verify

    where = "the CPU (dry run)" if args.cpu_dry_run else "the GPU"
    check.step(f"real run, clients on {where}", py + ["backend=real", f"backend.client_device={dev}",
               "exp_name=gpu_real", res, *RUN], 90, completed_on("gpu_real", "clients"))
    check.step(f"real run, server on {where} too", py + ["backend=real", f"backend.client_device={dev}",
               f"backend.server_device={dev}", "exp_name=gpu_server", res, *RUN], 90,
               completed_on("gpu_server", "server"))
    real_dirs = sorted((check.results / "gpu_real").glob("*/summary.json"))
    real_dir = str(real_dirs[0].parent) if real_dirs else str(check.results / "gpu_real" / "missing")

    def same_versions(_: str):
        a, b = check.summary("gpu_real"), check.summary("gpu_replay")
        rows = [f"{n:7} version {s.get('version')} test error {s.get('final', {}).get('test_error')}"
                for n, s in (("real", a), ("replay", b))]
        return b.get("status") == "completed" and a.get("version") == b.get("version"), "; ".join(rows)

    check.step(f"the real run replayed by the simulator on {where}", py + [
        "cost=replay", f"cost.path='{real_dir}'", f"device={dev}", "exp_name=gpu_replay", res,
        "progress=false", "force=true"], 60, same_versions)

    def identical(_: str):
        tables = [sorted((check.results / f"gpu_sim_{i}").glob("*/updates.csv")) for i in (1, 2)]
        if not all(tables):
            return False, "a simulator run left no updates.csv"
        same = all((a.parent / t).read_bytes() == (b.parent / t).read_bytes()
                   for a, b in zip(*tables) for t in ("updates.csv", "evals.csv"))
        return same, "byte-identical tables" if same else "the two runs' tables differ"

    for i in (1, 2):
        check.step(f"simulator on {where}, run {i} of 2", py + [f"device={dev}", f"exp_name=gpu_sim_{i}",
                   res, "num_epochs=2", "progress=false", "force=true"], 60,
                   identical if i == 2 else None)
    check.step("pytest -m gpu", [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"],
               120)
    if not args.no_suite:
        check.step("the default test suite", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                   BUDGET_S)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
