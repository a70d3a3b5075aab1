"""Dynamic batching and parallel instances, seen from the models' side: a batch's rows
split back to their requests, instances in processes of their own. Which requests form
a batch is proved in the scheduler's loop (tests/loop/test_scheduling.py)."""

import concurrent.futures as cf

import numpy as np
import pytest

from tests.e2e.clients import client, infer_input

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("protocol", ["http"])
def test_concurrent_requests_reach_one_execute_call(server, protocol):
    # batch_probe waits up to 2 s for preferred size 4: four concurrent requests
    # must arrive in one execute() call, and each must get its own rows back.
    def one(i):
        x = np.full((1, 4), i, dtype=np.float32)
        r = client(server, protocol).infer("batch_probe", [infer_input(protocol, "INPUT0", x, "FP32")])
        return x, r.as_numpy("OUTPUT0"), int(r.as_numpy("REQUESTS_IN_CALL")[0, 0])

    with cf.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4), timeout=60))
    for x, out, calls in results:
        np.testing.assert_array_equal(out, x)
        assert calls == 4


def test_two_instances_run_at_once(server):
    # slow_parallel has two instances (two processes); two 700 ms requests sent
    # together must overlap in time and run in different processes.
    def one(_):
        r = client(server, "grpc").infer(
            "slow_parallel", [infer_input("grpc", "DELAY_MS", np.array([700], np.int32), "INT32")])
        return int(r.as_numpy("PID")[0]), r.as_numpy("SPAN")

    with cf.ThreadPoolExecutor(2) as pool:
        (pid_a, span_a), (pid_b, span_b) = pool.map(one, range(2), timeout=60)
    assert pid_a != pid_b
    assert span_a[0] < span_b[1] and span_b[0] < span_a[1], (span_a, span_b)
