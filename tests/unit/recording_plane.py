"""The real SchedulerDataPlane for unit tests, one model loaded, its outbox recording
what it would send instead of sending it."""

from __future__ import annotations

import asyncio
import os

from frontend import dataplane
from frontend.dataplane import SchedulerDataPlane
from shm.messages.frontend import InferRequest, ModelStateUpdate
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


def count_validations(monkeypatch) -> list:
    """The configs the data plane's validate_request is called with from now on, one
    entry a call (it still validates)."""
    calls = []
    original = dataplane.validate_request

    def counting(request, cfg):
        calls.append(cfg)
        return original(request, cfg)
    monkeypatch.setattr(dataplane, "validate_request", counting)
    return calls


def check_forwarded(plane, validations: list, forwarding: bool, tags: list[str]) -> None:
    """Requests sent with an `x-tag` header or metadata of each of `tags`, forwarded
    as parameters or not: with forwarding, each carries its own and was validated with
    it; without, the first one's verdict stood for the rest."""
    sent = [m for _, m in plane.sent if isinstance(m, InferRequest)][-len(tags):]
    assert len(sent) == len(tags)
    if forwarding:
        assert [m.parameters["x-tag"] for m in sent] == tags
        assert len(validations) == len(tags)
    else:
        assert len(validations) == 1
