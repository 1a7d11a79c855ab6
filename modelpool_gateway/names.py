"""Name resolution (pure): which pool a request's model name means.

A client names a pool, in this order of precedence:

1. ``namespace/name``, exactly;
2. its ``spec.servedModelName`` (an alias such as ``sentence-transformers/all-MiniLM-L6-v2``);
3. its name alone;
4. the name of one of its LoRA adapters (``spec.adapters``): the request goes to the pool and keeps the
   adapter's name as its model, which the worker applies.

``namespace/name`` comes first so that no alias can take another pool's full name, and an alias shaped like
another namespace's ``namespace/name`` (``team-b/llama`` on a pool of ``team-a``) is not indexed at all: the
admission policy and the operator refuse such a pool (``alias_claims_namespace``), and one created before
them still cannot receive the prompts meant for team-b, even while team-b has no pool of that name.

A name that several watched namespaces answer to at the same step is ambiguous: the client is told to
write ``namespace/name``.  ``NameIndex`` is rebuilt whenever a pool is added, changed or deleted, so a
request costs a dictionary lookup or two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from modelpool_contract.api import alias_claims_namespace
from modelpool_gateway.state import Key, Pool

# The KServe v2 path segments after a model name (``/v2/models/{name}/...``) the workers serve.
V2_SUFFIXES = ("", "ready", "infer", "versions", "config", "stats")


@dataclass(frozen=True)
class Resolved:
    """The pool a name resolved to, and the LoRA adapter of it the name selects (None: the base model)."""

    key: Key
    adapter: str | None = None


@dataclass(frozen=True)
class Unresolved:
    """Why a name resolves to no pool (``ambiguous``: several pools; else none at all)."""

    message: str
    ambiguous: bool = False


Resolution = Resolved | Unresolved


def _group(pairs: Iterable[tuple[str, Key]]) -> dict[str, tuple[Key, ...]]:
    out: dict[str, list[Key]] = {}
    for name, key in pairs:
        out.setdefault(name, []).append(key)
    return {name: tuple(sorted(keys)) for name, keys in out.items()}


@dataclass(frozen=True)
class NameIndex:
    """Every name each known pool answers to."""

    aliases: Mapping[str, tuple[Key, ...]]
    names: Mapping[str, tuple[Key, ...]]
    keys: frozenset[Key]
    adapters: Mapping[str, tuple[Key, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, pools: Iterable[Pool]) -> NameIndex:
        listed = list(pools)
        return cls(
            aliases=_group(
                (p.served_model_name, p.key)
                for p in listed
                if p.served_model_name and alias_claims_namespace(p.served_model_name, p.namespace) is None
            ),
            names=_group((p.name, p.key) for p in listed),
            keys=frozenset(p.key for p in listed),
            adapters=_group((a, p.key) for p in listed for a in p.adapters),
        )

    def resolve(self, model: str) -> Resolution:
        """The pool ``model`` names (see the module docstring for the order)."""
        if not model:
            return Unresolved("the request names no model")
        namespace, slash, name = model.partition("/")
        if slash and (namespace, name) in self.keys:
            return Resolved((namespace, name))
        for table in (self.aliases, self.names, self.adapters):
            found = table.get(model, ())
            if len(found) == 1:
                return Resolved(found[0], model if table is self.adapters else None)
            if found:
                choices = ", ".join(f"{ns}/{n}" for ns, n in found)
                return Unresolved(
                    f"model {model!r} names several pools ({choices}); use namespace/name", ambiguous=True
                )
        return Unresolved(f"model {model!r} is not served here; GET /v1/models lists the models")

    def public_name(self, pool: Pool) -> str:
        """The shortest name that resolves to ``pool``: its alias or name when unique, else namespace/name."""
        for candidate in (pool.served_model_name, pool.name):
            if candidate and self.resolve(candidate) == Resolved(pool.key):
                return candidate
        return f"{pool.namespace}/{pool.name}"


def split_v2_path(index: NameIndex, rest: str) -> tuple[Resolution, str]:
    """Resolve the model in a v2 path (the part after ``/v2/models/``) and return the suffix after it.

    ``namespace/name`` and two-segment aliases contain a slash, as tritonclient sends them: the two-segment
    reading wins when it resolves and what follows it is a v2 suffix, else the first segment is the name.
    """
    segments = rest.split("/")
    if len(segments) >= 2 and (len(segments) == 2 or segments[2] in V2_SUFFIXES):
        two = index.resolve(f"{segments[0]}/{segments[1]}")
        if isinstance(two, Resolved):
            return two, "/".join(segments[2:])
    return index.resolve(segments[0]), "/".join(segments[1:])
