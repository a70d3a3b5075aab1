"""The dynamic batcher's queue policies and instance groups end to end, over HTTP and
gRPC with the official clients: what the wire shows of them (statuses, messages,
metrics, configs) and stopping with work queued. The rules of batch formation, queue
policies, preserve_ordering and the rate limiter are proved in the scheduler's loop
(tests/loop/test_batcher_rules.py). The models (tests/models_batcher) report which
execute() call of which instance ran each request and when; tests wait on the
pending-request gauge or on marker files the model writes, never on sleeps. The
configs were checked against Triton 2.51 (instance names, error texts and statuses)."""

import concurrent.futures as cf
import re
import time
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import client, infer_input
from tests.e2e.harness import ServerProcess, wait_until
from tests.models_batcher.repo import build

pytestmark = pytest.mark.e2e


def _serve(tmp_path_factory, name, models, *args, env=None):
    repo = build(tmp_path_factory.mktemp(f"{name}-repo"), models)
    markers = tmp_path_factory.mktemp(f"{name}-markers")
    srv = ServerProcess(repo, *args, frontends=2, log_dir=tmp_path_factory.mktemp(name),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers), **(env or {})})
    srv.markers = markers
    return srv


@pytest.fixture(scope="module")
def free(tmp_path_factory):
    """The rate limiter on, with one unit of resource R."""
    srv = _serve(tmp_path_factory, "free", ["qfull", "qreject", "groups", "wire"],
                 "--rate-limit=execution_count", "--rate-limit-resource=R:1")
    yield from srv.serve()


# -- helpers ------------------------------------------------------------------------------


def infer(srv, protocol, model, x, extra=None, **kw):
    """One request (INPUT0 = x, and INPUT1 = extra if given); returns what the probe
    model reports: call, in_call, instance, span, and when the response came."""
    x = np.asarray(x, dtype=np.float32)
    inputs = [infer_input(protocol, "INPUT0", x, "FP32")]
    if extra is not None:
        inputs.append(infer_input(protocol, "INPUT1", np.asarray(extra, np.float32), "FP32"))
    r = client(srv, protocol).infer(model, inputs, **kw)
    got = time.time()
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)  # its own rows back
    inst = r.as_numpy("INSTANCE").flat[0]
    return {"call": int(r.as_numpy("CALL").flat[0]),
            "in_call": int(r.as_numpy("IN_CALL").flat[0]),
            "instance": inst.decode() if isinstance(inst, bytes) else str(inst),
            "span": tuple(r.as_numpy("SPAN").reshape(-1)[:2]), "received": got}


def metric(srv, name, model, **labels):
    """A sample of the server's Prometheus endpoint for `model` (0 if absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics",
                                timeout=5) as r:
        text = r.read().decode()
    want = {"model": model, **labels}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(got.get(k) == v for k, v in want.items()):
            return float(m.group(3))
    return 0.0


def wait_pending(srv, model, n):
    wait_until(lambda: metric(srv, "nv_inference_pending_request_count", model) == n,
               30, what=f"{n} requests queued for {model}")


def wait_started(srv, pattern, before):
    """Wait until the model writes a `started-...` marker not in `before` (a set)."""
    wait_until(lambda: set(srv.markers.glob(pattern)) - before, 30,
               what=f"a new {pattern} marker")


def markers(srv, pattern):
    return set(srv.markers.glob(pattern))


def stats(srv, model):
    s = client(srv, "http").get_inference_statistics(model)["model_stats"][0]
    inf = s["inference_stats"]
    return {"execution_count": s["execution_count"], "inference_count": s["inference_count"],
            "success": inf["success"]["count"], "fail": inf["fail"]["count"],
            "batch_stats": {b["batch_size"]: b["compute_infer"]["count"]
                            for b in s["batch_stats"]}}


def settled(srv, model, finished):
    """The statistics once `finished` requests (successes and failures) are counted: a
    response can reach its client a moment before its batch is counted (Triton counts
    on request release, after the response too)."""
    wait_until(lambda: (lambda s: s["success"] + s["fail"] >= finished)(stats(srv, model)),
               30, what=f"{finished} requests counted for {model}")
    return stats(srv, model)


def expect_error(fn, http_status=None, grpc_status=None, message=None):
    with pytest.raises(InferenceServerException) as info:
        fn()
    err = info.value
    if message is not None:
        assert err.message() == message, err.message()
    status = str(err.status())
    assert status in {str(http_status), f"StatusCode.{grpc_status}"}, status
    return err


# -- queue rules (free) ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http"])  # the rule: tests/loop/
def test_full_queue_rejects_with_unavailable(free, protocol):
    """Rule: max_queue_size requests waiting -> the next is refused with UNAVAILABLE (HTTP
    503) and Triton's message; it counts as neither success nor failure."""
    before = stats(free, "qfull")
    seen = markers(free, "started-qfull_*")
    with cf.ThreadPoolExecutor(2) as pool:
        running = pool.submit(infer, free, protocol, "qfull", [[3000.0]])
        wait_started(free, "started-qfull_*", seen)
        queued = pool.submit(infer, free, protocol, "qfull", [[0.0]])
        wait_pending(free, "qfull", 1)
        expect_error(lambda: infer(free, protocol, "qfull", [[0.0]]), 503, "UNAVAILABLE",
                     "[request id: <id_unknown>] Exceeds maximum queue size")
        running.result(timeout=60)
        queued.result(timeout=60)
    after = settled(free, "qfull", before["success"] + before["fail"] + 2)
    assert after["success"] - before["success"] == 2
    assert after["fail"] == before["fail"]


@pytest.mark.parametrize("protocol", ["http"])  # the rule: tests/loop/
def test_queue_timeout_reject(free, protocol):
    """Rule: timeout_action REJECT: a request queued longer than its timeout (0.5 s
    default_timeout_microseconds) fails with UNAVAILABLE "Request timeout expired" while
    the instance is still busy, and counts as a failure with reason REJECTED."""
    before = stats(free, "qreject")
    rejected = metric(free, "nv_inference_request_failure", "qreject", reason="REJECTED")
    seen = markers(free, "started-qreject_*")
    with cf.ThreadPoolExecutor(1) as pool:
        running = pool.submit(infer, free, protocol, "qreject", [[2500.0]])
        wait_started(free, "started-qreject_*", seen)
        expect_error(lambda: infer(free, protocol, "qreject", [[0.0]]), 503,
                     "UNAVAILABLE", "Request timeout expired")
        assert not running.done(), "the rejection must not wait for the instance"
        running.result(timeout=60)
    after = settled(free, "qreject", before["success"] + before["fail"] + 2)
    assert (after["fail"] - before["fail"], after["success"] - before["success"]) == (1, 1)
    assert after["execution_count"] - before["execution_count"] == 1  # never ran
    assert metric(free, "nv_inference_request_failure", "qreject",
                  reason="REJECTED") == rejected + 1


# -- instances ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_instance_groups_are_named_as_triton_names_them_and_passive_never_runs(free,
                                                                              protocol):
    """Rules: every instance_group entry loads; an unnamed group is `<model>_<index>`,
    instances `<group>_<index>` (Triton 2.51: `groups_1_0` for a group of one); a
    passive instance is loaded but never scheduled."""
    c = client(free, protocol)
    cfg = c.get_model_config("groups")
    groups = cfg["instance_group"] if protocol == "http" else cfg.config.instance_group
    if protocol == "http":
        seen = [(g["name"], g["count"], bool(g.get("passive", False))) for g in groups]
    else:
        seen = [(g.name, g.count, g.passive) for g in groups]
    assert seen == [("pair", 2, False), ("groups_1", 1, False), ("standby", 1, True)]
    with cf.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda i: infer(free, protocol, "groups", [float(i)]),
                            range(12), timeout=60))
    names = {r["instance"] for r in got}
    assert names and names <= {"pair_0", "pair_1", "groups_1_0"}, names


# -- bad input ------------------------------------------------------------------------------


def test_priority_and_timeout_on_the_wire_as_triton_takes_them(free):
    """Rules (Triton 2.51): HTTP reads priority and timeout as unsigned integers and
    answers anything else with "Unable to parse '<key>': ..." (Triton with 500; the
    client's fault, so 400 here, as for every body Triton's JSON reader refuses); gRPC takes a
    negative int64 timeout (it becomes a huge unsigned one: no limit); a priority above
    priority_levels, or on a model without levels, means the default level. Refused
    requests change no counter."""
    before = stats(free, "wire")  # this test is the only one to use the model
    for key, value in (("timeout", -5), ("priority", -1)):
        kw = {key: value}
        expect_error(lambda: infer(free, "http", "wire", [1.0], **kw), 400, None,
                     f"Unable to parse '{key}': attempt to access JSON "
                     "non-unsigned-integer as unsigned-integer")
    after = stats(free, "wire")
    assert after == before
    infer(free, "grpc", "wire", [1.0], timeout=-5)
    infer(free, "grpc", "wire", [1.0], priority=7)
    infer(free, "http", "wire", [1.0], priority=7)
    assert settled(free, "wire", 3)["success"] == 3


# -- stopping ---------------------------------------------------------------------------------


def test_stopping_the_server_finishes_queued_requests(tmp_path_factory):
    """Rule: on SIGTERM the server stops taking requests but every request already
    queued or running still completes, and it exits 0 leaving no shared memory."""
    srv = _serve(tmp_path_factory, "stop", ["slow"])
    srv.start()
    try:
        with cf.ThreadPoolExecutor(4) as pool:
            futs = [pool.submit(infer, srv, ("http", "grpc")[i % 2], "slow", [[float(i)]])
                    for i in range(4)]
            wait_until(lambda: metric(srv, "nv_inference_pending_request_count", "slow")
                       == 3, 30, what="one running, three queued")
            srv.proc.send_signal(15)
            got = [f.result(timeout=60) for f in futs]
        assert sorted(r["call"] for r in got) == [1, 2, 3, 4]
        assert srv.proc.wait(60) == 0, srv.log()
        assert srv.segments() == []
    finally:
        srv.stop()
