"""Hostile HTTP requests for the model server and the gateway: hypothesis strategies that build raw request
bodies and headers per route group, the checks every answer must pass, and a raw-socket exchange for
what an HTTP client library refuses to send.

A ``Case`` is one request (method, path, headers, body bytes); ``Tally.check`` asserts the contract on its
answer: no 5xx except those the caller allows (and a 504 only where the case set a short deadline), and
every 4xx carries a reason in its body.  The strategies mix well-formed requests (so the success path is
exercised too) with near-valid ones (one field of the wrong type, out of range, truncated, invalid
UTF-8, lone surrogates) and junk.  Texts the echo handler treats as failure triggers (``boom``, ``fatal``,
``oom``, ``bad``) are never generated.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

MODEL = "echo"
# The echo handler's failure triggers (testkit/echo_models.py): never sent by the fuzzer.
TRIGGERS = frozenset({"boom", "fatal", "oom", "bad", "nohint", "unpicklable"})
DTYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
          "FP32", "FP64", "BYTES"]  # fmt: skip
_ITEMSIZE = {"BOOL": 1, "UINT8": 1, "UINT16": 2, "UINT32": 4, "UINT64": 8, "INT8": 1, "INT16": 2,
             "INT32": 4, "INT64": 8, "FP16": 2, "FP32": 4, "FP64": 8}  # fmt: skip
HEADER_LENGTH = "Inference-Header-Content-Length"


def FUZZ_SETTINGS(examples: int) -> settings:  # noqa: N802 - used as a decorator, like hypothesis' own
    """Deterministic (derandomized, no example database), no deadline (a shared CI machine), no health
    checks (the strategies are large on purpose), no shrinking beyond the first failure's."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
    )


@dataclass(frozen=True)
class Case:
    """One request.  ``may_time_out``: the case set a deadline short enough that a 504 is the answer
    the documentation promises."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    may_time_out: bool = False

    def send(self, client: httpx.Client, extra: dict[str, str] | None = None) -> httpx.Response:
        return client.request(
            self.method, self.path, headers={**self.headers, **(extra or {})}, content=self.body or None
        )


@dataclass
class Tally:
    """The answers seen; ``check`` asserts the contract on each."""

    codes: Counter[int] = field(default_factory=Counter)

    def check(self, case: Case, response: httpx.Response, allowed_5xx: Iterable[int] = ()) -> None:
        code = response.status_code
        self.codes[code] += 1
        where = f"{case.method} {case.path} {case.headers} {case.body[:300]!r}"
        if code >= 500:
            timeout = code == 504 and case.may_time_out
            assert timeout or code in set(allowed_5xx), f"{where}: {code} {response.text[:500]}"
        if 400 <= code < 500 and case.method != "HEAD":
            assert reason(response), f"{where}: {code} without a reason: {response.text[:300]!r}"

    def assert_varied(self, examples: int) -> None:
        """Every example was sent, and both accepted and refused answers were among them."""
        total = sum(self.codes.values())
        assert total >= examples, f"only {total} cases ran: {self.codes}"
        assert any(400 <= c < 500 for c in self.codes), self.codes


def reason(response: httpx.Response) -> str:
    """The reason in an error body: ``{"error": "..."}`` (v2), ``{"error": {"message": ...}}`` (/v1)."""
    try:
        doc = response.json()
    except ValueError:
        return ""
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return error if isinstance(error, str) else ""


# ---- values -------------------------------------------------------------------------------------------

# Text as clients send it (any code point but the surrogates), lone surrogates (valid JSON escapes that
# are not valid Unicode text), and the failure triggers left out.
plain_text = st.text(max_size=24).filter(lambda t: t not in TRIGGERS)
surrogate_text = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
any_text = st.one_of(plain_text, plain_text, plain_text, surrogate_text)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 1e308, -1e308, 0.5]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text)
junk = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(plain_text, inner, max_size=4),
    max_leaves=8,
)  # fmt: skip
# Header-safe printable ASCII (h11 refuses leading or trailing blanks in a value before sending).
ascii_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip)
timeouts = st.sampled_from(["abc", "-1", "0", "nan", "inf", "-inf", "1e308", "5", "30", "1e-9", ""])


def dumps(doc: Any) -> bytes:
    """JSON as bytes; lone surrogates become ``\\udXXX`` escapes (as a hostile client writes them)."""
    return json.dumps(doc).encode()


@st.composite
def corrupt(draw: st.DrawFn, body: bytes) -> bytes:
    """Usually the body as it is; else truncated, with invalid UTF-8 spliced in, or replaced by noise."""
    kind = draw(st.sampled_from(["same"] * 6 + ["truncate", "invalid-utf8", "noise"]))
    if kind == "same" or not body:
        return body
    at = draw(st.integers(min_value=0, max_value=len(body)))
    if kind == "truncate":
        return body[:at]
    if kind == "invalid-utf8":
        return (
            body[:at]
            + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"]))
            + body[at:]
        )
    return draw(st.binary(max_size=64))


def with_extra_keys(base: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict strategy, sometimes with unknown keys added (clients send fields a server has no use for)."""

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        doc = dict(draw(base))
        if draw(st.booleans()):
            doc.update(draw(st.dictionaries(plain_text, junk, max_size=2)))
        return doc

    return build()


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict whose every key is present or not."""
    return st.fixed_dictionaries({}, optional=fields)


def headers_with(content_type: bool = True) -> st.SearchStrategy[dict[str, str]]:
    fields: dict[str, st.SearchStrategy[str]] = {
        "x-request-timeout": timeouts,
        "x-fuzz": ascii_value,
        "accept": st.sampled_from(["*/*", "application/json", "text/event-stream", "image/png", ""]),
    }
    if content_type:
        fields["content-type"] = st.sampled_from(
            ["application/json", "text/plain", "application/octet-stream", "multipart/form-data", ""]
        )
    return st.fixed_dictionaries({}, optional=fields)


HEADERS = headers_with()
HEADERS_BINARY = headers_with(content_type=False)


def short_deadline(headers: dict[str, str], parameters: Any = None) -> bool:
    """Whether a case asks for a deadline short enough to expire before an echo answer (504)."""
    try:
        header = float(headers.get("x-request-timeout", "inf"))
    except ValueError:
        header = float("inf")
    param = parameters.get("timeout") if isinstance(parameters, dict) else None
    small_param = isinstance(param, (int, float)) and not isinstance(param, bool) and 0 < param < 2e6
    return 0 < header < 2 or small_param


# ---- the OpenAI routes --------------------------------------------------------------------------------

embedding_inputs = st.one_of(
    any_text, st.lists(any_text, max_size=5), st.lists(st.integers(-5, 70000), max_size=4),
    st.lists(st.lists(st.integers(-5, 70000), max_size=3), max_size=3), junk,
)  # fmt: skip
model_names = st.one_of(st.just(MODEL), st.just(MODEL), any_text, junk)
messages = st.lists(
    optional(role=st.one_of(st.sampled_from(["user", "system", "assistant", "tool"]), junk),
             content=st.one_of(any_text, st.lists(junk, max_size=2), junk)),
    max_size=3,
)  # fmt: skip
OPENAI_BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "/v1/embeddings": with_extra_keys(
        st.fixed_dictionaries(
            {"input": embedding_inputs},
            optional={
                "model": model_names,
                "encoding_format": st.one_of(st.sampled_from(["float", "base64"]), junk),
                "dimensions": st.one_of(st.integers(-3, 5), junk),
                "user": junk,
            },
        )
    ),
    "/v1/completions": with_extra_keys(
        optional(
            model=model_names,
            prompt=st.one_of(any_text, st.lists(any_text, max_size=3), junk),
            max_tokens=st.one_of(st.integers(-5, 10**9), junk),
            stream=st.one_of(st.booleans(), junk),
            temperature=st.one_of(numbers, junk),
            seed=st.one_of(numbers, junk),
        )
    ),
    "/v1/chat/completions": with_extra_keys(
        optional(
            model=model_names,
            messages=st.one_of(messages, junk),
            stream=st.one_of(st.booleans(), junk),
            max_completion_tokens=st.one_of(st.integers(-5, 10**9), junk),
        )
    ),
    "/v1/images/generations": with_extra_keys(
        optional(
            model=model_names,
            prompt=st.one_of(any_text, junk),
            size=st.one_of(ascii_value, junk),
            n=st.one_of(st.integers(-2, 100), junk),
            response_format=st.one_of(ascii_value, junk),
        )
    ),
}
OPENAI_PATHS = ["/v1/embeddings"] * 5 + [p for p in OPENAI_BODIES if p != "/v1/embeddings"]


@st.composite
def openai_cases(draw: st.DrawFn) -> Case:
    """The OpenAI routes, embeddings most of all (the task this server has); some with the wrong method,
    a junk body (not an object) or a corrupted one."""
    path = draw(st.sampled_from(OPENAI_PATHS))
    method = draw(st.sampled_from(["POST"] * 12 + ["GET", "PUT", "DELETE"]))
    doc: Any = draw(st.one_of(OPENAI_BODIES[path], OPENAI_BODIES[path], OPENAI_BODIES[path], junk))
    headers = draw(HEADERS)
    body = draw(corrupt(dumps(doc)))
    return Case(method, path, headers, body, short_deadline(headers))


# ---- KServe v2 infer, JSON ----------------------------------------------------------------------------

infer_names = st.one_of(st.just(MODEL), st.just(MODEL), st.just(MODEL), plain_text.filter(bool))
shapes = st.one_of(
    st.lists(st.integers(0, 4), max_size=3),
    st.lists(st.integers(-3, 2**62), max_size=3),
    junk,
)


@st.composite
def well_formed_text_tensor(draw: st.DrawFn) -> dict[str, Any]:
    texts = draw(st.lists(plain_text, min_size=1, max_size=4))
    return {"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}


tensor_data = st.one_of(
    st.lists(any_text, max_size=4), st.lists(numbers, max_size=4),
    st.lists(st.lists(numbers, max_size=3), max_size=3), st.lists(junk, max_size=3), junk,
)  # fmt: skip
fuzzy_tensor = optional(
    name=st.one_of(st.just("text"), st.just("text"), plain_text, junk),
    shape=shapes,
    datatype=st.one_of(st.sampled_from(DTYPES), st.sampled_from(DTYPES), junk),
    data=tensor_data,
    parameters=st.one_of(optional(binary_data_size=st.one_of(st.integers(-2, 10), junk)), junk),
)
v2_parameters = st.one_of(
    optional(timeout=st.one_of(st.integers(-5, 10**18), numbers, junk),
             binary_data_output=st.one_of(st.booleans(), junk), max_tokens=junk),
    junk,
)  # fmt: skip
v2_outputs = st.one_of(
    st.lists(optional(name=st.one_of(st.just("embedding"), plain_text, junk),
                      parameters=st.one_of(optional(binary_data=st.one_of(st.booleans(), junk)), junk)),
             max_size=2),
    junk,
)  # fmt: skip


V2_INPUTS = st.lists(
    st.one_of(well_formed_text_tensor(), well_formed_text_tensor(), fuzzy_tensor), min_size=1, max_size=3
)
V2_EXTRAS = optional(id=st.one_of(plain_text, junk), parameters=v2_parameters, outputs=v2_outputs)


@st.composite
def v2_document(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = draw(V2_EXTRAS)
    if draw(st.integers(0, 9)):
        doc["inputs"] = draw(V2_INPUTS)
    elif draw(st.booleans()):
        doc["inputs"] = draw(junk)
    return doc


def infer_path(draw: st.DrawFn) -> str:
    name = quote(draw(infer_names), safe="")
    form = draw(st.sampled_from(["plain"] * 8 + ["version-1", "version-junk"]))
    if form == "plain":
        return f"/v2/models/{name}/infer"
    version = "1" if form == "version-1" else quote(draw(plain_text), safe="")
    return f"/v2/models/{name}/versions/{version}/infer"


@st.composite
def v2_json_cases(draw: st.DrawFn) -> Case:
    """v2 infer with a JSON body: well-formed text tensors, fuzzy tensors, junk documents."""
    path = infer_path(draw)
    doc: Any = draw(st.one_of(v2_document(), v2_document(), v2_document(), junk))
    headers = draw(HEADERS)
    body = draw(corrupt(dumps(doc)))
    params = doc.get("parameters") if isinstance(doc, dict) else None
    return Case("POST", path, headers, body, short_deadline(headers, params))


# ---- KServe v2 infer, binary tensor extension ---------------------------------------------------------


def bytes_elements(items: list[bytes]) -> bytes:
    """BYTES tensor data in the binary form: each element 4-byte little-endian length prefixed."""
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


@st.composite
def binary_tensor(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """A tensor spec with ``binary_data_size`` and its bytes: usually consistent, else one thing off
    (truncated or overrunning data, a wrong size, a wrong datatype or shape, a bad length prefix)."""
    datatype = draw(st.sampled_from(["BYTES"] * 6 + DTYPES))
    count = draw(st.integers(0, 4))
    if datatype == "BYTES":
        items = draw(st.lists(st.one_of(plain_text.map(str.encode), st.binary(max_size=8)),
                              min_size=count, max_size=count))  # fmt: skip
        raw = bytes_elements(items)
    else:
        raw = draw(st.binary(min_size=count * _ITEMSIZE[datatype], max_size=count * _ITEMSIZE[datatype]))
    spec: dict[str, Any] = {"name": "text", "shape": [count], "datatype": datatype}
    flaw = draw(st.sampled_from(["none"] * 5 + ["truncate", "overrun", "size", "shape", "prefix", "name"]))
    if flaw == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif flaw == "overrun":
        raw += draw(st.binary(min_size=1, max_size=6))
    elif flaw == "shape":
        spec["shape"] = draw(shapes)
    elif flaw == "prefix":
        raw = struct.pack("<I", draw(st.sampled_from([2**32 - 1, 2**31, 10**6]))) + raw
    elif flaw == "name":
        spec["name"] = draw(st.one_of(plain_text, junk))
    # The size the header declares: the data's own, except where that is the flaw.
    size: Any = draw(st.one_of(st.integers(-3, 3 * len(raw) + 3), junk)) if flaw == "size" else len(raw)
    spec["parameters"] = {"binary_data_size": size}
    return spec, raw


BINARY_EXTRAS = optional(parameters=v2_parameters, outputs=v2_outputs)


@st.composite
def v2_binary_cases(draw: st.DrawFn) -> Case:
    """v2 infer with the binary tensor extension: a JSON header of ``Inference-Header-Content-Length``
    bytes, then each tensor's bytes; the header length itself sometimes wrong or not a number."""
    path = infer_path(draw)
    tensors = draw(st.lists(binary_tensor(), min_size=1, max_size=3))
    names = [f"text{i}" if i else t[0]["name"] for i, t in enumerate(tensors)]
    for name, (spec, _) in zip(names, tensors, strict=True):
        spec["name"] = name
    doc: dict[str, Any] = {"inputs": [spec for spec, _ in tensors]}
    doc.update(draw(BINARY_EXTRAS))
    head = draw(corrupt(dumps(doc)))
    payload = b"".join(raw for _, raw in tensors)
    length = draw(st.one_of(
        st.just(str(len(head))), st.just(str(len(head))), st.just(str(len(head))),
        st.integers(-5, len(head) + len(payload) + 5).map(str), ascii_value,
    ))  # fmt: skip
    headers = {**draw(HEADERS_BINARY), HEADER_LENGTH: length}
    headers["content-type"] = draw(st.sampled_from(["application/octet-stream", "application/json", ""]))
    body = head + payload
    if draw(st.integers(0, 5)) == 0:  # truncated in transit
        body = body[: draw(st.integers(0, len(body)))]
    params = doc.get("parameters")
    return Case("POST", path, headers, body, short_deadline(headers, params))


# ---- metadata and health ------------------------------------------------------------------------------

ROUTE_PATHS = [
    "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/{name}", "/v2/models/{name}/ready",
    "/v2/models/{name}/versions/{version}", "/v2/models/{name}/versions/{version}/ready", "/v1/models",
    "/v1/models/{name}", "/{junk}", "/v2/{junk}", "/v2/models/{name}/{junk}",
]  # fmt: skip
# /metrics and /stats gather every process's figures (tens of ms each): a few of them suffice.
META_PATHS = ROUTE_PATHS * 8 + ["/metrics", "/stats"]


@st.composite
def metadata_cases(draw: st.DrawFn) -> Case:
    """The GET routes: health, server and model metadata, model readiness, /metrics and /stats, with
    odd names, versions, query strings, methods and headers."""
    template = draw(st.sampled_from(META_PATHS))
    path = template.format(
        name=quote(draw(infer_names), safe=""),
        version=quote(draw(st.one_of(st.just("1"), plain_text)), safe=""),
        junk=quote(draw(plain_text), safe="/"),
    )
    if draw(st.integers(0, 4)) == 0:
        path += "?" + quote(draw(plain_text), safe="=&")
    method = draw(st.sampled_from(["GET"] * 10 + ["HEAD", "POST", "DELETE", "OPTIONS", "PATCH"]))
    body = draw(st.one_of(st.just(b""), st.just(b""), st.binary(max_size=32)))
    return Case(method, path, draw(HEADERS), body)


# ---- mutants ------------------------------------------------------------------------------------------
# Hypothesis draws each route's cases from the strategies above; drawing is the costly part (several ms a
# case), so each drawn case also yields ``MUTANTS - 1`` cheap variants from a seeded ``random.Random``:
# one JSON node replaced, removed or nested deep, a key added, the body truncated, a byte flipped,
# invalid UTF-8 spliced in, the binary header length moved.  Deterministic: the seed is drawn too.

MUTANTS = 10
_JUNK_SCALARS: list[Any] = [None, True, False, 0, -1, 1, 2**31, -(2**63), 2**64, 1e308, -0.0, 0.5, "",
                            "x", "\ud800", "\x00", "text", MODEL, "é" * 3, [], {}]  # fmt: skip


def rjunk(rnd: random.Random, depth: int = 2) -> Any:
    """A random JSON value (cheap: no hypothesis draws)."""
    kind = rnd.randrange(6) if depth > 0 else 0
    if kind <= 3:
        return rnd.choice(_JUNK_SCALARS)
    if kind == 4:
        return [rjunk(rnd, depth - 1) for _ in range(rnd.randrange(4))]
    return {rnd.choice(["name", "data", "shape", "input", "x", ""]): rjunk(rnd, depth - 1)
            for _ in range(rnd.randrange(3))}  # fmt: skip


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every node's path in a JSON document."""
    out = [path]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _nodes(value, (*path, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            out += _nodes(value, (*path, i))
    return out


def mutate_json(doc: Any, rnd: random.Random) -> Any:
    """``doc`` (a copy) with one node replaced, removed, deeply nested, or given an extra key."""
    doc = json.loads(json.dumps(doc))
    path = rnd.choice(_nodes(doc))
    op = rnd.choice(["replace", "replace", "remove", "nest", "add"])
    if not path:
        return rjunk(rnd) if op != "nest" else [[[[doc]]]]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if op == "replace":
        parent[last] = rjunk(rnd)
    elif op == "remove":
        del parent[last]
    elif op == "nest":
        parent[last] = json.loads("[" * 40 + json.dumps(parent[last]) + "]" * 40)
    elif isinstance(parent[last], dict):
        parent[last][rnd.choice(["zz", "name", "", "\ud800"])] = rjunk(rnd)
    else:
        parent[last] = rjunk(rnd)
    return doc


def mutate_bytes(body: bytes, rnd: random.Random) -> bytes:
    """``body`` truncated, with a byte flipped, invalid UTF-8 spliced in, or a slice repeated."""
    if not body:
        return bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 16)))
    at = rnd.randrange(len(body) + 1)
    op = rnd.randrange(4)
    if op == 0:
        return body[:at]
    if op == 1 and at < len(body):
        return body[:at] + bytes([body[at] ^ (1 << rnd.randrange(8))]) + body[at + 1 :]
    if op == 2:
        return body[:at] + rnd.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]) + body[at:]
    return body[:at] + body[at : at + 16] * rnd.randrange(1, 4) + body[at:]


def mutants(case: Case, seed: int, count: int = MUTANTS) -> list[Case]:
    """``case`` and ``count - 1`` variants of it, each with one thing changed."""
    rnd = random.Random(seed)
    out = [case]
    binary = HEADER_LENGTH in case.headers
    for _ in range(count - 1):
        headers = dict(case.headers)
        body = case.body
        op = rnd.randrange(5)
        if binary and op == 4:
            headers[HEADER_LENGTH] = rnd.choice(
                [str(rnd.randrange(-3, len(body) + 4)), "", "0x10", "1e3", "+5", str(2**64)]
            )
        elif op <= 2:
            try:
                head_len = int(headers[HEADER_LENGTH]) if binary else len(body)
                doc = json.loads(body[:head_len])
            except ValueError:
                body = mutate_bytes(body, rnd)
            else:
                head = json.dumps(mutate_json(doc, rnd)).encode()
                body = head + body[head_len:]
                if binary:
                    headers[HEADER_LENGTH] = str(len(head))
        else:
            body = mutate_bytes(body, rnd)
        out.append(Case(case.method, case.path, headers, body, case.may_time_out))
    return out


# ---- raw sockets --------------------------------------------------------------------------------------


# Header blocks over the bound (modelpool_contract.http_limits): one long header, many short ones, and a
# long URL.  Before the bound, uvicorn's httptools parser accepted each (and buffered it all).
HUGE_HEADERS = [
    b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%05d: v\r\n" % i for i in range(8000))
    + b"\r\n",
    b"GET /v2/health/ready?" + b"q" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
]


def raw_exchange(port: int, request: bytes, timeout: float = 10.0) -> tuple[int | None, bytes]:
    """Send raw bytes, read one answer: (status, body), or (None, b"") when the server closed the
    connection without answering (what a parser does with bytes that are not HTTP at all)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # The server may answer (and close) before reading everything: then read its answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = _content_length(head)
            while length is not None and len(body) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
        except ConnectionResetError:
            pass
    if not data.startswith(b"HTTP/1."):
        return None, b""
    return int(data.split(b" ", 2)[1]), body


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None
