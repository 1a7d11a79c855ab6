#!/usr/bin/env bash
# `make release`: everything a user installs, written to dist/ (docs/install.md, "Installing a release"):
#   modelpool-<v>-py3-none-any.whl, modelpool-<v>.tar.gz    the Python distribution (wheel and sdist)
#   modelpool-operator-<v>.tgz                               the packaged Helm chart (`helm package`)
#   modelpool-operator-<v>.oci.tar, modelpool-server-<v>.oci.tar
#                                                            both images as OCI archives (`make images` first)
#   SHA256SUMS                                               `sha256sum -c SHA256SUMS` checks them all
# The version is read from its one place (hack/version.sh); a Chart.yaml or CHANGELOG.md that does not name it
# stops the release.  An image archive is rewritten only when its image changed (the image ID it was written
# from is kept beside it in dist/.image-ids), so a release after an unchanged build costs seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="$root/bin:$PATH"
dist=${DIST_DIR:-$root/dist}
version=$(bash hack/version.sh)
chart=charts/modelpool-operator
storage=(--storage-driver vfs)

fail() { echo "release: $*" >&2; exit 1; }
chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$chart/Chart.yaml"; }
[ "$(chart_field version)" = "$version" ] || fail "$chart/Chart.yaml version is $(chart_field version), the release is $version"
[ "$(chart_field appVersion)" = "$version" ] || fail "$chart/Chart.yaml appVersion is $(chart_field appVersion), the release is $version"
grep -q "^## \[$version\]" CHANGELOG.md || fail "CHANGELOG.md has no '## [$version]' section"
command -v buildah >/dev/null || fail "buildah is missing: run 'make images' first"

start=$SECONDS
mkdir -p "$dist"
# Python distribution: a clean build from the sources (uv runs the setuptools backend in isolation).
rm -f "$dist"/modelpool-*.whl "$dist"/modelpool-*.tar.gz
uv=$(command -v uv || echo "$HOME/.local/bin/uv")
"$uv" build --quiet --sdist --wheel --out-dir "$dist" .
# The chart, packaged as `helm install` takes it.
rm -f "$dist"/modelpool-operator-*.tgz
helm package "$chart" --destination "$dist" >/dev/null

# The images, as OCI archives a registry-less user can load (skopeo copy / buildah pull oci-archive:...).
ids="$dist/.image-ids"
touch "$ids"
for name in modelpool-operator modelpool-server; do
  ref="ghcr.io/modelpool/$name:$version"
  id=$(buildah "${storage[@]}" inspect --type image --format '{{.FromImageID}}' "$ref" 2>/dev/null) \
    || fail "image $ref is not in the local store: run 'make images'"
  archive="$dist/$name-$version.oci.tar"
  if [ -f "$archive" ] && grep -qx "$name $id" "$ids"; then
    echo "release: $archive is image $id already"
    continue
  fi
  rm -f "$archive"
  t=$SECONDS
  buildah "${storage[@]}" push --quiet "$ref" "oci-archive:$archive:$ref" >/dev/null
  grep -v "^$name " "$ids" >"$ids.tmp" || true
  echo "$name $id" >>"$ids.tmp"
  mv "$ids.tmp" "$ids"
  echo "release: wrote $archive ($(du -h "$archive" | cut -f1)) in $((SECONDS - t))s"
done
# Stale files of another version are not part of this release.
find "$dist" -maxdepth 1 -type f -name '*.*' ! -name "*$version*" ! -name SHA256SUMS ! -name .image-ids -delete
(cd "$dist" && sha256sum -- *"$version"* >SHA256SUMS)
echo "release: $version in $dist in $((SECONDS - start))s"
(cd "$dist" && ls -l -- *"$version"* SHA256SUMS | awk '{printf "  %10s  %s\n", $5, $9}')
