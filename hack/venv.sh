#!/usr/bin/env bash
# Create (or update) the project's virtualenv from uv.lock: every extra (operator, gateway, server, dev),
# the project itself editable.  --locked: a lock that no longer matches pyproject.toml is an error here
# (run `uv lock` and commit uv.lock), never silently re-resolved.  uv's cache (~/.cache/uv) makes a second
# run on the same machine take seconds even in a fresh clone; nothing depends on the cache being there.
set -euo pipefail
venv=${1:-.venv}
if ! command -v uv >/dev/null 2>&1 && ! [ -x "$HOME/.local/bin/uv" ]; then
  python3 -m pip install --quiet --user uv 2>/dev/null || python3 -m pip install --quiet uv
fi
uv=$(command -v uv || echo "$HOME/.local/bin/uv")
# --compile-bytecode: without .pyc files every `import transformers` in a fresh process costs 30 s here.
UV_PROJECT_ENVIRONMENT=$venv "$uv" sync --quiet --locked --all-extras --compile-bytecode --python python3.11
