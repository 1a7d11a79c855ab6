#!/usr/bin/env bash
# The server benchmark on a GPU, in one run of at most 9 minutes on a 16-core H100 machine without network.
#
#   OUT=/some/dir bash hack/gpu-check.sh      (run from the repository root)
#
# The machine has Python 3.12, torch, transformers, sentence-transformers, uvloop, httpx,
# prometheus-client and pillow, but not the web stack: the wheels in .whl/ (listed in docs/server.md,
# "Benchmark") are installed into /tmp/site first.  Then `python -m bench.server` runs on CUDA with an
# all-MiniLM-L6-v2-shaped model with random weights and windows short enough to fit: the direct path
# (every shape warmed first), 1- and 32-sentence requests at concurrency 1 and 64 against the direct path
# at the batch formed and sentence-transformers, health and /stats during the model load and during a
# load of requests, the first request after Ready with and without the warm-up, the flood that ignores
# Retry-After, and --http-workers 1 against the default.  Results: $OUT/server-gpu.json (written after
# every section, so a run cut short keeps what it measured), $OUT/server-gpu.md (the table), the log,
# and the machine's description.
#
# The generation step (after the server's, within GEN_BUDGET_S): `python -m bench.generation` on a model of
# Qwen2.5-0.5B's shape with random weights, bfloat16 on CUDA: 16 concurrent streamed requests of 256
# tokens through the continuous-batching engine against the same 16 one after another through
# `generate`, tokens/s and p95 time to first token of each ($OUT/generation-gpu.txt).
#
# The density step (issue 21's shared host, within DENSITY_BUDGET_S): `python -m bench.density --device cuda`
# with MiniLM-shaped random weights in float16: 24 models (MiniLM under 21 names and three tiny models of
# other tasks) on one host whose ledger holds 4 awake (--device-memory 4 x 256 MiB), how many are awake
# and asleep at once, each asked once, the device memory a sleeping model's process still holds
# (nvidia-smi), 20 sleep -> wake cycles (p50 / p95 of the wake), and a sleeping MiniLM's first answer
# against a fresh load and a fresh dedicated server, 2 rounds ($OUT/density-gpu.json, .md and .txt).
#
# STEPS picks the steps (default "server generation": one 10-minute device command, about 80 s of
# install, 340 s of bench.server and 140 s of bench.generation). The density step does not fit in the
# same command (200 s more): run `STEPS=density` as a second command (about 5 minutes, install
# included) when the session has the device time.  With commands to spare, `STEPS=server BUDGET_S=460` then
# `STEPS=generation GEN_BUDGET_S=240` measure each in full.
set -uo pipefail

OUT=${OUT:-/tmp/gpu-check}
BUDGET_S=${BUDGET_S:-340}  # bench.server's own limit (it writes its figures after every section)
GEN_BUDGET_S=${GEN_BUDGET_S:-140}  # bench.generation's: the model's build, one round, its figures
DENSITY_BUDGET_S=${DENSITY_BUDGET_S:-200}  # bench.density's (it writes its figures after every measure)
STEPS=${STEPS:-server generation}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/pip.log" 2>&1 || { echo "wheel install failed"; tail -20 "$OUT/pip.log"; exit 1; }
export PYTHONPATH=/tmp/site:.
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  nproc
  python3 -c 'import sys, torch, transformers, sentence_transformers, fastapi, uvicorn, pydantic
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__, "sentence-transformers", sentence_transformers.__version__,
      "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__, "pydantic", pydantic.__version__)'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# Each step in a session of its own, so that whatever a run cut short leaves behind is stopped with it.
step() {  # step NAME BUDGET_S LOG COMMAND...: run it within its budget; its exit status
  local name=$1 budget=$2 log=$3
  shift 3
  setsid timeout --signal=INT --kill-after=20 "$budget" "$@" > "$log" 2>&1 &
  local pid=$!
  wait "$pid"
  local code=$?
  kill -TERM -- "-$pid" 2>/dev/null || true
  echo "$name exit status: $code" >> "$log"
  tail -c 6000 "$log"
  return "$code"
}

status=0
for name in $STEPS; do
  case $name in
    generation)
      step bench.generation "$GEN_BUDGET_S" "$OUT/generation-gpu.txt" \
        python3 -m bench.generation --shape qwen2.5-0.5b --device cuda --dtype bfloat16 \
          --concurrent 16 --tokens 256 --rounds 1 || status=$?
      ;;
    server)
      step bench.server "$BUDGET_S" "$OUT/bench.log" \
        python3 -m bench.server --device cuda --dtype float16 --random-weights \
          --duration 4 --flood-seconds 10 --latency-samples 100 --concurrency 1 64 \
          --no-docs --out "$OUT/server-gpu.json" --markdown "$OUT/server-gpu.md" || status=$?
      ;;
    density)
      step bench.density "$DENSITY_BUDGET_S" "$OUT/density-gpu.txt" \
        python3 -m bench.density --device cuda --dtype float16 --random-weights --models 24 --awake 4 \
          --cycles 20 --rounds 2 --no-docs --out "$OUT/density-gpu.json" --markdown "$OUT/density-gpu.md" \
        || status=$?
      ;;
    *) echo "unknown step $name (generation, server, density)"; status=2 ;;
  esac
done
exit "$status"
