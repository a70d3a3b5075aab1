"""Triton's gRPC TLS, PING-abuse and connection-age flags on a real server, on both
gRPC transports: mutual TLS with certificates made for the test, checked with
tritonclient's ssl options; a raw HTTP/2 client that PINGs too often gets GOAWAY
ENHANCE_YOUR_CALM "too_many_pings" (the default strikes) while a tritonclient is
served; --grpc-max-connection-age makes tritonclient reconnect without an error."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from frontend.transport import h2
from tests.e2e.harness import EXAMPLES, ServerProcess
from tests.tls_certs import make_certs

pytestmark = pytest.mark.timeout(120)
T = 20  # client-side timeout of every call, seconds
AGE_MS = 1000


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request, certs, tmp_path_factory):
    srv = ServerProcess(EXAMPLES, "--model-control-mode=explicit",
                        "--load-model=identity_fp32", "--grpc-use-ssl-mutual=true",
                        "--grpc-server-cert", certs.server_cert,
                        "--grpc-server-key", certs.server_key,
                        "--grpc-root-cert", certs.ca,
                        "--grpc-max-connection-age", str(AGE_MS),
                        "--grpc-max-connection-age-grace", "30000",
                        log_dir=tmp_path_factory.mktemp("logs"))
    srv.argv += ["--grpc-frontend", request.param]  # last: over SHMSERVE_TEST_...
    yield from srv.serve()


def tls_client(server, certs, cert=True, **kw):
    return grpcclient.InferenceServerClient(
        server.grpc_url, ssl=True, root_certificates=certs.ca,
        private_key=certs.client_key if cert else None,
        certificate_chain=certs.client_cert if cert else None, **kw)


def infer(client, n=16):
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    i = grpcclient.InferInput("INPUT0", [1, n], "FP32")
    i.set_data_from_numpy(x)
    r = client.infer("identity_fp32", [i], client_timeout=T)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_tls_inference_with_a_client_certificate(server, certs):
    """[1,16] and 1 MiB each way over mutual TLS (on the native transport the 1 MiB
    request is received into shared memory through the TLS transport)."""
    with tls_client(server, certs) as c:
        assert c.is_server_ready(client_timeout=T)
        infer(c)
        infer(c, 1 << 18)


def test_untrusted_and_plaintext_clients_are_refused_and_the_server_serves_on(server,
                                                                               certs):
    with tls_client(server, certs, cert=False) as c:  # no client certificate
        with pytest.raises(InferenceServerException) as e:
            c.is_server_live(client_timeout=T)
        assert "UNAVAILABLE" in str(e.value.status())
    with grpcclient.InferenceServerClient(server.grpc_url) as c:  # no TLS at all
        with pytest.raises(InferenceServerException) as e:
            c.is_server_live(client_timeout=T)
        assert "UNAVAILABLE" in str(e.value.status())
    with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=T) as s:
        s.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))  # cleartext HTTP/2
        while s.recv(65536):  # perhaps a TLS alert, then closed (a hold times out)
            pass
    with tls_client(server, certs) as c:
        infer(c)


class RawH2:
    """A mutual-TLS HTTP/2 client speaking frames (tests.unit.test_h2's view)."""

    def __init__(self, server, certs):
        ctx = ssl.create_default_context(cafile=certs.ca)
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection(("127.0.0.1", server.grpc_port), timeout=T)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.buf = b""
        self.sock.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0))

    def frame(self):
        """(type, flags, stream, payload), or None at the end of the connection."""
        while True:
            if len(self.buf) >= 9:
                word, flags, sid = struct.unpack_from(">IBI", self.buf)
                n = word >> 8
                if len(self.buf) >= 9 + n:
                    payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
                    return word & 0xFF, flags, sid & 0x7FFFFFFF, payload
            try:
                data = self.sock.recv(65536)
            except (ssl.SSLError, ConnectionResetError):
                data = b""
            if not data:
                return None
            self.buf += data

    def close(self):
        self.sock.close()


def ping_until_goaway(server, certs, pings=20):
    """PING, wait for its ACK, again: the GOAWAYs the server sends, once it closes."""
    c = RawH2(server, certs)
    goaways = []
    try:
        for i in range(pings):
            opaque = b"%08d" % i
            c.sock.sendall(h2.frame(h2.PING, 0, 0, opaque))
            while True:
                f = c.frame()
                if f is None:
                    return goaways
                if f[0] == h2.GOAWAY:
                    goaways.append(struct.unpack(">II", f[3][:8]) + (f[3][8:],))
                    if goaways[-1][1] != h2.NO_ERROR:  # not the age's: it closes
                        while c.frame() is not None:
                            pass
                        return goaways
                if f[0] == h2.PING and f[1] & h2.ACK and f[3] == opaque:
                    break
        return goaways
    finally:
        c.close()


def test_a_client_that_pings_too_often_gets_goaway_while_another_is_served(server,
                                                                           certs):
    """Triton's defaults (two strikes, and two hours between PINGs while no call
    runs): the fourth PING ends the attacker's connection with grpc-core's GOAWAY,
    every time; a tritonclient on its own connection is served all along."""
    stop, results = threading.Event(), []

    def victim():
        with tls_client(server, certs) as c:
            while not stop.is_set():
                try:
                    infer(c)
                    results.append(None)
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    results.append(e)

    t = threading.Thread(target=victim)
    t.start()
    try:
        for _ in range(3):
            goaways = ping_until_goaway(server, certs)
            assert goaways[-1][1:] == (h2.ENHANCE_YOUR_CALM, b"too_many_pings"), goaways
    finally:
        deadline = time.monotonic() + T
        while len(results) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # let the victim show it is still served
        stop.set()
        t.join(T)
    assert len(results) >= 3 and [r for r in results if r is not None] == []


def test_max_connection_age_makes_clients_reconnect_transparently(server, certs):
    """Connections live about AGE_MS: a client sending calls all along sees its
    channel reconnect (READY again, more than once) and not one call fails."""
    ready = []
    with tls_client(server, certs) as c:
        # grpc's public connectivity API on tritonclient's channel
        c._channel.subscribe(lambda state: ready.append(state)
                             if state.name == "READY" else None, try_to_connect=True)
        deadline = time.monotonic() + 10 * AGE_MS / 1000
        calls = 0
        while len(ready) < 3:
            assert time.monotonic() < deadline, f"{len(ready)} connections in 10 ages"
            infer(c)
            calls += 1
    assert calls > 3
