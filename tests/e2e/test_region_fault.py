"""A client's own system shared-memory region cannot fail other clients' requests
(issue 25, part 6).

Client A shrinks the object behind its registered region while its requests use it,
over and over, and re-registers it; client B's requests run in the same batches, on
the one instance of `region_batch`. A's requests fail with an error that names A's
region; every one of B's succeeds, and the worker never dies. Workers read a client's
object with preadv and write it with pwrite (shm/regions.py), so a shrunken object
is a short read that fails the request using it, where a read through a mapping of it
was a SIGBUS that killed the worker and every request in flight on it."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e import clients
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

TIMEOUT = 30  # a bound on every call and wait, never a pace
N = 16384  # floats per input: 64 KiB
MODEL = "region_batch"


@pytest.fixture(scope="module")
def rsrv(tmp_path_factory):
    """region_batch alone. TRITONSERVER_DELAY_SCHEDULER=2: its first batch forms only
    once two requests are queued, so the first test's two clients share it exactly."""
    markers = tmp_path_factory.mktemp("region-markers")
    srv = ServerProcess(ROOT / "tests" / "models_hardening", "--allow-client-shm=true",
                        "--model-control-mode=explicit", f"--load-model={MODEL}",
                        log_dir=tmp_path_factory.mktemp("region-logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers),
                             "TRITONSERVER_DELAY_SCHEDULER": "2"})
    srv.markers = markers
    yield from srv.serve()


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Region:
    """A client's object and the region it registered over it: the input at 0, the
    output after it. Written with pwrite, never through a mapping, so that shrinking
    it cannot fault this (the test's) process either."""

    def __init__(self, tag: str):
        self.name = _unique(tag)
        self.key = "/" + _unique(f"sstest-{tag}")
        self.size = 2 * N * 4
        self.path = f"/dev/shm/{self.key[1:]}"
        self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, self.size)

    def register(self, client) -> None:
        client.register_system_shared_memory(self.name, self.key, self.size)

    def write(self, values: np.ndarray) -> None:
        os.pwrite(self.fd, values.astype(np.float32).tobytes(), 0)

    def output(self) -> np.ndarray:
        return np.frombuffer(os.pread(self.fd, N * 4, N * 4), np.float32)

    def shrink(self) -> None:
        os.ftruncate(self.fd, 0)

    def regrow(self) -> None:
        os.ftruncate(self.fd, self.size)

    def close(self) -> None:
        os.close(self.fd)
        os.unlink(self.path)


def _infer(client, protocol: str, region: Region):
    """One request of [1, N] read from `region`, its OUTPUT0 written back into it."""
    mod = clients.module(protocol)
    inp = mod.InferInput("INPUT0", [1, N], "FP32")
    inp.set_shared_memory(region.name, N * 4)
    out = mod.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(region.name, N * 4, offset=N * 4)
    outputs = [out, mod.InferRequestedOutput("REQUESTS_IN_CALL"),
               mod.InferRequestedOutput("PID")]
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    r = client.infer(MODEL, [inp], outputs=outputs, **kwargs)
    return int(r.as_numpy("REQUESTS_IN_CALL")[0, 0]), int(r.as_numpy("PID")[0, 0])


def _client(srv, protocol):
    if protocol == "http":
        return clients.client(srv, protocol, network_timeout=TIMEOUT,
                              connection_timeout=TIMEOUT)
    return clients.client(srv, protocol)


def _worker_deaths(srv) -> int:
    return srv.log().count("in-flight request(s) failed")


def _is_own_fault(text: str, region: Region) -> bool:
    """An error A may get: its object was shrunk when a request read or wrote it, or
    its region was between unregister and register."""
    return (f"'{region.name}'" in text and "truncated" in text) or \
        f"Unable to find shared memory region: '{region.name}'" in text


def test_a_batch_keeps_the_requests_of_a_client_whose_region_shrank(rsrv):
    """A and B share one batch (the scheduler's hold forms it from both); A shrinks its
    object while the model holds the inputs. B's request succeeds, A's fails naming
    its region, and no worker died."""
    a, b = Region("a"), Region("b")
    admin = _client(rsrv, "http")
    deaths = _worker_deaths(rsrv)
    try:
        a.register(admin)
        b.register(admin)
        a.write(np.full(N, 7, np.float32))
        values = np.arange(N, dtype=np.float32)
        b.write(values)
        (rsrv.markers / "arm").touch()  # the model holds this batch until "go"
        with cf.ThreadPoolExecutor(2) as pool:
            # each client of its own (an HTTP client is not shared across threads)
            fb = pool.submit(lambda: _infer(_client(rsrv, "http"), "http", b))
            fa = pool.submit(lambda: _infer(_client(rsrv, "grpc"), "grpc", a))
            wait_until(lambda: (rsrv.markers / "holding").exists(), TIMEOUT,
                       what="the model holding both requests")
            a.shrink()
            (rsrv.markers / "go").touch()
            in_call, pid = fb.result(timeout=TIMEOUT)
            with pytest.raises(InferenceServerException) as err:
                fa.result(timeout=TIMEOUT)
        assert in_call == 2  # B's request ran in one execute() with A's
        np.testing.assert_array_equal(b.output(), values + 1)
        assert _is_own_fault(str(err.value), a) and "truncated" in str(err.value), \
            str(err.value)
        assert _worker_deaths(rsrv) == deaths, rsrv.log()
        rsrv.first_pid = pid
    finally:
        (rsrv.markers / "go").unlink(missing_ok=True)
        admin.unregister_system_shared_memory()
        a.close()
        b.close()


def _poll(predicate, timeout: float) -> bool:
    """wait_until without the raise, for threads that go on either way."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_a_client_that_keeps_shrinking_its_region_fails_alone(rsrv):
    """The issue's attack, bounded: A's two streams of requests run while A shrinks its
    object, grows it back and re-registers it, cycle after cycle; B sends 40 requests
    meanwhile, many batched with A's. Every one of B's succeeds with the right output,
    on the same worker process; A's fail only with errors that name its region."""
    a, b = Region("a"), Region("b")
    admin = _client(rsrv, "grpc")
    a.register(admin)
    b.register(admin)
    a.write(np.full(N, 7, np.float32))
    deaths = _worker_deaths(rsrv)
    stop = threading.Event()
    lock = threading.Lock()
    a_ok, a_errors, cycles = [0], [], [0]

    def a_sender():
        c = _client(rsrv, "grpc")
        while not stop.is_set():
            try:
                _infer(c, "grpc", a)
                with lock:
                    a_ok[0] += 1
            except InferenceServerException as exc:
                with lock:
                    a_errors.append(str(exc))

    def a_owner():
        c = _client(rsrv, "grpc")
        while not stop.is_set():
            failed = len(a_errors)
            a.shrink()
            _poll(lambda: len(a_errors) > failed or stop.is_set(), TIMEOUT)
            a.regrow()
            a.write(np.full(N, 7, np.float32))
            if cycles[0] % 2:  # the client that "kept re-registering"
                c.unregister_system_shared_memory(a.name, client_timeout=TIMEOUT)
                a.register(c)
            served = a_ok[0]
            _poll(lambda: a_ok[0] > served or stop.is_set(), TIMEOUT)
            cycles[0] += 1

    threads = [threading.Thread(target=f, daemon=True)
               for f in (a_sender, a_sender, a_owner)]
    b_client = _client(rsrv, "http")
    b_errors, in_calls, pids = [], [], set()
    try:
        for t in threads:
            t.start()
        for i in range(40):
            values = np.arange(N, dtype=np.float32) * (i + 1)
            b.write(values)
            try:
                in_call, pid = _infer(b_client, "http", b)
            except InferenceServerException as exc:
                b_errors.append(str(exc))
                continue
            in_calls.append(in_call)
            pids.add(pid)
            if not np.array_equal(b.output(), values + 1):
                b_errors.append(f"request {i}: wrong output")
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        admin.unregister_system_shared_memory()
        a.close()
        b.close()
    assert b_errors == [], b_errors
    assert pids == {getattr(rsrv, "first_pid", next(iter(pids)))}  # never restarted
    assert _worker_deaths(rsrv) == deaths, rsrv.log()
    assert "SIGBUS" not in rsrv.log()
    assert max(in_calls) > 1, in_calls  # B shared batches with A
    assert cycles[0] >= 1 and any("truncated" in e for e in a_errors), (cycles, a_errors)
    strange = [e for e in a_errors if not _is_own_fault(e, a)]
    assert strange == [], strange
