#!/usr/bin/env bash
# Create (or update) the project's virtualenv with uv.  uv's cache (~/.cache/uv) makes a second run on
# the same machine take seconds even in a fresh clone; nothing depends on the cache being there.
set -euo pipefail
venv=${1:-.venv}
if ! command -v uv >/dev/null 2>&1; then
  python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
fi
uv=$(command -v uv || echo "$HOME/.local/bin/uv")
[ -x "$venv/bin/python" ] || "$uv" venv --quiet --python python3.11 "$venv"
# --compile-bytecode: without .pyc files every `import transformers` in a fresh process costs 30 s here.
"$uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" -e ".[dev]"
