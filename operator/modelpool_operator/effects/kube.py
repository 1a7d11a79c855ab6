"""Thin async Kubernetes API calls (kubernetes_asyncio): pods, services, network policies, disruption
budgets, pool and budget status.

No decisions are made here: each function is one API request (two when a create meets an object of its
name), with the few error codes that mean "already done" (404 on delete, 409 on create) turned into
ordinary outcomes, because the operator is level-based and may well repeat an action that a previous pass
(or a previous operator process) already took. A 409 is "already done" only for an object its owner
controls (checked by uid: a list by name for a pod, a JSON patch's ``test`` for the rest); an object of
our name that is anyone else's raises ``NameTakenError``. Everything else raises ``ApiException`` for the
caller's retry logic.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from modelpool_contract.api import GROUP, MODELBUDGET_PLURAL, MODELHOST_PLURAL, MODELPOOL_PLURAL, VERSION
from modelpool_contract.picker import (
    INFERENCE_GROUP,
    INFERENCE_POOL_KIND,
    INFERENCE_POOL_PLURAL,
    INFERENCE_VERSION,
)

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
# The generated client's connections when its configuration names none (its own default).
_DEFAULT_CONNECTIONS = 100

GONE, EXISTS = 404, 409

#: What the API server answers a JSON patch whose ``test`` operation failed (and any other invalid patch).
UNPROCESSABLE = 422


class NameTakenError(Exception):
    """An object of the name the operator would make exists and is not controlled by its owner (a pool or a
    ModelHost): the operator leaves it as it is and says so (a condition and an Event), never takes it
    over."""


#: Why a pool's InferencePool cannot be made where the API server does not serve the InferencePool API.
INFERENCE_POOL_MISSING = (
    f"the API server has no {INFERENCE_POOL_KIND} API ({INFERENCE_GROUP}/{INFERENCE_VERSION}): install the "
    "Gateway API Inference Extension's CRDs (its manifests/ or config/crd/), or remove spec.inferencePool"
)


class InferencePoolUnavailableError(Exception):
    """The InferencePool API is not installed (the CRD is missing): a pool asking for one is told so."""


def owned_patch(body: Mapping[str, Any], fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pure: a JSON patch (RFC 6902) that first tests that the object's first owner reference is ``body``'s
    own (its controller's uid), then sets ``fields`` (JSON pointers -> values).  Applied atomically: an
    object someone else made under our name fails the test and is left untouched, with no ``get`` right
    needed to find out."""
    owners = body["metadata"].get("ownerReferences") or []
    if not owners:
        name = body["metadata"]["name"]
        raise ValueError(f"{name}: no owner reference to check the existing object against")
    test = {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": owners[0]["uid"]}
    return [test, *({"op": "add", "path": path, "value": value} for path, value in fields.items())]


def _first_owner_uid(body: Mapping[str, Any]) -> str | None:
    """The uid of the first owner reference of an object the operator builds (its controller's), if any."""
    owners = body["metadata"].get("ownerReferences") or []
    return str(owners[0]["uid"]) if owners and owners[0].get("uid") else None


def failed_test(exc: ApiException) -> bool:
    """Pure: the API server's answer to a JSON patch whose ``test`` failed: 422 Invalid with no causes (an
    invalid value in the patch itself is also 422 Invalid, but names its fields in ``details.causes``)."""
    if exc.status != UNPROCESSABLE:
        return False
    try:
        status = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return False
    return (
        isinstance(status, dict)
        and status.get("reason") == "Invalid"
        and not ((status.get("details") or {}).get("causes"))
    )


#: Told about every failed request: (operation, HTTP status or None when no answer came).
ErrorHook = Callable[[str, int | None], None]


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: changed keys, and ``None`` for keys
    that disappeared (a plain merge patch would otherwise keep a stale ``nextAttemptAfter`` forever).
    Lists are replaced whole, as merge patch does."""
    old = old or {}
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    return patch


def describe_error(exc: BaseException) -> str:
    """A failed request in one line: the API's own message (the Status object's) when it answered."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {message or exc.reason}"
    return f"{type(exc).__name__}: {exc}"


def refused(exc: BaseException) -> bool:
    """True when the API server answered the request with a client error (4xx: forbidden, exceeded quota,
    invalid, throttled), so it took no effect.  Anything else (a 5xx, a timeout, no answer at all) leaves
    the outcome unknown: a 504 or a timed-out create may still have made the object."""
    return isinstance(exc, ApiException) and exc.status is not None and 400 <= int(exc.status) < 500


class KubeApi(Protocol):
    """The API requests a reconciliation pass makes (``Kube`` on the API server; tests record them)."""

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> bool: ...
    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...
    async def delete_pod(
        self, namespace: str, name: str, grace_period_seconds: int | None = None
    ) -> bool: ...
    async def pod_exists(self, namespace: str, name: str) -> bool: ...
    async def disrupted_pods(self, namespace: str, name: str) -> dict[str, datetime]: ...
    async def ensure_service(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    async def ensure_network_policy(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    async def ensure_disruption_budget(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    async def ensure_inference_pool(self, namespace: str, body: Mapping[str, Any]) -> None: ...
    async def delete_inference_pool(self, namespace: str, name: str, owner_uid: str | None) -> bool: ...
    async def delete_owned(self, namespace: str, kind: str, name: str, owner_uid: str) -> bool: ...
    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool: ...
    async def patch_budget_status(self, name: str, status: Mapping[str, Any]) -> bool: ...
    async def create_budget(self, body: Mapping[str, Any]) -> bool: ...
    async def patch_host_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool: ...
    async def ensure_control_key_secret(self, namespace: str, body: Mapping[str, Any]) -> bool: ...
    async def close(self) -> None: ...


async def api_client() -> client.ApiClient:
    """An API client from the in-cluster service account, or else ``$KUBECONFIG`` / ~/.kube/config."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


async def connect(request_timeout: float, on_error: ErrorHook | None = None) -> Kube:
    """An API connection (``api_client``) for the operator's own requests."""
    return Kube(await api_client(), request_timeout, on_error)


class Kube:
    """The handful of API requests the operator makes besides Kopf's own watching."""

    def __init__(
        self, api_client: client.ApiClient, request_timeout: float, on_error: ErrorHook | None = None
    ) -> None:
        self._api = api_client
        self._on_error = on_error
        # Typed as Any: the generated client's stubs want model objects, while plain dicts (what the pure
        # builders return) are what the API accepts and what we send.
        self._core: Any = client.CoreV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._networking: Any = client.NetworkingV1Api(api_client)
        self._policy: Any = client.PolicyV1Api(api_client)
        self._timeout = request_timeout
        # As many requests at once as the client has connections (``_limited``).
        self._slots = asyncio.Semaphore(
            int(getattr(api_client.configuration, "connection_pool_maxsize", 0) or _DEFAULT_CONNECTIONS)
        )

    async def close(self) -> None:
        await self._api.close()

    async def _took_effect(
        self, operation: str, request: Awaitable[Any], *, unless: int = 0, unread: bool = False
    ) -> bool:
        """Await one API request: True when it took effect, False when the API answers ``unless`` (404:
        already gone, 409: already exists; an earlier pass did it); any other error is reported to the
        error hook and raised. ``unread``: sent with ``_preload_content=False`` (``_drop_answer``)."""
        try:
            await self._answer(operation, request, unless=unless, unread=unread)
        except ApiException as exc:
            if exc.status == unless:
                return False
            raise
        return True

    async def _answer(
        self, operation: str, request: Awaitable[Any], *, unless: int | None = None, unread: bool = False
    ) -> Any:
        """Await one request and return its answer; a failure is reported (an answer ``unless`` is not: the
        caller expects it) and raised."""
        try:
            return await self._limited(request, unread=unread)
        except ApiException as exc:
            if exc.status != unless:
                self._report(operation, exc.status)
            raise
        except Exception:
            self._report(operation, None)
            raise

    async def _limited(self, request: Awaitable[Any], *, unread: bool = False) -> Any:
        """Start ``request`` (a coroutine of the generated client, not started yet) once one of the client's
        connections is free, within the request timeout (as aiohttp's own wait for a connection was).

        The client serializes a request's body (a copy of it as plain data, then its JSON) when the request
        starts, and only then waits for a connection: a scale-up of 1,000 pools queued thousands of pod
        creates behind its 100 connections, each with its body twice over (1,000 pools: 250 MiB more RSS
        within six minutes). Waiting here, before the start, the waiting ones hold nothing of the client's."""
        try:
            async with asyncio.timeout(self._timeout):
                await self._slots.acquire()
        except BaseException:
            if inspect.iscoroutine(request):
                request.close()  # never started: nothing to undo, and no "never awaited" warning
            raise
        try:
            answer = await request
            if unread:  # its connection is held until its answer is read
                await self._drop_answer(answer)
                return None
            return answer
        finally:
            self._slots.release()

    @staticmethod
    async def _drop_answer(response: Any) -> None:
        """The answer of a request sent with ``_preload_content=False``, read as bytes and dropped (a non-2xx
        one raised as the client raises it, the API server's Status as its body), never turned into the
        client's models: at 1,000 pools the created, patched and deleted pods' answers made into ``V1Pod``s
        were 8 % of the operator's time during a scale-up."""
        try:
            body = await response.read()
        finally:
            response.release()
        if not 200 <= response.status <= 299:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = body.decode("utf-8", "replace")
            raise error

    def _report(self, operation: str, code: int | None) -> None:
        if self._on_error is not None:
            self._on_error(operation, code)

    # ---- pods ------------------------------------------------------------------------------------

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create a pod; False when a pod of that name already exists and is this one's owner's (an earlier
        pass, or an earlier process, made it). A pod of that name that is anyone else's (another owner, or
        none: a squatter, another pool whose worker names came out the same) raises ``NameTakenError``: a
        409 is not "made", so the caller neither counts that pod nor waits for it."""
        name = body["metadata"]["name"]
        made = await self._took_effect(
            "create_pod",
            self._core.create_namespaced_pod(
                namespace, dict(body), _preload_content=False, _request_timeout=self._timeout
            ),
            unless=EXISTS,
            unread=True,
        )
        if made:
            return True
        owner = _first_owner_uid(body)
        if owner is None:  # nothing to check it against (a body built without its owner's uid)
            return False
        found = await self._pod_owners(namespace, name)
        if found is not None and owner not in found:
            raise NameTakenError(
                f"pod {namespace}/{name} exists and is not controlled by this resource (another owner, or "
                "none): the operator leaves it as it is"
            )
        return False  # ours, or gone meanwhile (its reservation ends once it is known absent)

    async def _pod_owners(self, namespace: str, name: str) -> set[str] | None:
        """The uids of the pod ``name``'s controller owner references (None: no such pod now). A list by
        name: ``list`` is what the operator's RBAC grants on pods (no ``get``)."""
        listed = await self._answer(
            "list_pods",
            self._core.list_namespaced_pod(
                namespace, field_selector=f"metadata.name={name}", _request_timeout=self._timeout
            ),
        )
        if not listed.items:
            return None
        refs = listed.items[0].metadata.owner_references or []
        return {str(ref.uid) for ref in refs if ref.controller}

    async def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """Merge-patch a pod's metadata (``None`` values delete keys); False when the pod is gone."""
        return await self._took_effect(
            "patch_pod",
            self._core.patch_namespaced_pod(
                name,
                namespace,
                dict(patch),
                _content_type=MERGE_PATCH,
                _preload_content=False,
                _request_timeout=self._timeout,
            ),
            unless=GONE,
            unread=True,
        )

    async def delete_pod(self, namespace: str, name: str, grace_period_seconds: int | None = None) -> bool:
        """Delete a pod (with its own grace period unless given); False when it was already gone."""
        options = client.V1DeleteOptions(grace_period_seconds=grace_period_seconds)
        return await self._took_effect(
            "delete_pod",
            self._core.delete_namespaced_pod(
                name, namespace, body=options, _preload_content=False, _request_timeout=self._timeout
            ),
            unless=GONE,
            unread=True,
        )

    async def pod_exists(self, namespace: str, name: str) -> bool:
        """Whether the pod exists now (``_pod_owners``' list by name: a pod that is absent is an ordinary
        answer, not an error)."""
        return await self._pod_owners(namespace, name) is not None

    async def disrupted_pods(self, namespace: str, name: str) -> dict[str, datetime]:
        """The PodDisruptionBudget ``name``'s ``status.disruptedPods`` now (pod name -> when the Eviction
        API evicted it; empty when the budget is absent or lists none): a list by name, as the RBAC grants
        (``planner.disrupted``)."""
        listed = await self._answer(
            "list_pod_disruption_budgets",
            self._policy.list_namespaced_pod_disruption_budget(
                namespace, field_selector=f"metadata.name={name}", _request_timeout=self._timeout
            ),
        )
        status = listed.items[0].status if listed.items else None
        return dict(status.disrupted_pods or {}) if status is not None else {}

    async def ensure_control_key_secret(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create a ModelHost's control key Secret; when one of its name exists, write our key into it only
        if it is the ModelHost's (``owned_patch``: its first owner reference carries the ModelHost's uid).
        True when it was created, False when an existing one was brought to our key. A Secret of that name
        that is anyone else's raises ``NameTakenError`` and is left as it is: its key (one its maker knows)
        never reaches a host pod.

        Never a read: the patch's ``test`` answers "whose is it" atomically, in the request that writes the
        key, so a Secret made by someone else with a copied owner reference ends up holding the operator's
        key, not theirs. ``patch`` on Secrets is the one right this needs; the chart's operator policy
        (templates/operatorpolicy.yaml) lets the operator patch only control key Secrets a ModelHost
        owns."""
        plain = body.get("stringData") or {}
        data = {k: base64.b64encode(str(v).encode()).decode() for k, v in plain.items()}
        fields = {"/metadata/labels": body["metadata"].get("labels", {}), "/data": data}
        return await self._ensure_owned(self._core, "secret", namespace, body, fields, kind="Secret")

    # ---- services, network policies, disruption budgets --------------------------------------------

    async def ensure_service(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create the pool's Service, or bring an existing one's labels, selector and ports up to date, only
        if it is the pool's (``owned_patch``: an object of that name made by anyone else raises
        ``NameTakenError`` and is left as it is).

        ``spec.clusterIP`` is left out of the update: it is immutable, and a Service made before the pools'
        Services were headless keeps the virtual IP it has (docs/operator.md)."""
        fields = {"/metadata/labels": body["metadata"].get("labels", {})}
        fields |= {f"/spec/{k}": v for k, v in (body.get("spec") or {}).items() if k != "clusterIP"}
        await self._ensure_owned(self._core, "service", namespace, body, fields, kind="Service")

    async def ensure_network_policy(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create the pool's (or host's) NetworkPolicy, or bring an existing one's labels and rules up to
        date, only if it is ours (``owned_patch``; else ``NameTakenError``)."""
        fields = _labels_and_spec(body)
        await self._ensure_owned(
            self._networking, "network_policy", namespace, body, fields, kind="NetworkPolicy"
        )

    async def ensure_disruption_budget(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create the pool's (or host's) PodDisruptionBudget, or bring an existing one's labels and spec up to
        date (its minAvailable follows the pool's target), only if it is ours (``owned_patch``; else
        ``NameTakenError``)."""
        fields = _labels_and_spec(body)
        kind = "PodDisruptionBudget"
        await self._ensure_owned(self._policy, "pod_disruption_budget", namespace, body, fields, kind=kind)

    async def ensure_inference_pool(self, namespace: str, body: Mapping[str, Any]) -> None:
        """Create the pool's InferencePool, or bring an existing one's labels and spec up to date, only if it
        is the pool's (``owned_patch``; else ``NameTakenError``). ``InferencePoolUnavailableError`` where
        the API server has no InferencePool API (a 404 to the create: the CRD is not installed)."""
        fields = _labels_and_spec(body)
        pools = _InferencePools(self._custom)
        try:
            await self._ensure_owned(
                pools, "inference_pool", namespace, body, fields, kind=INFERENCE_POOL_KIND
            )
        except ApiException as exc:
            if exc.status == GONE:
                raise InferencePoolUnavailableError(INFERENCE_POOL_MISSING) from exc
            raise

    async def delete_inference_pool(self, namespace: str, name: str, owner_uid: str | None) -> bool:
        """Delete the InferencePool ``name`` if its controller is the pool ``owner_uid`` (a list by name,
        then a delete whose precondition is the uid listed, so an object made anew in between is not
        touched); True when one was deleted. Nothing to do where the API is not installed (404) or the
        object is gone or someone else's."""
        try:
            listed = await self._answer(
                "list_inference_pools",
                self._custom.list_namespaced_custom_object(
                    INFERENCE_GROUP,
                    INFERENCE_VERSION,
                    namespace,
                    INFERENCE_POOL_PLURAL,
                    field_selector=f"metadata.name={name}",
                    _request_timeout=self._timeout,
                ),
            )
        except ApiException as exc:
            if exc.status == GONE:
                return False
            raise
        ours = [item for item in listed.get("items", []) if owner_uid and _controller_uid(item) == owner_uid]
        if not ours:
            return False
        options = {"preconditions": {"uid": ours[0]["metadata"]["uid"]}}
        return await self._took_effect(
            "delete_inference_pool",
            self._custom.delete_namespaced_custom_object(
                INFERENCE_GROUP,
                INFERENCE_VERSION,
                namespace,
                INFERENCE_POOL_PLURAL,
                name,
                body=options,
                _request_timeout=self._timeout,
            ),
            unless=GONE,
        )

    async def delete_owned(self, namespace: str, kind: str, name: str, owner_uid: str) -> bool:
        """Delete the ``kind`` (a Service, NetworkPolicy or PodDisruptionBudget: ``OWNED_APIS``) ``name`` if
        its controller is ``owner_uid``, as ``delete_inference_pool`` does (a list by name, then a delete
        whose precondition is the uid listed); True when one was deleted, False when none of the owner's
        exists (gone, or someone else's)."""
        attribute, resource = OWNED_APIS[kind]
        api = getattr(self, attribute)
        listed = await self._answer(
            f"list_{resource}",
            getattr(api, f"list_namespaced_{resource}")(
                namespace, field_selector=f"metadata.name={name}", _request_timeout=self._timeout
            ),
        )
        ours = [
            item.metadata.uid
            for item in listed.items
            if any(ref.controller and ref.uid == owner_uid for ref in item.metadata.owner_references or [])
        ]
        if not owner_uid or not ours:
            return False
        options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=ours[0]))
        return await self._took_effect(
            f"delete_{resource}",
            getattr(api, f"delete_namespaced_{resource}")(
                name, namespace, body=options, _preload_content=False, _request_timeout=self._timeout
            ),
            unless=GONE,
            unread=True,
        )

    async def _ensure_owned(
        self, api: Any, resource: str, namespace: str, body: Mapping[str, Any], fields: Any, *, kind: str
    ) -> bool:
        """Create ``body`` (``api.create_namespaced_<resource>``); when an object of its name exists, bring
        ``fields`` (JSON-patch paths to values) up to date by an ``owned_patch``, whose failed owner test
        (the object is anyone else's) is ``NameTakenError``, not an API failure. True when created."""
        name = body["metadata"]["name"]
        create = getattr(api, f"create_namespaced_{resource}")
        made = create(namespace, dict(body), _request_timeout=self._timeout)
        if await self._took_effect(f"create_{resource}", made, unless=EXISTS):
            return True
        patch = getattr(api, f"patch_namespaced_{resource}")(
            name,
            namespace,
            owned_patch(body, fields),
            _content_type=JSON_PATCH,
            _request_timeout=self._timeout,
        )
        try:
            await self._took_effect(f"patch_{resource}", patch)
        except ApiException as exc:
            if not failed_test(exc):
                raise
            raise NameTakenError(
                f"{kind} {namespace}/{name} exists and is not controlled by this resource (another owner, or "
                "none): the operator leaves it as it is; delete or rename it, or rename this resource"
            ) from exc
        return False

    # ---- custom resources ------------------------------------------------------------------------

    async def patch_pool_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch a ModelPool's status subresource; False when the pool is gone."""
        patch = self._custom.patch_namespaced_custom_object_status
        return await self._patch_status(
            "patch_pool_status", patch, namespace, MODELPOOL_PLURAL, name, status=status
        )

    async def patch_budget_status(self, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch the (cluster-scoped) ModelBudget's status; False when it does not exist."""
        patch = self._custom.patch_cluster_custom_object_status
        return await self._patch_status("patch_budget_status", patch, MODELBUDGET_PLURAL, name, status=status)

    async def create_budget(self, body: Mapping[str, Any]) -> bool:
        """Create the (cluster-scoped) ModelBudget ``body``; False when one of its name exists (a 409: it is
        the user's from then on and is never read, patched nor replaced here)."""
        return await self._took_effect(
            "create_budget",
            self._custom.create_cluster_custom_object(
                GROUP, VERSION, MODELBUDGET_PLURAL, dict(body), _request_timeout=self._timeout
            ),
            unless=EXISTS,
        )

    async def patch_host_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch a ModelHost's status subresource; False when it is gone."""
        patch = self._custom.patch_namespaced_custom_object_status
        return await self._patch_status(
            "patch_host_status", patch, namespace, MODELHOST_PLURAL, name, status=status
        )

    async def _patch_status(self, operation: str, patch: Any, *where: str, status: Mapping[str, Any]) -> bool:
        """``patch(GROUP, VERSION, *where, body)`` as a merge patch of the status; False when gone."""
        return await self._took_effect(
            operation,
            patch(
                GROUP,
                VERSION,
                *where,
                {"status": dict(status)},
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            ),
            unless=GONE,
        )


#: The owned kinds ``Kube.delete_owned`` removes: the client attribute of their API, and their resource as
#: the generated client names its methods.
OWNED_APIS: dict[str, tuple[str, str]] = {
    "Service": ("_core", "service"),
    "NetworkPolicy": ("_networking", "network_policy"),
    "PodDisruptionBudget": ("_policy", "pod_disruption_budget"),
}


class _InferencePools:
    """The InferencePool custom resource in the shape ``Kube._ensure_owned`` calls (``create_namespaced_X``,
    ``patch_namespaced_X``), over the generated client's custom-object calls."""

    def __init__(self, custom: Any) -> None:
        self._custom = custom

    def create_namespaced_inference_pool(self, namespace: str, body: Any, **options: Any) -> Any:
        where = (INFERENCE_GROUP, INFERENCE_VERSION, namespace, INFERENCE_POOL_PLURAL)
        return self._custom.create_namespaced_custom_object(*where, body, **options)

    def patch_namespaced_inference_pool(self, name: str, namespace: str, body: Any, **options: Any) -> Any:
        where = (INFERENCE_GROUP, INFERENCE_VERSION, namespace, INFERENCE_POOL_PLURAL)
        return self._custom.patch_namespaced_custom_object(*where, name, body, **options)


def _controller_uid(item: Mapping[str, Any]) -> str | None:
    """The uid of an object's controller owner reference, if it has one."""
    for owner in item.get("metadata", {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid"))
    return None


def _labels_and_spec(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an update of an owned object brings up to date: its labels and its whole spec."""
    return {"/metadata/labels": body["metadata"].get("labels", {}), "/spec": body.get("spec", {})}


__all__ = [
    "INFERENCE_POOL_MISSING",
    "OWNED_APIS",
    "ApiException",
    "InferencePoolUnavailableError",
    "Kube",
    "connect",
    "describe_error",
    "merge_patch",
    "refused",
]
