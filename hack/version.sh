#!/usr/bin/env bash
# Print the release version, read from the one place it is written (modelpool_contract/version.py), without
# the virtualenv: image tags (hack/images.sh) and `make release` use it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^VERSION: Final = "\(.*\)"$/\1/p' "$root/modelpool_contract/version.py")
[ -n "$version" ] || { echo "version.sh: no VERSION in modelpool_contract/version.py" >&2; exit 1; }
echo "$version"
