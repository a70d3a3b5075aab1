"""TLS and mutual TLS on the gRPC port, both transports (the native one on uvloop, as
the frontends run it; grpc.aio), against tritonclient's ssl options, with
certificates made for the test by tests/tls_certs.py. The servers run in-process
over test_grpc_server's fake core."""

import asyncio
import socket
import ssl
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import uvloop
from tritonclient.utils import InferenceServerException

from frontend.grpc_server import handler_table
from frontend.grpc_tls import TlsSettings
from frontend.transport.engines import grpc_engine
from tests.unit.test_grpc_server import FakeCore, fp32_input

pytestmark = pytest.mark.timeout(60)
T = 10


class ArenaCore(FakeCore):
    """The fake core with the real one's arena hooks, so the native transport
    receives large messages into "arena blocks" here too (recorded by size)."""

    class arena:
        chunk_size = 64 << 20

    def __init__(self):
        super().__init__()
        self.blocks = []

    def body_buffer(self, nbytes, quota=None):
        self.blocks.append(nbytes)
        return memoryview(bytearray(nbytes)), ("block", len(self.blocks))

    def free_blocks(self, blocks):
        pass


class TlsServer:
    """The servicer on `frontend`'s engine with `tls`, on its own loop in a daemon
    thread."""

    def __init__(self, frontend: str, tls: TlsSettings, handshake_timeout=10.0):
        self.core = ArenaCore()
        self.loop = uvloop.new_event_loop() if frontend == "native" \
            else asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = self.call(self._start(frontend, tls, handshake_timeout))

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=T)

    async def _start(self, frontend, tls, handshake_timeout):
        self.server = grpc_engine(frontend, handler_table(self.core), "127.0.0.1:0",
                                  self.core, tls=tls,
                                  tls_handshake_timeout=handshake_timeout)
        await self.server.start()
        return self.server.bound_port

    def stop(self):
        self.call(self.server.stop(0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=T)
        self.loop.close()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def servers(request, certs):
    """(TLS server, mutual TLS server) on one transport."""
    plain = TlsServer(request.param, TlsSettings(certs.server_cert, certs.server_key))
    mutual = TlsServer(request.param, TlsSettings(certs.server_cert, certs.server_key,
                                                  certs.ca, mutual=True))
    yield request.param, plain, mutual
    plain.stop()
    mutual.stop()


def client(port, certs=None, cert=None, key=None, **kw):
    if certs is None:
        return grpcclient.InferenceServerClient(f"127.0.0.1:{port}", **kw)
    return grpcclient.InferenceServerClient(
        f"127.0.0.1:{port}", ssl=True, root_certificates=certs.ca, private_key=key,
        certificate_chain=cert, **kw)


def roundtrip(c, shape=(1, 16)):
    a = np.random.default_rng(1).random(shape, dtype=np.float32)
    r = c.infer("identity", [fp32_input(a)], client_timeout=T)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a)


def test_inference_over_tls_small_and_large(servers, certs):
    """[1,16] and a 1 MiB tensor both ways over TLS; on the native transport the
    large message is received into an arena block through the TLS transport and the
    reply goes out through its writelines."""
    frontend, plain, _ = servers
    with client(plain.port, certs) as c:
        assert c.is_server_ready(client_timeout=T)
        roundtrip(c)
        roundtrip(c, (16, 16384))
    if frontend == "native":
        assert any(n >= 1 << 20 for n in plain.core.blocks)


def test_plaintext_client_against_a_tls_port_fails_cleanly(servers, certs):
    _, plain, _ = servers
    with client(plain.port) as c:
        with pytest.raises(InferenceServerException) as e:
            c.is_server_live(client_timeout=T)
        assert "UNAVAILABLE" in str(e.value.status())
    with client(plain.port, certs) as c:  # and the server serves on
        roundtrip(c)


def test_mutual_tls_refuses_clients_without_a_trusted_certificate(servers, certs):
    _, _, mutual = servers
    with client(mutual.port, certs, certs.client_cert, certs.client_key) as c:
        roundtrip(c)
    for cert, key in ((None, None), (certs.stranger_cert, certs.stranger_key)):
        with client(mutual.port, certs, cert, key) as c:
            with pytest.raises(InferenceServerException) as e:
                c.is_server_live(client_timeout=T)
            assert "UNAVAILABLE" in str(e.value.status())
    with client(mutual.port, certs, certs.client_cert, certs.client_key) as c:
        roundtrip(c)


def test_native_tls_offers_h2_by_alpn(certs):
    srv = TlsServer("native", TlsSettings(certs.server_cert, certs.server_key))
    try:
        ctx = ssl.create_default_context(cafile=certs.ca)
        ctx.set_alpn_protocols(["http/1.1", "h2"])
        with socket.create_connection(("127.0.0.1", srv.port), timeout=T) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                assert tls.selected_alpn_protocol() == "h2"
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
    finally:
        srv.stop()


@pytest.mark.parametrize("frontend", ["native", "grpcio"])
def test_tls_handshake_has_a_deadline(frontend, certs):
    """A client that connects and sends nothing is dropped once the handshake
    timeout is over; the server serves on."""
    srv = TlsServer(frontend, TlsSettings(certs.server_cert, certs.server_key),
                    handshake_timeout=0.3)
    try:
        silent = socket.create_connection(("127.0.0.1", srv.port), timeout=T)
        start = time.monotonic()
        assert silent.recv(100) == b""  # closed by the server
        assert time.monotonic() - start < 5
        silent.close()
        with client(srv.port, certs) as c:
            roundtrip(c)
    finally:
        srv.stop()
