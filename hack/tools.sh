#!/usr/bin/env bash
# The Debian tools the images and the tests use, installed when missing (CI runs as root on a fresh
# machine): buildah, runc and debootstrap build and run the images (hack/images.sh); promtool, from
# Debian's prometheus package, checks and unit-tests the chart's alerts (e2e/test_monitoring.py). The package's
# service is never started (policy-rc.d on CI machines; nothing here needs a Prometheus server running).
set -euo pipefail
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v promtool >/dev/null || missing+=(prometheus)
if ((${#missing[@]})); then
  echo "tools: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
