"""A stop ends every process within --exit-timeout-secs (and a small margin), whatever
the clients do, and no frontend outlives its scheduler.

Triton's lifecycle tests once left a stream hanging; after SIGTERM a frontend went on
draining it for ~127 s, holding the ports, although the rest of the server had
stopped. Here the clients are as bad as they get at once: a gRPC stream whose request
runs a model that sleeps for ten minutes, an HTTP/2 peer that opened a stream with a
zero flow-control window (its answer can never be sent) and never reads, and an
HTTP/1.1 request cut off halfway through its body.
"""

import contextlib
import os
import queue
import signal
import socket
import sys
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.harness import MODELS, ROOT, ServerProcess, port_bindable, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EXIT_TIMEOUT_S = 2
MARGIN_S = 8.0  # the stop's own steps on a busy 2-core machine (~3.5 s); was 20+ s before


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def _cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()
    return b""


def _stalled_h2_stream(srv) -> socket.socket:
    """An HTTP/2 peer with a zero initial window: the answer to its stream request can
    never be sent, and it never reads."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import attack_wire as w
    s = socket.create_connection(("127.0.0.1", srv.grpc_port), timeout=10)
    body = w.grpc_message(w.model_infer_request("slow_identity", "INPUT0", [4],
                                                b"\1\0\0\0" * 4, "INT32"))
    s.sendall(w.PREFACE + w.settings({w.INITIAL_WINDOW_SIZE: 0})
              + w.frame(w.HEADERS, w.END_HEADERS, 1, w.request_block(
                  srv.grpc_url, "/inference.GRPCInferenceService/ModelStreamInfer"))
              + w.frame(w.DATA, 0, 1, body))
    return s


def test_stop_ends_every_process_within_the_exit_timeout(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess((ROOT / "tests" / "models_decoupled", MODELS),
                        "--exit-timeout-secs", str(EXIT_TIMEOUT_S), log_dir=tmp_path,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.start()
    scheduler = srv.scheduler_pid()
    children = srv.children()
    pids = [srv.proc.pid, scheduler, *children]
    frontends = [p for p in children if b"frontend" in _cmdline(p)]
    assert frontends, [_cmdline(p) for p in children]
    held = []
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        x = grpcclient.InferInput("INPUT0", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.async_stream_infer("slow_identity", [x], request_id="hung",
                                  parameters={"delay_ms": 600_000})
        held.append(_stalled_h2_stream(srv))
        h = socket.create_connection(("127.0.0.1", srv.http_port), timeout=10)
        h.sendall(b"POST /v2/models/slow_identity/infer HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Length: 100\r\n\r\n{")
        held.append(h)
        wait_until(lambda: (markers / "started-hung").exists(), 30,
                   what="the hung request to run")

        start = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        gone: dict[int, float] = {}

        def all_gone() -> bool:
            for pid in pids:
                if pid not in gone and not _alive(pid):
                    gone[pid] = time.monotonic() - start
            srv.proc.poll()  # reap the root
            return len(gone) == len(pids)

        wait_until(all_gone, EXIT_TIMEOUT_S + MARGIN_S, 0.05,
                   f"every process to exit (pids {pids}, gone {gone})")
        assert port_bindable(srv.http_port) and port_bindable(srv.grpc_port)
        # no frontend outlived the scheduler (it holds the ports and the arenas)
        assert max(gone[p] for p in frontends) <= gone[scheduler], gone
        assert srv.segments() == []
    finally:
        for s in held:
            s.close()
        with contextlib.suppress(Exception):
            client.stop_stream(cancel_requests=True)
        for pid in pids:  # whatever survived a failed check
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        srv.stop()
