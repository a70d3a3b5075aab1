"""What the scheduler does when a child comes or goes: a frontend ready (it is told
every model's state and the server's), a frontend gone (its queued requests dropped,
what it held given back), instances lost with a worker (their requests failed, their
regions quarantined after a SIGBUS), a client region gone (workers forget it)."""

from __future__ import annotations

import logging

from scheduler.callbacks import LoopCallbacks
from scheduler.processes.frontend_pool import FrontendHandle
from scheduler.processes.worker_pool import WorkerPool
from scheduler.regions import Region, RegionRegistry
from scheduler.repository.manager import ModelRepositoryManager
from scheduler.scheduling.rate_limiter import InstanceSlot
from shm.messages.frontend import ServerState
from shm.messages.regions import RegionGone
from shm.transport import OutboxLike

log = logging.getLogger("shmserve.scheduler")


class ChildEvents:
    def __init__(self, manager: ModelRepositoryManager, workers: WorkerPool,
                 regions: RegionRegistry, callbacks: LoopCallbacks, outbox: OutboxLike,
                 strict_readiness: bool):
        self.manager = manager
        self.workers = workers
        self.regions = regions
        self.callbacks = callbacks
        self.outbox = outbox
        self.strict_readiness = strict_readiness

    def instances_lost(self, slots: list[InstanceSlot], how: str) -> None:
        if "SIGBUS" in how:
            self._quarantine_regions(slots)
        self.manager.instances_lost(slots, how)

    def _quarantine_regions(self, slots: list[InstanceSlot]) -> None:
        """A worker died of SIGBUS running requests that read client regions. Workers
        read and write clients' objects with preadv/pwrite (shm/regions.py), so this is
        the backstop for a path nobody foresaw (a backend reading a region in place).
        The regions are unregistered, and the restart is not held against the
        instance; the other requests in flight on that worker still fail with it."""
        running = [q.req for slot in slots
                   if (sched := self.manager.by_instance.get(slot.key)) is not None
                   for q in sched.running(slot)]
        if self.regions.quarantine(running):
            for slot in slots:
                self.workers.restarts.forgive(slot.key)

    def frontend_gone(self, msg) -> None:
        """A frontend died: workers forget it, and the ensemble outputs it held go back
        to their owners (it will never release them). Its requests still queued are
        dropped: their inputs lie in its arena, which died with it."""
        self.workers.broadcast(msg)
        now = self.callbacks.clock()
        dropped = 0
        for sched in self.manager.schedulers():
            for q in sched.drop_from(msg.address, now):
                dropped += 1
                self.callbacks.request_ended(q, None, now)
            # those waiting at busy instances' workers: the workers drop them (told
            # above), and their batches' ends count them
            dropped += sched.waiting_from(msg.address)
        if dropped:
            log.warning("dropped %d queued request(s) of a frontend that died", dropped)
        self.callbacks.reader_gone(msg.address)

    def frontend_ready(self, fe: FrontendHandle) -> None:
        for mv in self.manager.models.all():
            self.outbox.send(fe.address, self.manager.state_update(mv))
        for region in self.regions.by_name.values():
            self.outbox.send(fe.address, region.info)
        stopping = self.manager.stopping
        self.outbox.send(fe.address, ServerState(ready=not stopping, stopping=stopping,
                                                 strict=self.strict_readiness))

    def region_gone(self, region: Region) -> None:
        log.info("unregistered %s shared memory region '%s'", region.kind, region.name)
        self.workers.broadcast(RegionGone(region.uid))
