"""The engine constructors (frontend/transport/engines.py): one per protocol, handed
what the frontend built over its data plane (the HTTP app, the gRPC handler table),
giving the native engine or its fallback, each started and stopped the same way."""

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2

from frontend.grpc_server import SERVICE, handler_table
from frontend.http_server import make_http_app
from frontend.transport.engines import grpc_engine, http_engine
from frontend.transport.fallbacks import GrpcioServer, UvicornServer
from frontend.transport.grpc_native import NativeGrpcServer
from frontend.transport.http1 import NativeHttpServer
from tests.unit.fake_dataplane import FakeDataPlane

pytestmark = pytest.mark.timeout(60)
T = 10


async def http_live(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    status = await asyncio.wait_for(reader.readline(), T)
    writer.close()
    return status


@pytest.mark.parametrize("kind, cls", [("native", NativeHttpServer),
                                       ("uvicorn", UvicornServer)])
def test_each_http_engine_serves_the_app_it_is_given(kind, cls):
    async def scenario():
        engine = http_engine(kind, make_http_app(FakeDataPlane()), "127.0.0.1", 0)
        assert isinstance(engine, cls)
        await engine.start()
        try:
            return await http_live(engine.sock.getsockname()[1])
        finally:
            await engine.stop(1.0)

    assert asyncio.run(asyncio.wait_for(scenario(), T)).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("kind, cls", [("native", NativeGrpcServer),
                                       ("grpcio", GrpcioServer)])
def test_each_grpc_engine_serves_the_table_it_is_given(kind, cls):
    async def scenario():
        core = FakeDataPlane()
        engine = grpc_engine(kind, handler_table(core), "127.0.0.1:0", core)
        assert isinstance(engine, cls)
        await engine.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{engine.bound_port}") as ch:
                live = ch.unary_unary(f"/{SERVICE}/ServerLive",
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=service_pb2.ServerLiveResponse
                                      .FromString)
                return await live(service_pb2.ServerLiveRequest(), timeout=T)
        finally:
            await engine.stop(0)

    assert asyncio.run(asyncio.wait_for(scenario(), 2 * T)).live is True


def test_an_unknown_engine_is_refused():
    core = FakeDataPlane()
    with pytest.raises(ValueError, match="unknown gRPC frontend 'h2'"):
        grpc_engine("h2", handler_table(core), "127.0.0.1:0", core)
    with pytest.raises(ValueError, match="unknown HTTP frontend 'h11'"):
        http_engine("h11", make_http_app(core), "127.0.0.1", 0)
