"""The test harness's ports (tests/e2e/harness.py): drawn below the kernel's ephemeral
range, never one a live shmserve holds, and drawn again when another test's server
takes one between the draw and the start (two pytest workers start servers at once)."""

import socket

import pytest

from tests.e2e.harness import EXAMPLES, PORTS, ServerProcess, free_ports

pytestmark = pytest.mark.e2e


def _hold(port: int) -> socket.socket:
    """What a running shmserve holds for its port: the port's lock."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lock.bind(f"\0shmserve-port-{port}")
    return lock


def test_ports_are_drawn_outside_the_ephemeral_range_and_skip_held_ones():
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(PORTS[0] <= p < PORTS[1] for p in ports)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    assert PORTS[1] <= low, "the harness's ports overlap the kernel's ephemeral ones"


def test_a_port_taken_before_the_start_is_drawn_again(tmp_path):
    srv = ServerProcess(EXAMPLES, "--model-control-mode", "explicit",
                        "--load-model", "identity_fp32", log_dir=tmp_path)
    taken = srv.grpc_port
    lock = _hold(taken)  # as another test's server would, between draw and start
    try:
        srv.start()
        try:
            assert srv.grpc_port != taken
            assert f"--grpc-port {srv.grpc_port} " in " ".join(srv.argv) + " "
            assert srv._ready_or_dead() and srv.proc.poll() is None
        finally:
            srv.stop_checked()
    finally:
        lock.close()
