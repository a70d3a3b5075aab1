"""FakeDataPlane: frontend.types.DataPlane with every member declared, for the unit
tests' fakes to start from. A call the fake does not serve answers UNSUPPORTED (the
test sees which); there is no arena, so bodies are received in process memory."""

from __future__ import annotations

import asyncio

from shm.errors import ErrorCode, InferError


class FakeDataPlane:
    """Every member of the DataPlane protocol; subclasses answer what they test."""

    stopping = False
    body_block_max = 64 << 20

    def server_live(self) -> bool:
        return True

    def server_ready(self) -> bool:
        return True

    def get_model(self, name: str, version: str = ""):
        raise InferError(ErrorCode.NOT_FOUND,
                         f"Request for unknown model: '{name}' is not found")

    def model_versions(self, name: str) -> list:
        return []

    async def infer(self, request, decoupled_refusal: str = ""):
        raise _unserved("infer")

    def start(self, request, decoupled_refusal: str = ""):
        raise _unserved("start")

    def start_unary(self, request, on_done, decoupled_refusal: str = ""):
        """`infer`, awaited by a task, its answer handed to on_done."""
        async def run():
            try:
                answer = await self.infer(request, decoupled_refusal)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - what infer raises is the answer
                answer = exc
            on_done(answer)
        return asyncio.get_running_loop().create_task(run())  # cancel(): dropped

    def body_quota(self):
        return None

    def body_buffer(self, nbytes: int, quota=None):
        return None  # no arena: every body is received in process memory

    def free_blocks(self, blocks) -> None:
        pass  # body_buffer gives none out

    async def model_statistics(self, name: str = "", version: str = "") -> bytes:
        raise _unserved("model_statistics")

    async def log_settings(self, update=None):
        raise _unserved("log_settings")

    async def trace_settings(self, model: str = "", update=None) -> dict:
        raise _unserved("trace_settings")

    async def repository_index(self, ready: bool = False) -> list:
        raise _unserved("repository_index")

    async def repository_load(self, name, config=None, files=None) -> None:
        raise _unserved("repository_load")

    async def repository_unload(self, name, unload_dependents=False) -> None:
        raise _unserved("repository_unload")

    async def shm_call(self, op, kind, *, name="", key="", offset=0, byte_size=0,
                       device_id=0, raw_handle=b"") -> list:
        raise _unserved("shm_call")


def _unserved(member: str) -> InferError:
    return InferError(ErrorCode.UNSUPPORTED, f"the fake data plane does not serve {member}")
