"""frontend.types.DataPlane: the one interface the transports and endpoints call,
declared whole. The production data plane and the unit tests' fakes offer every member,
and no transport probes the data plane for optional ones (the bug this replaced:
getattr(core, "body_buffer", None) silently turned the arena path off for an object
that lacked it)."""

import asyncio
import os
import re
from pathlib import Path

from frontend.dataplane import SchedulerDataPlane
from frontend.types import DataPlane
from tests.unit.fake_dataplane import FakeDataPlane

ROOT = Path(__file__).resolve().parents[2]


def members(protocol) -> set[str]:
    declared = {n for n in vars(protocol) if not n.startswith("_")}
    return declared | set(protocol.__annotations__)


def test_the_protocol_declares_what_the_transports_use():
    assert {"body_buffer", "body_quota", "free_blocks", "body_block_max", "stopping",
            "infer", "start", "get_model", "shm_call"} <= members(DataPlane)


def test_the_scheduler_data_plane_offers_every_member(tmp_path):
    async def build():
        plane = SchedulerDataPlane(f"ipc://{tmp_path}/fe", "ipc://nowhere",
                                   f"shmserve-unittest-dp-{os.getpid()}", 1 << 20)
        try:
            missing = {m for m in members(DataPlane) if not hasattr(plane, m)}
            return missing, isinstance(plane, DataPlane), plane.body_block_max
        finally:
            plane.close()
    missing, conforms, block_max = asyncio.run(build())
    assert not missing and conforms
    assert block_max == 1 << 20  # an arena chunk: a larger body needs its own segment


def test_the_fakes_offer_every_member():
    from tests.unit import test_grpc_server, test_health, test_http_server, \
        test_shm_endpoints
    for fake in (FakeDataPlane(), test_grpc_server.FakeCore(), test_health.FakeCore(),
                 test_http_server.FakeCore(), test_shm_endpoints.FakeCore()):
        assert isinstance(fake, DataPlane), type(fake)
        assert not {m for m in members(DataPlane) if not hasattr(fake, m)}


def test_no_transport_probes_the_data_plane():
    # the data plane itself, or one of its members handed on (server.body_quota)
    probe = re.compile(r"(getattr|hasattr)\((self\.)?(core|infer)\b"
                       r"|(getattr|hasattr)\([\w.]+, \"(body_|free_blocks|arena|stopping)")
    found = [f"{path.relative_to(ROOT)}:{n}"
             for path in sorted((ROOT / "frontend").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if probe.search(line)]
    assert not found
