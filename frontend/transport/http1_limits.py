"""The deadlines and the connection limit of http1.py's HTTP/1.1 transport:
their defaults, and the sweep that applies them (HttpProtocol.overdue says which
deadline a connection is past)."""

from __future__ import annotations

import asyncio

# a keep-alive connection with no request for this long is closed (what the uvicorn
# transport was configured with, `timeout_keep_alive`)
IDLE_TIMEOUT = 300.0
HEADER_TIMEOUT = 60.0  # nginx's client_header_timeout
BODY_TIMEOUT = 60.0  # nginx's client_body_timeout: between two reads of a body
# open connections per frontend process; each costs a descriptor (and a little
# memory), and past the process's descriptor limit asyncio stops accepting for a while
MAX_CONNECTIONS = 4096
LINGER = 2.0  # seconds a connection closed on an error reads what the client still sends

TIMED_OUT = object()  # overdue(): a request's head or body stopped coming
IDLE = object()  # overdue(): no request came


def default_max_connections() -> int:
    """MAX_CONNECTIONS, or half the process's descriptor limit if that is lower (the
    rest for gRPC, the scheduler's sockets and files)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft // 2))


async def sweep(connections: set, idle: float, header: float, body: float) -> None:
    """Close the connections past a deadline (HttpProtocol.overdue), looked at every
    quarter of the shortest, so one may stay up to 1.25 times as long. A sweep, not a
    timer per connection: a request costs no timer's arming and cancelling, and the
    clock read data_received makes anyway."""
    loop = asyncio.get_running_loop()
    period = min(max(min(idle, header, body) / 4, 0.01), 30.0)
    while True:
        await asyncio.sleep(period)
        now = loop.time()
        for conn in list(connections):
            why = conn.overdue(now, idle, header, body)
            if why is TIMED_OUT:
                conn.time_out()
            elif why is IDLE:
                conn.shutdown()
