"""The bounded end-to-end fuzz of the native HTTP/2 transport (issue 25, part 4): a few
hundred seeded, mutated HTTP/2 byte streams (tests/data/h2_fuzz_cases.py), one
connection each, four at a time, against a real server. As the HTTP/1 fuzz run
(test_fuzz.py) asserts: the server's processes stay the same, nothing is answered as a
server fault (no GOAWAY INTERNAL_ERROR, no gRPC UNKNOWN, INTERNAL only with grpcio's
words for a malformed message, no traceback in the log), each case ends within its
time, the frontend's memory stays bounded, and a valid request after each chunk of
cases succeeds.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from frontend.transport import h2
from tests.data import h2_fuzz_cases
from tests.e2e.harness import EXAMPLES, ServerProcess
from tests.e2e.test_h2_attacks import frontend_rss_kib

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150),
              # the native transport's limits: grpc.aio's are grpc-core's own
              pytest.mark.skipif(os.environ.get("SHMSERVE_TEST_GRPC_FRONTEND") == "grpcio",
                                 reason="tests the native HTTP/2 transport")]

SEED = 25
CASES = 400
CHUNK = 50
CASE_LIMIT = 10.0  # seconds for one case, a bound and never a pace
# what grpcio (and so this server) says, with INTERNAL, of a request message that is
# malformed on the wire: the client's doing, not a server fault
FRAMING = ("Incomplete request message", "Received more than one request message",
           "Received no request message", "Compressed message without grpc-encoding",
           "Failed to decompress", "Error parsing 'grpc-encoding' metadata")


def _valid_request(srv) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
    out = client.infer("identity_fp32", [inp], client_timeout=10)
    assert out.as_numpy("OUTPUT0").shape == (1, 16)
    client.close()


def _faults(c, out) -> list[str]:
    bad = []
    if h2.INTERNAL_ERROR in out.goaways:
        bad.append("GOAWAY INTERNAL_ERROR")
    for status, message in out.statuses:
        if status == "2" or status == "13" and not message.startswith(FRAMING):
            bad.append(f"grpc-status {status} {message[:100]}")
    if out.seconds >= CASE_LIMIT:
        bad.append(f"took {out.seconds:.1f} s")
    return [f"case {c.id} ({c.note}): {b}" for b in bad]


def test_mutated_http2_streams_get_protocol_answers_and_hurt_nothing(tmp_path):
    srv = ServerProcess(EXAMPLES, log_dir=tmp_path).start()
    try:
        pids = (srv.scheduler_pid(), sorted(srv.children()))
        rss = frontend_rss_kib(srv)
        cases = h2_fuzz_cases.corpus(SEED, CASES)
        faults, codes = [], set()
        with ThreadPoolExecutor(4) as pool:
            for first in range(0, CASES, CHUNK):
                chunk = cases[first:first + CHUNK]
                outs = list(pool.map(
                    lambda c: h2_fuzz_cases.play(srv.grpc_port, c, limit=CASE_LIMIT),
                    chunk))
                for c, out in zip(chunk, outs):
                    faults += _faults(c, out)
                    codes.update(out.goaways)
                assert (srv.scheduler_pid(), sorted(srv.children())) == pids, \
                    srv.log()[-3000:]
                _valid_request(srv)
        grown = frontend_rss_kib(srv) - rss
    finally:
        code = srv.stop()
    assert not faults, "\n".join(faults[:30])
    # nothing escaped the transport's own handling (asyncio logs what does)
    assert "Traceback" not in srv.log(), srv.log()[-3000:]
    # the corpus reaches the transport's error paths, not only its happy one
    assert {h2.PROTOCOL_ERROR, h2.FRAME_SIZE_ERROR, h2.COMPRESSION_ERROR} <= codes, codes
    assert grown < 100 * 1024, f"the frontend grew by {grown} KiB"
    assert code == 0, srv.log()[-3000:]
