"""The real SchedulerDataPlane for unit tests, one model loaded, its outbox recording
what it would send instead of sending it."""

from __future__ import annotations

import asyncio
import os

from frontend.dataplane import SchedulerDataPlane
from shm.messages.frontend import ModelStateUpdate
from shm.messages.repository import ModelReadyState


def run_with_plane(tmp_path, test, config: bytes, model: str = "m") -> None:
    """asyncio.run `await test(plane)`: a data plane at ipc://{tmp_path}/fe whose
    scheduler is ipc://sched, with `model` version 1 READY under the serialized
    `config`; `plane.sent` lists the (address, message) pairs its outbox was given."""
    async def main():
        plane = SchedulerDataPlane(f"ipc://{tmp_path}/fe", "ipc://sched",
                                   f"shmserve-unittest-{tmp_path.name}-{os.getpid()}",
                                   1 << 20)
        plane.sent = []
        plane.outbox.send = lambda to, msg: plane.sent.append((to, msg))
        plane.on_model_state(ModelStateUpdate(model, 1, ModelReadyState.READY,
                                              config=config))
        try:
            await test(plane)
        finally:
            plane.close()
    asyncio.run(main())
