"""Leases (shm/messages/leases.py): a client whose requests come one at a time is
served with its frontend sending them to the instance's worker straight. What a user
sees must not change: every answer right, statistics exact, an unload and a lost
instance handled as before, concurrent clients served; the wake counts written at the
stop show that the requests did go under a lease."""

from __future__ import annotations

import concurrent.futures as cf
import json
import queue
import shutil
import threading
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.e2e import clients
from tests.e2e.harness import EXAMPLES, ROOT, ServerProcess, wait_until
from tests.e2e.test_streams import _int_input, _metric

N = 40  # requests at c=1: the first LEASE_AFTER (16) earn the lease
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("leases")
    repo = tmp / "repo"
    # the faults model with one instance and no execute timeout (a watched instance is
    # never lent): killing it while lent must fail the request sent under the lease
    (repo / "lent_faulty" / "1").mkdir(parents=True)
    faulty = ROOT / "tests" / "models_faults" / "faulty"
    shutil.copy(faulty / "1" / "model.py", repo / "lent_faulty" / "1")
    config = (faulty / "config.pbtxt").read_text().replace('"faulty"', '"lent_faulty"')
    config = config.replace("count: 2", "count: 1")
    config = "\n".join(line for line in config.splitlines()
                       if "EXECUTE_TIMEOUT_SECS" not in line)
    (repo / "lent_faulty" / "config.pbtxt").write_text(config)
    markers = tmp / "markers"
    markers.mkdir()
    srv = ServerProcess([EXAMPLES, repo], "--model-control-mode", "explicit",
                        "--load-model", "identity_fp32", "--load-model", "lent_faulty",
                        log_dir=tmp, env={"SHMSERVE_WAKE_COUNTS": str(tmp / "wakes.json"),
                                          "SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.counts = tmp / "wakes.json"
    srv.start()
    yield srv
    srv.stop()  # test_the_requests_went_under_leases stops it checked


def identity(c, protocol: str, value: float) -> None:
    data = np.full((1, 16), value, dtype=np.float32)
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    out = c.infer("identity_fp32", [clients.infer_input(protocol, "INPUT0", data, "FP32")],
                  **kwargs).as_numpy("OUTPUT0")
    assert (out == data).all()


def counts(c, model: str) -> tuple[int, int, int]:
    stats = c.get_inference_statistics(model)
    if not isinstance(stats, dict):  # gRPC: the message
        from google.protobuf.json_format import MessageToDict
        stats = MessageToDict(stats, preserving_proto_field_name=True)
    s = stats["model_stats"][0]
    return (int(s["inference_stats"]["success"].get("count", 0)),
            int(s.get("inference_count", 0)), int(s.get("execution_count", 0)))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_one_request_at_a_time_is_answered_and_counted(server, protocol):
    c = clients.client(server, protocol)
    before = counts(c, "identity_fp32")
    for i in range(N):
        identity(c, protocol, float(i))
    # asked right after the last answer: the ends of batches sent under the lease
    # are read before the statistics are
    assert counts(c, "identity_fp32") == tuple(b + N for b in before)


def test_concurrent_clients_take_the_lease_back(server):
    http = clients.client(server, "http")
    for i in range(N):  # a lease is out when the burst comes
        identity(http, "http", float(i))
    before = counts(http, "identity_fp32")

    def burst(k: int) -> None:
        protocol = clients.PROTOCOLS[k % 2]
        c = clients.client(server, protocol)
        for i in range(20):
            identity(c, protocol, float(k * 100 + i))

    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(burst, range(4)))
    success, inferences, executions = counts(http, "identity_fp32")
    # requests that came together may have been batched: fewer executions
    assert (success, inferences) == (before[0] + 80, before[1] + 80)
    assert before[2] < executions <= before[2] + 80
    for i in range(N):  # and one client alone again
        identity(http, "http", float(i))
    assert counts(http, "identity_fp32") == (success + N, inferences + N, executions + N)


def test_an_unload_ends_the_lease(server):
    c = clients.client(server, "http")
    for i in range(N):
        identity(c, "http", float(i))
    c.unload_model("identity_fp32")
    with pytest.raises(InferenceServerException) as err:
        identity(c, "http", 1.0)
    assert "identity_fp32" in str(err.value)  # as before leases: unknown now
    c.load_model("identity_fp32")
    for i in range(N):
        identity(c, "http", float(i))


def test_an_unload_while_a_lone_client_sends_leaves_no_request_hanging(server):
    """The unload comes while requests flow one at a time under a lease: each of them
    is answered, with its outputs or with an error naming the model (one the worker
    never read fails when the worker stops), none waits out the client's deadline."""
    c = clients.client(server, "grpc")
    for i in range(N):
        identity(c, "grpc", float(i))
    outcomes: list[str] = []
    stop = threading.Event()

    def lone_client() -> None:
        client = clients.client(server, "grpc")
        while not stop.is_set():
            try:
                identity(client, "grpc", 2.0)
                outcomes.append("ok")
            except InferenceServerException as exc:
                outcomes.append(str(exc))

    thread = threading.Thread(target=lone_client)
    thread.start()
    try:
        wait_until(lambda: len(outcomes) >= 20, 10, what="requests under the lease")
        c.unload_model("identity_fp32")
        errors_from = len(outcomes)
        wait_until(lambda: len(outcomes) >= errors_from + 5, 10, what="answers after it")
    finally:
        stop.set()
        thread.join(2 * TIMEOUT)
    assert not thread.is_alive()
    errors = [o for o in outcomes if o != "ok"]
    assert errors, "no request came after the unload"
    for error in errors:
        assert "identity_fp32" in error and "Deadline" not in error, error
    c.load_model("identity_fp32")
    for i in range(N):
        identity(c, "grpc", float(i))


def _faulty_inputs(protocol: str, mode: int, delay_ms: int = 0) -> list:
    return [clients.infer_input(protocol, "MODE", np.array([mode], np.int32), "INT32"),
            clients.infer_input(protocol, "DELAY_MS", np.array([delay_ms], np.int32),
                                "INT32")]


def _faulty(c, protocol: str, mode: int) -> int:
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    return int(c.infer("lent_faulty", _faulty_inputs(protocol, mode), **kwargs)
               .as_numpy("PID")[0])


def _served_again(c, protocol: str) -> None:
    """Wait for lent_faulty's instance to serve (again, after its process died)."""
    def served() -> bool:
        try:
            return _faulty(c, protocol, 0) > 0
        except InferenceServerException:
            return False
    wait_until(served, 30, what="the instance back")


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_a_lent_instance_that_dies_fails_its_request(server, protocol):
    """The request the frontend sent under its lease fails with the scheduler's reason
    (it heard of the death, the frontend did not), and the restarted instance serves
    again."""
    c = clients.client(server, protocol, **({"network_timeout": TIMEOUT}
                                            if protocol == "http" else {}))
    wait_until(lambda: _faulty(c, protocol, 0) > 0, 30, what="the instance serving")
    for _ in range(N):
        _faulty(c, protocol, 0)
    with pytest.raises(InferenceServerException) as err:
        _faulty(c, protocol, 2)  # kills its own process
    assert "lent_faulty" in str(err.value) and "restarting" in str(err.value)
    _served_again(c, protocol)


def test_requests_waiting_under_a_deep_lease_when_its_instance_dies_are_answered(server):
    """lent_faulty runs every request alone on one instance: its lease is deep. Three
    requests go at once: the first runs 300 ms, the second kills the process, the
    third waits behind them. The first is answered with its outputs, the other two
    with an error naming the model, none waits out its deadline; the instance comes
    back and serves."""
    c = clients.client(server, "grpc")
    wait_until(lambda: _faulty(c, "grpc", 0) > 0, 30, what="the instance serving")
    for _ in range(N):  # the lease
        _faulty(c, "grpc", 0)
    got: queue.Queue = queue.Queue()
    for k, (mode, delay) in enumerate(((0, 300), (2, 0), (0, 0))):
        c.async_infer("lent_faulty", _faulty_inputs("grpc", mode, delay),
                      client_timeout=TIMEOUT,
                      callback=lambda result, error, k=k: got.put((k, result, error)))
    answers = dict((k, (r, e)) for k, r, e in (got.get(timeout=2 * TIMEOUT)
                                                for _ in range(3)))
    result, error = answers[0]
    assert error is None and int(result.as_numpy("PID")[0]) > 0
    for k in (1, 2):
        result, error = answers[k]
        assert result is None and "lent_faulty" in str(error), error
        assert "Deadline" not in str(error), error
    _served_again(c, "grpc")


def test_requests_in_client_regions_go_under_a_lease(tmp_path):
    """The frontend resolves the region names of a request it sends under its lease
    (the scheduler shares its table); an unregister takes the leases back and waits
    for them, and a region name gone, or a tensor out of its region's bounds, is
    refused as before, in the scheduler's words. A server of its own: its wake counts
    are this test's alone."""
    srv = ServerProcess(EXAMPLES, "--model-control-mode", "explicit",
                        "--load-model", "identity_fp32", "--allow-client-shm", "true",
                        log_dir=tmp_path,
                        env={"SHMSERVE_WAKE_COUNTS": str(tmp_path / "wakes.json")}).start()
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    key = f"/lease-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, 2 * data.nbytes)
    try:
        for protocol in clients.PROTOCOLS:
            c = clients.client(srv, protocol)
            mod = clients.module(protocol)
            rin, rout = f"in{uuid.uuid4().hex[:8]}", f"out{uuid.uuid4().hex[:8]}"
            c.register_system_shared_memory(rin, key, data.nbytes)
            c.register_system_shared_memory(rout, key, data.nbytes, offset=data.nbytes)
            before = counts(c, "identity_fp32")
            for i in range(N):
                shm.set_shared_memory_region(handle, [data + i])
                inp = mod.InferInput("INPUT0", [1, 16], "FP32")
                inp.set_shared_memory(rin, data.nbytes)
                out = mod.InferRequestedOutput("OUTPUT0")
                out.set_shared_memory(rout, data.nbytes)
                c.infer("identity_fp32", [inp], outputs=[out])
                got = shm.get_contents_as_numpy(handle, np.float32, [2, 16])
                np.testing.assert_array_equal(got[1], (data + i)[0])
            assert counts(c, "identity_fp32") == tuple(b + N for b in before)
            c.unregister_system_shared_memory(rin)
            inp = mod.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_shared_memory(rin, data.nbytes)
            with pytest.raises(InferenceServerException, match="Unable to find shared"):
                c.infer("identity_fp32", [inp])
            inp = mod.InferInput("INPUT0", [1, 16], "FP32")
            inp.set_shared_memory(rout, data.nbytes, offset=4)
            with pytest.raises(InferenceServerException, match="Invalid offset"):
                c.infer("identity_fp32", [inp])
            c.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(handle)
        srv.stop_checked()
    wakes = json.loads((tmp_path / "wakes.json").read_text())
    # of 2 x N, all but the LEASE_AFTER (16) that earn each lease, less a few where
    # an answer outran its batch's end to the scheduler (the count starts again)
    assert wakes.get("BatchDone under a lease", 0) >= N, wakes


def test_the_requests_went_under_leases(server):
    """Last in the module: the stop is clean (no segment left, exit 0) and the wake
    counts say most c=1 requests reached their worker without the scheduler."""
    server.stop_checked()
    wakes = json.loads(server.counts.read_text())
    # 2 x N (one module's c=1 runs per protocol) + 2 x N + 2 x N more above, less
    # the LEASE_AFTER each lease costs and what a revocation sends back
    assert wakes.get("BatchDone under a lease", 0) >= 3 * N, wakes
    assert "never released" not in server.log() and "still in use" not in server.log()


def _alone_repo(tmp_path):
    """A repository of `alone`: a python identity with one instance and no batching,
    whose lease is deep."""
    repo = tmp_path / "repo"
    (repo / "alone" / "1").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "models" / "nobatch_identity" / "1" / "model.py",
                repo / "alone" / "1")
    (repo / "alone" / "config.pbtxt").write_text(
        'name: "alone"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    return repo


def test_overlapping_clients_of_one_frontend_go_under_a_deep_lease(tmp_path):
    """The one instance of a model that runs every request alone is lent deep: four
    clients at once, through one frontend, send their requests to its worker
    straight, up to LEASE_DEPTH at once, the worker holding those it has not run as
    the instance's queue. Every answer is its own request's, the statistics count
    each once, and the wake counts show that the scheduler saw few of them. A server
    of its own: its wake counts are this test's alone."""
    srv = ServerProcess(_alone_repo(tmp_path), "--frontend-processes", "1", log_dir=tmp_path,
                        env={"SHMSERVE_WAKE_COUNTS": str(tmp_path / "wakes.json")}).start()
    per_client = 60

    def client(k: int) -> None:
        protocol = clients.PROTOCOLS[k % 2]
        c = clients.client(srv, protocol)
        for i in range(per_client):
            data = np.full((1, 16), k * 1000 + i, dtype=np.float32)
            out = c.infer("alone", [clients.infer_input(protocol, "INPUT0", data, "FP32")])
            np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), data)

    try:
        with cf.ThreadPoolExecutor(4) as pool:
            list(pool.map(client, range(4)))
        total = 4 * per_client
        assert counts(clients.client(srv, "http"), "alone") == (total, total, total)
    finally:
        srv.stop_checked()
    wakes = json.loads((tmp_path / "wakes.json").read_text())
    # all but those before the lease (LEASE_AFTER, 16) and a few the frontend sent
    # past its depth before an answer came back ran under it; the scheduler sent on
    # only those, and nothing took the lease back
    assert wakes.get("BatchDone under a lease", 0) >= total - 40, wakes
    assert wakes.get("sent on under a lease", 0) <= total // 2, wakes


def test_a_request_waiting_under_a_deep_lease_is_pending_and_a_cancel_drops_it(tmp_path):
    """Under a deep lease a request sent while another runs waits at the worker, not
    in the scheduler, and is still queued for its client and for the metrics: the
    pending count says 1, a cancel answers it and it never runs (Triton's rule for a
    queued request), and the statistics count it as failed. A server of its own with
    one frontend, the one-instance slow model of the stream tests."""
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess(ROOT / "tests" / "models_decoupled", "--model-control-mode",
                        "explicit", "--load-model", "slow_identity",
                        "--frontend-processes", "1", log_dir=tmp_path,
                        env={"SHMSERVE_WAKE_COUNTS": str(tmp_path / "wakes.json"),
                             "SHMSERVE_TEST_MARKER_DIR": str(markers)}).start()

    def slow_input(value):
        return [_int_input(grpcclient, "INPUT0", [value])]

    def pending():
        return _metric(srv, "nv_inference_pending_request_count", "slow_identity")

    try:
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        for i in range(N):  # one at a time: the lease, and the lessee's sends under it
            assert c.infer("slow_identity", slow_input(i)).as_numpy("OUTPUT0")[0] == i
        before = counts(c, "slow_identity")
        got: queue.Queue = queue.Queue()
        c.async_infer("slow_identity", slow_input(1), request_id="run-deep",
                      parameters={"delay_ms": 1500},
                      callback=lambda result, error: got.put(("running", result, error)))
        wait_until(lambda: (markers / "started-run-deep").exists(), TIMEOUT,
                   what="the long request to run")
        call = c.async_infer("slow_identity", slow_input(2),
                             callback=lambda result, error: got.put(("queued", result,
                                                                     error)))
        wait_until(lambda: pending() == 1, TIMEOUT, what="the second to be pending")
        call.cancel()
        which, result, error = got.get(timeout=TIMEOUT)
        assert which == "queued" and result is None and "CANCELLED" in str(error.status())
        which, result, error = got.get(timeout=TIMEOUT)
        assert which == "running" and error is None
        # one success, inference and execution more (the long one); the cancelled one
        # failed, never ran
        wait_until(lambda: counts(c, "slow_identity") == (before[0] + 1, before[1] + 1,
                                                          before[2] + 1), TIMEOUT,
                   what="the cancelled request counted and never run")
        stats = c.get_inference_statistics("slow_identity", as_json=True)
        assert int(stats["model_stats"][0]["inference_stats"]["fail"]["count"]) == 1
        wait_until(lambda: pending() == 0, TIMEOUT, what="nothing pending")
    finally:
        srv.stop_checked()
    wakes = json.loads((tmp_path / "wakes.json").read_text())
    # the scheduler saw the requests that earned the lease, and few more: the long one
    # and the cancelled one went to the worker straight
    assert wakes["InferRequest"] <= 16 + 4, wakes
    assert wakes.get("BatchDone under a lease", 0) >= N - 16, wakes


def test_an_unload_while_clients_overlap_under_a_deep_lease_leaves_none_hanging(tmp_path):
    """Four clients of one frontend send to `alone` under its deep lease, up to four of
    their requests at the worker, when it is unloaded: each request is answered, with
    its outputs or an error naming the model (those the worker had not run are
    handed on to the scheduler, or fail when the worker stops), none waits out the
    client's deadline, and the model serves again once loaded."""
    srv = ServerProcess(_alone_repo(tmp_path), "--frontend-processes", "1",
                        "--model-control-mode", "explicit", "--load-model", "alone",
                        log_dir=tmp_path).start()
    outcomes: list[str] = []
    stop = threading.Event()

    def client(k: int) -> None:
        c = clients.client(srv, "grpc")
        data = np.full((1, 16), k, dtype=np.float32)
        while not stop.is_set():
            try:
                out = c.infer("alone", [clients.infer_input("grpc", "INPUT0", data, "FP32")],
                              client_timeout=TIMEOUT).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, data)
                outcomes.append("ok")
            except InferenceServerException as exc:
                outcomes.append(str(exc))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(outcomes) >= 100, 20, what="requests under the lease")
        c = clients.client(srv, "http")
        c.unload_model("alone")
        errors_from = len(outcomes)
        wait_until(lambda: len(outcomes) >= errors_from + 8, 20, what="answers after it")
        stop.set()
        for t in threads:
            t.join(2 * TIMEOUT)
        assert not any(t.is_alive() for t in threads)
        errors = [o for o in outcomes if o != "ok"]
        assert errors, "no request came after the unload"
        for error in errors:
            assert "alone" in error and "Deadline" not in error, error
        c.load_model("alone")
        data = np.ones((1, 16), dtype=np.float32)
        out = c.infer("alone", [clients.infer_input("http", "INPUT0", data, "FP32")])
        np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), data)
    finally:
        stop.set()
        srv.stop_checked()
