"""frontend.restricted and its hooks: Triton's restricted API groups (the route table,
the flag parser, the HTTP and gRPC refusals) and --http-max-input-size (refused before
the body is read, chunked bodies stopped at the limit, decompression bounded)."""

import asyncio
import gzip
import json
import zlib

import pytest
from tritonclient.grpc import service_pb2

from frontend import http_codec, restricted
from frontend.http_server import make_http_app
from scheduler import cli
from scripts.attack_wire import gzip_of_zeros
from shm.errors import InferError
from shm.messages.settings import LogSettings
from tests.unit.test_http_server import FakeCore, infer_body

HINT = "Use --http-max-input-size to increase the limit."


# ----------------------------------------------------------------- the flag parser

def test_groups_are_tritons_and_agree_between_the_parser_and_the_route_table():
    """Rule: the nine group names are Triton's RESTRICTED_CATEGORY_NAMES, and the
    scheduler's parser and the frontends' table use the same ones."""
    assert restricted.GROUPS == cli.RESTRICTED_GROUPS == (
        "health", "metadata", "inference", "shared-memory", "model-config",
        "model-repository", "statistics", "trace", "logging")
    assert {g for _, g in restricted.HTTP_ROUTES} == set(restricted.GROUPS)
    assert set(restricted.GRPC_METHODS.values()) == set(restricted.GROUPS)


def test_parse_groups_keys_and_values():
    """Rule: API[,API]:KEY=VALUE, repeatable; every group of an item gets its
    header and value; the value may contain '=' and ':'; gRPC keys get the
    triton-grpc-protocol- prefix."""
    got = cli.parse_restrictions(["model-repository,shared-memory:admin=s:e=cret",
                                  "inference:user=u"], "http-restricted-api", "api")
    assert got == {"model-repository": ("admin", "s:e=cret"),
                   "shared-memory": ("admin", "s:e=cret"), "inference": ("user", "u")}
    args = cli.parse_args(["--model-repository", "/x",
                           "--grpc-restricted-protocol", "health:Key=v",
                           "--http-restricted-api", "trace,logging:k=v"])
    assert args.grpc_restricted_protocol == {"health": ("triton-grpc-protocol-key", "v")}
    assert args.http_restricted_api == {"trace": ("k", "v"), "logging": ("k", "v")}
    assert args.http_max_input_size == 64 * 1024 * 1024
    alias = cli.parse_args(["--model-repository", "/x", "--grpc-restricted-api",
                            "inference:k=v"])
    assert alias.grpc_restricted_protocol == {"inference": ("triton-grpc-protocol-k", "v")}


@pytest.mark.parametrize("items, kind, message", [
    (["health"], "api",
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health"),
    (["health:k"], "api", "option format is"),
    (["health:k="], "api", "option format is"),
    ([":k=v"], "api", "option format is"),
    (["health:=v"], "api", "option format is"),
    (["foo:k=v"], "api", "unknown restricted api 'foo'"),
    (["bar:k=v"], "protocol", "unknown restricted protocol 'bar'"),
    (["health,metadata:a=b", "health:c=d"], "api",
     "restricted api 'health' can not be specified in multiple config groups"),
    (["inference,inference:a=b"], "protocol",
     "restricted protocol 'inference' can not be specified in multiple config groups"),
])
def test_parse_errors_are_tritons(items, kind, message):
    """Rule: tritonserver's words for a malformed item, an unknown group and a group
    in two items (compared with tritonserver 2.51's output)."""
    with pytest.raises(ValueError) as e:
        cli.parse_restrictions(items, "http-restricted-api", kind)
    assert message in str(e.value)


@pytest.mark.parametrize("argv, message", [
    (["--http-restricted-api", "nope:k=v"], "unknown restricted api 'nope'"),
    (["--grpc-restricted-protocol", "health:k=v", "--grpc-restricted-protocol",
      "health:k=w"], "restricted protocol 'health' can not be specified"),
    (["--http-max-input-size", "0"], "--http-max-input-size must be greater than 0."),
    (["--http-max-input-size", "-5"], "--http-max-input-size must be greater than 0."),
])
def test_command_line_refuses(argv, message, capsys):
    """Rule: a bad value stops the server at start, naming the problem."""
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--model-repository", "/x", *argv])
    assert e.value.code != 0
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------- the route table

@pytest.mark.parametrize("path, group", [
    ("/v2/health/live", "health"), ("/v2/health/ready", "health"),
    ("/v2/models/m/ready", "health"), ("/v2/models/m/versions/2/ready", "health"),
    ("/v2", "metadata"), ("/v2/models/m", "metadata"),
    ("/v2/models/m/versions/3", "metadata"),
    ("/v2/models/m/infer", "inference"), ("/v2/models/m/versions/1/infer", "inference"),
    ("/v2/models/m/generate", "inference"), ("/v2/models/m/generate_stream", "inference"),
    ("/v2/models/m/infer_stream", "inference"),
    ("/v2/models/m/config", "model-config"),
    ("/v2/models/stats", "statistics"), ("/v2/models/m/stats", "statistics"),
    ("/v2/models/m/versions/1/stats", "statistics"),
    ("/v2/trace/setting", "trace"), ("/v2/models/m/trace/setting", "trace"),
    ("/v2/logging", "logging"),
    ("/v2/systemsharedmemory/status", "shared-memory"),
    ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
    ("/v2/repository/index", "model-repository"),
    ("/v2/repository/models/m/load", "model-repository"),
    ("/v2/repository/models/m/unload", "model-repository"),
    ("/metrics", None), ("/v2/nothing/here", None),
])
def test_http_paths_belong_to_tritons_groups(path, group):
    """Rule: each endpoint is in the group Triton's HTTP server checks for it (model
    ready is health, generate is inference, both trace paths are trace)."""
    assert restricted.http_group(path) == group


def test_every_http_route_of_the_app_has_a_group():
    """Rule: no route escapes a restriction: each route the app serves is in a group."""
    app = make_http_app(FakeCore())
    for route in app.routes:
        path = route.path.replace("{model_name}", "m").replace("{version}", "1") \
            .replace("{name}", "r")
        assert restricted.http_group(path) is not None, route.path


def test_every_grpc_method_has_a_group():
    """Rule: every RPC of GRPCInferenceService (repository ones included) and the
    standard health service are in a group, so none escapes a restriction."""
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        name = restricted.grpc_method_name(f"/inference.GRPCInferenceService/{method.name}")
        assert name in restricted.GRPC_METHODS, method.name
    assert restricted.GRPC_METHODS[
        restricted.grpc_method_name("/grpc.health.v1.Health/Check")] == "health"


# ------------------------------------------------------------- the HTTP app, via ASGI

def drive(app, path, body=b"", headers=(), method="POST", chunked=False, pieces=4):
    """One request through the ASGI app. Returns (status, headers, body, number of body
    messages the app asked for). A chunked body has no Content-Length."""
    head = [(k.lower().encode(), str(v).encode()) for k, v in headers]
    if chunked:
        head.append((b"transfer-encoding", b"chunked"))
    else:
        head.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "server": ("t", 80),
             "client": ("t", 1), "headers": head}
    step = max(1, -(-len(body) // pieces))
    parts = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                for i, p in enumerate(parts)]
    sent, asked = [], [0]

    async def receive():
        asked[0] += 1
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    out = b"".join(m.get("body", b"") for m in sent[1:])
    return (sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]},
            out, asked[0])


@pytest.fixture
def guarded():
    return make_http_app(FakeCore(), restrictions={
        "model-config": ("admin-key", "s3cret"), "inference": ("user", "u"),
        "model-repository": ("admin-key", "s3cret")})


def test_http_restricted_group_needs_its_header(guarded):
    """Rule: a restricted API without its header, or with another value, is 403 with
    Triton's message; the right header (name in any case) passes; other groups are
    open; the refusal comes before the body is read."""
    status, head, out, asked = drive(guarded, "/v2/models/identity/config", method="GET")
    assert status == 403
    assert json.loads(out) == {"error": "This API is restricted, expecting header "
                                        "'admin-key'"}
    assert drive(guarded, "/v2/models/identity/config", method="GET",
                 headers=[("admin-key", "wrong")])[0] == 403
    assert drive(guarded, "/v2/models/identity/config", method="GET",
                 headers=[("Admin-Key", "s3cret")])[0] == 200
    assert drive(guarded, "/v2/models/identity", method="GET")[0] == 200  # metadata open
    _, body, headers = infer_body()
    status, _, out, asked = drive(guarded, "/v2/models/identity/infer", body, headers)
    assert (status, asked) == (403, 0)
    assert "expecting header 'user'" in json.loads(out)["error"]
    assert drive(guarded, "/v2/models/identity/infer", body,
                 [*headers, ("user", "u")])[0] == 200
    # a route no module serves yet is still covered by the table
    assert drive(guarded, "/v2/repository/index", b"{}")[0] == 403


def test_http_unrestricted_app_answers_everything():
    """Rule: with no restriction, nothing asks for a header."""
    app = make_http_app(FakeCore())
    assert drive(app, "/v2/models/identity/config", method="GET")[0] == 200


# ---------------------------------------------------------------- HTTP input limit

def test_declared_body_over_the_limit_is_refused_unread():
    """Rule: a Content-Length over --http-max-input-size is 400 with Triton's words
    (by request kind) before a byte is read, and the connection is closed."""
    app = make_http_app(FakeCore(), max_input_size=500)
    _, body, headers = infer_body(binary=False, batch=8)
    assert len(body) > 500
    status, head, out, asked = drive(app, "/v2/models/identity/infer", body, headers)
    assert (status, asked, head.get("connection")) == (400, 0, "close")
    assert json.loads(out)["error"] == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size "
        f"of 500 bytes. {HINT}")
    raw = bytes(4 * 16 * 8)
    status, _, out, asked = drive(app, "/v2/models/identity/infer", raw,
                                  [("Inference-Header-Content-Length", 0)])
    assert (status, asked) == (400, 0)
    assert json.loads(out)["error"] == (
        f"Raw input has a byte_size ({len(raw)} bytes) that exceeds the maximum allowed "
        f"value of 500 bytes. {HINT}")
    _, body, headers = infer_body(binary=True, batch=8)
    status, _, out, _ = drive(app, "/v2/models/identity/infer", body, headers)
    assert status == 400 and json.loads(out)["error"].startswith(
        f"request size of {len(body)} bytes exceeds the maximum allowed input size")
    # other routes too (the repository load carries model files in its body)
    status, _, out, asked = drive(app, "/v2/repository/models/x/load", b"{" * 2000)
    assert (status, asked) == (400, 0)
    # at the limit passes
    _, body, headers = infer_body(binary=True)
    app = make_http_app(FakeCore(), max_input_size=len(body))
    assert drive(app, "/v2/models/identity/infer", body, headers)[0] == 200


def test_chunked_body_is_stopped_at_the_limit():
    """Rule: a body without Content-Length is read only until it passes the limit,
    then refused; under the limit it is served whole, on the infer route and others."""
    _, body, headers = infer_body(binary=False, batch=8)
    app = make_http_app(FakeCore(), max_input_size=len(body) // 2)
    status, head, out, asked = drive(app, "/v2/models/identity/infer", body, headers,
                                     chunked=True, pieces=8)
    assert status == 400 and asked < 8
    assert "exceeds the maximum allowed input size" in json.loads(out)["error"]
    status, _, _, asked = drive(app, "/v2/logging", b" " * len(body), chunked=True,
                                pieces=8)
    assert status == 400 and asked < 8
    core = SettingsCore()
    app = make_http_app(core, max_input_size=len(body))
    assert drive(app, "/v2/models/identity/infer", body, headers, chunked=True)[0] == 200
    # a starlette route gets the whole body, replayed
    assert drive(app, "/v2/logging", b'{"log_verbose_level": 3}', chunked=True)[0] == 200
    assert core.update == {"log_verbose_level": 3}


class SettingsCore(FakeCore):
    update = None

    async def log_settings(self, update):
        self.update = update
        return LogSettings()


def test_decompressed_body_is_bounded():
    """Rule: the limit holds for the decompressed body too (a small gzip bomb is
    refused without inflating it whole); multi-member gzip and deflate still work."""
    bomb = gzip_of_zeros(10 << 20)  # built, not deflated: ~60 ms of CPU less
    with pytest.raises(InferError) as e:
        http_codec.decompress(bomb, "gzip", 1 << 20)
    assert e.value.message == ("Decompressed data size exceeds the maximum allowed value "
                               f"of {1 << 20} bytes. {HINT}")
    assert http_codec.decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip",
                                 4) == b"abcd"
    with pytest.raises(InferError):
        http_codec.decompress(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 3)
    assert http_codec.decompress(zlib.compress(b"x" * 100), "deflate", 100) == b"x" * 100
    with pytest.raises(InferError, match="failed to decompress"):
        http_codec.decompress(gzip.compress(b"abc")[:-4], "gzip", 100)
    _, body, headers = infer_body(binary=False, batch=8)
    app = make_http_app(FakeCore(), max_input_size=len(body) - 1)
    status, _, out, _ = drive(app, "/v2/models/identity/infer", gzip.compress(body),
                              [*headers, ("Content-Encoding", "gzip")])
    assert status == 400 and "Decompressed data size exceeds" in json.loads(out)["error"]
