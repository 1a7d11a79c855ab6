#!/usr/bin/env bash
# The real endpoint picker for tests/operator/integration/test_endpoint_picker.py (issue 33): the Gateway
# API Inference Extension's EPP, built from its Go module at a pinned version, and the small ext_proc
# client of our own that asks it where a request goes (hack/extproc-client), both into $EPP_DIR
# (default bin/, where `make testbin` builds them). The version: gateway-api-inference-extension v1.5.0, the last release whose module
# has the full EPP (v1.6 moved it to llm-d-router, whose module the proxy here does not serve; v1.6 keeps
# only a round-robin "lwepp"). Idempotent: binaries that exist are kept; the Go caches make a rebuild
# quick (a cold build of the EPP: about 6 minutes on 2 busy cores). Nothing is downloaded but Go modules.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir="${EPP_DIR:-$root/bin}"
EPP_MODULE=sigs.k8s.io/gateway-api-inference-extension
EPP_VERSION=v1.5.0
mkdir -p "$dir"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"
if ! [ -x "$dir/epp-$EPP_VERSION" ]; then
  GOBIN="$dir/.gobin" go install -trimpath "$EPP_MODULE/cmd/epp@$EPP_VERSION"
  mv "$dir/.gobin/epp" "$dir/epp-$EPP_VERSION"
fi
if ! [ -x "$dir/extproc-client" ] || [ "$root/hack/extproc-client/main.go" -nt "$dir/extproc-client" ]; then
  (cd "$root/hack/extproc-client" && go build -trimpath -o "$dir/extproc-client" .)
fi
echo "$dir/epp-$EPP_VERSION"
echo "$dir/extproc-client"
