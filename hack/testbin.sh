#!/usr/bin/env bash
# `make testbin`: build the local control plane's binaries into bin/ from the Go module proxy, at the
# versions pinned in hack/testbin/versions.env (the one place to bump them):
#   kube-apiserver kube-controller-manager kube-scheduler kubectl  (hack/testbin/kubernetes: k8s.io/kubernetes)
#   etcd                                                          (hack/testbin/etcd: go.etcd.io/etcd/server/v3)
#   kwok kwokctl                                                  (hack/testbin/kwok: sigs.k8s.io/kwok)
#   helm                                                          (hack/testbin/helm: helm.sh/helm/v3)
#   otelcol   an OpenTelemetry Collector: OTLP receiver + file exporter (hack/testbin/otelcol), the traces tests'
#   epp-<version> extproc-client      the Inference Extension's endpoint picker and our ext_proc client (hack/epp.sh)
# Each upstream gets its own wrapper Go module so their Kubernetes library versions never clash.
# Idempotent: a binary that exists and reports the pinned version is kept; the Go module and build caches
# make a rebuild after `rm -rf bin` a matter of linking.  Nothing is downloaded but Go modules.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tb="$root/hack/testbin"
bin="${TESTBIN_DIR:-$root/bin}"
# shellcheck source=testbin/versions.env
source "$tb/versions.env"
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

k8s_minor=${KUBERNETES_VERSION#v1.}
k8s_minor=${k8s_minor%%.*}
# The same flags as every earlier build, so the Go build cache is reused (version ldflags make /version
# and `kubectl version` report the release instead of v0.0.0).
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$k8s_minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$k8s_minor"
kwok_ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$KUBERNETES_VERSION"
# Helm's release build stamps the Kubernetes version it assumes offline (`helm template`, lint,
# .Capabilities.KubeVersion); unstamped it falls back to 1.20.  Stamp the version of the cluster we build.
helm_k8s="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34"
helm_k8s="$helm_k8s -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=34"
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean $helm_k8s"

# has_version BINARY ARGS... -- EXPECTED: the binary exists and its version output contains EXPECTED.
has_version() {
  local exe="$bin/$1" expected="${*: -1}"
  shift
  set -- "${@:1:$(($# - 1))}"
  [ -x "$exe" ] || return 1
  local out
  # Captured first: with pipefail, `grep -q` closing the pipe early would fail a multi-line writer.
  out=$("$exe" "$@" 2>/dev/null) || return 1
  grep -qF -- "$expected" <<<"$out"
}

# build MODULE_DIR LDFLAGS PACKAGE...: one `go build` for several commands of one wrapper module.
build() {
  local dir="$1" ldflags="$2"
  shift 2
  local start=$SECONDS
  echo "testbin: building $* (module hack/testbin/$dir)"
  (cd "$tb/$dir" && go build -trimpath -ldflags "$ldflags" -o "$bin/" "$@")
  local names="${*##*/}"
  [ "$names" = "." ] && names=$dir
  echo "testbin: built $names in $((SECONDS - start))s"
}

total=$SECONDS
declare -a k8s_cmds=()
for c in kube-apiserver kube-controller-manager kube-scheduler; do
  has_version "$c" --version "Kubernetes $KUBERNETES_VERSION" || k8s_cmds+=("k8s.io/kubernetes/cmd/$c")
done
has_version kubectl version --client "Client Version: $KUBERNETES_VERSION" || k8s_cmds+=(k8s.io/kubernetes/cmd/kubectl)
if [ ${#k8s_cmds[@]} -gt 0 ]; then
  build kubernetes "$k8s_ldflags" "${k8s_cmds[@]}"
fi

# The wrapper main (module modelpool.dev/testbin/etcd) builds to bin/etcd.
has_version etcd --version "etcd Version: ${ETCD_VERSION#v}" || build etcd "-s -w" .

declare -a kwok_cmds=()
has_version kwok --version "$KWOK_VERSION" || kwok_cmds+=(sigs.k8s.io/kwok/cmd/kwok)
has_version kwokctl --version "$KWOK_VERSION" || kwok_cmds+=(sigs.k8s.io/kwok/cmd/kwokctl)
if [ ${#kwok_cmds[@]} -gt 0 ]; then
  build kwok "$kwok_ldflags" "${kwok_cmds[@]}"
fi

has_version helm version --short "$HELM_VERSION" || build helm "$helm_ldflags" helm.sh/helm/v3/cmd/helm

# A cold build took 10.5 minutes on 2 cores shared with five other builds (about 380 packages).
has_version otelcol --version "${OTELCOL_VERSION#v}" || build otelcol "-s -w -X main.version=${OTELCOL_VERSION#v}" .

# The endpoint picker of tests/operator/integration/test_endpoint_picker.py: here, not in the test, so a cold
# build (about 6 minutes on 2 busy cores) is never paid inside `make test`'s time.
EPP_DIR="$bin" bash "$root/hack/epp.sh" >/dev/null

# Every binary must now report its pinned version; say so, or fail loudly.
status=0
check() {
  if has_version "$@"; then echo "testbin: ok   $1 (${*: -1})"; else echo "testbin: FAIL $1 does not report ${*: -1}" >&2; status=1; fi
}
check kube-apiserver --version "Kubernetes $KUBERNETES_VERSION"
check kube-controller-manager --version "Kubernetes $KUBERNETES_VERSION"
check kube-scheduler --version "Kubernetes $KUBERNETES_VERSION"
check kubectl version --client "Client Version: $KUBERNETES_VERSION"
check etcd --version "etcd Version: ${ETCD_VERSION#v}"
check kwok --version "$KWOK_VERSION"
check kwokctl --version "$KWOK_VERSION"
check helm version --short "$HELM_VERSION"
check otelcol --version "${OTELCOL_VERSION#v}"
echo "testbin: done in $((SECONDS - total))s ($bin)"
exit $status
