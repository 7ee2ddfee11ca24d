#!/usr/bin/env bash
# GPU check of the real driver, for a machine with one or more CUDA GPUs; under 5 minutes.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        (from the repository root; PYTHON=... to pick one)
#
# 1. a real run whose clients train on cuda:k (summary.json client_devices says where);
# 2. a real run with the server's parameters on the GPU too (backend.server_device=cuda);
# 3. the first run replayed in the simulator on the GPU (cost=replay), final errors side by side;
# 4. pytest -m gpu.
# Prints PASS/FAIL per step and exits non-zero if any step failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
COMMON="num_clients=2 nsync=4 num_epochs=3 algo.lr=0.2 algo.momentum=0 progress=false results_dir=$OUT"
RESULTS=()

step() {   # step NAME COMMAND...: run (programs with a time limit), record PASS/FAIL
  local name=$1; shift
  local limit=(timeout 150)
  declare -F "$1" >/dev/null && limit=()   # a shell function: timeout cannot run it
  echo; echo "=== $name"
  if "${limit[@]}" "$@"; then RESULTS+=("PASS  $name"); else RESULTS+=("FAIL  $name (exit $?)"); fi
}

summary_of() {   # the one summary.json under $OUT/$1
  find "$OUT/$1" -name summary.json | head -1
}

check_run() {    # check_run EXP: completed, and every client trained on a GPU
  "$PY" - "$(summary_of "$1")" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print("status", s["status"], "| client devices", s.get("client_devices"), "| test error", s["final"].get("test_error"))
ok = s["status"] == "completed" and s.get("client_devices") and all(d.startswith("cuda") for d in s["client_devices"].values())
sys.exit(0 if ok else 1)
EOF
}

compare_replay() {
  "$PY" - "$(summary_of gpu_real)" "$(summary_of gpu_replay)" <<'EOF'
import json, sys
real, replay = (json.load(open(p)) for p in sys.argv[1:3])
print(f"{'':8} {'version':>8} {'test error':>11} {'train error':>12}")
for name, s in (("real", real), ("replay", replay)):
    print(f"{name:8} {s['version']:>8} {s['final']['test_error']:>11.4f} {s['final']['train_error']:>12.4f}")
sys.exit(0 if replay["status"] == "completed" and replay["version"] == real["version"] else 1)
EOF
}

"$PY" -c "import torch, sys; n = torch.cuda.device_count(); print('CUDA devices:', n, [torch.cuda.get_device_name(i) for i in range(n)]); sys.exit(0 if n else 1)" \
  || { echo "FAIL  no CUDA device visible"; exit 1; }
echo "results under $OUT"

step "real run, clients on GPU" "$PY" -m repro.run backend=real exp_name=gpu_real $COMMON
step "  ... completed on cuda" check_run gpu_real
step "real run, server on GPU too" "$PY" -m repro.run backend=real backend.server_device=cuda exp_name=gpu_server $COMMON
step "  ... completed on cuda" check_run gpu_server
REAL_DIR=$(dirname "$(summary_of gpu_real)")
step "replay of the real run in the simulator" "$PY" -m repro.run cost=replay "cost.path='$REAL_DIR'" device=cuda \
  exp_name=gpu_replay progress=false "results_dir=$OUT"
step "  ... same versions; errors side by side" compare_replay
step "pytest -m gpu" "$PY" -m pytest -m gpu -q -p no:cacheprovider

echo; echo "=== gpu_check summary"
printf '%s\n' "${RESULTS[@]}"
! printf '%s\n' "${RESULTS[@]}" | grep -q '^FAIL'
