"""What Kopf copies of every watched object at every watch event: its "essence", built without the status.

Kopf builds an object's essence (what its change-detecting handlers compare: the object without
``metadata`` and ``status``, plus its labels and useful annotations) for every watch event of every
watched resource, whatever handlers it has, and its stock storage begins with ``copy.deepcopy`` of the
whole body: a worker pod's ``managedFields`` and status included. At 150 pools a profile of the operator
put a fifth of its CPU there (``AnnotationsDiffBaseStorage.build``). ``LeanDiffBaseStorage`` builds the
same essence (``tests/operator/unit/test_scale.py`` compares it with Kopf's) from the parts it keeps only,
copied through JSON (watch bodies are JSON), which is several times faster than ``deepcopy``.

A worker pod's essence is empty: the operator has no change-detecting handler on pods (only an index and
an event handler, which read the body itself), so Kopf compares nothing of them, and a copy of each pod's
spec at each of its watch events (ten thousand pods at 1,000 pools, several events each) bought nothing.
Nor are the objects the pools own (``owned``: their Services, NetworkPolicies, PodDisruptionBudgets and
InferencePools, watched for their deletion only): their essence is empty too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any, cast

import kopf
from kopf._cogs.structs import dicts as kopf_dicts  # Kopf's field-spec removal, as its storage uses

# The parts of a body an essence never holds (Kopf's ``DiffBaseStorage.build`` deletes them).
_DROPPED = frozenset({"apiVersion", "kind", "metadata", "status"})
# The metadata an essence keeps (then filtered as Kopf filters it).
_KEPT_METADATA = ("labels", "annotations")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# The kinds no change-detecting handler reads (module doc): their essence is empty. Named here, not
# imported from ``owned`` (which reaches the settings, which import this module); test_owned checks both.
_NO_ESSENCE = frozenset({"Pod", "Service", "NetworkPolicy", "PodDisruptionBudget", "InferencePool"})


class LeanDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's annotations diff-base storage, with an essence built from what it keeps only."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> Any:
        if body.get("kind") in _NO_ESSENCE:  # no change-detecting handler reads their essence (module doc)
            return {}
        fields = list(extra_fields or ())
        if fields:  # a handler watches a field (of the status, maybe): Kopf's own way, exactly
            return super().build(body=body, extra_fields=fields)
        meta = body.get("metadata") or {}
        kept: dict[str, Any] = {k: v for k, v in body.items() if k not in _DROPPED}
        picked = {k: meta[k] for k in _KEPT_METADATA if k in meta}
        if picked:
            kept["metadata"] = picked
        essence: dict[str, Any] = json.loads(json.dumps(kept))
        annotations = essence.get("metadata", {}).get("annotations", {})
        ignored = self._detect_marked_prefixes(annotations)  # other Kopf operators' storages
        for annotation in list(annotations):
            if annotation == _LAST_APPLIED or any(annotation.startswith(f"{p}/") for p in ignored):
                del annotations[annotation]
        self.remove_empty_stanzas(cast(Any, essence))
        for ignored_field in self.ignored_fields:
            with contextlib.suppress(TypeError):  # as Kopf: a field that cannot be deleted is skipped
                kopf_dicts.remove(essence, ignored_field)
        self.remove_annotations(cast(Any, essence), set(self.make_keys(self.key, body=body)))
        self.remove_empty_stanzas(cast(Any, essence))
        return essence
