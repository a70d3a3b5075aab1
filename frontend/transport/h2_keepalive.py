"""Keepalive PINGs, PING abuse and connection age for h2.py connections,
with the meaning grpc-core's chttp2 transport gives Triton's gRPC flags
(grpc/doc/keepalive.md, chttp2's ping abuse and ping rate policies, the max-age
filter):

- Keepalive (`--grpc-keepalive-time`, `--grpc-keepalive-timeout`,
  `--grpc-keepalive-permit-without-calls`, `--grpc-http2-max-pings-without-data`):
  once the client has sent nothing for a keepalive period, the server sends a PING
  if calls are running (or always, when permitted without calls); if nothing at all
  comes back within the timeout the peer is taken for dead and the connection is
  dropped. At most max-pings-without-data such PINGs go out until the server sends
  HEADERS or DATA again (0: no limit).
- PING abuse (`--grpc-http2-min-recv-ping-interval-without-data`,
  `--grpc-http2-max-ping-strikes`): a client PING that comes sooner than the minimum
  interval after the one before is a strike (the interval is two hours while no call
  runs, unless PINGs are permitted without calls). Whenever the server sends HEADERS
  or DATA the strikes are forgiven. One strike more than the maximum (0: no maximum)
  and the connection gets GOAWAY ENHANCE_YOUR_CALM with debug data "too_many_pings",
  and is closed, as grpc-core does.
- Age (`--grpc-max-connection-age`, `--grpc-max-connection-age-grace`): at the age,
  give or take 10% so that clients do not all reconnect at once, a GOAWAY NO_ERROR
  naming stream 2^31-1 and a PING; once the PING is answered (a round trip: streams
  the client opened meanwhile are in), the final GOAWAY naming the last stream
  (RFC 9113 6.8). The connection closes when its calls are done, or is dropped when
  the grace period, counted from the first GOAWAY, is over. 0 means no limit for
  either, as Triton passes neither to grpc-core then.

h2.py's part is two flags it sets (`bytes_read` on each read, `data_sent` when it
queues HEADERS, DATA or a connection WINDOW_UPDATE) and three calls (a PING, a PING
ACK, the connection lost); everything else happens on a PING or on this connection's
own timers, never per frame.
"""

from __future__ import annotations

import logging
import math
import random
import struct

from shm.messages.roles import GrpcKeepalive

from . import h2

log = logging.getLogger(__name__)

INT_MAX = 2**31 - 1  # a keepalive time of INT_MAX ms is grpc-core's "never"
IDLE_PING_INTERVAL = 7200.0  # s: RFC 1122's floor for TCP keepalive, grpc-core's rule
GOAWAY_PING_TIMEOUT = 20.0  # s: how long grpc-core waits for the graceful GOAWAY's PING
AGE_JITTER = 0.1
# the opaque data of this server's own PINGs, told apart from the client's
KEEPALIVE_PING = b"shmkeep\x00"
GOAWAY_PING = b"shmgoaw\x00"


class KeepaliveSettings(GrpcKeepalive, frozen=True):
    """The frontend spec's GrpcKeepalive (its fields and Triton's defaults), with what
    the transports make of it."""

    def grpcio_options(self) -> list[tuple[str, int]]:
        """The same settings as grpc.aio server channel arguments, as Triton sets them."""
        opts = [
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls",
             int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            ("grpc.http2.min_recv_ping_interval_without_data_ms",
             self.http2_min_recv_ping_interval_without_data_ms),
            ("grpc.http2.max_ping_strikes", self.http2_max_ping_strikes),
        ]
        if self.max_connection_age_ms:
            opts.append(("grpc.max_connection_age_ms", self.max_connection_age_ms))
        if self.max_connection_age_grace_ms:
            opts.append(("grpc.max_connection_age_grace_ms",
                         self.max_connection_age_grace_ms))
        return opts


class ConnectionPolicy:
    """One connection's keepalive, PING strikes and age (see the module's docstring).
    Made when the connection is (GrpcConnection.connection_made), closed with it."""

    __slots__ = ("conn", "loop", "settings", "keepalive_timer", "watchdog", "age_timer",
                 "goaway_timer", "grace_timer", "pings_without_data", "last_ping_in",
                 "strikes", "min_interval")

    def __init__(self, settings: KeepaliveSettings, conn):
        self.conn = conn
        self.loop = conn.loop
        self.settings = settings
        self.keepalive_timer = self.watchdog = self.age_timer = None
        self.goaway_timer = self.grace_timer = None
        self.pings_without_data = 0
        self.last_ping_in = -math.inf
        self.strikes = 0
        self.min_interval = settings.http2_min_recv_ping_interval_without_data_ms / 1000
        self._arm_keepalive()
        if settings.max_connection_age_ms > 0:
            age = settings.max_connection_age_ms / 1000 * random.uniform(
                1 - AGE_JITTER, 1 + AGE_JITTER)
            self.age_timer = self.loop.call_later(age, self._age_reached)

    def close(self) -> None:
        """The connection is gone: no timer of it may outlive it (nor keep it alive)."""
        for timer in (self.keepalive_timer, self.watchdog, self.age_timer,
                      self.goaway_timer, self.grace_timer):
            if timer is not None:
                timer.cancel()
        self.keepalive_timer = self.watchdog = self.age_timer = None
        self.goaway_timer = self.grace_timer = None

    # -- what h2.py calls -------------------------------------------------------------

    def ping_received(self) -> bool:
        """A client PING (not an ACK): True when it is one strike too many."""
        self._forgive_if_data_sent()
        now = self.loop.time()
        idle = not self.settings.keepalive_permit_without_calls and not self.conn.streams
        allowed_at = self.last_ping_in + (IDLE_PING_INTERVAL if idle else self.min_interval)
        self.last_ping_in = now
        if allowed_at <= now:
            return False
        self.strikes += 1
        limit = self.settings.http2_max_ping_strikes
        return limit != 0 and self.strikes > limit

    def ping_acked(self, opaque: bytes) -> bool:
        """The ACK of a PING: True when it answers one of ours (an ACK nobody asked
        for is the connection's to count as a useless frame)."""
        if opaque == KEEPALIVE_PING and self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
            self._arm_keepalive()
            return True
        if opaque == GOAWAY_PING and self.goaway_timer is not None:
            self.goaway_timer.cancel()
            self.goaway_timer = None
            self.conn.goaway()  # the final GOAWAY: no stream after the last one
            return True
        return False

    # -- keepalive ----------------------------------------------------------------------

    def _forgive_if_data_sent(self) -> None:
        """grpc-core's reset of the ping clock: the server sent HEADERS or DATA since
        this was last asked, so the client's PINGs start afresh and ours may go out."""
        conn = self.conn
        if conn.data_sent:
            conn.data_sent = False
            self.strikes = 0
            self.last_ping_in = -math.inf
            self.pings_without_data = 0

    def _arm_keepalive(self) -> None:
        ms = self.settings.keepalive_time_ms
        if 0 < ms < INT_MAX:
            self.keepalive_timer = self.loop.call_later(ms / 1000, self._keepalive_due)

    def _keepalive_due(self) -> None:
        """A keepalive period is over. A connection that read something during it is
        alive (grpc-core restarts the period on every read; a flag per read and a
        timer per period cost less: the PING goes out one to two periods after the
        last byte, not one)."""
        self.keepalive_timer = None
        conn, s = self.conn, self.settings
        if conn.bytes_read or not (s.keepalive_permit_without_calls or conn.streams):
            conn.bytes_read = False
            return self._arm_keepalive()
        self._forgive_if_data_sent()
        limit = s.http2_max_pings_without_data
        if limit and self.pings_without_data >= limit:
            return self._arm_keepalive()  # no more until HEADERS or DATA go out
        self.pings_without_data += 1
        conn.send_frame(h2.frame(h2.PING, 0, 0, KEEPALIVE_PING))
        self.watchdog = self.loop.call_later(s.keepalive_timeout_ms / 1000,
                                             self._watchdog_fired)

    def _watchdog_fired(self) -> None:
        """No ACK within the timeout: alive all the same if anything was read since
        the PING (as grpc-core: any read cancels the watchdog), else dropped."""
        self.watchdog = None
        if self.conn.bytes_read:
            self.conn.bytes_read = False
            return self._arm_keepalive()
        log.debug("HTTP/2 connection dropped: keepalive PING unanswered for %d ms",
                  self.settings.keepalive_timeout_ms)
        self.conn.abort()

    # -- age ----------------------------------------------------------------------------

    def _age_reached(self) -> None:
        self.age_timer = None
        conn = self.conn
        if conn.going_away or conn.transport is None or conn.transport.is_closing():
            return
        # the first, graceful GOAWAY: streams already on their way are still taken
        conn.send_frame(h2.frame(h2.GOAWAY, 0, 0, struct.pack(">II", INT_MAX, h2.NO_ERROR))
                        + h2.frame(h2.PING, 0, 0, GOAWAY_PING))
        self.goaway_timer = self.loop.call_later(GOAWAY_PING_TIMEOUT,
                                                 self._goaway_unanswered)
        grace = self.settings.max_connection_age_grace_ms
        if grace > 0:
            self.grace_timer = self.loop.call_later(grace / 1000, self._grace_over)

    def _goaway_unanswered(self) -> None:
        self.goaway_timer = None
        self.conn.goaway()

    def _grace_over(self) -> None:
        """The calls had their grace period: whatever still runs is cut off."""
        self.grace_timer = None
        log.debug("HTTP/2 connection dropped: max connection age and its grace are over")
        self.conn.abort()
