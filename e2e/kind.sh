#!/usr/bin/env bash
# `make e2e-kind`: the e2e suite on a kind cluster, with the operator and server images built from the
# Dockerfile. NEEDS A DOCKER ENGINE (kind runs Kubernetes nodes as containers); on a machine without one
# (such as the project's CI and dev boxes, which use the local control plane from `make testbin` instead)
# it stops at once with a clear message.
#
#   1. kind create cluster (name: modelpool-e2e; reused when it exists);
#   2. docker build --target operator / --target server, kind load docker-image;
#   3. pytest e2e/ with KUBECONFIG pointing at kind (MODELPOOL_E2E_CLUSTER=external: the tests use that
#      cluster instead of starting the local one, and install the chart with the images just loaded
#      (MODELPOOL_E2E_OPERATOR_IMAGE / MODELPOOL_E2E_SERVER_IMAGE); the KWOK pool test is skipped there);
#   4. kind delete cluster, unless KEEP=1.
#
# Tools: docker (with a running engine), kind, and bin/helm + bin/kubectl (make testbin) or helm/kubectl on
# PATH. Environment: KIND_CLUSTER (default modelpool-e2e), KIND_NODE_IMAGE (default kind's own),
# IMAGE_TAG (default e2e), KEEP=1.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PATH="$ROOT/bin:$ROOT/.venv/bin:$PATH"

CLUSTER=${KIND_CLUSTER:-modelpool-e2e}
TAG=${IMAGE_TAG:-e2e}
OPERATOR_IMAGE=ghcr.io/modelpool/modelpool-operator
SERVER_IMAGE=ghcr.io/modelpool/modelpool-server
KEEP=${KEEP:-0}

die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }
banner() { printf '\n==> %s\n' "$*"; }

# ---- prerequisites: fail clearly without Docker -------------------------------------------------------------
command -v docker >/dev/null 2>&1 || die "docker is not installed; this target needs a Docker engine (use 'make test' for the local control plane)"
docker info >/dev/null 2>&1 || die "no Docker engine is reachable ('docker info' failed); this target needs one (use 'make test' for the local control plane)"
command -v kind >/dev/null 2>&1 || die "kind is not installed (go install sigs.k8s.io/kind@latest, or see https://kind.sigs.k8s.io)"
command -v helm >/dev/null 2>&1 || die "helm is missing: run 'make testbin'"
command -v kubectl >/dev/null 2>&1 || die "kubectl is missing: run 'make testbin'"
[[ -x .venv/bin/pytest ]] || die "the virtualenv is missing: run 'make venv'"

KUBECONFIG_KIND="$ROOT/.cluster/kind-$CLUSTER.kubeconfig"
mkdir -p "$ROOT/.cluster"

cleanup() {
  local rc=$?
  if [[ "$KEEP" == "1" ]]; then
    printf '\nKEEP=1: kind cluster %s kept (KUBECONFIG=%s)\n' "$CLUSTER" "$KUBECONFIG_KIND"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT

# ---- 1. cluster ---------------------------------------------------------------------------------------------
banner "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 120s
fi
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_KIND"
export KUBECONFIG="$KUBECONFIG_KIND"
kubectl get nodes -o wide

# ---- 2. images ----------------------------------------------------------------------------------------------
banner "docker build (operator, server) and kind load"
docker build --target operator -t "$OPERATOR_IMAGE:$TAG" .
docker build --target server --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
  -t "$SERVER_IMAGE:$TAG" .
kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE:$TAG" "$SERVER_IMAGE:$TAG"

# ---- 3. the e2e suite (it installs the chart itself, with these images) ----------------------------------
banner "pytest e2e/ against kind"
MODELPOOL_E2E_CLUSTER=external \
MODELPOOL_E2E_OPERATOR_IMAGE="$OPERATOR_IMAGE:$TAG" \
MODELPOOL_E2E_SERVER_IMAGE="$SERVER_IMAGE:$TAG" \
  .venv/bin/pytest e2e -v
