"""The loop's Callbacks (scheduler/scheduling/interface.py) for a scheduler under test:
the functions a test gives, the rest recorded or ignored."""

import time


class FakeCallbacks:
    address = "ipc:///run/scheduler"
    clock = staticmethod(time.monotonic_ns)

    def __init__(self, send_batch=None, fail=None, respond=None):
        self.send_batch = send_batch or (lambda slot, batch: None)
        self.fail = fail or (lambda req, code, reason: None)
        self.respond = respond or (lambda req, response: None)
        self.pumped: set = set()  # schedulers that asked to be pumped
        self.woken: list = []

    def pump_soon(self, sched) -> None:
        self.pumped.add(sched)

    def wake(self, sched) -> None:
        self.woken.append(sched)
