"""The scheduler's registry of client shared-memory regions, and the workers' maps."""

from __future__ import annotations

import mmap
import os
import uuid

import numpy as np
import pytest

from scheduler.cli import parse_backend_config
from scheduler.regions import RegionRegistry
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.regions import CUDA, SYSTEM, RegionRequest
from shm.regions import RegionMaps, RegionTruncated, check_client_key
from shm.tensor import TensorRef


@pytest.fixture
def key():
    """A client's POSIX shm object of 4096 bytes."""
    name = f"sstest-unit-{uuid.uuid4().hex[:10]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield "/" + name
    os.unlink(f"/dev/shm/{name}")


def registry(allowed=True, gpus=0):
    gone = []
    return RegionRegistry(allowed, gpus, gone.append), gone


def register(reg, name, key, byte_size=4096, offset=0):
    reg.register(RegionRequest(1, "fe", "register", SYSTEM, name, key, offset, byte_size))


def request(rid, *inputs, outputs=None):
    return InferRequest(rid, "fe", "m", 1, list(inputs), outputs)


def ref(region, offset=0, nbytes=16, name="IN"):
    return TensorRef(name, "UINT8", [nbytes], segment=region, offset=offset, nbytes=nbytes,
                     region=-1)


def test_register_checks_keys_sizes_and_names(key):
    reg, _ = registry()
    register(reg, "a", key, 2048, offset=2048)
    with pytest.raises(InferError, match="already in manager") as e:
        register(reg, "a", key)
    assert e.value.code == ErrorCode.ALREADY_EXISTS
    # Triton 2.51's words and codes (checked against it): out of bounds is 400
    # "invalid args", a key that cannot be opened is 500 with the key only
    with pytest.raises(InferError) as e:
        register(reg, "b", key, 2048, offset=2049)
    assert (e.value.code, e.value.message) == (
        ErrorCode.INVALID_ARG, "failed to register shared memory region 'b': invalid args")
    with pytest.raises(InferError) as e:
        register(reg, "b", "/sstest-no-such-object")
    assert (e.value.code, e.value.message) == (
        ErrorCode.INTERNAL, "Unable to open shared memory region: '/sstest-no-such-object'")
    for bad in ("", "/", "/a/b", "..", "/..", "x\0y"):
        with pytest.raises(InferError, match="invalid shared memory key"):
            register(reg, "b", bad)
    with pytest.raises(InferError, match="server's own memory"):
        register(reg, "b", "/shmserve-1234-f0-0")
    with pytest.raises(InferError) as e:
        register(reg, "b", key, 0)
    assert e.value.message == ("failed to register shared memory region 'b': unable to "
                               "process address spaceInvalid argument")
    assert [s.name for s in reg.status(SYSTEM, "")] == ["a"]
    assert reg.status(SYSTEM, "a")[0].offset == 2048
    with pytest.raises(InferError, match="Unable to find") as e:
        reg.status(SYSTEM, "zzz")
    assert e.value.code == ErrorCode.NOT_FOUND


def test_status_lists_regions_in_name_order(key):
    """Rule (issue 26, 7): the status of every region comes in name order (byte order:
    upper case first), as Triton 2.51's, whatever the order of registration."""
    reg, _ = registry()
    for name in ("zeta", "alpha", "Mid", "beta"):
        register(reg, name, key, 64)
    assert [s.name for s in reg.status(SYSTEM, "")] == ["Mid", "alpha", "beta", "zeta"]


def test_register_out_of_bounds_says_invalid_args_before_an_empty_size(key):
    """Rule: Triton checks offset + byte size against the object before it maps the
    region, so every out-of-bound registration ends "invalid args" (its qa tests match
    that), an offset past the end with byte size 0 too; a byte size of 0 inside the
    object is its mmap's EINVAL."""
    reg, _ = registry()
    for offset, size in ((0, 4097), (1, 4096), (4096, 1), (4097, 0)):
        with pytest.raises(InferError) as e:
            register(reg, "r", key, size, offset=offset)
        assert (e.value.code, e.value.message) == (
            ErrorCode.INVALID_ARG, "failed to register shared memory region 'r': invalid "
                                   "args"), (offset, size)
    with pytest.raises(InferError, match="unable to process address spaceInvalid arg"):
        register(reg, "r", key, 0, offset=4096)
    with pytest.raises(InferError, match="Unable to open shared memory region"):
        register(reg, "r", "/sstest-no-such-object", 0)
    assert reg.status(SYSTEM, "") == []


def test_disabled_and_cuda_without_devices(key):
    # Triton's code (UNSUPPORTED) and words, for register and unregister; status answers
    reg, _ = registry(allowed=False)
    with pytest.raises(InferError) as e:
        register(reg, "a", key)
    assert (e.value.code, e.value.message) == (
        ErrorCode.UNSUPPORTED, "Client shared memory is disabled. Start the server with "
                               "'--allow-client-shm=true' to enable.")
    with pytest.raises(InferError, match="'--allow-client-shm=true' to enable"):
        reg.unregister(SYSTEM, "", lambda: None)
    assert reg.status(SYSTEM, "") == [] and reg.status(CUDA, "") == []
    reg, _ = registry(allowed=True, gpus=0)
    # Triton 2.51 on a machine without a GPU: 400 "invalid args"; status and
    # unregister answer as for any unknown region
    with pytest.raises(InferError) as e:
        reg.register(RegionRequest(1, "fe", "register", CUDA, "c", byte_size=16,
                                   raw_handle=bytes(64)))
    assert e.value.code == ErrorCode.INVALID_ARG
    assert e.value.message == "failed to register shared memory region: invalid args"
    assert reg.status(CUDA, "") == []
    reg, _ = registry(allowed=True, gpus=1)
    with pytest.raises(InferError, match="64 bytes"):
        reg.register(RegionRequest(1, "fe", "register", CUDA, "c", byte_size=16,
                                   raw_handle=bytes(10)))
    reg.register(RegionRequest(1, "fe", "register", CUDA, "c", byte_size=16, device_id=0,
                               raw_handle=bytes(64)))
    req = request(1, ref("c", 0, 16))
    reg.resolve(req)
    assert req.inputs[0].device == 0 and req.inputs[0].handle == bytes(64)
    assert req.inputs[0].region_size == 16


def test_resolve_checks_bounds_and_rewrites_to_the_object(key):
    reg, _ = registry()
    register(reg, "a", key, 1024, offset=1024)
    req = request(1, ref("a", offset=1000, nbytes=24),
                  outputs=[RequestedOutput("OUT", target=ref("a", 0, 8, name="OUT"))])
    reg.resolve(req)
    inp, out = req.inputs[0], req.outputs[0].target
    assert inp.segment == key and inp.offset == 2024 and inp.region > 0
    assert out.offset == 1024 and out.region == inp.region
    assert inp.region_name == out.region_name == "a"  # for the worker's errors
    # Triton 2.51's words, which its qa tests match (checked on it over HTTP and
    # gRPC, an input's and an output's): the sum past the end, or the offset itself
    for offset, nbytes, which in ((1000, 25, "offset + byte size"), (1023, 2, "offset + "
                                  "byte size"), (1024, 8, "offset"), (1024, 0, "offset"),
                                  (2**64 - 32, 8, "offset"), (-32, 8, "offset")):
        for req in (request(2, ref("a", offset=offset, nbytes=nbytes)),
                    request(2, outputs=[RequestedOutput(
                        "OUT", target=ref("a", offset, nbytes, name="OUT"))])):
            with pytest.raises(InferError) as e:
                reg.resolve(req)
            assert (e.value.code, e.value.message) == (
                ErrorCode.INVALID_ARG, f"Invalid {which} for shared memory region: 'a'")
    with pytest.raises(InferError, match="Unable to find shared memory region: 'nope'"):
        reg.resolve(request(3, ref("nope")))
    assert list(reg.users) == [("fe", 1)]  # failed requests hold nothing


def test_unregister_waits_for_the_last_user(key):
    """Unregistering a region in use takes the name at once and answers, and frees the
    region, when its last user is done (Triton 2.51 refuses instead: see DELIBERATE in
    tests/e2e/test_error_table.py for why we wait)."""
    reg, gone = registry()
    register(reg, "a", key)
    first, second = request(1, ref("a")), request(2, ref("a"))
    reg.resolve(first)
    reg.resolve(second)
    answered = []
    reg.unregister(SYSTEM, "a", lambda: answered.append(True))
    # the name is gone at once, the region only once nobody uses it
    assert reg.status(SYSTEM, "") == []
    with pytest.raises(InferError, match="Unable to find"):
        reg.resolve(request(3, ref("a")))
    assert answered == [] and gone == []
    reg.finished(first)
    assert answered == [] and gone == []
    reg.finished(second)
    assert answered == [True] and [r.name for r in gone] == ["a"]
    # the name may be registered again, as a new region
    register(reg, "a", key)
    assert reg.by_name["a"].uid != gone[0].uid


def test_unregister_unused_and_all(key):
    reg, gone = registry()
    register(reg, "a", key)
    register(reg, "b", key)
    answered = []
    reg.unregister(SYSTEM, "missing", lambda: answered.append("missing"))
    reg.unregister(SYSTEM, "", lambda: answered.append("all"))
    assert answered == ["missing", "all"]
    assert sorted(r.name for r in gone) == ["a", "b"]


def test_region_maps_read_and_write_with_the_descriptor(key):
    """A worker reads a region's bytes into memory of its own and writes outputs with
    pwrite; an input lands straight in the array it is given (a batch tensor's rows)."""
    maps = RegionMaps()
    maps.write(7, key, 100, b"abcdefgh", "r")
    assert maps.read(7, key, 100, 8).tobytes() == b"abcdefgh"
    rows = np.zeros((4, 2), np.float32)
    maps.read(7, key, 100, 8, rows[1:2])
    assert rows[1:2].tobytes() == b"abcdefgh" and not rows[0].any() and not rows[2:].any()
    assert maps.read(7, key, 0, 0).nbytes == 0
    with pytest.raises(ValueError, match="outside"):
        maps.read(7, key, -1, 8)
    maps.close()


def _maps_of(key: str) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if key in line]


def test_a_shrunken_object_fails_the_request_instead_of_faulting(key):
    """The client shrinks its object under a region in use: reading or writing past its
    new end is a RegionTruncated (INVALID_ARG, naming the region, what needed which
    bytes, and the size left), never a SIGBUS, and writes nothing; what is left reads
    as before. A CPU worker never maps the object at all."""
    maps = RegionMaps()
    maps.write(7, key, 1000, b"x" * 48, "r")
    os.truncate(f"/dev/shm{key}", 1024)
    with pytest.raises(RegionTruncated) as e:
        maps.read(7, key, 1000, 48, name="r", what="input 'IN'")
    assert e.value.code == ErrorCode.INVALID_ARG
    assert e.value.message == (
        f"shared memory region 'r' was truncated after it was registered: input 'IN' "
        f"needs bytes [1000, 1048) of its object '{key}', which holds 1024")
    with pytest.raises(RegionTruncated, match="holds 1024"):
        maps.read(7, key, 2048, 8, name="r")  # wholly past the end
    with pytest.raises(RegionTruncated, match="output 'OUT' needs bytes"):
        maps.write(7, key, 1020, b"12345678", "r", "output 'OUT'")
    assert os.stat(f"/dev/shm{key}").st_size == 1024  # nothing was written past it
    assert maps.read(7, key, 1000, 24).tobytes() == b"x" * 24
    os.truncate(f"/dev/shm{key}", 0)
    with pytest.raises(RegionTruncated, match="holds 0"):
        maps.read(7, key, 0, 1 << 31, name="r")  # checked before taking the memory
    assert _maps_of(key[1:]) == []
    maps.close()


def test_an_unlinked_object_fails_the_request(key):
    maps = RegionMaps()
    os.unlink(f"/dev/shm{key}")
    try:
        with pytest.raises(InferError, match="region 'r': its object .* cannot be opened"):
            maps.read(3, key, 0, 8, name="r")
    finally:
        open(f"/dev/shm{key}", "wb").close()  # for the fixture to remove
    maps.close()


def test_client_keys():
    assert check_client_key("/abc") == "abc"
    assert check_client_key("abc") == "abc"
    with pytest.raises(ValueError):
        check_client_key("/" + "x" * 300)


def test_backend_config_flag():
    assert parse_backend_config(["onnxruntime,default-max-batch-size=8",
                                 "pytorch,intra-op-thread-count=2",
                                 "onnxruntime,enable-global-threadpool=1"]) == {
        "onnxruntime": {"default-max-batch-size": "8", "enable-global-threadpool": "1"},
        "pytorch": {"intra-op-thread-count": "2"}}
    for bad in ("onnxruntime", "onnxruntime,novalue", ",a=b"):
        with pytest.raises(ValueError, match="format"):
            parse_backend_config([bad])


def test_an_input_read_is_the_workers_own_memory(key):
    """A model may keep an input past the batch: it is a copy, which neither forgetting
    the region nor the client's later writes or truncation change or fault."""
    maps = RegionMaps()
    maps.write(1, key, 0, bytes(range(16)), "r")
    arr = maps.read(1, key, 0, 16)
    maps.forget(1)
    os.truncate(f"/dev/shm{key}", 0)
    assert arr.tolist() == list(range(16))


def test_keys_that_are_not_shm_objects_are_refused_without_blocking(tmp_path):
    """A FIFO (which would block a blocking open until a writer came), a symlink (which
    would be followed to any file) and a directory under /dev/shm are refused."""
    import os
    import signal
    import uuid

    def blocked(signum, frame):
        raise TimeoutError("opening the key blocked")

    reg, _ = registry()
    made = []
    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)  # bounds the test if an open blocks (a FIFO opened blocking)
    try:
        fifo = f"/dev/shm/sstest-fifo-{uuid.uuid4().hex[:8]}"
        os.mkfifo(fifo)
        made.append(fifo)
        target = tmp_path / "target"
        target.write_bytes(b"x" * 4096)
        link = f"/dev/shm/sstest-link-{uuid.uuid4().hex[:8]}"
        os.symlink(target, link)
        made.append(link)
        with pytest.raises(InferError, match="'r': invalid args") as e:
            register(reg, "r", fifo[len("/dev/shm"):], 16)
        assert e.value.code == ErrorCode.INVALID_ARG
        with pytest.raises(InferError, match="Unable to open shared memory region") as e:
            register(reg, "r", link[len("/dev/shm"):], 16)
        assert e.value.code == ErrorCode.INTERNAL
        assert not reg.by_name
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for path in made:
            os.unlink(path)


def test_a_gpu_workers_system_regions_are_pinned_once_and_unpinned_before_unmap(key):
    """Rule: with pin hooks (a GPU worker), a client's system region is mapped and
    page-locked the first time a device copies from or to it, once however often, and
    unlocked before it is unmapped. A region over `pin_max`, one the driver would not
    pin, or any without pin hooks gets no view (its copies go through the host), and
    is not left mapped. A view is refused for bytes past the object's end."""
    calls = []

    def pin(view):
        np.frombuffer(view, np.uint8)[::4096].sum()  # faults the pages in, as the driver
        calls.append(("pin", len(view)))
        return 0xABC

    maps = RegionMaps(pin=pin, unpin=lambda ptr: calls.append(("unpin", ptr)))
    maps.dma_view(7, key, 0, 16)[:4] = b"abcd"  # the device's part, in this test
    assert bytes(maps.dma_view(7, key, 0, 4)) == b"abcd"
    assert calls == [("pin", 4096)]
    os.truncate(f"/dev/shm{key}", 8)
    with pytest.raises(RegionTruncated, match="needs bytes \\[0, 16\\)"):
        maps.dma_view(7, key, 0, 16, name="r")
    maps.forget(7)
    assert calls == [("pin", 4096), ("unpin", 0xABC)]
    os.truncate(f"/dev/shm{key}", 4096)

    # shrunk and grown back since it was pinned: the pages the driver holds are no
    # longer the object's (an H200 showed it), so no more views, and it is unpinned
    # only once forgotten (no copy can be using it then). Writes of the worker's own
    # and of the client (through a mapping of its own) change nothing.
    calls.clear()
    maps = RegionMaps(pin=pin, unpin=lambda ptr: calls.append(("unpin", ptr)))
    assert maps.dma_view(8, key, 0, 4096) is not None
    maps.write(8, key, 0, b"w" * 16)
    with open(f"/dev/shm{key}", "r+b") as f, mmap.mmap(f.fileno(), 4096) as client:
        client[100:104] = b"cccc"
    assert maps.dma_view(8, key, 0, 4096) is not None
    os.truncate(f"/dev/shm{key}", 0)
    os.truncate(f"/dev/shm{key}", 4096)
    assert maps.dma_view(8, key, 0, 16) is None
    assert maps.dma_view(8, key, 0, 16) is None and calls == [("pin", 4096)]
    assert maps.read(8, key, 0, 4).tobytes() == bytes(4)  # the host path reads it
    maps.forget(8)
    assert calls == [("pin", 4096), ("unpin", 0xABC)]

    calls.clear()
    small = RegionMaps(pin=pin, unpin=lambda ptr: calls.append(("unpin", ptr)), pin_max=4095)
    assert small.dma_view(1, key, 0, 16) is None
    small.close()
    assert calls == []

    refused = RegionMaps(pin=lambda view: None, unpin=lambda ptr: calls.append(ptr))
    assert refused.dma_view(1, key, 0, 16) is None
    assert _maps_of(key[1:]) == []
    refused.close()
    assert calls == []
    assert RegionMaps().dma_view(1, key, 0, 16) is None


@pytest.mark.gpu
def test_pinned_system_region_is_registered_with_the_driver(key):
    from shm import cuda
    if cuda.device_count() == 0:
        pytest.skip("no CUDA device")
    cp = pytest.importorskip("cupy")
    maps = RegionMaps(pin=cuda.pin, unpin=cuda.unpin)
    host = np.arange(1024, dtype=np.float32)
    maps.write(1, key, 0, host)
    view = maps.dma_view(1, key, 0, 4096)
    ptr = np.frombuffer(view, np.uint8).ctypes.data
    assert cp.cuda.runtime.pointerGetAttributes(ptr).type == 1  # cudaMemoryTypeHost
    dev = cp.empty(1024, cp.float32)
    dev.set(np.frombuffer(view, np.float32))
    np.testing.assert_array_equal(cp.asnumpy(dev), host)
    maps.close()
    assert cp.cuda.runtime.pointerGetAttributes(ptr).type == 0  # unregistered again
