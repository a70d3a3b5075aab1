"""Inference over HTTP (JSON and binary) and gRPC (sync, aio, streaming)."""

import asyncio

import numpy as np
import pytest

from tests.e2e.clients import PROTOCOLS, client, infer_input, requested

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("shape", [(1, 16), (5, 16), (1, 262144), (2, 3_000_000)])
def test_identity_round_trip(server, protocol, shape):
    # [1,262144] and larger cross through shared-memory arenas, small ones inline
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    r = client(server, protocol).infer("identity_fp32", [infer_input(protocol, "INPUT0", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    resp = r.get_response()
    name = resp["model_name"] if protocol == "http" else resp.model_name
    assert name == "identity_fp32"


def test_http_json_tensors(server):
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    c = client(server, "http")
    r = c.infer("identity_fp32", [infer_input("http", "INPUT0", x, "FP32", binary=False)],
                outputs=[requested("http", "OUTPUT0", binary=False)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
    out = r.get_response()["outputs"][0]
    assert out["data"] == list(range(16))  # JSON, not binary


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_add_sub_and_output_subset(server, protocol):
    a = np.arange(16, dtype=np.float32)
    b = np.ones(16, dtype=np.float32)
    c = client(server, protocol)
    inputs = [infer_input(protocol, "INPUT0", a, "FP32"), infer_input(protocol, "INPUT1", b, "FP32")]
    r = c.infer("add_sub", inputs, request_id="req-7")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    r = c.infer("add_sub", inputs, outputs=[requested(protocol, "OUTPUT1")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.as_numpy("OUTPUT0") is None
    resp = r.get_response()
    names = [o["name"] for o in resp["outputs"]] if protocol == "http" else \
        [o.name for o in resp.outputs]
    assert names == ["OUTPUT1"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_id_echoed(server, protocol):
    a = np.zeros(16, dtype=np.float32)
    c = client(server, protocol)
    r = c.infer("add_sub", [infer_input(protocol, "INPUT0", a, "FP32"),
                            infer_input(protocol, "INPUT1", a, "FP32")], request_id="abc-42")
    resp = r.get_response()
    assert (resp["id"] if protocol == "http" else resp.id) == "abc-42"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("binary", [True, False])
def test_bytes_round_trip(server, protocol, binary):
    if protocol == "grpc" and not binary:
        pytest.skip("gRPC has one encoding")
    text = np.array([[b"hello"], [b"w\xc3\xb6rld"], [b""]], dtype=object)
    r = client(server, protocol).infer(
        "string_upper", [infer_input(protocol, "TEXT", text, "BYTES", binary=binary)],
        outputs=[requested(protocol, "UPPER", binary=binary)])
    out = r.as_numpy("UPPER")
    assert out.shape == (3, 1)
    # JSON carries BYTES as strings, which the client hands back as str
    got = [v if isinstance(v, bytes) else v.encode() for v in out.reshape(-1)]
    assert got == [b"HELLO", "WöRLD".encode(), b""]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_batch_model(server, protocol):
    x = np.arange(10, dtype=np.int32).reshape(2, 5)
    r = client(server, protocol).infer("nobatch_identity", [infer_input(protocol, "INPUT0", x, "INT32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_64mib_input(server):
    x = np.random.default_rng(1).standard_normal((1, 16 * 1024 * 1024), dtype=np.float32)
    r = client(server, "grpc").infer("identity_fp32", [infer_input("grpc", "INPUT0", x, "FP32")],
                                     client_timeout=120)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_grpc_aio_and_http_aio(server):
    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http.aio as httpaio

    async def run():
        x = np.random.default_rng(2).standard_normal((1, 16), dtype=np.float32)
        g = grpcaio.InferenceServerClient(server.grpc_url)
        h = httpaio.InferenceServerClient(server.http_url)
        try:
            gi = grpcaio.InferInput("INPUT0", [1, 16], "FP32")
            gi.set_data_from_numpy(x)
            hi = httpaio.InferInput("INPUT0", [1, 16], "FP32")
            hi.set_data_from_numpy(x)
            results = await asyncio.gather(*(g.infer("identity_fp32", [gi]) for _ in range(8)),
                                           *(h.infer("identity_fp32", [hi]) for _ in range(8)))
            for r in results:
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)
            assert await g.is_server_ready() and await h.is_server_ready()
        finally:
            await g.close()
            await h.close()

    asyncio.run(asyncio.wait_for(run(), 60))


def test_grpc_stream(server):
    import queue

    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    c = client(server, "grpc")
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        sent = {}
        for i in range(6):
            x = np.full((1, 16), i, dtype=np.float32)
            sent[str(i)] = x
            inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_data_from_numpy(x)
            c.async_stream_infer("identity_fp32", [inp], request_id=str(i))
        for _ in range(6):
            result, error = results.get(timeout=30)
            assert error is None
            rid = result.get_response().id
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), sent.pop(rid))
        assert not sent
    finally:
        c.stop_stream()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_classification_extension(server, protocol):
    # Rule (classification extension): an output requested with class_count k comes
    # back as the top k of each batch item, "<value>:<index>", highest first, as BYTES;
    # both protocols, since the server metadata lists the extension for both.
    from tests.e2e.clients import module
    from tritonclient.utils import InferenceServerException
    mod = module(protocol)
    x = np.array([[3, 9, 1, 7], [0, -1, 5, 2]], dtype=np.float32)
    c = client(server, protocol)
    r = c.infer("identity_fp32", [infer_input(protocol, "INPUT0", x, "FP32")],
                outputs=[mod.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert r.as_numpy("OUTPUT0").tolist() == [
        [b"9.000000:1", b"7.000000:3"], [b"5.000000:2", b"2.000000:3"]]
    # a BYTES output has no classes: a clear error, and the server keeps serving
    text = np.array([[b"a"]], dtype=np.object_)
    with pytest.raises(InferenceServerException, match="unsupported type 'BYTES'"):
        c.infer("string_upper", [infer_input(protocol, "TEXT", text, "BYTES")],
                outputs=[mod.InferRequestedOutput("UPPER", class_count=1)])
    assert c.is_server_ready()
