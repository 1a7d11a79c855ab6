#!/usr/bin/env bash
# Copy the generated CRDs (crds/*.yaml, from `python -m modelpool_operator.crdgen --write`) into the Helm
# chart (charts/modelpool-operator/files/crds/), which renders them as templates behind crds.enabled.
# `make crds` runs this after the generator; tests/e2e check that the copy is identical.
#   --check   exit 1 (and say which file) when the chart's copy differs from crds/, change nothing
set -euo pipefail
cd "$(dirname "$0")/.."
src=crds
dst=charts/modelpool-operator/files/crds
check=0
[[ "${1:-}" == "--check" ]] && check=1

shopt -s nullglob
sources=("$src"/*.yaml)
if ((${#sources[@]} == 0)); then
  echo "sync-chart-crds: no CRDs in $src/ (run: make crds)" >&2
  exit 1
fi

if ((check)); then
  status=0
  for f in "${sources[@]}"; do
    if ! cmp -s "$f" "$dst/$(basename "$f")"; then
      echo "sync-chart-crds: $dst/$(basename "$f") is missing or differs from $f (run: bash hack/sync-chart-crds.sh)" >&2
      status=1
    fi
  done
  for f in "$dst"/*.yaml; do
    if [[ ! -e "$src/$(basename "$f")" ]]; then
      echo "sync-chart-crds: $f has no counterpart in $src/ (run: bash hack/sync-chart-crds.sh)" >&2
      status=1
    fi
  done
  exit "$status"
fi

mkdir -p "$dst"
# Remove copies of CRDs that no longer exist, then copy every current one.
for f in "$dst"/*.yaml; do
  [[ -e "$src/$(basename "$f")" ]] || { rm -f "$f"; echo "removed $f"; }
done
for f in "${sources[@]}"; do
  cp "$f" "$dst/"
  echo "synced $dst/$(basename "$f")"
done
