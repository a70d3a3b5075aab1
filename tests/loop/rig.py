"""A scheduler `Server` on one event loop with in-memory channels and fake children.

The Server is the real one (model repository from disk, manager, schedulers, rate
limiter, statistics, the quiet inbox); what it talks to is not: a `MemoryHub` carries
the messages (encoded and decoded as on the sockets), `FakeLauncher` starts in-process
`FakeWorker`s and one `FakeFrontend` instead of processes, and `ManualTimer` fires a
batching deadline only when the test says so. A test sends InferRequests as a frontend
would and sees each ExecuteBatch the workers get: which requests, in which order, on
which instance; it finishes batches when it chooses. No tensors move: inputs are
inline, and the fake workers answer a client's request without outputs and an
ensemble step's with its first input under each output name it asks for.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import threading
import time
from pathlib import Path

import msgspec
import orjson

from scheduler.cli import parse_args
from scheduler.processes.supervisor import Child
from scheduler.server import Server
from shm.errors import ErrorCode
from shm.messages.frontend import (FRONTEND_INBOX, Drain, FrontendReady, FrontendStopped,
                                   InferRequest, StatsRequest)
from shm.messages.leases import EndLease, LeaseEnded
from shm.messages.results import Error, InferResponse
from shm.messages.roles import WorkerSpec
from shm.messages.worker import (WORKER_INBOX, BatchDone, ExecuteBatch, InstanceLoaded,
                                 LoadInstance, StopWorker, WorkerReady, done_address)
from shm.tensor import TensorRef
from shm.transport import MemoryHub

DEADLINE_S = 10.0  # every wait in these tests


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


class TestClock:
    """The loop's clock in a test: CLOCK_MONOTONIC plus what the test skipped ahead. It
    never runs backwards, and a deadline is reached when the test says (fire(),
    advance()), not when the real clock gets there: a 2 s batching delay costs no
    2 s. Everything that stamps a time in these loops reads it (Server, the fake
    workers, requests' start)."""

    def __init__(self):
        self.skipped = 0

    def __call__(self) -> int:
        return time.monotonic_ns() + self.skipped

    def advance(self, ns: int) -> None:
        self.skipped += ns

    def reach(self, t: int) -> None:
        self.advance(max(t - self(), 0))


class ManualTimer:
    """PreciseTimer's interface; fires only from `fire()`, which moves the test's
    clock to the deadline first."""

    def __init__(self, loop, callback, clock: TestClock):
        self._callback = callback
        self.clock = clock
        self.deadline: int | None = None

    def set(self, deadline_ns: int | None) -> None:
        if deadline_ns is not None and (self.deadline is None or deadline_ns < self.deadline):
            self.deadline = deadline_ns

    def fire(self) -> None:
        """Run the callback as the timer would at its deadline."""
        assert self.deadline is not None, "no deadline is armed"
        self.clock.reach(self.deadline)
        self.deadline = None
        self._callback()

    def close(self) -> None:
        pass


class FakeChild:
    """supervisor.Child's interface for an in-process fake of a worker or frontend."""

    def __init__(self, rig: "Rig", name, module, args, on_exit, executable="", env=None):
        self.rig, self.name, self.module, self.args = rig, name, module, args
        self.on_exit = on_exit
        self.returncode: int | None = None
        self.exited = asyncio.Event()
        self.pid = 0
        self.process = None

    def start(self, loop) -> None:
        if self.module != "workers.main":
            kind = FakeFrontend
        else:
            kind = RealWorker if self.rig.real_workers else FakeWorker
        self.process = kind(self.rig, self, self.args)

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.process.inbox.close()
            self.exited.set()
            self.on_exit(self, code)

    def signal(self, sig) -> None:
        self.exit(-int(sig))

    async def stop(self, timeout: float) -> None:
        self.exit(-15)

    wait = Child.wait  # on `exited`, as the real one


class FakeWorker:
    """Loads every instance, and keeps each ExecuteBatch until the test finishes it
    (or answers it at once when `rig.auto_finish`)."""

    def __init__(self, rig: "Rig", child: FakeChild, argv: list[str]):
        self.rig, self.child = rig, child
        self.address, self.scheduler = _flag(argv, "--address"), _flag(argv, "--scheduler")
        self.inbox = rig.hub.inbox(self.address, WORKER_INBOX)
        self.outbox = rig.hub.outbox(rig.loop)
        self.inbox.attach(rig.loop, self.on_message, self.outbox.uncork)
        self.received: dict[int, int] = {}  # batch id -> when it came (monotonic ns)
        self.outbox.send(self.scheduler, WorkerReady(_flag(argv, "--name"), self.address, 0))
        rig.workers.append(self)

    def on_message(self, msg) -> None:
        self.outbox.cork()
        if isinstance(msg, LoadInstance):
            self.outbox.send(self.scheduler, InstanceLoaded(msg.instance, True))
        elif isinstance(msg, ExecuteBatch):
            self.received[msg.batch_id] = self.rig.clock()
            self.rig.batches.append((self, msg))
            if self.rig.auto_finish:
                self.finish(msg)
        elif isinstance(msg, StopWorker):
            self.rig.loop.call_soon(self.child.exit, 0)
        elif isinstance(msg, EndLease):
            self.rig.end_leases.append((self, msg))

    def finish(self, batch: ExecuteBatch, failed=()) -> BatchDone:
        """Answer every request of `batch` (those in `failed` with an error), then tell
        the scheduler the batch is done, as workers/main.py's run_batch does. Its
        compute_infer phase spans from the batch's arrival to now; the other phases
        take no time. Returns the BatchDone, whose times the statistics count."""
        now = self.rig.clock()
        came = self.received.get(batch.batch_id, now)
        responses = [InferResponse(r.id, _echo(r), owner=self.address) if i not in failed
                     else InferResponse(r.id, error=Error(ErrorCode.INTERNAL, "failed"))
                     for i, r in enumerate(batch.requests)]
        done = BatchDone(batch.batch_id, batch.instance, came, came, now, now, list(failed))
        if batch.relay:
            done.responses = responses
            self.outbox.send(self.scheduler, done)
        else:
            self.outbox.send_many([*((r.reply_to, resp) for r, resp in
                                     zip(batch.requests, responses)),
                                   (done_address(self.scheduler) if batch.quiet
                                    else self.scheduler, done)])
        self.outbox.uncork()
        return done


class RealWorker:
    """workers/main.py's Worker itself on a thread of this process, over the hub: its
    instances are loaded and run as in a worker process (models' code, arena, threads),
    and its outputs are read from its arena as a frontend reads them."""

    def __init__(self, rig: "Rig", child: FakeChild, argv: list[str]):
        from workers.main import Worker
        self.rig, self.child = rig, child
        self.spec = WorkerSpec.from_argv(argv)
        self.worker: Worker | None = None
        started = threading.Event()

        def run():
            try:
                # made on its own thread: the worker receives there (BlsClient.receiver)
                s = self.spec
                self.worker = Worker(s.name, s.address, s.scheduler, s.segment_prefix,
                                     s.arena_bytes, s.device, s.arena_high_water,
                                     transport=rig.hub, clock=rig.clock)
                started.set()
                self.worker.run()
            finally:
                started.set()
                rig.loop.call_soon_threadsafe(child.exit, 0)

        self.thread = threading.Thread(target=run, name=self.spec.name, daemon=True)
        self.thread.start()
        started.wait(DEADLINE_S)
        self.inbox = self.worker.inbox
        rig.workers.append(self)


def _echo(req: InferRequest) -> list[TensorRef]:
    """Each output the request names (an ensemble's step names them all) as a copy of
    its first input, inline: enough for the steps after it to run."""
    if not req.outputs or not req.inputs:
        return []
    first = req.inputs[0]
    return [msgspec.structs.replace(first, name=o.name) for o in req.outputs]


class FakeFrontend:
    """The requests' frontend: the test sends through it and reads its answers."""

    def __init__(self, rig: "Rig", child: FakeChild, argv: list[str]):
        self.rig, self.child = rig, child
        self.index = int(_flag(argv, "--index"))
        self.address, self.scheduler = _flag(argv, "--address"), _flag(argv, "--scheduler")
        self.inbox = rig.hub.inbox(self.address, FRONTEND_INBOX)
        self.outbox = rig.hub.outbox(rig.loop)
        self.inbox.attach(rig.loop, self.on_message)
        self.replies: dict[int, asyncio.Future] = {}
        self.leases_ended: list[LeaseEnded] = []
        self.outbox.send(self.scheduler, FrontendReady(self.index, self.address, 0))
        rig.frontend = self

    def on_message(self, msg) -> None:
        if isinstance(msg, InferResponse) or hasattr(msg, "call_id"):
            key = msg.id if isinstance(msg, InferResponse) else msg.call_id
            fut = self.replies.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif isinstance(msg, LeaseEnded):
            self.leases_ended.append(msg)
        elif isinstance(msg, Drain):
            self.outbox.send(self.scheduler, FrontendStopped(self.index, 0))
            self.rig.loop.call_soon(self.child.exit, 0)

    def expect(self, key: int) -> asyncio.Future:
        fut = self.replies[key] = self.rig.loop.create_future()
        return fut


class Rig:
    def __init__(self, loop, repo: Path, *flags: str, real_workers: bool = False):
        self.loop = loop
        self.real_workers = real_workers  # RealWorker for FakeWorker: models really run
        self.hub = MemoryHub()
        self.workers: list[FakeWorker] = []
        self.frontend: FakeFrontend | None = None
        self.batches: list[tuple[FakeWorker, ExecuteBatch]] = []
        self.end_leases: list[tuple[FakeWorker, EndLease]] = []  # as the workers got them
        self.auto_finish = False
        self._ids = itertools.count(1)
        args = parse_args(["--model-repository", str(repo), "--frontend-processes", "1",
                           "--http-port", "0", "--grpc-port", "0", "--allow-metrics",
                           "false", *flags])
        self.clock = TestClock()
        self.server = Server(args, transport=self.hub,
                             launcher=lambda *a, **kw: FakeChild(self, *a, **kw),
                             timer=lambda loop, cb: ManualTimer(loop, cb, self.clock),
                             clock=self.clock)
        self.timer: ManualTimer = self.server.pumps.timer

    async def start(self) -> None:
        self._run = self.loop.create_task(self.server.run())
        await self.until(lambda: self._run.done() or self.frontend is not None and
                         self.server.frontends.frontends[0].ready.done(),
                         "the server to be ready")
        if self._run.done():  # it gave up (a model that failed to load, say)
            raise AssertionError(f"the server exited with {self._run.result()}")

    async def stop(self) -> int:
        self.auto_finish = True
        for worker, batch in self.take_batches():
            worker.finish(batch)
        self.server.request_stop()
        return await asyncio.wait_for(self._run, DEADLINE_S)

    async def until(self, cond, what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.0005)  # a poll: the loop runs what is queued

    # -- as a frontend ----------------------------------------------------------------

    def send(self, model: str, rows: int = 1, cols: int = 4, inputs=("INPUT0",),
             **kw) -> asyncio.Future:
        """An InferRequest as a frontend makes it; the future gets its response. Sent
        with the next pass of the loop, with whatever else is sent before it."""
        rid = next(self._ids)
        fe = self.frontend
        tensors = [TensorRef(name, "FP32", [rows, cols], data=bytes(rows * cols * 4))
                   for name in inputs]
        fut = fe.expect(rid)
        fe.outbox.send(fe.scheduler, InferRequest(rid, fe.address, model, 0, tensors,
                                                  batch_size=rows,
                                                  start_ns=self.clock(), **kw))
        fut.request_id = rid
        return fut

    async def stats(self, model: str = "") -> dict:
        fe = self.frontend
        cid = next(self._ids)
        fut = fe.expect(cid)
        fe.outbox.send(fe.scheduler, StatsRequest(cid, fe.address, model))
        reply = await asyncio.wait_for(fut, DEADLINE_S)
        assert not reply.error, reply.error
        return orjson.loads(reply.body)

    # -- as the workers ---------------------------------------------------------------

    async def batches_sent(self, n: int) -> list[tuple[FakeWorker, ExecuteBatch]]:
        """Wait until `n` batches (in all) have reached the workers; all of them."""
        await self.until(lambda: len(self.batches) >= n, f"{n} batch(es)")
        return list(self.batches)

    def take_batches(self) -> list[tuple[FakeWorker, ExecuteBatch]]:
        got, self.batches[:] = list(self.batches), []
        return got

    async def settle(self) -> None:
        """Let every message now in flight be handled (the loop runs dry)."""
        for _ in range(20):
            await asyncio.sleep(0)


_IDENTITY_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""


def identity_repo(root: Path, name: str, count: int = 1, extra: str = "") -> Path:
    """`root` as a repository of one model `name`: tests/models' nobatch_identity
    (INPUT0 -> OUTPUT0, no batching) on `count` CPU instances, `extra` added to its
    config."""
    model = root / name
    (model / "1").mkdir(parents=True)
    shutil.copy(Path(__file__).parents[1] / "models" / "nobatch_identity" / "1" / "model.py",
                model / "1")
    (model / "config.pbtxt").write_text(_IDENTITY_CONFIG.format(name=name, count=count)
                                        + extra)
    return root


def ids(batch: ExecuteBatch) -> list[int]:
    return [r.id for r in batch.requests]


def run(repo: Path, test, *flags: str, real_workers: bool = False) -> None:
    """Run `await test(rig)` against a started server, then stop it cleanly."""
    async def main():
        rig = Rig(asyncio.get_running_loop(), repo, *flags, real_workers=real_workers)
        await rig.start()
        try:
            await asyncio.wait_for(test(rig), 3 * DEADLINE_S)  # a response that never comes
        finally:
            assert await rig.stop() == 0
    asyncio.run(main())
