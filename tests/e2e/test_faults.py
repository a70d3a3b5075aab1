"""Faults survived under load: kill -9 of a worker, the scheduler and a frontend while
clients of both protocols keep sending; a python model that raises, kills itself or
hangs; SIGTERM under load. Every client call has a timeout, every wait a deadline;
timings are asserted in seconds."""

import concurrent.futures as cf
import os
import signal
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from tests.e2e import clients
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

REPO = ROOT / "tests" / "models_faults"
TIMEOUT = 20.0  # bound on every client call
HELD_FAILS_WITHIN = 3.0  # a held request's error comes this soon after the kill
BACK_WITHIN = 30.0  # the killed child is serving again this soon
SERVE, RAISE, KILL_SELF, HANG = 0, 1, 2, 3


def _client(srv, protocol):
    if protocol == "http":
        return clients.client(srv, protocol, connection_timeout=TIMEOUT,
                              network_timeout=TIMEOUT)
    return clients.client(srv, protocol)


def _infer(c, protocol, mode=SERVE, delay_ms=0):
    inputs = [clients.infer_input(protocol, "MODE", np.array([mode], np.int32), "INT32"),
              clients.infer_input(protocol, "DELAY_MS", np.array([delay_ms], np.int32),
                                  "INT32")]
    kwargs = {"client_timeout": TIMEOUT} if protocol == "grpc" else {}
    return int(c.infer("faulty", inputs, **kwargs).as_numpy("PID")[0])


def _closed(c) -> None:
    """Close a client on the thread that made it (an HTTP client's gevent pool cannot
    be joined from another thread's garbage collection); always None."""
    if c is not None:
        try:
            c.close()
        except Exception:  # noqa: BLE001 -- a client of a server that went away
            pass
    return None


def _ready(srv) -> bool:
    try:
        with urllib.request.urlopen(f"http://{srv.http_url}/v2/health/ready",
                                    timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


class Load:
    """A few client threads, HTTP and gRPC, sending short requests until stopped; each
    call is recorded as (protocol, start, end, pid or None, error)."""

    def __init__(self, srv, threads: int = 4, delay_ms: int = 50):
        self.srv, self.delay_ms = srv, delay_ms
        self.stop = threading.Event()
        self.calls: list[tuple] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(("http", "grpc")[i % 2],),
                                         daemon=True) for i in range(threads)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(TIMEOUT + 5)
        assert not any(t.is_alive() for t in self.threads), "a client call hung"

    def _run(self, protocol):
        c = None
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                # a client per connection: a gRPC channel whose server went away backs
                # off for seconds before it reconnects; a fresh one tries at once
                c = c or _client(self.srv, protocol)
                pid, error = _infer(c, protocol, SERVE, self.delay_ms), None
            except Exception as exc:  # noqa: BLE001 -- every failure is recorded
                pid, error = None, exc
                c = _closed(c)
                self.stop.wait(0.02)  # a refused connection must not spin a core
            with self.lock:
                self.calls.append((protocol, start, time.monotonic(), pid, error))
        _closed(c)

    def snapshot(self) -> list[tuple]:
        with self.lock:
            return list(self.calls)

    def served_since(self, t: float, protocol: str | None = None) -> list[tuple]:
        return [c for c in self.snapshot() if c[1] >= t and c[4] is None
                and (protocol is None or c[0] == protocol)]


class ReadinessPoll:
    """Polls /v2/health/ready and keeps every (time, ready) it saw."""

    def __init__(self, srv):
        self.srv, self.seen, self.stop = srv, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            ready = _ready(self.srv)
            self.seen.append((time.monotonic(), ready))  # when the answer came
            self.stop.wait(0.02)

    def down_then_up(self, since: float) -> float:
        """Readiness said no after `since` (a dying child may still answer yes for a
        moment), then yes again within BACK_WITHIN: when it came back."""
        down = wait_until(lambda: next((t for t, ready in self.seen
                                        if t > since and not ready), None),
                          BACK_WITHIN, what="readiness to say no")
        return wait_until(lambda: next((t for t, ready in self.seen
                                        if t > down and ready), None),
                          BACK_WITHIN, what="ready again")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


def _held(srv, protocol, markers, ms: int = 15000):
    """A request of `ms` on one instance; returns its future and the pid running it."""
    pool = cf.ThreadPoolExecutor(1)
    before = set(os.listdir(markers))
    fut = pool.submit(lambda: _infer(_client(srv, protocol), protocol, SERVE, ms))
    pool.shutdown(wait=False)
    name = wait_until(lambda: next((n for n in os.listdir(markers)
                                    if n.startswith("running-") and n not in before), None),
                      TIMEOUT, what="the held request running")
    os.unlink(markers / name)
    return fut, int(name.split("-")[1])


def _fails_soon(fut, killed: float) -> Exception:
    """The held request fails soon after the kill. Over HTTP, a killed frontend's
    connection closes under the client, which raises its transport's error rather than
    an InferenceServerException."""
    with pytest.raises(Exception) as err:
        fut.result(timeout=TIMEOUT)
    assert not isinstance(err.value, cf.TimeoutError), "the held request hung"
    took = time.monotonic() - killed
    assert took < HELD_FAILS_WITHIN, f"the held request took {took:.1f}s to fail"
    return err.value


def _in_flight_ended_soon(load: Load, killed: float) -> None:
    """Every load request that was in flight at the kill ended (answered or failed)
    within seconds: none waited for its client timeout."""
    held = [c for c in load.snapshot() if c[1] < killed < c[2]]
    late = [c for c in held if c[2] - killed > HELD_FAILS_WITHIN + 2]
    assert not late, f"{len(late)} in-flight request(s) ended late: {late[:3]}"


def _stop_clean(srv, run_dirs=()):
    assert srv.stop() == 0, srv.log()[-4000:]
    assert srv.segments() == [], "shared memory left behind"
    for d in run_dirs:
        assert not os.path.exists(d), f"socket directory {d} left behind"


def _run_dir(srv) -> str:
    for pid in srv.children():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            for arg in f.read().split(b"\0"):
                if arg.startswith(b"ipc://"):
                    return os.path.dirname(arg[len(b"ipc://"):].decode())
    raise AssertionError("no child names the socket directory")


def _start(tmp_path, *args, frontends=1, env=None):
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    srv = ServerProcess(REPO, *args, frontends=frontends, log_dir=tmp_path,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers), **(env or {})})
    return srv.start(), markers


# -- kill -9 of each child kind under load ----------------------------------------------


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_kill9_worker_under_load(tmp_path, protocol):
    """kill -9 of a worker: its request fails within seconds with an error naming the
    model, the other instance serves on (readiness stays true), the instance is
    restarted and serves again; nothing is left in /dev/shm after the stop."""
    srv, markers = _start(tmp_path)
    try:
        with Load(srv) as load, ReadinessPoll(srv) as poll:
            wait_until(lambda: len(load.served_since(0)) >= 8, TIMEOUT, what="load runs")
            fut, victim = _held(srv, protocol, markers)
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            err = _fails_soon(fut, killed)
            assert "'faulty'" in str(err) and "SIGKILL" in str(err), str(err)
            # restarted: a process other than the victim and the survivor answers
            pids_before = {c[3] for c in load.served_since(0) if c[1] < killed}
            wait_until(lambda: {c[3] for c in load.served_since(killed)} - pids_before
                       - {victim}, BACK_WITHIN, what="the restarted instance serving")
            _in_flight_ended_soon(load, killed)
            assert all(ready for t, ready in poll.seen if t > killed), \
                "one instance still served: the server stayed ready"
            after = time.monotonic()
            wait_until(lambda: len(load.served_since(after)) >= 8, TIMEOUT,
                       what="load served after the restart")
        assert "instance 'faulty_0_" in srv.log() and "is back" in srv.log()
    finally:
        _stop_clean(srv)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_kill9_scheduler_under_load(tmp_path, protocol):
    """kill -9 of the scheduler: the requests it held fail within seconds (the
    frontends die with it), readiness is false while no scheduler serves, the root
    process starts a new one that is ready within seconds and serves both protocols,
    and after the stop no segment or socket directory of either generation is left."""
    srv, markers = _start(tmp_path)
    old_dir, old_scheduler = _run_dir(srv), srv.scheduler_pid()
    try:
        with Load(srv) as load, ReadinessPoll(srv) as poll:
            wait_until(lambda: len(load.served_since(0)) >= 8, TIMEOUT, what="load runs")
            fut, _ = _held(srv, protocol, markers)
            os.kill(old_scheduler, signal.SIGKILL)
            killed = time.monotonic()
            _fails_soon(fut, killed)
            back = poll.down_then_up(killed)
            _in_flight_ended_soon(load, killed)
            for p in clients.PROTOCOLS:
                wait_until(lambda: load.served_since(back, p), TIMEOUT,
                           what=f"{p} served by the new scheduler")
        new_scheduler = srv.scheduler_pid()
        assert new_scheduler not in (0, old_scheduler)
        new_dir = _run_dir(srv)
        assert not os.path.exists(old_dir), "the dead scheduler's socket dir is left"
        assert "scheduler killed by SIGKILL; restarting it" in srv.log()
    finally:
        _stop_clean(srv, [old_dir])
    assert not os.path.exists(new_dir)


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_kill9_frontend_under_load(tmp_path, protocol):
    """kill -9 of the (only) frontend: the requests it held fail within seconds,
    readiness is false until it is restarted, then both protocols serve again."""
    srv, markers = _start(tmp_path)
    try:
        with Load(srv) as load, ReadinessPoll(srv) as poll:
            wait_until(lambda: len(load.served_since(0)) >= 8, TIMEOUT, what="load runs")
            # long enough to be running at the kill, short enough that the stop below
            # does not wait out a 15 s request whose frontend is gone
            fut, _ = _held(srv, protocol, markers, ms=6000)
            frontend = next(p for p in srv.children()
                            if b"frontend.main" in open(f"/proc/{p}/cmdline", "rb").read())
            os.kill(frontend, signal.SIGKILL)
            killed = time.monotonic()
            _fails_soon(fut, killed)
            back = poll.down_then_up(killed)
            _in_flight_ended_soon(load, killed)
            for p in clients.PROTOCOLS:
                wait_until(lambda: load.served_since(back, p), TIMEOUT,
                           what=f"{p} served by the new frontend")
        assert "frontend 0 killed by SIGKILL; restarting it" in srv.log()
    finally:
        _stop_clean(srv)


def test_scheduler_that_keeps_dying_is_given_up(tmp_path):
    """The root restarts a killed scheduler a bounded number of times in a minute,
    then exits non-zero (no endless restart loop), leaving nothing behind."""
    from scheduler.processes.root import MAX_RESTARTS
    srv, _ = _start(tmp_path)
    try:
        for n in range(MAX_RESTARTS + 1):
            pid = wait_until(srv.scheduler_pid, BACK_WITHIN, what="a scheduler")
            os.kill(pid, signal.SIGKILL)
            if n < MAX_RESTARTS:
                wait_until(lambda: srv.scheduler_pid() not in (0, pid), BACK_WITHIN,
                           what="the next scheduler")
        assert srv.proc.wait(BACK_WITHIN) == 1
        assert "not restarting it" in srv.log()
    finally:
        srv.stop()
    assert srv.segments() == []


# -- python models that misbehave -----------------------------------------------------


def test_sigterm_to_a_worker_inside_execute_stops_it(tmp_path):
    """SIGTERM to a python worker while its model sleeps in execute, on the worker's
    main thread (an idle instance's batch runs there): the stop is not taken for an
    exception of the model's (which would answer the request and serve on); the
    worker leaves at once, its request fails within seconds and the instance is
    restarted."""
    srv, markers = _start(tmp_path)
    try:
        fut, pid = _held(srv, "grpc", markers)
        killed = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                   open(f"/proc/{pid}/stat").read().split()[2] == "Z",
                   HELD_FAILS_WITHIN, what="the worker to leave")
        _fails_soon(fut, killed)
        c = _client(srv, "grpc")
        wait_until(lambda: _infer(c, "grpc") > 0, BACK_WITHIN, what="served again")
    finally:
        _stop_clean(srv)


@pytest.fixture(scope="module")
def fsrv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("faulty")
    markers = tmp / "markers"
    markers.mkdir()
    srv = ServerProcess(REPO, log_dir=tmp, env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    yield from srv.serve()


def _pids(srv, protocol, n=6) -> set[int]:
    """Pids of the instances answering `n` quick requests sent two at a time."""
    with cf.ThreadPoolExecutor(2) as pool:
        return set(pool.map(lambda _: _infer(_client(srv, protocol), protocol, SERVE, 100),
                            range(n)))


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_model_that_raises_fails_its_request_only(fsrv, protocol):
    """An exception in execute fails that request with an error naming the model and
    the exception; the instance is not restarted and keeps serving."""
    c = _client(fsrv, protocol)
    before = _pids(fsrv, protocol)
    with pytest.raises(InferenceServerException) as err:
        _infer(c, protocol, RAISE)
    assert "faulty" in str(err.value) and "faulty was asked to raise" in str(err.value)
    assert _infer(c, protocol) in before
    assert _pids(fsrv, protocol) <= before


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_model_that_kills_itself_is_restarted(fsrv, protocol):
    """os.kill(os.getpid(), 9) inside execute: the request fails within seconds with an
    error naming the model; the instance is restarted (a new process answers) and the
    model stays ready."""
    c = _client(fsrv, protocol)
    start = time.monotonic()
    with pytest.raises(InferenceServerException) as err:
        _infer(c, protocol, KILL_SELF)
    assert time.monotonic() - start < HELD_FAILS_WITHIN + 2
    assert "model 'faulty'" in str(err.value) and "restarting" in str(err.value)
    assert c.is_model_ready("faulty")
    wait_until(lambda: _infer(c, protocol) > 0, BACK_WITHIN, what="served again")


@pytest.mark.parametrize("protocol", clients.PROTOCOLS)
def test_hung_model_instance_is_killed_after_its_timeout(fsrv, protocol):
    """An execute that never returns: past the model's EXECUTE_TIMEOUT_SECS (3 s) its
    process is killed, the request fails naming the model and the timeout, the other
    instance serves meanwhile, and the hung instance is restarted."""
    markers = fsrv.markers
    for m in markers.iterdir():
        m.unlink()
    with cf.ThreadPoolExecutor(1) as pool:
        start = time.monotonic()
        fut = pool.submit(lambda: _infer(_client(fsrv, protocol), protocol, HANG))
        name = wait_until(lambda: next((n for n in os.listdir(markers)
                                        if n.startswith("running-")), None),
                          TIMEOUT, what="the hang to start")
        hung = int(name.split("-")[1])
        # the other instance serves while this one hangs
        c = _client(fsrv, protocol)
        assert _infer(c, protocol) != hung
        with pytest.raises(InferenceServerException) as err:
            fut.result(timeout=TIMEOUT)
        took = time.monotonic() - start
    assert 3.0 <= took < 3.0 + HELD_FAILS_WITHIN + 2, took
    text = str(err.value)
    assert "model 'faulty'" in text and "execute timeout of 3s" in text, text
    wait_until(lambda: not os.path.exists(f"/proc/{hung}"), TIMEOUT, what="hung pid gone")
    assert c.is_model_ready("faulty")
    assert hung not in _pids(fsrv, protocol)


# -- SIGTERM under load ---------------------------------------------------------------


def test_sigterm_under_load_drains_and_cleans_up(tmp_path):
    """SIGTERM while clients of both protocols send: requests in flight finish (held
    ones of 2 s over both protocols succeed), new ones are refused at once with an
    error (not a hang), the server exits 0 within --exit-timeout-secs, and neither
    /dev/shm nor the temp directory keeps anything of it."""
    srv, markers = _start(tmp_path, "--exit-timeout-secs=10")
    run_dir = _run_dir(srv)
    assert os.path.dirname(run_dir) == tempfile.gettempdir()
    try:
        with Load(srv, threads=4, delay_ms=20) as load:
            wait_until(lambda: len(load.served_since(0)) >= 8, TIMEOUT, what="load runs")
            pool = cf.ThreadPoolExecutor(2)
            held = [pool.submit(lambda p=p: _infer(_client(srv, p), p, SERVE, 2000))
                    for p in clients.PROTOCOLS]
            wait_until(lambda: len([n for n in os.listdir(markers)
                                    if n.startswith("running-")]) == 2,
                       TIMEOUT, what="both held requests running")
            srv.proc.send_signal(signal.SIGTERM)
            termed = time.monotonic()
            for fut in held:
                assert fut.result(timeout=TIMEOUT) > 0  # in flight: finished
            pool.shutdown()
            assert srv.proc.wait(10 + 5) == 0, srv.log()[-3000:]
            stopped = time.monotonic()
        late = [c for c in load.snapshot() if c[1] > termed + 0.5]
        assert late and all(c[4] is not None for c in late if c[1] > stopped), \
            "requests after the stop were not refused"
        assert all(c[2] - c[1] < 5 for c in late), "a refused request hung"
    finally:
        srv.stop()
    assert srv.segments() == []
    assert not os.path.exists(run_dir)  # its one directory in the temp dir


def test_sigterm_while_the_scheduler_starts_is_a_clean_stop(tmp_path):
    """A stop sent while the scheduler is still starting (importing, loading models)
    is honoured as a stop: exit 0 and nothing left, never a death by the signal."""
    srv = ServerProcess(REPO, log_dir=tmp_path)
    srv.start(wait_ready=False)
    try:
        wait_until(srv.scheduler_pid, TIMEOUT, what="the scheduler process")
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(TIMEOUT + 30) == 0, srv.log()[-3000:]
    finally:
        srv.stop()
    assert srv.segments() == []


def test_scheduler_stuck_in_its_stop_is_killed_by_the_root(tmp_path):
    """The root bounds a stop: a scheduler that has not exited --exit-timeout-secs +
    a margin (30 s; 3 here, through SHMSERVE_STOP_MARGIN_S) after SIGTERM (here: frozen
    with SIGSTOP) is killed, its children exit, nothing is left in /dev/shm, and the
    exit status says it was killed (128 + 9)."""
    srv, _ = _start(tmp_path, "--exit-timeout-secs=1", env={"SHMSERVE_STOP_MARGIN_S": "3"})
    scheduler, children = srv.scheduler_pid(), srv.children()
    try:
        os.kill(scheduler, signal.SIGSTOP)
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(1 + 3 + TIMEOUT) == 128 + signal.SIGKILL
        assert "did not stop within 4s; killing it" in srv.log()
    finally:
        srv.stop()
    assert not [p for p in children + [scheduler] if os.path.exists(f"/proc/{p}")]
    assert srv.segments() == []
