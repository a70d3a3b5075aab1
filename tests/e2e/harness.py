"""Starting a real shmserve (every process) on free loopback ports, for tests."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models"
EXAMPLES = ROOT / "examples" / "model_repository"
# The examples are served beside the test models: two repositories, as
# --model-repository is repeatable, and the examples stay tested.
DEFAULT_REPOS = (EXAMPLES, MODELS)


# Below the kernel's ephemeral range (32768 and up here): a port the kernel gave a
# test's outgoing connection, or another test process's bind(0), is never one of
# these. Two test processes drawing the same one at once is left to start()'s retry.
PORTS = (20000, 32000)


def port_bindable(port: int) -> bool:
    """A server could listen on `port` now (bound as servers bind: SO_REUSEADDR, so a
    closed connection's TIME_WAIT does not count)."""
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _port_is_free(port: int) -> bool:
    """Nothing listens there, and no shmserve holds its lock (an abstract socket named
    after the port: scheduler/processes/frontend_pool.py)."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0shmserve-port-{port}")
    except OSError:
        return False
    try:
        return port_bindable(port)
    finally:
        lock.close()


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    rng = random.SystemRandom()
    while len(ports) < n:
        port = rng.randrange(*PORTS)
        if port not in ports and _port_is_free(port):
            ports.append(port)
    return ports


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def _pgrep_children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


class ServerProcess:
    """`shmserve` as a user starts it, with its log in a file."""

    def __init__(self, repos=DEFAULT_REPOS, *args: str, frontends: int = 1,
                 log_dir: Path | None = None, env: dict | None = None):
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        if isinstance(repos, (str, Path)):
            repos = [repos]
        repo_args = [a for r in repos for a in ("--model-repository", str(r))]
        self.argv = [sys.executable, "-m", "scheduler.main", *repo_args,
                     "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                     "--metrics-address", "127.0.0.1",
                     "--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port),
                     "--metrics-port", str(self.metrics_port),
                     "--frontend-processes", str(frontends), *args]
        # SHMSERVE_TEST_GRPC_FRONTEND=native runs every test server on the native
        # gRPC transport (scripts/test's second pass)
        grpc_frontend = os.environ.get("SHMSERVE_TEST_GRPC_FRONTEND")
        if grpc_frontend:
            self.argv += ["--grpc-frontend", grpc_frontend]
        # SHMSERVE_TEST_HTTP_FRONTEND=native: the same for the HTTP/1.1 transport
        http_frontend = os.environ.get("SHMSERVE_TEST_HTTP_FRONTEND")
        if http_frontend:
            self.argv += ["--http-frontend", http_frontend]
        self.log_path = Path(log_dir or "/tmp") / f"shmserve-test-{self.http_port}.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, wait_ready: bool = True, timeout: float = 120.0) -> "ServerProcess":
        for attempt in range(3):
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, stdout=self._log,
                                         stderr=subprocess.STDOUT, env=self.env)
            if not wait_ready:
                return self
            wait_until(self._ready_or_dead, timeout, 0.1, "server readiness")
            if self.proc.poll() is None:
                return self
            log = self.log()
            if "is already in use" not in log or attempt == 2:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log}")
            # another test's server took a port between our draw and its bind: new ports
            self._log.close()
            self._new_ports()
        return self

    def _new_ports(self) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        for flag, port in (("--http-port", self.http_port), ("--grpc-port", self.grpc_port),
                           ("--metrics-port", self.metrics_port)):
            self.argv[self.argv.index(flag) + 1] = str(port)

    def _ready_or_dead(self) -> bool:
        if self.proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(
                    f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def segments(self) -> list[str]:
        """This server's segments in /dev/shm (their names start with its pid in hex)."""
        prefix = f"shmserve-{self.proc.pid:x}"
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))

    def scheduler_pid(self) -> int:
        """The scheduler process: the one child of the root (`shmserve`) process,
        which restarts it when it is killed; 0 while none runs."""
        for pid in _pgrep_children(self.proc.pid):
            # right after a scheduler died, its children are the root's for a moment
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"scheduler.main" in f.read():
                        return pid
            except OSError:
                continue
        return 0

    def children(self) -> list[int]:
        """The scheduler's children: the frontends and the workers."""
        pid = self.scheduler_pid()
        return _pgrep_children(pid) if pid else []

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            for pid in self.children() + [self.scheduler_pid()]:
                if not pid:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            self._log.close()

    def serve(self):
        """For fixtures, `yield from srv.serve()`: starts the server, hands it to the
        tests, and afterwards checks that it stopped cleanly (exit code 0) and left no
        shared-memory segment behind."""
        self.start()
        yield self
        self.stop_checked()

    def stop_checked(self) -> None:
        """Stop, and check that it stopped cleanly and left no shared memory."""
        code = self.stop()
        assert code == 0, self.log()
        assert self.segments() == [], "server left shared memory behind"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
