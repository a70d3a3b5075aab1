"""Triton's system shared-memory extension through tritonclient, HTTP and gRPC: the
client's tensors go into the model and back without passing through the frontends;
a worker reads an input once and writes an output once."""

from __future__ import annotations

import os
import threading
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e import clients
from tests.e2e.harness import wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def regions():
    """Client regions made by a test, destroyed after it (the client owns them)."""
    made = []

    def make(size: int):
        key = f"/sstest-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _name() -> str:
    return f"r{uuid.uuid4().hex[:10]}"


def _unregister_all(client):
    client.unregister_system_shared_memory()


def _shm_input(protocol, name, shape, datatype, region, nbytes, offset=0):
    inp = clients.module(protocol).InferInput(name, shape, datatype)
    inp.set_shared_memory(region, nbytes, offset=offset)
    return inp


def _shm_output(protocol, name, region, nbytes, offset=0):
    out = clients.module(protocol).InferRequestedOutput(name)
    out.set_shared_memory(region, nbytes, offset=offset)
    return out


def _status(client, protocol, name=""):
    """Region status as {name: (key, offset, byte_size)} for either protocol."""
    got = client.get_system_shared_memory_status(region_name=name)
    if protocol == "http":
        return {r["name"]: (r["key"], int(r.get("offset", 0)), int(r["byte_size"]))
                for r in got}
    return {n: (r.key, r.offset, r.byte_size) for n, r in got.regions.items()}


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_register_status_unregister(shm_server, regions, protocol):
    client = clients.client(shm_server, protocol)
    key_a, _ = regions(4096)
    key_b, _ = regions(8192)
    a, b = _name(), _name()
    client.register_system_shared_memory(a, key_a, 4096)
    client.register_system_shared_memory(b, key_b, 4096, offset=4096)
    try:
        everything = _status(client, protocol)
        assert everything[a] == (key_a, 0, 4096)
        assert everything[b] == (key_b, 4096, 4096)
        assert _status(client, protocol, b) == {b: (key_b, 4096, 4096)}
        # registered through one connection, seen through a fresh one (maybe the other
        # frontend process): the scheduler holds the one table
        other = clients.client(shm_server, protocol)
        assert a in _status(other, protocol)
        client.unregister_system_shared_memory(a)
        assert a not in _status(client, protocol)
        with pytest.raises(InferenceServerException, match="Unable to find"):
            client.get_system_shared_memory_status(region_name=a)
    finally:
        _unregister_all(client)
    assert _status(client, protocol) == {}


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_inputs_and_outputs_in_regions(shm_server, regions, protocol):
    client = clients.client(shm_server, protocol)
    data = np.arange(4096, dtype=np.float32)
    nbytes = data.nbytes
    in_key, in_handle = regions(nbytes)
    out_key, out_handle = regions(nbytes + 64)
    shm.set_shared_memory_region(in_handle, [data])
    rin, rout = _name(), _name()
    client.register_system_shared_memory(rin, in_key, nbytes)
    client.register_system_shared_memory(rout, out_key, nbytes + 64)
    try:
        for round_ in range(3):  # the worker maps each region once and reuses it
            shm.set_shared_memory_region(in_handle, [data + round_])
            result = client.infer("identity_fp32", [
                _shm_input(protocol, "INPUT0", [1, 4096], "FP32", rin, nbytes)],
                outputs=[_shm_output(protocol, "OUTPUT0", rout, nbytes + 64, offset=0)])
            # the response names the output; its bytes are in the region, not here
            assert result.get_output("OUTPUT0") is not None
            got = shm.get_contents_as_numpy(out_handle, np.float32, [1, 4096])
            np.testing.assert_array_equal(got[0], data + round_)
    finally:
        _unregister_all(client)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_mixed_region_and_wire_tensors(shm_server, regions, protocol):
    """add_sub with one input from a region and one on the wire, and one output into a
    region while the other comes back in the response."""
    client = clients.client(shm_server, protocol)
    a = np.arange(16, dtype=np.float32)
    b = np.full(16, 2.0, dtype=np.float32)
    key, handle = regions(a.nbytes * 2)
    shm.set_shared_memory_region(handle, [a])
    region = _name()
    client.register_system_shared_memory(region, key, a.nbytes * 2)
    try:
        result = client.infer("add_sub", [
            _shm_input(protocol, "INPUT0", [16], "FP32", region, a.nbytes),
            clients.infer_input(protocol, "INPUT1", b, "FP32")],
            outputs=[_shm_output(protocol, "OUTPUT0", region, a.nbytes, offset=a.nbytes),
                     clients.requested(protocol, "OUTPUT1")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        got = shm.get_contents_as_numpy(handle, np.float32, [2, 16])
        np.testing.assert_array_equal(got[1], a + b)
        np.testing.assert_array_equal(got[0], a)  # the input is untouched
    finally:
        _unregister_all(client)


def test_large_input_is_read_once_into_the_worker(shm_server, regions):
    """A 64 MiB input in a client's region reaches the model read into the worker's own
    memory, not as a view over the client's object, which its client could shrink under
    the model (test_region_fault.py): the model reports which mapping its input lies
    in, and that the bytes are right."""
    client = clients.client(shm_server, "http")
    size = 64 << 20
    key, handle = regions(size)
    data = np.frombuffer(os.urandom(1 << 16), dtype=np.uint8)
    array = np.tile(data, size // data.size)
    shm.set_shared_memory_region(handle, [array])
    region = _name()
    client.register_system_shared_memory(region, key, size)
    try:
        result = client.infer("shm_probe", [
            _shm_input("http", "INPUT0", [size], "UINT8", region, size)])
        mapping = result.as_numpy("MAPPING")[0].decode()
        assert not mapping.startswith("/dev/shm"), mapping
        assert result.as_numpy("CHECKSUM")[0] == int(array[::4096].sum(dtype=np.uint64))
    finally:
        _unregister_all(client)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_bad_registrations(shm_server, regions, protocol):
    client = clients.client(shm_server, protocol)
    key, _ = regions(4096)
    name = _name()
    client.register_system_shared_memory(name, key, 4096)
    try:
        with pytest.raises(InferenceServerException, match="already in manager"):
            client.register_system_shared_memory(name, key, 4096)
        # Triton 2.51's wording and status (run against it): 500 for a missing key
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory(_name(), "/no-such-key-shmserve", 16)
        assert e.value.message() == "Unable to open shared memory region: '/no-such-key-shmserve'"
        assert e.value.status() in ("500", "StatusCode.INTERNAL")
        bad = _name()
        with pytest.raises(InferenceServerException) as e:
            client.register_system_shared_memory(bad, key, 4096, offset=1)
        assert e.value.message() == f"failed to register shared memory region '{bad}': invalid args"
        assert e.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        with pytest.raises(InferenceServerException, match="invalid shared memory key"):
            client.register_system_shared_memory(_name(), "/../etc/passwd", 16)
        with pytest.raises(InferenceServerException, match="server's own memory"):
            client.register_system_shared_memory(_name(), "/shmserve-anything", 16)
        assert list(_status(client, protocol)) == [name]
    finally:
        _unregister_all(client)
    assert client.is_server_live()


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_out_of_bounds_requests(shm_server, regions, protocol):
    client = clients.client(shm_server, protocol)
    key, handle = regions(256)
    region = _name()
    client.register_system_shared_memory(region, key, 256)
    try:
        # the input claims bytes past the end of the region
        with pytest.raises(InferenceServerException, match="Invalid offset"):
            client.infer("identity_fp32", [
                _shm_input(protocol, "INPUT0", [1, 64], "FP32", region, 256, offset=64)])
        # the output does not fit the region part the request gave it
        with pytest.raises(InferenceServerException, match="should be at least 256 bytes"):
            client.infer("identity_fp32", [
                _shm_input(protocol, "INPUT0", [1, 64], "FP32", region, 256)],
                outputs=[_shm_output(protocol, "OUTPUT0", region, 128)])
        with pytest.raises(InferenceServerException, match="Unable to find shared memory"):
            client.infer("identity_fp32", [
                _shm_input(protocol, "INPUT0", [1, 64], "FP32", "no-such-region", 256)])
        # still serving, and the region still works
        shm.set_shared_memory_region(handle, [np.ones(64, dtype=np.float32)])
        result = client.infer("identity_fp32", [
            _shm_input(protocol, "INPUT0", [1, 64], "FP32", region, 256)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 64), np.float32))
    finally:
        _unregister_all(client)


def test_unregister_waits_for_requests_using_the_region(shm_server, regions):
    """Unregistering a region a request is still reading returns only once that request
    has finished; the request succeeds, and later ones cannot name the region."""
    client = clients.client(shm_server, "http")
    key, handle = regions(4)
    shm.set_shared_memory_region(handle, [np.array([1500], dtype=np.int32)])
    region = _name()
    client.register_system_shared_memory(region, key, 4)
    for f in shm_server.marker_dir.glob("running-*"):
        f.unlink()

    result = {}

    def slow_infer():
        c = clients.client(shm_server, "http")
        result["value"] = c.infer("slow_parallel", [
            _shm_input("http", "DELAY_MS", [1], "INT32", region, 4)])
        result["done"] = True

    infer_thread = threading.Thread(target=slow_infer)
    infer_thread.start()
    wait_until(lambda: any(shm_server.marker_dir.glob("running-*")), 10, what="model running")
    unregistered = threading.Event()

    def unregister():
        clients.client(shm_server, "http").unregister_system_shared_memory(region)
        unregistered.set()

    unreg_thread = threading.Thread(target=unregister)
    unreg_thread.start()
    # the model sleeps 1.5 s: the unregister call must still be waiting for it
    assert not unregistered.wait(0.5)
    assert "done" not in result
    infer_thread.join(20)
    unreg_thread.join(20)
    assert result.get("done"), "the request using the region failed"
    assert unregistered.is_set()
    assert region not in _status(client, "http")
    with pytest.raises(InferenceServerException, match="Unable to find shared memory"):
        client.infer("slow_parallel", [_shm_input("http", "DELAY_MS", [1], "INT32", region, 4)])


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_off_unless_allowed(server, regions, protocol):
    """The session server runs without --allow-client-shm: registration is refused."""
    client = clients.client(server, protocol)
    key, _ = regions(64)
    with pytest.raises(InferenceServerException, match="--allow-client-shm=true"):
        client.register_system_shared_memory(_name(), key, 64)
    assert client.is_server_live()
