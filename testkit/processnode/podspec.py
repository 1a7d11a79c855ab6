"""Pure functions that turn a pod spec into what a process needs: argv, environment, probe targets.

Nothing here talks to the API server or starts a process; references to ConfigMaps and Secrets are
resolved through a lookup callable the caller provides, so every rule is testable with plain data.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from modelpool_contract.quantity import QuantityError, quantity_value

JSON = dict[str, Any]

# (kind "configmap"|"secret", namespace, name) -> the object's data (secret values still base64) or None.
Lookup = Callable[[str, str, str], "dict[str, str] | None"]


class SpecError(Exception):
    """The pod cannot be run as a process: the message is written to the container's waiting state."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: `$(NAME)` becomes NAME's value when defined and stays verbatim
    otherwise; `$$` is an escaped `$`; any other `$` is literal (k8s.io/kubernetes third_party expansion)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : close]
            out.append(env[name] if name in env else text[i : close + 1])
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: JSON, path: str, pod_ip: str, host_ip: str) -> str:
    """The value of an env `valueFrom.fieldRef.fieldPath`, as the kubelet resolves it."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return str(simple[path])
    m = _LABEL_REF.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise SpecError("CreateContainerConfigError", f"unsupported fieldRef fieldPath {path!r}")


def _key_ref(kind: str, ref: JSON, namespace: str, lookup: Lookup) -> str | None:
    data = lookup(kind, namespace, str(ref.get("name", "")))
    optional = bool(ref.get("optional", False))
    key = str(ref.get("key", ""))
    if data is None or key not in data:
        if optional:
            return None
        what = "configmap" if kind == "configmap" else "secret"
        raise SpecError("CreateContainerConfigError", f"{what} {ref.get('name')!r} key {key!r} not found")
    value = data[key]
    return base64.b64decode(value).decode("utf-8", "replace") if kind == "secret" else value


def resource_field(raw: str, divisor: str) -> str:
    """A `resourceFieldRef` value as the kubelet writes it: the quantity over the divisor, rounded up
    (requests.cpu 2 with divisor 1m: "2000"); a value that is no quantity is written as it is."""
    try:
        return str(math.ceil(quantity_value(raw) / (quantity_value(divisor) or Decimal(1))))
    except QuantityError:
        return raw


def build_env(
    pod: JSON,
    container: JSON,
    base: Mapping[str, str],
    *,
    pod_ip: str,
    host_ip: str,
    lookup: Lookup,
) -> dict[str, str]:
    """The process environment: `base` (inherited variables, POD_IP, the bind and termination-log
    variables), then envFrom, then env in order, each value expanded against what precedes it."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = dict(base)
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix", ""))
        for kind, field in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(field)
            if not ref:
                continue
            data = lookup(kind, namespace, str(ref.get("name", "")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise SpecError("CreateContainerConfigError", f"{kind} {ref.get('name')!r} not found")
            for key, raw in data.items():
                env[prefix + key] = (
                    base64.b64decode(raw).decode("utf-8", "replace") if kind == "secret" else raw
                )
    for item in container.get("env") or []:
        name = str(item["name"])
        if "value" in item and item["value"] is not None:
            env[name] = expand(str(item["value"]), env)
            continue
        source = item.get("valueFrom") or {}
        value: str | None
        if "fieldRef" in source:
            value = field_ref(pod, str(source["fieldRef"].get("fieldPath", "")), pod_ip, host_ip)
        elif "configMapKeyRef" in source:
            value = _key_ref("configmap", source["configMapKeyRef"], namespace, lookup)
        elif "secretKeyRef" in source:
            value = _key_ref("secret", source["secretKeyRef"], namespace, lookup)
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            group, _, rname = str(ref.get("resource", "")).partition(".")
            raw = str(((container.get("resources") or {}).get(group) or {}).get(rname, "0"))
            value = resource_field(raw, str(ref.get("divisor") or "1"))
        else:
            value = ""
        if value is not None:
            env[name] = value
    return env


def build_argv(container: JSON, env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expansion; a container without `command` cannot run as a process
    (there is no image to take an entrypoint from)."""
    command = container.get("command") or []
    if not command:
        raise SpecError(
            "CreateContainerConfigError",
            "the process node runs a container's explicit `command` (images are not pulled); none is set",
        )
    return [expand(str(a), env) for a in [*command, *(container.get("args") or [])]]


def resolve_port(container: JSON, port: Any) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    text = str(port)
    if text.isdigit():
        return int(text)
    for p in container.get("ports") or []:
        if p.get("name") == text:
            return int(p["containerPort"])
    raise SpecError("CreateContainerConfigError", f"probe port {text!r} is not a named container port")


def grace_seconds(pod: JSON) -> float:
    """How long a deleted pod's processes get between SIGTERM and SIGKILL."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionGracePeriodSeconds") is not None:
        return float(meta["deletionGracePeriodSeconds"])
    value = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return float(30 if value is None else value)


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """restartPolicy semantics for a container that exited with exit_code."""
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def backoff_delay(failures: int, initial: float, maximum: float) -> float:
    """The kubelet's crash-loop back-off: initial, doubling per consecutive failure, capped."""
    if failures <= 0:
        return 0.0
    return float(min(maximum, initial * (2 ** (failures - 1))))


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (negative for a signal) as a container exit code (128 + signal)."""
    return 128 - returncode if returncode < 0 else returncode
