"""Triton's `--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request
headers (HTTP) or metadata (gRPC) whose name the regular expression matches anywhere
(a search, as Triton's RE2::PartialMatch) become string parameters of the inference
request, so the model reads them with `request.parameters()`.

The pattern matches case-insensitively, as Triton's (shm/header_pattern.py), so
`MY_HEADER.*` forwards `my_header_1`. Header names arrive lower-cased (HTTP/1.1 names
are case-insensitive and ASGI lower-cases them; gRPC metadata keys are lower-case by
rule) and are forwarded so: Triton's HTTP forwards the client's spelling.
"""

from __future__ import annotations

import re
from typing import Iterable


def forward(parameters: dict, headers: Iterable[tuple], pattern: re.Pattern | None) -> None:
    """Add each header matching `pattern` to `parameters` as a string. `headers` are
    (name, value) pairs of str or bytes. A parameter the request itself carries keeps
    its value (the body is what the client said explicitly); grpc's own reserved
    metadata (':authority', 'grpc-*', binary '-bin' keys) is never forwarded."""
    if pattern is None:
        return
    for name, value in headers:
        if isinstance(name, bytes):
            name = name.decode("latin-1")
        if name.startswith(":") or name.startswith("grpc-") or name.endswith("-bin"):
            continue
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if pattern.search(name) and name not in parameters:
            parameters[name] = value


def forward_into(request, headers: Iterable[tuple], pattern: re.Pattern | None) -> None:
    """`forward` into a DecodedRequest. Its parameters are replaced, never changed in
    place (a decoder's memo may share them), and where a header was added the verdict
    the request came with (`checked`, `memo`: a remembered header's or template's) is
    dropped: it was for the request without it."""
    if pattern is None:
        return
    params = dict(request.parameters)
    forward(params, headers, pattern)
    if len(params) != len(request.parameters):
        request.parameters = params
        request.checked = request.memo = None
