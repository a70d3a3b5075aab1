"""The bounded end-to-end fuzz run (issue 11, part 6): a few thousand seeded malformed
requests (tests/data/fuzz_cases.py: malformed JSON, lying Inference-Header-Content-
Length and binary_data_size, huge, negative and mismatched shapes, bad datatypes, lying
BYTES length prefixes, truncated, slow and malformed chunked bodies, random bytes, over
HTTP, gRPC and the gRPC stream) against a real server. No process dies, every answer
is one its case allows (a 4xx or a gRPC client-error code; a hang-up only where the
body never came whole; a success only where the mutation may have left the request
valid: never a 5xx, gRPC INTERNAL or UNKNOWN, nor a timeout), a valid request after
each chunk of cases succeeds, and the stopped server leaves no shared memory behind.

`scripts/fuzz` runs the same corpus against any server; tests/data/fuzz_triton_2.51.json
holds its cases and outcomes per class for the real Triton 2.51 beside shmserve's."""

from __future__ import annotations

import os

import pytest

from tests.data import fuzz_cases
from tests.e2e.harness import EXAMPLES, ServerProcess

pytestmark = pytest.mark.e2e

SEED = 11
CASES = 3000
CHECK_EVERY = 250
BUDGET = 75.0  # seconds for the cases; on this machine they take ~5
CASE_TIMEOUT = 10.0  # a bound on each case's answer, never a pace


def _processes(srv: ServerProcess) -> tuple[int, list[int]]:
    return srv.scheduler_pid(), sorted(srv.children())


@pytest.mark.timeout(115)
def test_fuzz_corpus_gets_client_errors_and_kills_nothing(tmp_path):
    srv = ServerProcess(EXAMPLES, frontends=2, log_dir=tmp_path).start()
    try:
        before = _processes(srv)
        assert before[0] and len(before[1]) >= 6, before  # 2 frontends, 4 instances
        changes, segments = [], []

        def same_processes(report):
            segments.append(srv.segments())
            now = _processes(srv)
            if srv.proc.poll() is not None or now != before:
                changes.append((len(report.results), now))
                raise AssertionError(
                    f"after case {len(report.results) - 1} the server's processes changed: "
                    f"{before} -> {now} (root exit {srv.proc.poll()})\n{srv.log()[-4000:]}")

        report = fuzz_cases.run(fuzz_cases.corpus(SEED, CASES), "127.0.0.1",
                                srv.http_port, srv.grpc_port, check_every=CHECK_EVERY,
                                timeout=CASE_TIMEOUT, seed=SEED, on_chunk=same_processes,
                                budget=BUDGET)
    finally:
        code = srv.stop()
    summary = "\n".join(f"{cls}: {dict(c)}" for cls, c in report.per_class().items())
    assert report.unsent == 0, f"{report.unsent} cases not sent in {BUDGET} s\n{summary}"
    assert len(report.results) == CASES
    assert set(report.per_class()) == set(fuzz_cases.CLASSES), summary
    unexpected = [f"case {r['id']} {r['cls']} ({r['note']}): {r['outcome']} {r['message']}"
                  for r in report.unexpected()]
    assert not unexpected, "\n".join(unexpected[:30]) + "\n" + summary
    assert not report.failed_checks(), report.failed_checks()
    assert len(report.checks) == CASES // CHECK_EVERY
    assert not changes
    assert code == 0, srv.log()[-4000:]
    assert segments[0], "the running server had no shared-memory segments?"
    # its segments are named shmserve-<root pid>...: others' servers may run meanwhile
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"shmserve-{srv.proc.pid:x}")]
    assert left == [], f"the server left shared memory behind: {left}"
