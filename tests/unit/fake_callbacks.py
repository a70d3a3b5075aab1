"""The loop's Callbacks (scheduler/scheduling/interface.py) for a scheduler under test:
the functions a test gives, the rest recorded or ignored."""

import time


class FakeCallbacks:
    address = "ipc:///run/scheduler"
    clock = staticmethod(time.monotonic_ns)

    def __init__(self, send_batch=None, fail=None, respond=None):
        self.send_batch = send_batch or (lambda slot, batch, requests: None)
        self.fail = fail or (lambda req, code, reason: None)
        self.respond = respond or (lambda req, response: None)
        self.pumped: set = set()  # schedulers that asked to be pumped
        self.woken: list = []
        self.lendable = True  # may_lend's answer
        self.ends: list = []  # end_lease calls: (instance, lease)
        self.direct: list = []  # send_direct calls: (instance, lease, Queued)
        self.lost: list = []  # lease_lost calls: (instance, lease, lessee, reason)

    def pump_soon(self, sched) -> None:
        self.pumped.add(sched)

    def wake(self, sched) -> None:
        self.woken.append(sched)

    def may_lend(self, slot) -> bool:
        return self.lendable

    def send_direct(self, slot, q) -> None:
        self.direct.append((slot.key, slot.lease, q))

    def end_lease(self, slot) -> None:
        self.ends.append((slot.key, slot.lease))

    def lease_lost(self, slot, reason: str) -> None:
        self.lost.append((slot.key, slot.lease, slot.lessee, reason))
