"""The release in dist/ (`make release`) is what the sources say it is: every file named by the one version,
checked by SHA256SUMS, the wheel and the packaged chart carrying that version, the chart in the archive the
same as the source folder's, and each image archive the very image `make images` built (uid 10001, its
entrypoint, its tag).  The install of the packaged chart with these images is e2e/test_images.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.helpers import CHART, require_binary, run
from modelpool_contract.version import VERSION
from testkit.environment import ROOT

DIST = ROOT / "dist"
WHEEL = DIST / f"modelpool-{VERSION}-py3-none-any.whl"
SDIST = DIST / f"modelpool-{VERSION}.tar.gz"
CHART_TGZ = DIST / f"modelpool-operator-{VERSION}.tgz"
IMAGES = {
    "modelpool-operator": ["modelpool-operator"],
    "modelpool-server": ["modelpool-server"],
}


def archive(name: str) -> Path:
    return DIST / f"{name}-{VERSION}.oci.tar"


def released_files() -> list[Path]:
    return [WHEEL, SDIST, CHART_TGZ, *(archive(name) for name in IMAGES)]


@pytest.fixture(scope="module")
def dist() -> Path:
    missing = [p.name for p in [*released_files(), DIST / "SHA256SUMS"] if not p.is_file()]
    if missing:
        pytest.fail(f"dist/ lacks {', '.join(missing)}: run 'make release' (it needs 'make images')")
    return DIST


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_sha256sums_names_and_checks_every_released_file(dist: Path) -> None:
    sums: dict[str, str] = {}
    for line in (dist / "SHA256SUMS").read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name] = digest
    assert sorted(sums) == sorted(p.name for p in released_files())
    for path in released_files():
        assert sums[path.name] == sha256(path), f"{path.name}: its digest is not the one in SHA256SUMS"


def test_the_wheel_carries_the_version_and_the_three_commands(dist: Path) -> None:
    with zipfile.ZipFile(WHEEL) as wheel:
        names = wheel.namelist()
        info = f"modelpool-{VERSION}.dist-info"
        metadata = wheel.read(f"{info}/METADATA").decode()
        scripts = wheel.read(f"{info}/entry_points.txt").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    for command in ("modelpool-operator", "modelpool-server", "modelpool-gateway"):
        assert f"{command} = " in scripts
    assert "modelpool_contract/version.py" in names
    assert any(n.startswith("modelpool_operator/") for n in names)


def test_the_sdist_has_the_license_and_the_sources(dist: Path) -> None:
    with tarfile.open(SDIST) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"LICENSE", "pyproject.toml", "modelpool_contract/version.py"} <= names


def chart_files(directory: Path) -> dict[str, bytes]:
    """Every file of the chart's source folder by its path in the chart."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


def test_the_packaged_chart_is_the_source_chart_at_the_version(dist: Path) -> None:
    with tarfile.open(CHART_TGZ) as tgz:
        packaged = {
            m.name.split("/", 1)[1]: tgz.extractfile(m).read()  # type: ignore[union-attr]
            for m in tgz.getmembers()
            if m.isfile()
        }
    chart = yaml.safe_load(packaged["Chart.yaml"])
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    source = chart_files(CHART)
    # helm package writes Chart.yaml anew (its keys sorted, comments dropped): compared as data.
    assert chart == yaml.safe_load(source.pop("Chart.yaml"))
    packaged.pop("Chart.yaml")
    stale = sorted(name for name, body in packaged.items() if source.get(name) != body)
    assert sorted(packaged) == sorted(source), "the packaged chart lacks or adds files"
    assert not stale, f"dist/ was packaged from another chart ({stale[:5]}): run 'make release' again"


def test_the_packaged_chart_renders_the_release_images(dist: Path) -> None:
    helm = require_binary("helm")
    out = run([str(helm), "template", "modelpool", str(CHART_TGZ), "--namespace", "modelpool-system"]).stdout
    images = {
        c["image"]
        for doc in yaml.safe_load_all(out)
        if doc and doc.get("kind") == "Deployment"
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/modelpool/modelpool-operator:{VERSION}"}


def oci_image(path: Path) -> tuple[str, dict[str, Any], str]:
    """(the tag the archive names, the image's config, the config's digest = the image ID)."""
    with tarfile.open(path) as tar:

        def blob(digest: str) -> bytes:
            algorithm, hexdigest = digest.split(":", 1)
            return tar.extractfile(f"blobs/{algorithm}/{hexdigest}").read()  # type: ignore[union-attr]

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        (entry,) = index["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        config_digest = manifest["config"]["digest"]
        config = json.loads(blob(config_digest))
    return entry["annotations"]["org.opencontainers.image.ref.name"], config, config_digest


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_each_image_archive_is_the_built_image(dist: Path, name: str) -> None:
    tag, config, digest = oci_image(archive(name))
    ref = f"ghcr.io/modelpool/{name}:{VERSION}"
    assert tag in (ref, VERSION), f"{archive(name).name} names {tag!r}"
    assert config["config"]["User"].split(":")[0] == "10001"
    assert config["config"]["Entrypoint"] == IMAGES[name]
    buildah = shutil.which("buildah")
    if buildah is None:  # a machine that only holds the release: the archive is all there is
        return
    built = subprocess.run(
        [buildah, "--storage-driver=vfs", "inspect", "--type=image", "--format={{.FromImageID}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode == 0:
        assert digest == f"sha256:{built.stdout.strip()}", (
            f"{archive(name).name} is not the image {ref} in the local store: run 'make release' again"
        )
