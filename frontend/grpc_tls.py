"""TLS on the gRPC port, as Triton's --grpc-use-ssl, --grpc-use-ssl-mutual,
--grpc-server-cert, --grpc-server-key and --grpc-root-cert set it up in grpc-core:
the server presents its certificate; with mutual TLS it requires a client
certificate signed by the root certificate and refuses the handshake without one;
without it, no client certificate is asked for.

The native transport takes an `ssl.SSLContext` (the standard library's OpenSSL, under
asyncio's or uvloop's TLS transport) offering ALPN "h2", TLS 1.2 or later, without
compression or renegotiation (RFC 9113 9.2); the grpc.aio fallback takes
grpc.ssl_server_credentials of the same files.
"""

from __future__ import annotations

import ssl

from shm.messages.roles import TlsSettings  # noqa: F401 (the frontend spec declares it)

# A TLS handshake is a round trip or two; a client that has not finished one by then
# (one that connects and sends nothing) is dropped rather than held. grpc-core's own
# handshake deadline is 120 s; the grpc.aio fallback is given this one too.
HANDSHAKE_TIMEOUT = 10.0


def server_context(tls: TlsSettings) -> ssl.SSLContext:
    """The native transport's context (raises OSError/ssl.SSLError on a bad file)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # AEAD suites with forward secrecy
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    ctx.load_cert_chain(tls.server_cert, tls.server_key)
    ctx.set_alpn_protocols(["h2"])
    if tls.mutual:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=tls.root_cert)  # only this root is trusted
    return ctx


def grpcio_credentials(tls: TlsSettings):
    """The grpc.aio fallback's credentials, from the same files."""
    import grpc

    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_server_credentials(
        [(read(tls.server_key), read(tls.server_cert))],
        root_certificates=read(tls.root_cert) if tls.root_cert else None,
        require_client_auth=tls.mutual)
