"""Defects a hostile client or a crash finds (issue 11, 5b): client shared-memory keys
that are FIFOs or symlinks, a region truncated under the server, a dead frontend's
queued requests, the socket directory after a stop, malformed inputs, and kill -9 of
the scheduler."""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import json
import os
import re
import signal
import time
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from shm.arena import remove_segments
from tests.e2e import clients
from tests.e2e.harness import DEFAULT_REPOS, EXAMPLES, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

TIMEOUT = 30  # a bound on every call, never a pace
# a server that needs one model only starts ~1 s sooner than one with every test model
ONE_MODEL = ("--model-control-mode", "explicit", "--load-model", "identity_fp32")


@pytest.fixture(scope="module")
def hsrv(tmp_path_factory):
    srv = ServerProcess(DEFAULT_REPOS, "--allow-client-shm=true", frontends=1,
                        log_dir=tmp_path_factory.mktemp("hardening-logs"))
    yield from srv.serve()


def _client(srv, protocol):
    if protocol == "http":
        return clients.client(srv, protocol, network_timeout=TIMEOUT,
                              connection_timeout=TIMEOUT)
    return clients.client(srv, protocol)


def _register(client, protocol, name, key, size):
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    client.register_system_shared_memory(name, key, size, **kwargs)


def _identity(client, protocol, values=(1.0, 2.0, 3.0)):
    x = np.array([values], np.float32)
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    r = client.infer("identity_fp32", [clients.infer_input(protocol, "INPUT0", x, "FP32")],
                     **kwargs)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def _unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- 1. keys that are not regular shm objects ------------------------------------------


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_fifo_key_is_refused_without_blocking(hsrv, protocol):
    """A key naming a FIFO in /dev/shm is refused at once (the scheduler opens keys
    non-blocking and accepts regular files only) and every model keeps serving."""
    name = _unique("sstest-fifo")
    path = f"/dev/shm/{name}"
    os.mkfifo(path)
    try:
        client = _client(hsrv, protocol)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as err:
            _register(client, protocol, _unique("fifo"), "/" + name, 64)
        assert time.monotonic() - started < 10
        # Triton (whose mmap of a FIFO fails) answers this text, 400
        assert "': invalid args" in str(err.value), str(err.value)
        assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
        _identity(client, protocol)
        assert name not in str(client.get_system_shared_memory_status())
    finally:
        os.unlink(path)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_symlink_key_is_refused(hsrv, tmp_path, protocol):
    """A key that is a symlink in /dev/shm is not followed (O_NOFOLLOW): a client cannot
    make the server read or write a file the link points at."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 4096)
    name = _unique("sstest-link")
    os.symlink(secret, f"/dev/shm/{name}")
    try:
        client = _client(hsrv, protocol)
        with pytest.raises(InferenceServerException) as err:
            _register(client, protocol, _unique("link"), "/" + name, 64)
        assert f"Unable to open shared memory region: '/{name}'" in str(err.value)
        assert err.value.status() in ("500", "StatusCode.INTERNAL")
        _identity(client, protocol)
    finally:
        os.unlink(f"/dev/shm/{name}")


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_missing_key_is_refused_as_triton_does(hsrv, protocol):
    """A key naming no object answers Triton's text."""
    client = _client(hsrv, protocol)
    key = "/" + _unique("sstest-missing")
    with pytest.raises(InferenceServerException) as err:
        _register(client, protocol, _unique("missing"), key, 64)
    assert f"Unable to open shared memory region: '{key}'" in str(err.value)
    # Triton: shm_open failing is INTERNAL
    assert err.value.status() in ("500", "StatusCode.INTERNAL"), err.value.status()


# -- 2. a region truncated after registration ------------------------------------------


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_truncated_region_fails_its_request_and_server_serves(hsrv, protocol):
    """A client that truncates its registered object makes its own requests fail with a
    clear error; the worker does not die of SIGBUS and the model stays READY."""
    key = "/" + _unique("sstest-trunc")
    nbytes = 3 * 4
    handle = shm.create_shared_memory_region(key[1:], key, 4096)
    region = _unique("trunc")
    client = _client(hsrv, protocol)
    try:
        shm.set_shared_memory_region(handle, [np.array([1, 2, 3], np.float32)])
        _register(client, protocol, region, key, 4096)
        mod = clients.module(protocol)

        def shm_infer():
            inp = mod.InferInput("INPUT0", [1, 3], "FP32")
            inp.set_shared_memory(region, nbytes)
            out = mod.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory(region, nbytes, offset=1024)
            kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
            return client.infer("identity_fp32", [inp], outputs=[out], **kwargs)

        shm_infer()  # maps the region in a worker
        fd = os.open(f"/dev/shm/{key[1:]}", os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        for _ in range(4):  # both instances, and again: never a crash loop
            with pytest.raises(InferenceServerException) as err:
                shm_infer()
            assert "shared memory" in str(err.value), str(err.value)
        _identity(client, protocol)
        assert client.is_model_ready("identity_fp32")
        assert "restart" not in hsrv.log().lower() or "identity_fp32" not in _restarts(hsrv)
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def _restarts(srv) -> str:
    return "\n".join(line for line in srv.log().splitlines() if "restart" in line.lower())


# -- 4. the socket directory -----------------------------------------------------------


def _run_dir(srv) -> str:
    """The scheduler's socket directory, from a child's command line (--address)."""
    for pid in srv.children():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        for arg in argv:
            m = re.match(rb"ipc://(.+)/[^/]+$", arg)
            if m:
                return m.group(1).decode()
    raise AssertionError("no child names the socket directory")


@pytest.mark.parametrize("kill_frontend", [False, True])
def test_run_dir_is_removed_after_stop(tmp_path, kill_frontend):
    """The socket directory goes with the server, also when a child was killed."""
    srv = ServerProcess(EXAMPLES, *ONE_MODEL, log_dir=tmp_path).start()
    try:
        run_dir = _run_dir(srv)
        assert os.path.isdir(run_dir)
        if kill_frontend:
            victim = next(p for p in srv.children()
                          if b"frontend.main" in open(f"/proc/{p}/cmdline", "rb").read())
            os.kill(victim, signal.SIGKILL)
    finally:
        assert srv.stop() == 0, srv.log()
    assert not os.path.exists(run_dir)
    assert srv.segments() == []


# -- 5. input validation ---------------------------------------------------------------


def _post(srv, path, body: bytes, headers=None):
    conn = http.client.HTTPConnection(srv.http_url, timeout=TIMEOUT)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json",
                                          **(headers or {})})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def test_zero_element_shape_with_values_is_refused_http(hsrv):
    """Shape [0,4] holds no element: 8 values (JSON or binary) are a byte-size
    mismatch, 400, not silently dropped. Triton 2.51 sizes a batch of 0 as one item:
    "Expected 16, got 32" (tests/data/triton_errors_2.51.json: batch_zero_with_more_data)."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [0, 4], "datatype": "FP32",
                                   "data": [1, 2, 3, 4, 5, 6, 7, 8]}]}).encode()
    status, got = _post(hsrv, "/v2/models/identity_fp32/infer", body)
    assert status == 400, got
    assert "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. " \
           "Expected 16, got 32" in got["error"], got
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [0, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 32}}]}).encode()
    status, got = _post(hsrv, "/v2/models/identity_fp32/infer",
                        header + np.arange(8, dtype=np.float32).tobytes(),
                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400, got
    assert "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. " \
           "Expected 16, got 32" in got["error"], got


def test_zero_element_shape_with_values_is_refused_grpc(hsrv):
    """The same over gRPC: raw contents of 32 bytes for shape [0,4] is INVALID_ARGUMENT."""
    import tritonclient.grpc as grpcclient
    client = _client(hsrv, "grpc")
    inp = grpcclient.InferInput("INPUT0", [0, 4], "FP32")
    inp.set_data_from_numpy(np.zeros((0, 4), np.float32))
    inp._raw_content = np.arange(8, dtype=np.float32).tobytes()  # what a liar sends
    with pytest.raises(InferenceServerException) as err:
        client.infer("identity_fp32", [inp], client_timeout=TIMEOUT)
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "Expected 16, got 32" in str(err.value)  # Triton 2.51's sizes, as above


def test_deeply_nested_json_is_400(hsrv):
    """JSON nested 2,000 deep is malformed input (400), not a server error."""
    body = b'{"inputs": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    status, got = _post(hsrv, "/v2/models/identity_fp32/infer", body)
    assert status == 400, got
    assert "error" in got
    _identity(_client(hsrv, "http"), "http")


def test_huge_priority_is_400_http(hsrv):
    """A priority of 2**70 does not fit Triton's uint64: 400 with a parse error."""
    body = json.dumps({"parameters": {"priority": 2 ** 70},
                       "inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32",
                                   "data": [1]}]}).encode()
    status, got = _post(hsrv, "/v2/models/identity_fp32/infer", body)
    assert status == 400, got
    assert "priority" in got["error"], got


# -- 3, 6. dying processes -------------------------------------------------------------


def _slow_request(srv, protocol, delay_ms):
    inp = clients.infer_input(protocol, "DELAY_MS", np.array([delay_ms], np.int32), "INT32")
    c = _client(srv, protocol)
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    return c.infer("slow_parallel", [inp], **kwargs)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_kill9_scheduler_fails_in_flight_and_children_exit(tmp_path, protocol):
    """kill -9 of the root process (nobody is left to restart the scheduler): the
    scheduler dies with it, an in-flight request fails within seconds (no hang), every
    child exits at once, and no segment is left in /dev/shm. (kill -9 of the scheduler
    alone restarts it: tests/e2e/test_faults.py.)"""
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess(DEFAULT_REPOS, log_dir=tmp_path,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)}).start()
    children = srv.children()
    assert children
    run_dir = _run_dir(srv)
    prefix = f"shmserve-{srv.proc.pid:x}"
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(_slow_request, srv, protocol, 20000)
            wait_until(lambda: any(n.startswith("running-") for n in os.listdir(markers)),
                       TIMEOUT, what="slow request running")
            srv.proc.kill()
            killed = time.monotonic()
            with pytest.raises(Exception):
                fut.result(timeout=TIMEOUT)
            assert time.monotonic() - killed < 5.0, "in-flight request hung"
        try:
            wait_until(lambda: not [p for p in children if _alive(p)], 10,
                       what="children exit")
        except TimeoutError:
            left = [open(f"/proc/{p}/cmdline", "rb").read()[:120] for p in children
                    if _alive(p)]
            raise AssertionError(f"children still running: {left}\n{srv.log()[-3000:]}")
        wait_until(lambda: not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)],
                   10, what="segments removed")
        assert not os.path.exists(run_dir)
    finally:
        srv.proc.wait(TIMEOUT)
        for p in children:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        srv._log.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_largest_uint64_priority_is_served(hsrv, protocol):
    """Triton reads priority as uint64: 2**64-1 is a valid value (a level past the
    model's lowest runs at its default), never an overflow inside the server."""
    client = _client(hsrv, protocol)
    x = np.array([[1.0]], np.float32)
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    r = client.infer("identity_fp32", [clients.infer_input(protocol, "INPUT0", x, "FP32")],
                     priority=2 ** 64 - 1, **kwargs)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def _metric(srv, name: str, model: str) -> float | None:
    try:
        conn = http.client.HTTPConnection(f"127.0.0.1:{srv.metrics_port}", timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _fail_count(srv, model: str) -> int | None:
    try:
        conn = http.client.HTTPConnection(srv.http_url, timeout=5)
        conn.request("GET", f"/v2/models/{model}/stats")
        body = json.loads(conn.getresponse().read())
        conn.close()
        return int(body["model_stats"][0]["inference_stats"]["fail"]["count"])
    except (OSError, ValueError, KeyError):
        return None


def test_dead_frontends_queued_requests_are_dropped(tmp_path):
    """When a frontend dies, the requests it had queued in the scheduler are removed
    (they would run against its freed arena): with both slow_parallel instances busy,
    a queued request of the killed frontend counts as failed at once and never runs."""
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess(DEFAULT_REPOS, log_dir=tmp_path,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)}).start()
    try:
        frontend = next(p for p in srv.children()
                        if b"frontend.main" in open(f"/proc/{p}/cmdline", "rb").read())
        pool = cf.ThreadPoolExecutor(3)
        busy = [pool.submit(_slow_request, srv, "grpc", 8000) for _ in range(2)]
        wait_until(lambda: len([n for n in os.listdir(markers)
                                if n.startswith("running-")]) == 2,
                   TIMEOUT, what="both instances busy")
        queued = pool.submit(_slow_request, srv, "grpc", 8000)
        wait_until(lambda: _metric(srv, "nv_inference_pending_request_count",
                                   "slow_parallel") == 1, TIMEOUT, what="one queued")
        assert _fail_count(srv, "slow_parallel") == 0
        os.kill(frontend, signal.SIGKILL)
        for fut in busy + [queued]:
            with pytest.raises(Exception):
                fut.result(timeout=TIMEOUT)
        pool.shutdown()
        # the restarted frontend answers; the queued request was dropped, not run:
        # the pending gauge is 0 and it counts as failed while both instances still
        # sleep through their 8 s requests
        wait_until(lambda: _fail_count(srv, "slow_parallel") == 1, TIMEOUT,
                   what="the queued request dropped")
        assert _metric(srv, "nv_inference_pending_request_count", "slow_parallel") == 0
        assert "dropped 1 queued request(s) of a frontend that died" in srv.log()
    finally:
        assert srv.stop() == 0, srv.log()
    assert srv.segments() == []


@pytest.fixture(scope="module")
def wait_srv(tmp_path_factory):
    """shm_wait, whose one instance holds its input until the test touches "go"."""
    from tests.e2e.harness import ROOT
    markers = tmp_path_factory.mktemp("wait-markers")
    srv = ServerProcess(ROOT / "tests" / "models_hardening", "--allow-client-shm=true",
                        "--model-control-mode=explicit", "--load-model=shm_wait",
                        log_dir=tmp_path_factory.mktemp("wait-logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    yield from srv.serve()


def _shm_wait(srv, protocol, name, size, client=None):
    mod = clients.module(protocol)
    inp = mod.InferInput("INPUT0", [size], "UINT8")
    inp.set_shared_memory(name, size)
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    r = (client or _client(srv, protocol)).infer("shm_wait", [inp], **kwargs)
    return int(r.as_numpy("CHECKSUM")[0])


def _hold_and_truncate(srv, protocol, name, key):
    """One request of shm_wait on region `name`, truncated (to 0) while the model holds
    its input; the request's outcome."""
    markers = srv.markers
    with cf.ThreadPoolExecutor(1) as pool:
        # a client of its own: the HTTP client is not shared across threads
        fut = pool.submit(_shm_wait, srv, protocol, name, 16 * 4096)
        wait_until(lambda: (markers / "holding").exists(), TIMEOUT,
                   what="model holding the input")
        fd = os.open(f"/dev/shm/{key[1:]}", os.O_RDWR)
        os.ftruncate(fd, 0)
        os.close(fd)
        (markers / "go").touch()
        try:
            return fut.result(timeout=TIMEOUT)
        except InferenceServerException as exc:
            return exc
        finally:
            (markers / "go").unlink()


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_region_truncated_while_the_model_reads_it(wait_srv, protocol):
    """A client truncates its object while the model holds its input. The worker read
    that input into memory of its own before the model ran (shm/regions.py), so
    nothing faults: the request is answered from the bytes as they were, the region
    stays registered, and the client's next request fails with an error naming it,
    until the object is whole again."""
    size = 16 * 4096
    key = "/" + _unique("sstest-held")
    name = _unique("held")
    handle = shm.create_shared_memory_region(key[1:], key, size)
    client = _client(wait_srv, protocol)
    try:
        shm.set_shared_memory_region(handle, [np.full(size, 3, np.uint8)])
        _register(client, protocol, name, key, size)
        assert _hold_and_truncate(wait_srv, protocol, name, key) == 3 * 16
        (wait_srv.markers / "go").touch()  # the model reads at once from here on
        try:
            with pytest.raises(InferenceServerException) as err:
                _shm_wait(wait_srv, protocol, name, size, client)
            assert f"shared memory region '{name}' was truncated" in str(err.value)
            fd = os.open(f"/dev/shm/{key[1:]}", os.O_RDWR)
            os.ftruncate(fd, size)  # whole again (zeros)
            os.close(fd)
            assert _shm_wait(wait_srv, protocol, name, size, client) == 0
        finally:
            (wait_srv.markers / "go").unlink()
        assert "SIGBUS" not in wait_srv.log()
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def test_region_faulting_a_worker_is_quarantined(tmp_path):
    """The backstop, for a fault nobody foresaw (shm_wait maps the object itself, as no
    worker does): a client truncates its object while the model reads it in place, the
    read faults (SIGBUS) and kills that one worker. Its request fails, the region is
    unregistered (quarantined), the instance comes back, and the restart is not held
    against it: more faults than the restart policy allows (5 a minute) do not disable
    the model for everyone. The protocol does not matter here: gRPC only."""
    from scheduler.processes.worker_pool import MAX_RESTARTS
    from tests.e2e.harness import ROOT
    protocol = "grpc"
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess(ROOT / "tests" / "models_hardening", "--allow-client-shm=true",
                        "--model-control-mode=explicit", "--load-model=shm_wait",
                        log_dir=tmp_path, env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    srv.start()
    size = 16 * 4096
    client = _client(srv, protocol)

    def fault_once(i):
        key = "/" + _unique("sstest-fault")
        name = f"fault{i}"
        handle = shm.create_shared_memory_region(key[1:], key, size)
        try:
            shm.set_shared_memory_region(handle, [np.ones(size, np.uint8)])
            _register(client, protocol, name, key, size)
            (markers / "key").write_text(key)
            assert isinstance(_hold_and_truncate(srv, protocol, name, key),
                              InferenceServerException)
            # quarantined: the region is gone, its client's next request says so
            with pytest.raises(InferenceServerException) as err:
                _shm_wait(srv, protocol, name, size, client)
            assert f"Unable to find shared memory region: '{name}'" in str(err.value)
        finally:
            shm.destroy_shared_memory_region(handle)

    try:
        for i in range(MAX_RESTARTS + 2):
            fault_once(i)
        assert srv.log().count("killed by SIGBUS") == MAX_RESTARTS + 2
        assert "keeps dying" not in srv.log()
        (markers / "key").unlink()
        (markers / "go").touch()  # the model reads its input at once from now on
        plain = clients.module(protocol).InferInput("INPUT0", [4], "UINT8")
        plain.set_data_from_numpy(np.ones(4, np.uint8))
        r = client.infer("shm_wait", [plain], client_timeout=TIMEOUT)  # waits for it
        assert int(r.as_numpy("CHECKSUM")[0]) == 1
        assert client.is_model_ready("shm_wait")
    finally:
        assert srv.stop() == 0, srv.log()
    assert srv.segments() == []


def _refusal(infer) -> str:
    """The error of a request refused for its truncated region; "" while the instance
    is still restarting (UNAVAILABLE)."""
    try:
        infer()
    except InferenceServerException as exc:
        return str(exc) if "truncated" in str(exc) else ""
    raise AssertionError("a request read a truncated region")


def test_a_server_killed_whole_is_swept_by_the_next_one(tmp_path):
    """Every process of a server stopped, then SIGKILLed (nobody survives to clean
    up, as when a container's processes are OOM-killed together): its segments and
    run directory stay, and the next server to start removes them
    (scheduler/processes/leftovers.py) without touching a live server's."""
    for name in ("a", "b", "live"):
        (tmp_path / name).mkdir()
    srv = ServerProcess(EXAMPLES, *ONE_MODEL, log_dir=tmp_path / "a").start()
    prefix = f"shmserve-{srv.proc.pid:x}"
    live = ServerProcess(EXAMPLES, *ONE_MODEL, log_dir=tmp_path / "live").start()
    try:
        run_dir = _run_dir(srv)
        live_dir = _run_dir(live)
        x = np.zeros((1, 1 << 18), np.float32)  # 1 MiB: the arenas make their segments
        _client(srv, "http").infer("identity_fp32",
                                   [clients.infer_input("http", "INPUT0", x, "FP32")])
        everyone = [srv.proc.pid, srv.scheduler_pid(), *srv.children()]
        for pid in everyone:  # stopped first: none can react to another's death
            os.kill(pid, signal.SIGSTOP)
        for pid in everyone:
            os.kill(pid, signal.SIGKILL)
        srv.proc.wait(TIMEOUT)
        wait_until(lambda: not [p for p in everyone if _alive(p)], 10, what="all dead")
        left = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        # left for the next server to sweep (a server starting meanwhile on another
        # test worker may already have swept them, and then nothing is left at all)
        assert (left and os.path.exists(run_dir)) or not (left or os.path.exists(run_dir))
        ServerProcess(EXAMPLES, *ONE_MODEL, log_dir=tmp_path / "b").start().stop()
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        assert not os.path.exists(run_dir)
        assert os.path.exists(live_dir), "a live server's run directory was swept"
        assert _client(live, "http").is_server_ready()
    finally:
        srv._log.close()
        live.stop()
        remove_segments(prefix)  # when it failed before the sweep
