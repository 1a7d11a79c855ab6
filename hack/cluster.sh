#!/usr/bin/env bash
# The local control plane: `hack/cluster.sh up | down | status`  (make cluster-up / cluster-down).
#
#   up     kwokctl (binary runtime) starts the upstream etcd, kube-apiserver, kube-controller-manager,
#          kube-scheduler and the KWOK controller, every one from bin/ (never a download); the
#          kubeconfig is written to $CLUSTER_DIR/kubeconfig; fake GPU nodes kwok-gpu-0..3 are created
#          (hack/kwok/nodes.yaml) with KWOK's default stages plus modelpool's chaos stages
#          (hack/kwok/stages); and one process node (python -m testkit.processnode) runs in the background.
#          The controller-manager runs without the Endpoints and EndpointSlice controllers, which cannot
#          work on loopback pod addresses (hack/kwok/controller-manager.yaml says why).
#          On a cluster that exists (e.g. after `kwokctl stop cluster`) it starts it again; the process
#          node's agent rides out the restart, or is started anew when it has gone.
#          The API server records the requests of the `modelpool-audit` namespace's ServiceAccounts
#          (hack/audit-policy.yaml; log: $KWOK_WORKDIR/clusters/<name>/logs/audit.log) and enforces
#          OwnerReferencesPermissionEnforcement (setting blockOwnerDeletion needs update on the owner's
#          finalizers), as hardened clusters do; both serve the RBAC test.
#   down   stops the process node and deletes the cluster (logs under $CLUSTER_DIR/logs are kept).
#   status prints what is running.
#
# Settings (environment): CLUSTER_DIR (default <repo>/.cluster), CLUSTER_NAME (default modelpool),
# BIN_DIR (default <repo>/bin), VENV (default <repo>/.venv), PROCESSNODE_NAME (default process-node-0),
# PROCESSNODE_IP_OCTET (pods on the process node get 127.<octet>.y.z; default 42),
# PROCESSNODE_BACKOFF_INITIAL / PROCESSNODE_BACKOFF_MAX (crash-loop back-off seconds; default 1 / 30),
# PROCESSNODE_RUN_IMAGES=1 (the process node runs each pod whose images are all in the local store from
# those images, with runc: `--run-images`, docs/cluster.md; `make demo` sets it once `make images` has
# built both images; default 0: every pod runs as host processes from $VENV, as the tests expect).
# KWOK_NODE_LEASE_SECONDS (at creation: the fake nodes' lease duration; kwokctl's default is 200 s, which
# KWOK's controller waits out after a control-plane restart before it moves pods again; the soak sets 20).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${CLUSTER_DIR:-$root/.cluster}
name=${CLUSTER_NAME:-modelpool}
bin=${BIN_DIR:-$root/bin}
venv=${VENV:-$root/.venv}
node=${PROCESSNODE_NAME:-process-node-0}
octet=${PROCESSNODE_IP_OCTET:-42}
images_flag=""
[ "${PROCESSNODE_RUN_IMAGES:-0}" = 1 ] && images_flag=--run-images
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
kubeconfig="$dir/kubeconfig"
logs="$dir/logs"
pidfile="$dir/processnode.pid"
# kwokctl keeps each cluster's files (pki, component logs, pids) under $KWOK_WORKDIR/clusters/<name>.
export KWOK_WORKDIR="$dir/kwok"
# kwokctl has no flag for kubectl; this is its documented environment override.
export KWOK_KUBECTL_BINARY="$bin/kubectl"

need_binaries() {
  local missing=()
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl; do
    [ -x "$bin/$b" ] || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "cluster: missing in $bin: ${missing[*]} (run: make testbin)" >&2
    exit 1
  fi
  [ -x "$venv/bin/python" ] || { echo "cluster: no Python env at $venv (run: make venv)" >&2; exit 1; }
}

kwokctl() { "$bin/kwokctl" --name "$name" "$@"; }
# kwokctl picks free ports for a cluster's components when it creates or starts it and binds them a moment
# later: two clusters brought up at once (make test's two workers) could pick the same one, and the second
# kwok controller then never starts (its nodes stay NotReady). One at a time on this machine. The command
# runs without the lock's descriptor (9>&-): the components it leaves running would inherit it, and with
# it the lock, for as long as the cluster lives.
one_at_a_time() { ( flock 9 && "$@" 9>&- ) 9>"${TMPDIR:-/tmp}/modelpool-kwokctl.lock"; }
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

processnode_running() {
  # The pid is this cluster's agent only while its command line names this cluster's pods directory: once
  # the agent is gone its pid is reused (pid_max is 32768 here), and a stop would signal a stranger.
  local pid
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  kill -0 "$pid" 2>/dev/null && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$dir/pods"
}

stop_processnode() {
  if processnode_running; then
    local pid
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$pid" 2>/dev/null || true
    echo "cluster: process node stopped (pid $pid)"
  fi
  rm -f "$pidfile"
}

start_processnode() {
  # A simple command sent to the background, so $! is the agent itself (setsid execs it without a fork:
  # the new session keeps it out of this shell's process group and stdout is not held open).
  (
    cd "$root"
    HF_HUB_OFFLINE=1 exec setsid "$venv/bin/python" -m testkit.processnode \
      --kubeconfig "$kubeconfig" \
      --node-name "$node" \
      --extra-path "$venv/bin" \
      --log-dir "$dir/processnode" \
      --pods-dir "$dir/pods" \
      --ip-octet "$octet" \
      --backoff-initial "${PROCESSNODE_BACKOFF_INITIAL:-1}" \
      --backoff-max "${PROCESSNODE_BACKOFF_MAX:-30}" \
      ${images_flag:+"$images_flag"} \
      >>"$logs/processnode.log" 2>&1 </dev/null
  ) &
  echo $! >"$pidfile"
}

# The process node's agent has renewed its Lease since $1 (an RFC 3339 UTC time): it is alive and talking
# to this API server.  (Ready alone is not enough: after a control-plane restart the node still shows the
# Ready it posted before, until the node controller's grace period runs out.)
processnode_renewed_since() {
  local renewed
  renewed=$(kubectl get lease -n kube-node-lease "$node" -o jsonpath='{.spec.renewTime}' 2>/dev/null) || return 1
  [[ -n "$renewed" && "$renewed" > "$1" ]]
}

up() {
  need_binaries
  mkdir -p "$logs"
  local start=$SECONDS since
  since=$(date -u +%Y-%m-%dT%H:%M:%S)
  if [ -d "$KWOK_WORKDIR/clusters/$name" ]; then
    echo "cluster: $name already exists in $KWOK_WORKDIR; starting it"
    one_at_a_time kwokctl start cluster >"$logs/kwokctl.log" 2>&1 || { cat "$logs/kwokctl.log" >&2; exit 1; }
  else
    echo "cluster: creating $name (kwokctl binary runtime, binaries from $bin)"
    # The binary runtime would let KWOK manage every node; it must leave the process node to its agent.
    # One scheduler and one controller-manager, without leader election: on a loaded machine a lease renewal
    # that misses its deadline made both exit for good mid-benchmark (pods left Pending, none scheduled).
    if ! one_at_a_time kwokctl create cluster \
      --runtime binary \
      --kubeconfig "" \
      --etcd-binary "$bin/etcd" \
      --kube-apiserver-binary "$bin/kube-apiserver" \
      --kube-controller-manager-binary "$bin/kube-controller-manager" \
      --kube-scheduler-binary "$bin/kube-scheduler" \
      --kwok-controller-binary "$bin/kwok" \
      --config "$root/hack/kwok/stages/default.yaml" \
      --config "$root/hack/kwok/stages/chaos.yaml" \
      --config "$root/hack/kwok/controller-manager.yaml" \
      --extra-args "kwok-controller=manage-all-nodes=false" \
      --extra-args "kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" \
      --kube-audit-policy "$root/hack/audit-policy.yaml" \
      --extra-args "kube-apiserver=enable-admission-plugins=OwnerReferencesPermissionEnforcement" \
      --extra-args "kube-scheduler=leader-elect=false" \
      --extra-args "kube-controller-manager=leader-elect=false" \
      ${KWOK_NODE_LEASE_SECONDS:+--extra-args "kwok-controller=node-lease-duration-seconds=$KWOK_NODE_LEASE_SECONDS"} \
      --quiet-pull \
      --wait 120s \
      >"$logs/kwokctl.log" 2>&1; then
      cat "$logs/kwokctl.log" >&2
      exit 1
    fi
  fi
  kwokctl get kubeconfig >"$kubeconfig.tmp"
  mv "$kubeconfig.tmp" "$kubeconfig"
  kubectl apply -f "$root/hack/kwok/nodes.yaml" >/dev/null

  processnode_running || start_processnode

  # Ready means: every node Ready, the process node's agent heard from since now, and the default
  # ServiceAccount there (pods are refused without it).
  local deadline=$((SECONDS + 120)) respawn_at=$((SECONDS + 45))
  until kubectl wait --for=condition=Ready node --all --timeout=5s >/dev/null 2>&1 \
    && [ "$(kubectl get nodes --no-headers 2>/dev/null | wc -l)" -ge 5 ] \
    && processnode_renewed_since "$since" \
    && kubectl get serviceaccount default -n default >/dev/null 2>&1; do
    if [ $SECONDS -gt $respawn_at ] && processnode_running && ! processnode_renewed_since "$since"; then
      # An agent that retries for ever renews within 10 s of the API server's return; one that does not
      # is stuck (e.g. from an older checkout): replace it once.
      echo "cluster: $node has not renewed its lease for 45s although its agent runs; restarting the agent"
      stop_processnode
      start_processnode
      respawn_at=$deadline
    fi
    if [ $SECONDS -gt $deadline ]; then
      echo "cluster: not ready after 120s; logs: $logs, $KWOK_WORKDIR/clusters/$name/logs" >&2
      kubectl get nodes >&2 || true
      exit 1
    fi
    processnode_running || { echo "cluster: process node died; see $logs/processnode.log" >&2; tail -20 "$logs/processnode.log" >&2; exit 1; }
    sleep 1
  done
  echo "cluster: ready in $((SECONDS - start))s"
  echo "  kubeconfig:     $kubeconfig"
  echo "  process node:   $node (pid $(cat "$pidfile"))${images_flag:+, runs pods from their images (--run-images)}, container logs in $dir/processnode/<namespace>/<pod>/"
  echo "  logs:           $logs and $KWOK_WORKDIR/clusters/$name/logs"
  kubectl get nodes -o custom-columns='NAME:.metadata.name,GPU:.status.capacity.nvidia\.com/gpu,CPU:.status.capacity.cpu,MEMORY:.status.capacity.memory,TYPE:.metadata.labels.type'
}

down() {
  stop_processnode
  if [ -d "$KWOK_WORKDIR/clusters/$name" ] && [ -x "$bin/kwokctl" ]; then
    kwokctl delete cluster --kubeconfig "" >>"$logs/kwokctl.log" 2>&1 || kwokctl delete cluster >/dev/null 2>&1 || true
    echo "cluster: $name deleted"
  fi
  rm -f "$kubeconfig"
}

status() {
  if processnode_running; then echo "process node: running (pid $(cat "$pidfile"))"; else echo "process node: stopped"; fi
  if [ -f "$kubeconfig" ]; then kubectl get nodes; else echo "cluster: no kubeconfig at $kubeconfig"; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
