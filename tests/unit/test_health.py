"""Server readiness rules (--strict-readiness) and the grpc.health.v1 service, over a
fake core."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest

from frontend import grpc_health
from frontend.dataplane import all_models_ready
from frontend.types import ModelView
from scheduler.processes.frontend_pool import PortInUse, claim_port
from tests.unit.fake_dataplane import FakeDataPlane

pytestmark = pytest.mark.timeout(60)


def view(state: str, reason: str = "") -> ModelView:
    return ModelView("m", 1, state, reason, None)


def test_strict_rule_all_ready():
    """Rule: ready when every version of every model is READY (and with no models)."""
    assert all_models_ready({})
    assert all_models_ready({"a": {1: view("READY")}, "b": {1: view("READY"),
                                                            2: view("READY")}})


@pytest.mark.parametrize("state, reason", [("UNAVAILABLE", "failed to load"),
                                           ("LOADING", ""), ("UNLOADING", ""),
                                           ("UNAVAILABLE", "")])
def test_strict_rule_one_version_down_is_not_ready(state, reason):
    """Rule (Triton's IsReady): one version that is not READY makes the server not
    ready, even beside a READY version of the same model."""
    assert not all_models_ready({"a": {1: view("READY")},
                                 "b": {1: view("READY"), 2: view(state, reason)}})


def test_strict_rule_unloaded_versions_do_not_count():
    """Rule: a version unloaded on purpose (reason "unloaded") leaves readiness alone."""
    assert all_models_ready({"a": {1: view("READY")},
                             "b": {1: view("UNAVAILABLE", "unloaded")}})


def test_strict_rule_model_without_versions_is_not_ready():
    """Rule: a model with no version state at all cannot be served: not ready."""
    assert not all_models_ready({"a": {}})


def test_response_wire_form():
    """HealthCheckResponse{status} is field 1 as a varint; encode and decode agree
    with the protobuf wire format (SERVING = 1, NOT_SERVING = 2)."""
    assert grpc_health.encode_response(grpc_health.SERVING) == b"\x08\x01"
    assert grpc_health.decode_response(b"\x08\x02") == grpc_health.NOT_SERVING
    assert grpc_health.decode_response(b"") == 0
    assert grpc_health.encode_request("x" * 200)[:3] == b"\x0a\xc8\x01"


class FakeCore(FakeDataPlane):
    def __init__(self):
        self.ready = False
        self.stopping = False

    def server_ready(self) -> bool:
        return self.ready


async def _serve(core):
    server = grpc.aio.server()
    grpc_health.register(server, core)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, grpc.aio.insecure_channel(f"127.0.0.1:{port}")


async def _check(channel, service: str = "") -> int:
    call = channel.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=None, response_deserializer=None)
    return grpc_health.decode_response(await call(grpc_health.encode_request(service),
                                                  timeout=10))


def test_check_follows_readiness():
    """Rule: Check answers NOT_SERVING while the server is not ready and SERVING once
    it is, whatever service name is asked (Triton does not look at it)."""
    async def run():
        core = FakeCore()
        server, channel = await _serve(core)
        try:
            assert await _check(channel) == grpc_health.NOT_SERVING
            core.ready = True
            assert await _check(channel) == grpc_health.SERVING
            assert await _check(channel, "inference.GRPCInferenceService") == \
                grpc_health.SERVING
        finally:
            await channel.close()
            await server.stop(None)
    asyncio.run(run())


def test_watch_streams_changes_and_ends_when_stopping():
    """Rule: Watch sends the status at once, again on each change, and ends with
    NOT_SERVING when the server stops."""
    async def run():
        core = FakeCore()
        server, channel = await _serve(core)
        try:
            watch = channel.unary_stream("/grpc.health.v1.Health/Watch",
                                         request_serializer=None,
                                         response_deserializer=None)
            call = watch(b"", timeout=30)
            assert grpc_health.decode_response(await call.read()) == grpc_health.NOT_SERVING
            core.ready = True
            assert grpc_health.decode_response(await call.read()) == grpc_health.SERVING
            core.ready, core.stopping = False, True
            assert grpc_health.decode_response(await call.read()) == grpc_health.NOT_SERVING
            assert await call.read() is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
        finally:
            await channel.close()
            await server.stop(None)
    asyncio.run(run())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_claim_port_twice_fails_naming_the_port():
    """Rule: one server holds a port's claim; a second claim fails at once, naming the
    port and its flag, and succeeds once the first is released."""
    port = _free_port()
    lock = claim_port("--http-port", "127.0.0.1", port)
    try:
        with pytest.raises(PortInUse, match=f"port {port} \\(--http-port\\) is already "
                                            "in use by another shmserve"):
            claim_port("--http-port", "127.0.0.1", port)
    finally:
        lock.close()
    claim_port("--http-port", "127.0.0.1", port).close()


def test_claim_port_fails_when_anything_listens():
    """Rule: a port another program listens on (even with SO_REUSEPORT, as our own
    frontends bind) cannot be claimed."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {port} \\(--grpc-port\\) on "
                                            "127.0.0.1 is already in use"):
            claim_port("--grpc-port", "127.0.0.1", port)


def test_claimed_port_still_binds_with_reuseport():
    """Rule: the claim leaves the port free for the server's own frontends, which
    bind it with SO_REUSEPORT after the claim."""
    port = _free_port()
    lock = claim_port("--http-port", "127.0.0.1", port)
    try:
        socks = []
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
            socks.append(s)
        for s in socks:
            s.close()
    finally:
        lock.close()
