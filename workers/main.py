"""The worker process: hosts model instances and runs the batches sent to it.

One run loop over one inbox. Batches run to completion on this thread: a python
model's own code holds the GIL, which is why each python instance gets a process.
Results go straight to each request's `reply_to`; the scheduler only hears BatchDone.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from shm.arena import Arena, SegmentCache
from shm.channel import Inbox, Outbox
from shm.errors import ErrorCode, InferError
from shm.lifecycle import die_with_parent, setup_logging
from shm.messages.results import InferResponse, PeerGone, ReleaseBlocks
from shm.messages.worker import (WORKER_INBOX, BatchDone, ExecuteBatch, InstanceLoaded,
                                 LoadInstance, StopWorker, UnloadInstance, WorkerReady)
from workers.backends import create_instance
from workers.tensors import OutputWriter

log = logging.getLogger("shmserve.worker")


class _Stop(Exception):
    pass


class Worker:
    def __init__(self, name: str, address: str, scheduler: str, segment_prefix: str,
                 arena_bytes: int):
        self.name = name
        self.address = address
        self.scheduler = scheduler
        self.inbox = Inbox(address, WORKER_INBOX)
        self.outbox = Outbox()
        self.segments = SegmentCache()
        # Arena chunks are created on first large output, not at start, so a model
        # that only answers with small tensors costs no shared memory.
        self.arena = Arena(segment_prefix, chunk_size=arena_bytes)
        self.writer = OutputWriter(self.arena, address)
        self.instances = {}
        self.handlers = {
            LoadInstance: self.on_load,
            ExecuteBatch: self.on_execute,
            UnloadInstance: self.on_unload,
            ReleaseBlocks: self.on_release,
            PeerGone: self.on_peer_gone,
            StopWorker: self.on_stop,
        }

    def run(self) -> None:
        self.outbox.send(self.scheduler, WorkerReady(self.name, self.address, os.getpid()))
        handlers = self.handlers
        try:
            while True:
                msg = self.inbox.recv()
                handlers[type(msg)](msg)
        except _Stop:
            pass
        finally:
            self.close()

    def close(self) -> None:
        for name, inst in list(self.instances.items()):
            try:
                inst.finalize()
            except Exception:
                log.exception("finalize() of %s failed", name)
        self.instances.clear()
        self.segments.close()
        self.arena.close()
        self.inbox.close()
        self.outbox.close()

    # -- handlers ---------------------------------------------------------------------

    def on_load(self, msg: LoadInstance) -> None:
        try:
            inst, config = create_instance(msg)
            self.instances[msg.instance] = inst
            reply = InstanceLoaded(msg.instance, True, config=config)
        except Exception as exc:  # the reason goes to the model's state, not a crash
            log.exception("failed to load %s", msg.instance)
            reply = InstanceLoaded(msg.instance, False, error=_reason(exc))
        self.outbox.send(self.scheduler, reply)

    def on_unload(self, msg: UnloadInstance) -> None:
        inst = self.instances.pop(msg.instance, None)
        if inst is not None:
            inst.finalize()

    def on_release(self, msg: ReleaseBlocks) -> None:
        self.writer.released(msg.reader, msg.blocks)

    def on_peer_gone(self, msg: PeerGone) -> None:
        self.outbox.drop(msg.address)
        self.segments.forget(msg.segment_prefix)
        self.writer.forget_reader(msg.address)

    def on_stop(self, msg: StopWorker) -> None:
        raise _Stop()

    def on_execute(self, msg: ExecuteBatch) -> None:
        start = time.monotonic_ns()
        failed = 0
        inst = self.instances.get(msg.instance)
        send = self.outbox.send
        if inst is None:
            results = [InferError(ErrorCode.UNAVAILABLE,
                                  f"instance {msg.instance} is not loaded")] * len(msg.requests)
        else:
            results = inst.execute(msg.requests, self.segments)
        for request, result in zip(msg.requests, results):
            if isinstance(result, InferError):
                failed += 1
                send(request.reply_to, InferResponse(request.id, error=result.message,
                                                     error_code=int(result.code)))
                continue
            try:
                refs = self.writer.write(result, request.reply_to)
            except Exception as exc:
                failed += 1
                send(request.reply_to, InferResponse(
                    request.id, error=f"failed to return outputs: {_reason(exc)}",
                    error_code=int(ErrorCode.INTERNAL)))
                continue
            send(request.reply_to, InferResponse(request.id, outputs=refs, owner=self.address))
        send(self.scheduler, BatchDone(msg.batch_id, msg.instance, start,
                                       time.monotonic_ns(), failed))


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="shmserve-worker")
    p.add_argument("--name", required=True)
    p.add_argument("--address", required=True)
    p.add_argument("--scheduler", required=True)
    p.add_argument("--segment-prefix", required=True)
    p.add_argument("--arena-bytes", type=int, default=64 << 20)
    p.add_argument("--log-verbose", type=int, default=0)
    args = p.parse_args(argv)
    setup_logging(f"worker[{args.name}]", args.log_verbose)

    def on_term(signum, frame):
        raise _Stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduler coordinates shutdown
    die_with_parent(signal.SIGTERM)
    worker = Worker(args.name, args.address, args.scheduler, args.segment_prefix,
                    args.arena_bytes)
    worker.run()
    sys.exit(0)


if __name__ == "__main__":
    main()
