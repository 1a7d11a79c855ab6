"""The NetworkPolicyPeer type (networking.k8s.io/v1) that the operator's settings accept for the callers a
pool's NetworkPolicy admits.

Apart from ``network_policy`` (the builder) because the settings import it: it depends on nothing else of
the operator. Strict (an unknown field is an error), so a typo in the chart's values stops the operator at
start instead of admitting everyone or no one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class _Peer(BaseModel):
    """camelCase on the wire; an unknown field is an error (a typo would otherwise admit everyone)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class LabelSelectorRequirement(_Peer):
    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] | None = None


class LabelSelector(_Peer):
    match_labels: dict[str, str] | None = None
    match_expressions: tuple[LabelSelectorRequirement, ...] | None = None


class IPBlock(_Peer):
    cidr: str = Field(min_length=1)
    except_: tuple[str, ...] | None = Field(default=None, alias="except")


class NetworkPolicyPeer(_Peer):
    """A NetworkPolicyPeer (networking.k8s.io/v1): pods by label, namespaces by label (both: those pods in
    those namespaces), or an IP block."""

    pod_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    ip_block: IPBlock | None = None

    @model_validator(mode="after")
    def _names_someone(self) -> NetworkPolicyPeer:
        if self.pod_selector is None and self.namespace_selector is None and self.ip_block is None:
            raise ValueError("a peer needs podSelector, namespaceSelector or ipBlock")
        if self.ip_block is not None and (self.pod_selector or self.namespace_selector):
            raise ValueError("ipBlock cannot be combined with podSelector or namespaceSelector")
        return self

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
