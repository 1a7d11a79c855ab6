"""Generated ModelPool and ModelBudget manifests on the real API server and a running operator.

The manifests come from the CRDs themselves (``crds/*.yaml``): ``from_schema`` turns the structural schema
into a hypothesis strategy of valid specs (types, bounds, enums, patterns, lengths, the CEL ``matches``
rules), ``repair`` applies the CRDs' cross-field CEL rules, and ``mutate`` makes a near-valid one by
changing exactly one field (wrong type, below the minimum, above the maximum, too long, too short, a
pattern or enum broken, a negative quantity, an unknown key, a required key dropped).

Every manifest goes to the API server with ``dryRun=All`` and ``fieldValidation=Strict`` (schema and CEL
validation run, nothing is stored): a mutated one must be refused with the mutated field named in the
message, a valid one accepted.  Then a sample of the accepted pools is really created in a namespace an
operator watches (pods pinned to no node, so none runs): each must get a status from the operator, one
the pydantic model refuses (the CRD is looser in places) must say why in a condition, and the operator's
log must hold no traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from modelpool_contract.api import SHARED_POOL_RULES, parse_pool_spec
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import wait_for
from tests.operator.integration.opharness import GROUP_VERSION, StartOperator
from tests.server.fuzzcases import FUZZ_SETTINGS

pytestmark = pytest.mark.cluster

GROUP, VERSION = GROUP_VERSION.split("/")
POOL_EXAMPLES = 250
BUDGET_EXAMPLES = 60
CREATED_SAMPLE = 40
# Where the sampled pools' pods are pinned: no node has this label, so each stays Pending (the operator
# still builds and creates it; the API server still validates it).
NOWHERE = {"modelpool.dev/fuzz": "nowhere"}


def crd_spec_schema(name: str) -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / f"{name}.yaml").read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


POOL_SCHEMA = crd_spec_schema("modelpools")
BUDGET_SCHEMA = crd_spec_schema("modelbudgets")
_MATCHES = re.compile(r"^self\.matches\('(.*)'\)$")


# ---- valid specs from the schema ----------------------------------------------------------------------


def matches_rule(node: dict[str, Any]) -> str | None:
    """The regex of a ``self.matches('...')`` CEL rule on a string node (how the CRD bounds ``source``)."""
    for rule in node.get("x-kubernetes-validations") or []:
        found = _MATCHES.match(rule["rule"])
        if found:
            return found.group(1).replace("\\\\", "\\")
    return None


free_text = st.text(
    st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]) | st.sampled_from("-_./: "), max_size=20
)


def string_strategy(node: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = node.get("minLength", 0), node.get("maxLength", 40)
    if "enum" in node:
        return st.sampled_from(node["enum"])
    regex = node.get("pattern") or matches_rule(node)
    base = go_regex(regex) if regex else free_text
    return base.filter(lambda s: low <= len(s) <= high)


def go_regex(regex: str) -> st.SearchStrategy[str]:
    """Strings matching ``regex`` as the API server (Go's RE2) reads it: Python's ``$`` also matches before
    a trailing newline, RE2's does not."""
    return st.from_regex(regex).filter(lambda s: not s.endswith("\n"))


def quantity_strategy(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.integers(min_value=node.get("minimum", 0), max_value=2**45),
        st.sampled_from(["1Gi", "512Mi", "500m", "2", "1e3", ".5Gi", "+1Ki", "0", "0.5", "1E"]),
        go_regex(node["pattern"]).filter(lambda s: len(s) <= 24),
    )


def from_schema(node: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Valid values of a structural schema node (cross-field CEL rules aside: see ``repair``)."""
    if node.get("x-kubernetes-int-or-string"):
        return quantity_strategy(node)
    kind = node.get("type")
    if kind == "string":
        return string_strategy(node)
    if kind == "integer":
        low = node.get("minimum", -(2**31))
        return st.integers(low, node.get("maximum", max(low, 0) + 10**6))
    if kind == "number":
        low = node.get("minimum", 0.0)
        return st.floats(low, node.get("maximum", low + 1e6), exclude_min=bool(node.get("exclusiveMinimum")))
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        low = node.get("minItems", 0)
        return st.lists(
            from_schema(node["items"], depth + 1),
            min_size=low,
            max_size=max(low, min(node.get("maxItems", 3), 3)),
        )
    if kind == "object" and "properties" in node:
        props = node["properties"]
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v, depth + 1) for k, v in props.items() if k in required},
            optional={k: from_schema(v, depth + 1) for k, v in props.items() if k not in required},
        )
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        low = node.get("minProperties", 0)
        values = from_schema(node["additionalProperties"])
        return st.dictionaries(free_text.filter(bool), values, min_size=low, max_size=max(low, 2))
    return st.just({})


def ordered(doc: dict[str, Any], schema: dict[str, Any], *keys: str) -> None:
    """Make ``doc[keys[0]] <= doc[keys[1]] <= ...``, a missing key counting as its schema default (when any
    of them is present, all are then set)."""
    if not any(k in doc for k in keys):
        return
    values = sorted(doc.get(k, schema["properties"][k]["default"]) for k in keys)
    doc.update(zip(keys, values, strict=True))


# Built once: a strategy from the whole schema is costly to construct (regexes, nested dictionaries).
VALID_POOL_SPECS = from_schema(POOL_SCHEMA)
VALID_BUDGET_SPECS = from_schema(BUDGET_SCHEMA)


def repair(spec: dict[str, Any]) -> dict[str, Any]:
    """The CRD's cross-field CEL rules applied to a generated spec (so that a valid one is valid).  The
    API server applies the schema's defaults before the rules, so a field left out counts as its default."""
    ordered(spec, POOL_SCHEMA, "minReplicas", "replicas", "maxReplicas")
    autoscaling = spec.get("autoscaling")
    if isinstance(autoscaling, dict):
        capacity = (spec.get("queue") or {}).get("capacity", 100)
        if autoscaling.get("targetPerWorker", 10) > capacity:
            autoscaling["targetPerWorker"] = capacity
        # A metric other than requests needs its own target (CEL on spec.autoscaling).
        if autoscaling.get("metric") == "tokens":
            autoscaling.setdefault("targetTokensPerWorker", 1)
        if autoscaling.get("metric") == "kvCache":
            autoscaling.setdefault("targetKvCache", 1)
        ordered(
            autoscaling,
            POOL_SCHEMA["properties"]["autoscaling"],
            "scaleUpWindowSeconds",
            "stableWindowSeconds",
        )
    cache = (spec.get("model") or {}).get("cache")
    if isinstance(cache, dict):
        cache.setdefault(
            "claimName" if cache["type"] == "pvc" else "path", "c" if cache["type"] == "pvc" else "/c"
        )
    if "inferencePool" in spec:
        # The endpoint picker reads what only text-generation workers export (CEL on spec.inferencePool).
        spec["model"]["task"] = "text-generation"
    _distinct_adapters(spec)
    if "host" in spec:
        # A shared pool leaves the pod to its ModelHost: the CEL rules on spec refuse these fields.
        for field, _, _ in SHARED_POOL_RULES:
            parent, _, leaf = field.rpartition(".")
            owner = spec.get(parent) if parent else spec
            if isinstance(owner, dict):
                owner.pop(leaf, None)
    _own_namespace_only((spec.get("podTemplate") or {}).get("affinity"))
    for entry in (spec.get("podTemplate") or {}).get("env") or []:
        if "value" in entry and "valueFrom" in entry:
            del entry["valueFrom"]
        source = entry.get("valueFrom")
        if source is not None and ("secretKeyRef" in source) == ("configMapKeyRef" in source):
            source.pop("configMapKeyRef", None)
            source.setdefault("secretKeyRef", {"name": "s", "key": "k"})
    return spec


def _distinct_adapters(spec: dict[str, Any]) -> None:
    """LoRA adapters (CEL on spec.adapters): a text-generation pool's, each name once and none the base
    model's served name."""
    adapters = spec.get("adapters")
    if not adapters:
        return
    spec["model"]["task"] = "text-generation"
    seen = {spec.get("servedModelName")}
    kept = []
    for adapter in adapters:
        if adapter["name"] not in seen:
            seen.add(adapter["name"])
            kept.append(adapter)
    spec["adapters"] = kept


def _own_namespace_only(value: Any) -> None:
    """A pod (anti-)affinity term selects pods of the pool's own namespace (a CEL rule refuses
    ``namespaces`` and ``namespaceSelector``): drop them wherever the generator put them."""
    if isinstance(value, dict):
        value.pop("namespaces", None)
        value.pop("namespaceSelector", None)
        for child in value.values():
            _own_namespace_only(child)
    elif isinstance(value, list):
        for child in value:
            _own_namespace_only(child)


# ---- one field broken ---------------------------------------------------------------------------------


def nodes(
    value: Any, schema: dict[str, Any], path: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every (path, schema) in a value, maps' entries excepted (the API server names those differently)."""
    yield path, schema
    if isinstance(value, dict) and "properties" in schema:
        for key, child in value.items():
            yield from nodes(child, schema["properties"][key], (*path, key))
    elif isinstance(value, list) and "items" in schema:
        for i, child in enumerate(value):
            yield from nodes(child, schema["items"], (*path, i))


def field_path(path: tuple[Any, ...]) -> str:
    """The API server's way of naming a field: ``spec.podTemplate.env[0].name``."""
    out = "spec"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def breakers(schema: dict[str, Any], value: Any) -> list[tuple[str, Any]]:
    """(kind, replacement) pairs that make ``value`` invalid against ``schema``; ``None`` replacement with
    kind ``unknown`` or ``required`` is handled by the caller."""
    out: list[tuple[str, Any]] = []
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        out += [
            ("type", True),
            ("type", [1]),
            ("negative", -5),
            ("pattern", "12 apples"),
            ("pattern", "-1Gi"),
        ]
    elif kind == "string":
        out.append(("type", 12345))
        if "maxLength" in schema:
            out.append(("too-long", "a" * (schema["maxLength"] + 1)))
        if schema.get("minLength", 0) > 0:
            out.append(("too-short", ""))
        if "enum" in schema:
            out.append(("enum", "not-a-choice"))
        regex = schema.get("pattern") or matches_rule(schema)
        if regex and not re.search(regex, "!! not this"):
            out.append(("pattern", "!! not this"))
    elif kind in ("integer", "number"):
        out.append(("type", "12"))
        if "minimum" in schema:
            out.append(("below-minimum", schema["minimum"] - 1))
        if "maximum" in schema:
            out.append(("above-maximum", schema["maximum"] + 1))
    elif kind == "boolean":
        out.append(("type", "yes"))
    elif kind == "array":
        out.append(("type", {"a": 1}))
    elif kind == "object":
        out.append(("type", "an object"))
        if "properties" in schema:
            out.append(("unknown", None))
            out += [
                ("required", key)
                for key in schema.get("required", [])
                if isinstance(value, dict) and key in value
            ]
    return out


@st.composite
def mutated(draw: st.DrawFn, spec: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
    """``spec`` with one field broken: (spec, the field's path as the API server names it, the kind)."""
    candidates = [(p, s) for p, s in nodes(spec, schema) if breakers(s, _get(spec, p))]
    path, node = draw(st.sampled_from(candidates))
    kind, replacement = draw(st.sampled_from(breakers(node, _get(spec, path))))
    spec = json.loads(json.dumps(spec))
    if kind == "unknown":
        _get(spec, path)["zzUnknownField"] = 1
        return spec, field_path((*path, "zzUnknownField")), kind
    if kind == "required":
        del _get(spec, path)[replacement]
        return spec, field_path((*path, replacement)), kind
    if not path:
        return replacement, "spec", kind
    _get(spec, path[:-1])[path[-1]] = replacement
    return spec, field_path(path), kind


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


# ---- the API server -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(crds: Cluster) -> k8s.CustomObjectsApi:
    # The client leaves its config loaders untyped (testkit.watch ignores its call alike).
    client = k8s_config.new_client_from_config(config_file=str(crds.kubeconfig))  # type: ignore[no-untyped-call]
    return k8s.CustomObjectsApi(client)


def dry_run(api: k8s.CustomObjectsApi, manifest: dict[str, Any], namespace: str | None) -> str | None:
    """None when the API server accepts ``manifest`` (dry run, strict field validation), else its message
    (the Status message and every cause's field and message)."""
    try:
        if namespace is None:
            api.create_cluster_custom_object(GROUP, VERSION, "modelbudgets", manifest, dry_run="All",
                                             field_validation="Strict")  # fmt: skip
        else:
            api.create_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools", manifest,
                                                dry_run="All", field_validation="Strict")  # fmt: skip
    except ApiException as exc:
        assert exc.status in (400, 422), f"{exc.status} {exc.body}"
        return str(exc.body)
    return None


def pool_manifest(name: str, spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}


def parses(parse: Callable[[Any], Any], spec: Any) -> bool:
    try:
        parse(spec)
    except ValueError:
        return False
    return True


ACCEPTED_POOLS: list[dict[str, Any]] = []


def check(message: str | None, spec: Any, broken: tuple[str, str] | None) -> None:
    if broken is None:
        assert message is None, f"a valid spec was refused: {message}\n{json.dumps(spec)[:2000]}"
        return
    where, kind = broken
    assert message is not None, f"accepted with {where} broken ({kind}): {json.dumps(spec)[:2000]}"
    assert where in message, f"{where} ({kind}) not named in: {message[:1500]}"


def test_generated_pools(api: k8s.CustomObjectsApi, namespace: str) -> None:
    counts = {"valid": 0, "broken": 0, "refused": 0, "operator-invalid": 0}

    @FUZZ_SETTINGS(POOL_EXAMPLES)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        spec = repair(data.draw(VALID_POOL_SPECS, label="valid spec"))
        broken: tuple[str, str] | None = None
        if data.draw(st.sampled_from((True, False, False)), label="break"):  # about two thirds broken
            spec, where, kind = data.draw(mutated(spec, POOL_SCHEMA), label="broken spec")
            broken = (where, kind)
        message = dry_run(api, pool_manifest("fuzz", spec), namespace)
        check(message, spec, broken)
        counts["broken" if broken else "valid"] += 1
        counts["refused"] += message is not None
        if message is None:
            ACCEPTED_POOLS.append(spec)
            counts["operator-invalid"] += not parses(parse_pool_spec, spec)

    run()
    assert counts["valid"] + counts["broken"] >= POOL_EXAMPLES, counts
    assert counts["refused"] >= counts["broken"] > 120 and counts["valid"] > CREATED_SAMPLE, counts


def test_generated_budgets(api: k8s.CustomObjectsApi) -> None:
    seen = {"accepted": 0, "refused": 0}

    @FUZZ_SETTINGS(BUDGET_EXAMPLES)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        spec = data.draw(VALID_BUDGET_SPECS, label="valid spec")
        broken: tuple[str, str] | None = None
        if data.draw(st.sampled_from((True, False, False)), label="break"):  # about two thirds broken
            spec, where, kind = data.draw(mutated(spec, BUDGET_SCHEMA), label="broken spec")
            broken = (where, kind)
        manifest = {
            "apiVersion": GROUP_VERSION,
            "kind": "ModelBudget",
            "metadata": {"name": "fuzz"},
            "spec": spec,
        }
        message = dry_run(api, manifest, None)
        check(message, spec, broken)
        seen["refused" if message else "accepted"] += 1

    run()
    assert sum(seen.values()) >= BUDGET_EXAMPLES and min(seen.values()) > 10, seen


# Found by this module, kept as explicit cases: a negative integer quantity was accepted by the CRD (its
# quantity pattern only constrains strings); a ModelBudget of -5 was then "a budget of -5 bytes".
NEGATIVE_QUANTITIES = [
    ("ModelBudget", {"memory": -5}, "spec.memory"),
    ("ModelPool", {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": -1}},
     "spec.resources.memory"),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "spec", "where"), NEGATIVE_QUANTITIES)
def test_negative_quantities_are_refused(
    api: k8s.CustomObjectsApi, namespace: str, kind: str, spec: dict[str, Any], where: str
) -> None:
    manifest = {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": {"name": "negative"}, "spec": spec}
    message = dry_run(api, manifest, namespace if kind == "ModelPool" else None)
    assert message is not None and where in message and "greater than or equal to 0" in message, message


def test_accepted_pools_are_reconciled(
    api: k8s.CustomObjectsApi,
    crds: Cluster,
    namespace: str,
    budget: Callable[[str], None],
    start_operator: StartOperator,
) -> None:
    """A sample of the accepted pools, created for real with an operator watching: every one gets a status
    (a phase), one the operator cannot parse says why in a condition, and no traceback is logged."""
    assert len(ACCEPTED_POOLS) >= CREATED_SAMPLE, "test_generated_pools runs first and fills the sample"
    budget("10Ti")
    operator = start_operator(namespace)
    names = []
    for i, accepted in enumerate(ACCEPTED_POOLS[:CREATED_SAMPLE]):
        spec = pinned(accepted)
        name = f"fuzz-{i}"
        api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, "modelpools", pool_manifest(name, spec)
        )
        names.append(name)

    def statuses() -> dict[str, dict[str, Any]] | None:
        listed = api.list_namespaced_custom_object(GROUP, VERSION, namespace, "modelpools")
        items = cast(dict[str, Any], listed)["items"]  # the client types a custom object's list as object
        got = {p["metadata"]["name"]: p for p in items if (p.get("status") or {}).get("phase")}
        return got if len(got) == len(names) else None

    pools = wait_for(statuses, timeout=120, interval=1, message="a status on every created pool")
    invalid = {name: pool for name, pool in pools.items() if not parses(parse_pool_spec, pool["spec"])}
    assert invalid, "the sample holds pools the CRD admits and the operator's model refuses"
    for name, pool in invalid.items():
        ready: dict[str, Any] = next(
            (c for c in pool["status"].get("conditions") or [] if c["type"] == "Ready"), {}
        )
        assert ready.get("reason") == "InvalidSpec" and "spec." in ready.get("message", ""), (name, pool)
    log = operator.log_tail(10**8)
    assert "Traceback" not in log, log[-6000:]


def pinned(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with its pods pinned to no node and at most two of them (cheap: none runs)."""
    spec = json.loads(json.dumps(spec))
    # A shared pool may not pin its pods (its ModelHost's do; the operator does not place shared pools yet,
    # so it would make dedicated workers): it is created as a dedicated one.
    spec.pop("host", None)
    template = spec.setdefault("podTemplate", {})
    template["nodeSelector"] = NOWHERE
    for key in ("minReplicas", "replicas", "maxReplicas"):
        if key in spec:
            spec[key] = min(spec[key], 2)
    return spec
