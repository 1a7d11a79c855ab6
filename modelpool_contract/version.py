"""The release version: the one place it is written.

Everything else reads it from here: the distribution's metadata (pyproject.toml's dynamic ``version``), the
``__version__`` of each package, the worker image the operator runs by default, the image tags ``make images``
writes (``hack/version.sh``), and the chart's ``version``/``appVersion`` (kept equal by a test and refused by
``make release`` when they differ, since Helm reads only its own Chart.yaml).
"""

from __future__ import annotations

from typing import Final

#: The version of this release (semantic versioning; see CHANGELOG.md).
VERSION: Final = "0.2.0"
