"""KServe v2 / Open Inference Protocol codec, JSON and binary tensor extension, as tritonclient speaks it.

Pure functions: request bytes (+ the ``Inference-Header-Content-Length`` header) -> ``V2Request`` of
numpy arrays; output arrays -> response bytes (+ header value).  Every malformed input raises
``InvalidInput`` naming the tensor.  BYTES elements in the binary form are 4-byte little-endian length
prefixed.  The v2 ``timeout`` request parameter is in microseconds (tritonclient's unit).
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from model_server.errors import InvalidInput

DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
_BY_NUMPY = {v: k for k, v in DTYPES.items()}
MAX_ELEMENTS = 1 << 26  # a shape that claims more elements than this is refused before allocating


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool


@dataclass(frozen=True)
class V2Request:
    id: str | None
    inputs: dict[str, npt.NDArray[Any]]
    parameters: dict[str, Any]
    outputs: tuple[RequestedOutput, ...]  # empty: all outputs
    binary_default: bool  # parameters.binary_data_output

    @property
    def timeout_s(self) -> float | None:
        """The request's ``timeout`` parameter (microseconds) in seconds, if given and valid."""
        value = self.parameters.get("timeout")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise InvalidInput("parameter 'timeout' must be a positive number of microseconds")
        return float(value) / 1e6


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in raw):
        raise InvalidInput(f"input tensor '{name}': 'shape' must be a list of integers")
    if any(d < 0 for d in raw):
        raise InvalidInput(f"input tensor '{name}': negative dimension in shape {raw}")
    if math.prod(raw) > MAX_ELEMENTS:
        raise InvalidInput(f"input tensor '{name}': shape {raw} is too large")
    return tuple(raw)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def _from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> npt.NDArray[Any]:
    flat = _flatten(data)
    count = math.prod(shape)
    if len(flat) != count:
        raise InvalidInput(
            f"input tensor '{name}': shape {list(shape)} needs {count} elements, got {len(flat)}"
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=object)
        for i, x in enumerate(flat):
            if isinstance(x, str):
                out[i] = x.encode("utf-8", "surrogatepass")
            else:
                raise InvalidInput(f"input tensor '{name}': BYTES data must be strings")
        return out.reshape(shape)
    if any(isinstance(x, (str, dict)) or x is None for x in flat):
        raise InvalidInput(f"input tensor '{name}': {datatype} data must be numbers")
    try:
        return np.asarray(flat, dtype=DTYPES[datatype]).reshape(shape)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input tensor '{name}': cannot convert data to {datatype}: {exc}") from None


def _from_binary(name: str, datatype: str, shape: tuple[int, ...], raw: bytes) -> npt.NDArray[Any]:
    count = math.prod(shape)
    if datatype == "BYTES":
        items: list[bytes] = []
        pos = 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise InvalidInput(f"input tensor '{name}': truncated BYTES element length")
            (n,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            if pos + n > len(raw):
                raise InvalidInput(f"input tensor '{name}': BYTES element overruns the binary data")
            items.append(raw[pos : pos + n])
            pos += n
        if len(items) != count:
            raise InvalidInput(
                f"input tensor '{name}': shape {list(shape)} needs {count} elements, got {len(items)}"
            )
        out = np.empty(count, dtype=object)
        out[:] = items
        return out.reshape(shape)
    dtype = DTYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(
            f"input tensor '{name}': {len(raw)} bytes of binary data "
            f"do not fit shape {list(shape)} {datatype}"
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def decode_request(body: bytes, header_length: str | None) -> V2Request:
    """Parse an infer request body (JSON, or JSON header + binary tensors)."""
    head, binary = _split_body(body, header_length)
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("request body must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request must have a non-empty 'inputs' list")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be an object")
    binary_default = bool(parameters.get("binary_data_output", False))
    rid = doc.get("id")
    return V2Request(
        id=rid if isinstance(rid, str) else None,
        inputs=_decode_inputs(raw_inputs, binary),
        parameters=parameters,
        outputs=_requested_outputs(doc.get("outputs") or [], binary_default),
        binary_default=binary_default,
    )


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """(JSON header, binary tensor data) by ``Inference-Header-Content-Length``."""
    if header_length is None:
        return body, b""
    try:
        hlen = int(header_length)
    except ValueError:
        raise InvalidInput("Inference-Header-Content-Length must be an integer") from None
    if hlen < 0 or hlen > len(body):
        raise InvalidInput("Inference-Header-Content-Length is larger than the body")
    return body[:hlen], body[hlen:]


def _decode_inputs(raw_inputs: list[Any], binary: bytes) -> dict[str, npt.NDArray[Any]]:
    """The input tensors by name; binary ones take their bytes from ``binary`` in order."""
    inputs: dict[str, npt.NDArray[Any]] = {}
    pos = 0
    for spec in raw_inputs:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidInput("each input must be an object with a 'name'")
        name = spec["name"]
        if name in inputs:
            raise InvalidInput(f"input tensor '{name}' given twice")
        datatype = spec.get("datatype")
        if not isinstance(datatype, str) or datatype not in DTYPES:
            raise InvalidInput(f"input tensor '{name}': unknown datatype {datatype!r}")
        shape = _shape(spec.get("shape"), name)
        params = spec.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"input tensor '{name}': 'parameters' must be an object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or pos + size > len(binary):
                raise InvalidInput(f"input tensor '{name}': binary_data_size does not match the body")
            inputs[name] = _from_binary(name, datatype, shape, binary[pos : pos + size])
            pos += size
        elif "data" in spec:
            inputs[name] = _from_json(name, datatype, shape, spec["data"])
        else:
            raise InvalidInput(f"input tensor '{name}' has neither 'data' nor binary_data_size")
    if pos != len(binary):
        raise InvalidInput(f"{len(binary) - pos} bytes of binary data belong to no input")
    return inputs


def _requested_outputs(raw_outputs: Any, binary_default: bool) -> tuple[RequestedOutput, ...]:
    if not isinstance(raw_outputs, list):
        raise InvalidInput("'outputs' must be a list")
    outputs: list[RequestedOutput] = []
    for out in raw_outputs:
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name'")
        oparams = out.get("parameters") or {}
        binary_flag = (
            oparams.get("binary_data", binary_default) if isinstance(oparams, dict) else binary_default
        )
        outputs.append(RequestedOutput(out["name"], bool(binary_flag)))
    return tuple(outputs)


def _datatype(array: npt.NDArray[Any]) -> str:
    try:
        return _BY_NUMPY[array.dtype]
    except KeyError:
        raise TypeError(f"no v2 datatype for numpy dtype {array.dtype}") from None


def _bytes_json(x: Any) -> str:
    raw = x if isinstance(x, bytes) else str(x).encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # binary payloads (PNG...) as base64; prefer binary_data outputs for those
        return base64.b64encode(raw).decode()


def _to_binary(array: npt.NDArray[Any]) -> bytes:
    if array.dtype == np.object_:
        parts = []
        for x in array.reshape(-1).tolist():
            raw = x if isinstance(x, bytes) else str(x).encode()
            parts.append(struct.pack("<I", len(raw)))
            parts.append(raw)
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def encode_response(
    model_name: str,
    request: V2Request,
    outputs: Mapping[str, npt.NDArray[Any]],
) -> tuple[bytes, int | None]:
    """Output tensors -> (body, Inference-Header-Content-Length or None for pure JSON)."""
    if request.outputs:
        wanted = []
        for req in request.outputs:
            if req.name not in outputs:
                names = ", ".join(sorted(outputs))
                raise InvalidInput(f"unknown output tensor '{req.name}'; this model has: {names}")
            wanted.append((req.name, req.binary))
    else:
        wanted = [(name, request.binary_default) for name in outputs]
    doc_outputs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in wanted:
        array = outputs[name]
        entry: dict[str, Any] = {"name": name, "datatype": _datatype(array), "shape": list(array.shape)}
        if binary:
            blob = _to_binary(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif array.dtype == np.object_:
            entry["data"] = [_bytes_json(x) for x in array.reshape(-1).tolist()]
        else:
            entry["data"] = array.reshape(-1)
        doc_outputs.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": doc_outputs}
    if request.id is not None:
        doc["id"] = request.id
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)
