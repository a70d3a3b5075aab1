import pytest

from tests.e2e.harness import DEFAULT_REPOS, ROOT, ServerProcess

# TRITONSERVER_DELAY_SCHEDULER for held_server: no batch forms until this many are queued
HOLD = 4


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """One server on the test model repository, shared by the tests that only talk to it,
    with two frontend processes so requests cross SO_REUSEPORT-shared ports."""
    marker_dir = tmp_path_factory.mktemp("markers")
    srv = ServerProcess(frontends=2, log_dir=tmp_path_factory.mktemp("logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(marker_dir)})
    yield from srv.serve()


@pytest.fixture(scope="session")
def shm_server(tmp_path_factory):
    """A server that accepts client shared memory (--allow-client-shm=true), on the same
    repositories, with two frontends: a region registered through one connection is
    used through others."""
    marker_dir = tmp_path_factory.mktemp("shm-markers")
    srv = ServerProcess(DEFAULT_REPOS, "--allow-client-shm=true", frontends=2,
                        log_dir=tmp_path_factory.mktemp("shm-logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(marker_dir)})
    srv.marker_dir = marker_dir
    yield from srv.serve()


@pytest.fixture(scope="module")
def held_server(tmp_path_factory):
    """tests/models_sched with Triton's TRITONSERVER_DELAY_SCHEDULER hook holding the
    first batch until HOLD requests are queued, so it forms exactly; one per module,
    since the hold applies once. Two frontends: counts must not depend on which one a
    request came through."""
    srv = ServerProcess(ROOT / "tests" / "models_sched", frontends=2,
                        log_dir=tmp_path_factory.mktemp("held-logs"),
                        env={"TRITONSERVER_DELAY_SCHEDULER": str(HOLD)})
    yield from srv.serve()
