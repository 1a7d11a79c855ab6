"""What an API key grants (``parse_grant``, pure), the key store the Secret watch keeps, and where keys are
read from: a Secret outside the gateway's own namespace never grants another namespace."""

from __future__ import annotations

import base64
import os
import subprocess
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from modelpool_contract.gateway_keys import (
    KEY_FIELD,
    MAX_PER_MINUTE,
    NAMESPACES_FIELD,
    POOLS_FIELD,
    REQUESTS_PER_MINUTE_FIELD,
    TOKENS_PER_MINUTE_FIELD,
    default_keys_namespace,
)
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.keys import (
    EVERYTHING,
    Grant,
    KeyStore,
    bearer_token,
    key_namespaces,
    parse_grant,
    parse_limits,
    token_digest,
)
from modelpool_gateway.limits import Limits
from modelpool_gateway.main import key_store, watch_scopes
from testkit.environment import ROOT

ADMIN = "gateway"
KEY = "0123456789abcdef-key"

names = st.sampled_from(["a", "b", "gateway", "team-x", "*"])
pool_entries = st.one_of(names, st.builds(lambda n, p: f"{n}/{p}", names, names))
lists = st.lists(pool_entries, max_size=4).map(",".join) | st.none()


def secret(namespace: str, name: str = "k", **fields: str) -> dict[str, Any]:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in fields.items()}
    return {"metadata": {"namespace": namespace, "name": name}, "data": data}


@given(namespace=names.filter(lambda n: n not in (ADMIN, "*")), namespaces=lists, pools=lists)
def test_a_secret_outside_the_gateways_namespace_grants_its_own_namespace_at_most(
    namespace: str, namespaces: str | None, pools: str | None
) -> None:
    grant = parse_grant(namespace, ADMIN, namespaces, pools)
    if isinstance(grant, str):
        return  # refused whole: grants nothing
    assert not grant.everything
    for other in ("a", "b", "gateway", "team-x"):
        assert grant.allows((other, "pool")) == (other == namespace and namespace in grant.namespaces)
        assert all(key[0] == namespace for key in grant.pools)


@given(namespace=names, namespaces=lists, pools=lists)
def test_whatever_is_refused_is_said_and_whatever_is_granted_is_listed(
    namespace: str, namespaces: str | None, pools: str | None
) -> None:
    grant = parse_grant(namespace, ADMIN, namespaces, pools)
    if isinstance(grant, Grant):
        listed = {p.strip() for p in (namespaces or "").split(",") if p.strip()}
        assert grant.namespaces == (listed or ({namespace} if not grant.pools else set()))


def test_the_fields_grant_their_namespace_their_pools_or_both() -> None:
    assert parse_grant("a", ADMIN, None, None) == Grant(frozenset({"a"}))
    assert parse_grant("a", ADMIN, " ", "") == Grant(frozenset({"a"}))
    only = parse_grant("a", ADMIN, None, "bert, a/gpt")
    assert only == Grant(pools=frozenset({("a", "bert"), ("a", "gpt")}))
    assert isinstance(only, Grant) and not only.allows(("a", "other"))
    admin = parse_grant(ADMIN, ADMIN, "a,b", "c/x")
    assert admin == Grant(frozenset({"a", "b"}), frozenset({("c", "x")}))
    assert isinstance(admin, Grant) and not admin.allows((ADMIN, "x"))
    everything = parse_grant(ADMIN, ADMIN, "*", None)
    assert isinstance(everything, Grant) and everything.everything and everything.allows(("z", "p"))


def test_a_tenant_secret_naming_another_namespace_is_refused_whole() -> None:
    for namespaces, pools in (("a,b", None), ("*", None), (None, "b/x"), ("a", "b/x")):
        refused = parse_grant("a", ADMIN, namespaces, pools)
        assert isinstance(refused, str) and "only its own namespace a" in refused, (namespaces, pools)
    assert isinstance(parse_grant("a", ADMIN, None, "x/y/z"), str)
    assert isinstance(parse_grant("a", ADMIN, None, "/y"), str)


def test_the_store_keeps_digests_and_follows_secrets() -> None:
    store = KeyStore(ADMIN)
    store.set_secret(secret(ADMIN, "one", **{KEY_FIELD: KEY + "\n", NAMESPACES_FIELD: "a"}))
    assert store.grant(KEY.encode()) == Grant(frozenset({"a"}))
    assert KEY not in repr(vars(store)) and KEY.encode() not in repr(vars(store)).encode()
    # The same key in a second Secret: the union, until that Secret goes.
    store.set_secret(secret(ADMIN, "two", **{KEY_FIELD: KEY, POOLS_FIELD: "b/x"}))
    assert store.grant(KEY.encode()) == Grant(frozenset({"a"}), frozenset({("b", "x")}))
    store.delete_secret((ADMIN, "one"))
    assert store.grant(KEY.encode()) == Grant(pools=frozenset({("b", "x")}))
    # A Secret changed to another key: the old one stops.
    store.set_secret(secret(ADMIN, "two", **{KEY_FIELD: KEY + "-rotated"}))
    assert store.grant(KEY.encode()) is None and store.grant((KEY + "-rotated").encode()) is not None
    store.replace(ADMIN, [])
    assert len(store) == 0 and store.grant((KEY + "-rotated").encode()) is None


def test_invalid_key_secrets_are_refused() -> None:
    store = KeyStore(ADMIN)
    store.set_secret(secret(ADMIN, "short", **{KEY_FIELD: "short"}))
    store.set_secret(secret(ADMIN, "spaced", **{KEY_FIELD: "has a space in the key"}))
    store.set_secret(secret(ADMIN, "none", **{NAMESPACES_FIELD: "a"}))
    store.set_secret(secret("a", "foreign", **{KEY_FIELD: KEY, NAMESPACES_FIELD: "b"}))
    store.set_secret({"metadata": {"namespace": ADMIN, "name": "garbled"}, "data": {KEY_FIELD: "%%%"}})
    assert len(store) == 0 and store.grant(KEY.encode()) is None
    # A valid Secret turned invalid loses its key.
    store.set_secret(secret(ADMIN, "k", **{KEY_FIELD: KEY}))
    assert store.grant(KEY.encode()) is not None
    store.set_secret(secret(ADMIN, "k", **{KEY_FIELD: KEY, NAMESPACES_FIELD: "a", POOLS_FIELD: "/"}))
    assert store.grant(KEY.encode()) is None


def test_limits_are_positive_whole_numbers_or_absent() -> None:
    assert parse_limits(None, None) == Limits() and parse_limits("", "") == Limits()
    assert parse_limits("600", "100000") == Limits(600, 100000)
    assert parse_limits(str(MAX_PER_MINUTE), None) == Limits(MAX_PER_MINUTE, None)
    for bad in ("0", "-1", "1.5", "1e3", "ten", str(MAX_PER_MINUTE + 1), "²"):
        for requests, tokens in ((bad, None), (None, bad)):
            refused = parse_limits(requests, tokens)
            field = REQUESTS_PER_MINUTE_FIELD if requests else TOKENS_PER_MINUTE_FIELD
            assert isinstance(refused, str) and refused.startswith(field), (bad, refused)


def test_a_secret_with_an_invalid_limit_is_refused_whole_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = KeyStore(ADMIN)
    store.set_secret(secret(ADMIN, "k", **{KEY_FIELD: KEY, REQUESTS_PER_MINUTE_FIELD: "many"}))
    assert store.grant(KEY.encode()) is None
    assert f"key Secret {ADMIN}/k refused: requestsPerMinute" in caplog.text and KEY not in caplog.text
    store.set_secret(secret(ADMIN, "k", **{KEY_FIELD: KEY, TOKENS_PER_MINUTE_FIELD: " 500\n"}))
    assert store.limits_of(token_digest(KEY.encode())) == Limits(None, 500)


def test_a_key_in_several_secrets_gets_the_strictest_limits() -> None:
    store, digest = KeyStore(ADMIN), token_digest(KEY.encode())
    store.set_secret(secret(ADMIN, "admin", **{KEY_FIELD: KEY, REQUESTS_PER_MINUTE_FIELD: "10"}))
    store.set_secret(secret(ADMIN, "more", **{KEY_FIELD: KEY, TOKENS_PER_MINUTE_FIELD: "99"}))
    store.set_secret(secret(ADMIN, "loose", **{KEY_FIELD: KEY}))  # no limits: lifts none
    assert store.limits_of(digest) == Limits(10, 99)
    store.delete_secret((ADMIN, "admin"))
    assert store.limits_of(digest) == Limits(None, 99)
    assert store.limits_of(token_digest(b"no-such-key-at-all")) == Limits()


def test_a_keys_windows_go_only_when_no_secret_holds_it_any_more() -> None:
    gone: list[bytes] = []
    store = KeyStore(ADMIN, on_gone=gone.append)
    digest = token_digest(KEY.encode())
    one = secret(ADMIN, "one", **{KEY_FIELD: KEY, REQUESTS_PER_MINUTE_FIELD: "5"})
    store.set_secret(one)
    store.set_secret(secret(ADMIN, "one", **{KEY_FIELD: KEY, REQUESTS_PER_MINUTE_FIELD: "9"}))
    store.replace(ADMIN, [one])  # a relist listing it again
    store.set_secret(secret(ADMIN, "two", **{KEY_FIELD: KEY}))
    store.delete_secret((ADMIN, "one"))
    assert gone == []  # changed, relisted, or still held by another Secret: its windows stay
    store.set_secret(secret(ADMIN, "two", **{KEY_FIELD: KEY + "-rotated"}))
    assert gone == [digest]  # its last Secret now holds another key
    store.set_secret(secret(ADMIN, "two", **{KEY_FIELD: KEY + "-rotated", REQUESTS_PER_MINUTE_FIELD: "x"}))
    store.replace(ADMIN, [])
    assert gone == [digest, token_digest((KEY + "-rotated").encode())]


def test_the_bearer_token_is_read_from_the_authorization_header() -> None:
    assert bearer_token(b"Bearer abc") == b"abc"
    assert bearer_token(b"bearer  abc ") == b"abc"
    for header in (None, b"", b"Bearer", b"Bearer ", b"Basic abc", b"abc"):
        assert bearer_token(header) is None, header


def test_keys_are_read_in_the_gateways_namespace_and_tenant_namespaces_only_when_asked() -> None:
    assert key_namespaces("gw", False, ["a", "b"]) == ["gw"]
    assert key_namespaces("gw", True, ["a", "gw", "b"]) == ["gw", "a", "b"]
    assert isinstance(key_namespaces("gw", True, []), str)  # never every namespace's Secrets
    assert isinstance(key_namespaces(None, False, ["a"]), str)
    assert EVERYTHING.allows(("any", "pool"))


def test_keys_are_the_default_and_none_must_be_asked_for() -> None:
    assert GatewaySettings().auth == "keys" and GatewaySettings().tenant_keys is False
    assert GatewaySettings(auth="none").auth == "none"
    with pytest.raises(ValidationError):
        GatewaySettings(auth="off")  # type: ignore[arg-type]  # not one of its values: refused


def test_the_gateway_will_not_start_with_keys_it_cannot_read() -> None:
    """Outside a pod, --auth keys needs --keys-namespace; --tenant-keys needs --namespace: exit 2 at once,
    before the API server is contacted."""
    script = str(ROOT / ".venv" / "bin" / "modelpool-gateway")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MODELPOOL_GATEWAY_", "KUBERNETES_"))}
    for args, message in (
        ([], "--keys-namespace is needed"),
        (["--keys-namespace", "gw", "--tenant-keys"], "--tenant-keys needs --namespace"),
    ):
        done = subprocess.run(
            [script, "--kubeconfig", "/nonexistent", *args],
            capture_output=True,
            check=False,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 2 and message in done.stderr, (done.returncode, done.stderr)


def _store(settings: GatewaySettings, own: str) -> tuple[str, list[str]]:
    found = key_store(settings, own)
    assert not isinstance(found, str) and found[0] is not None, found
    return found[0].admin_namespace, found[1]


def test_admin_keys_live_in_a_namespace_of_their_own_and_tenant_keys_never_in_the_gateways() -> None:
    """The admin keys' namespace is --keys-namespace, else <own namespace>-keys (the chart's default too):
    never the release namespace, whose other Secrets hold the control seed and Helm's releases."""
    own = "mp-system"
    assert _store(GatewaySettings(), own) == ("mp-system-keys", ["mp-system-keys"])
    assert default_keys_namespace(own) == "mp-system-keys"
    assert _store(GatewaySettings(keys_namespace="vault"), own) == ("vault", ["vault"])
    tenants = GatewaySettings(keys_namespace="vault", tenant_keys=True, namespaces=["mp-system", "team-a"])
    assert _store(tenants, own) == ("vault", ["vault", "team-a"])


def test_the_gateways_own_namespace_is_never_watched() -> None:
    assert watch_scopes([], "mp-system") == [None]  # every namespace; the registry skips its own
    assert watch_scopes(["mp-system", "team-a", "team-a"], "mp-system") == ["team-a"]
    assert watch_scopes(["mp-system"], "mp-system") == []  # nothing to route (and a warning says so)
