"""The container's HEALTHCHECK (scheduler.healthcheck) asks the port the server was
started with, not a port written into the image."""

import http.server
import threading
from pathlib import Path

import pytest

from scheduler import healthcheck

ROOT = Path(__file__).resolve().parents[2]


def fake_proc(tmp_path: Path, processes: dict[int, list[str]]) -> str:
    tmp_path.mkdir()
    for pid, argv in processes.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv)
                                                      + b"\0")
    (tmp_path / "self").mkdir()  # not a pid: skipped
    return str(tmp_path)


SCRIPT = ["/opt/shmserve/bin/python3", "/opt/shmserve/bin/shmserve"]


@pytest.mark.parametrize("args, expected", [
    (["--model-repository=/models"], ("http", "http://127.0.0.1:8000/v2/health/ready")),
    (["--model-repository=/models", "--http-port=9000"],
     ("http", "http://127.0.0.1:9000/v2/health/ready")),
    (["--http-port", "9001", "--http-address", "10.1.2.3", "--unknown-flag"],
     ("http", "http://10.1.2.3:9001/v2/health/ready")),
    (["--http-address", "::", "--http-port", "9002"],
     ("http", "http://[::1]:9002/v2/health/ready")),
    (["--allow-http=false", "--grpc-port=9003"], ("grpc", "127.0.0.1:9003")),
])
def test_target_follows_the_servers_own_flags(args, expected):
    assert healthcheck.target([*SCRIPT, *args]) == expected
    assert healthcheck.target(["python", "-m", "scheduler.main", *args]) == expected


def test_the_oldest_shmserve_process_is_the_server(tmp_path):
    proc = fake_proc(tmp_path / "a", {
        3: ["sleep", "100"],
        7: [*SCRIPT, "--http-port=9000"],
        9: ["python", "-m", "scheduler.main", "--http-port=9000"],  # the scheduler
        12: ["python3", "-m", "scheduler.healthcheck"]})
    assert healthcheck.find_server(proc) == [*SCRIPT, "--http-port=9000"]
    # `docker run --init`: the init names shmserve and its flags; they are the server's
    init = ["/sbin/docker-init", "--", "shmserve", "--http-port=9000"]
    proc = fake_proc(tmp_path / "b", {1: init, 7: [*SCRIPT, "--http-port=9000"]})
    assert healthcheck.target(healthcheck.find_server(proc))[1].endswith(":9000/v2/health/ready")
    assert healthcheck.find_server(fake_proc(tmp_path / "c", {3: ["sleep", "1"]})) is None


def test_ready_answers_by_status():
    statuses = iter([200, 503])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(next(statuses))
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/v2/health/ready"
        assert healthcheck.ready("http", url)
        assert not healthcheck.ready("http", url)  # 503: not ready
    finally:
        srv.shutdown()
        srv.server_close()
    assert not healthcheck.ready("http", url, timeout=1)  # nobody listens


def test_the_image_checks_with_it_and_no_port_is_written_in():
    text = (ROOT / "Dockerfile").read_text()
    healthcheck_lines = text[text.index("HEALTHCHECK"):text.index("ENTRYPOINT")]
    assert '"-m", "scheduler.healthcheck"' in healthcheck_lines
    assert "8000" not in healthcheck_lines.split("CMD", 1)[1]
