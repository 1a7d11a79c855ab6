#!/usr/bin/env bash
# Build the project's two images from the Dockerfile without a Docker daemon (`make images`):
#   ghcr.io/modelpool/modelpool-operator:<version>   (target operator: operator + gateway, no torch)
#   ghcr.io/modelpool/modelpool-server:<version>     (target server: the model server with torch)
# into the default containers store (/var/lib/containers/storage) with buildah, the vfs storage driver and
# chroot isolation: what works as root in a container with no daemon, no overlayfs and no user namespaces.
#
# No registry is reachable here, so the base image is made locally: a Debian bookworm root from
# debootstrap (minbase + Debian's Python 3.11, python3-venv, ca-certificates), imported as
# localhost/modelpool-base:bookworm and kept (rebuilt only when missing).  The Dockerfile's default base
# (python:3.11-slim) is what `docker build` uses elsewhere.
#
# A build is skipped when its inputs are unchanged: each image carries a label with the hash of what goes
# into it (the Dockerfile, the lock, the sources, the base image, the build args), so a warm `make test`
# pays nothing.
#
# Usage: hack/images.sh [base|operator|server|all|smoke]...   (default: all; the operator first: it is small)
#        smoke: run the built images' checks (uid 10001, the console scripts, torch only in the server)
# Env:   TORCH_INDEX_URL  empty (default): the locked PyPI torch (the CUDA build, it runs on CPU too);
#                         https://download.pytorch.org/whl/cpu for the CPU-only variant (needs that host).
#        IMAGES_FORCE=1   rebuild even when the inputs are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."

# buildah 1.28 ignores STORAGE_DRIVER in the environment (its default here is overlay, a separate store):
# every call names the driver.
bh() { buildah --storage-driver vfs "$@"; }
REGISTRY=ghcr.io/modelpool
BASE_IMAGE=localhost/modelpool-base:bookworm
BASE_WORK=${BASE_WORK:-/var/tmp/modelpool-base}
LABEL=io.modelpool.inputs
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}

log() { echo "== images: $*" >&2; }

# The tools come from Debian (hack/tools.sh; CI runs as root on a fresh machine).
ensure_tools() { bash hack/tools.sh; }

version() { bash hack/version.sh; }

# The Debian mirror this machine's apt uses (deb822 .sources or one-line lists), else Debian's CDN.
debian_mirror() {
  local uri
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs: *//p' | tr ' ' '\n' \
    | grep -E '/debian/?$' | head -1 || true)
  [ -n "$uri" ] || uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$1 == "deb" && $2 ~ /\/debian\/?$/ {print $2; exit}' || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

image_exists() { bh inspect --type image "$1" >/dev/null 2>&1; }

build_base() {
  if image_exists "$BASE_IMAGE"; then
    log "$BASE_IMAGE present"
    return
  fi
  local rootfs=$BASE_WORK/rootfs mirror start
  mirror=$(debian_mirror)
  start=$(date +%s)
  log "debootstrap bookworm from $mirror into $rootfs"
  rm -rf "$rootfs"
  mkdir -p "$BASE_WORK"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$BASE_WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$BASE_WORK/debootstrap.log" >&2; exit 1; }
  # The image needs neither apt's downloaded packages and lists nor the host's resolver settings.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/etc/resolv.conf
  tar -C "$rootfs" --numeric-owner -cf "$BASE_WORK/rootfs.tar" .
  local ctr
  ctr=$(bh from scratch)
  bh add --quiet "$ctr" "$BASE_WORK/rootfs.tar" / >/dev/null
  bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd /bin/bash --label io.modelpool.base="debootstrap bookworm minbase" "$ctr"
  bh commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs" "$BASE_WORK/rootfs.tar"
  log "base $BASE_IMAGE built in $(($(date +%s) - start)) s"
}

# What goes into the images: the hash of every input file (what .dockerignore lets into the context),
# the base image's ID and the build arguments (this script's own text is not: editing how it builds does
# not change what it builds; IMAGES_FORCE=1 rebuilds).
inputs_hash() {
  local target=$1
  {
    find Dockerfile .dockerignore uv.lock pyproject.toml README.md \
      operator model_server modelpool_contract modelpool_gateway \
      -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*/.mypy_cache/*' ! -path '*.egg-info/*' \
      -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    bh inspect --type image --format '{{.FromImageID}}' "$BASE_IMAGE"
    echo "target=$target torch_index=$TORCH_INDEX_URL"
  } | sha256sum | cut -d' ' -f1
}

# The free space a target's build needs at its peak, in GiB: df sampled each second through
# `IMAGES_FORCE=1 hack/images.sh` (2026-12-07): the server's build took 20.8 GB beyond what it started with,
# the operator's about 1.5 GB.  IMAGES_MIN_FREE_GB overrides it.
need_free() {
  local target=$1 need have store=/var/lib/containers/storage
  case $target in server) need=${IMAGES_MIN_FREE_GB:-22} ;; *) need=${IMAGES_MIN_FREE_GB:-3} ;; esac
  mkdir -p "$store"
  have=$(df --output=avail -BG "$store" | tail -1 | tr -dc 0-9)
  if [ "$have" -lt "$need" ]; then
    log "building the $target image needs about $need GiB free under $store (vfs copies every layer); $have GiB are"
    df -h "$store" >&2
    return 1
  fi
}

build_target() {
  local target=$1 image hash current start
  image=$REGISTRY/modelpool-$target:$(version)
  hash=$(inputs_hash "$target")
  current=$(bh inspect --type image --format "{{index .OCIv1.Config.Labels \"$LABEL\"}}" "$image" \
    2>/dev/null || true)
  if [ "$current" = "$hash" ] && [ "${IMAGES_FORCE:-0}" != 1 ]; then
    log "$image is up to date"
    return
  fi
  # Disk: under vfs a build needs about three times the image at its commit (the container's root, the
  # layer's blob being staged, the new layer: ~21 GB for the 6.3 GB server image).  The stale image of
  # this tag is removed first (it would hold another copy through the build), and the space is checked
  # before minutes of work run into ENOSPC.
  if image_exists "$image"; then
    log "removing the stale $image"
    bh rmi --force "$image" >/dev/null
  fi
  bh rmi --prune >/dev/null 2>&1 || true
  need_free "$target" || return 1
  local args=(bud --isolation chroot --target "$target" --tag "$image"
    --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "$LABEL=$hash" --pull=never)
  [ -z "$TORCH_INDEX_URL" ] || args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
  # The host's uv cache, bound into the build: the torch layer's ~3 GB of wheels are not downloaded
  # again (uv copies out of it; the cache is not part of any image).
  local cache
  cache=$( (command -v uv >/dev/null && uv cache dir) || { [ -x "$HOME/.local/bin/uv" ] && "$HOME/.local/bin/uv" cache dir; } || true)
  if [ -n "$cache" ]; then
    mkdir -p "$cache"
    args+=(--volume "$cache:/var/cache/uv-host" --build-arg "UV_CACHE_OPT=--cache-dir=/var/cache/uv-host")
  fi
  # This host's CA bundle over the image's for the build (not committed): PyPI may be reached through a
  # TLS-inspecting proxy whose CA only the host trusts.
  [ ! -f /etc/ssl/certs/ca-certificates.crt ] \
    || args+=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
  start=$(date +%s)
  # buildah's step-by-step output (thousands of lines per image) goes to a log of its own; its tail is
  # shown when the build fails.
  local build_log="$PWD/build/images-$target.log"
  mkdir -p "$(dirname "$build_log")"
  log "building $image (log: $build_log)"
  local attempt
  for attempt in 1 2 3; do
    bh "${args[@]}" . >"$build_log" 2>&1 && break
    # A failed build leaves its working containers (a whole root each under vfs): none is kept (this
    # store's only other containers are the smoke check's, which removes its own).
    bh rm --all >/dev/null 2>&1 || true
    # A RUN step re-executes buildah from a sealed memfd copy of itself (containers/storage's unshare.c);
    # the kernel answers F_ADD_SEALS with EBUSY while the copy's fresh pages still hold transient
    # references, a race outside this build.  Only that failure is tried again (the finished layers are
    # cached); any other failure stops here.
    if [ "$attempt" -lt 3 ] && grep -q 'sealing memfd copy: Device or resource busy' "$build_log"; then
      log "building $image: buildah's memfd seal was refused (EBUSY), attempt $attempt of 3; again"
      continue
    fi
    tail -n 60 "$build_log" >&2
    log "building $image failed; the whole log: $build_log"
    return 1
  done
  log "$image built in $(($(date +%s) - start)) s"
  # The stage images buildah kept for the multi-stage build (untagged) cost disk under vfs.
  bh rmi --prune >/dev/null 2>&1 || true
}

# What a pod relies on, checked in the built images: the uid, the console scripts on PATH, torch only in
# the server image.  (Each `buildah from` copies the image under vfs: ~25 s for the server.)
smoke() {
  local op srv
  op=$REGISTRY/modelpool-operator:$(version)
  srv=$REGISTRY/modelpool-server:$(version)
  SMOKE_CTR=$(bh from --pull=never "$op")
  trap '[ -z "${SMOKE_CTR:-}" ] || bh rm "$SMOKE_CTR" >/dev/null' EXIT
  run() { bh run --isolation chroot "$SMOKE_CTR" -- "$@"; }
  [ "$(run id -u)" = 10001 ] || { echo "smoke: $op does not run as 10001" >&2; return 1; }
  run modelpool-operator --help >/dev/null
  run modelpool-gateway --help >/dev/null
  if run python -c 'import torch' 2>/dev/null; then echo "smoke: torch in $op" >&2 && return 1; fi
  bh rm "$SMOKE_CTR" >/dev/null
  SMOKE_CTR=$(bh from --pull=never "$srv")
  [ "$(run id -u)" = 10001 ] || { echo "smoke: $srv does not run as 10001" >&2; return 1; }
  run modelpool-server --help >/dev/null
  run python -c 'import torch, transformers, model_server'
  log "smoke checks passed ($op, $srv)"
}

main() {
  local targets=("$@")
  ((${#targets[@]})) || targets=(all)
  ensure_tools
  build_base
  for t in "${targets[@]}"; do
    case $t in
      base) ;;
      operator | server) build_target "$t" ;;
      all) build_target operator; build_target server ;;
      smoke) smoke ;;
      *) echo "usage: $0 [base|operator|server|all|smoke]..." >&2 && exit 2 ;;
    esac
  done
}

main "$@"
