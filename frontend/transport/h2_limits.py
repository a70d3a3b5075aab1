"""The limits that h2.py holds a hostile HTTP/2 peer to, with their defaults and
where they come from, and the two small objects that keep count: `TokenBucket` (a rate
limit with a burst) and `HeldBudget` (bytes held for peers, for a whole process).

Every limit is an attribute of `Limits`; `H2Connection(limits=...)` takes another set
(the tests use small ones). The defaults follow the mature servers:

Streams
- `max_streams` 250: SETTINGS_MAX_CONCURRENT_STREAMS, Go's x/net/http2 default (h2o and
  nghttpd advertise 100; grpc-core and Triton advertise none, unlimited). gRPC clients
  queue calls beyond it, so it bounds the work and memory one connection holds without
  failing any call. Handlers still running after their stream was reset count against
  it (Go's rule since CVE-2023-44487), so resets cannot open unbounded work.
- `reset_burst` 1000, `reset_rate` 33/s: streams the peer resets before their response
  is complete, and streams refused or reset for the peer's fault, drain a token bucket
  (nghttp2's stream reset rate limit: the same burst and rate); a response completed
  gives a token back (h2o's reset budget: only a peer whose resets outrun its completed
  calls runs dry). Empty: GOAWAY ENHANCE_YOUR_CALM.
- The requests of a connection's ModelStreamInfer streams share `max_streams` slots
  (frontend/stream_slots.py); a streaming call's queued messages keep their window
  shut until its handler reads them (h2.py's `hold`/`release`, Go's rule), so a
  stream past its slots stops its client within the 16 MiB stream window, and
  streams nobody reads within the 64 MiB connection window.
- `streams_per_read` 32 (grpc-core's max_requests_per_read) and `frames_per_read` 1024:
  after that much work on one read the connection stops reading and goes on at the
  loop's next turn, behind the other connections.

Headers
- `max_header_list` 16 KiB: SETTINGS_MAX_HEADER_LIST_SIZE, grpc-core's hard metadata
  limit (Triton advertises it). Counted as RFC 7541 4.1 counts a field (name + value +
  32), for what dynamic-table references expand to, while decoding. Past it the stream
  is answered (gRPC: RESOURCE_EXHAUSTED, as grpc-core words it) and the decoder's table
  is kept right; the stream costs reset tokens in proportion to how far past the limit
  it went, so a flagrant amplification (a 4 KiB entry referenced 4,000 times) empties
  the bucket at once.
- `max_header_block` 32 KiB: an encoded header block (HEADERS and its CONTINUATIONs)
  larger than twice the list limit is not decoded at all: GOAWAY ENHANCE_YOUR_CALM (Go
  closes at 2x the remaining list size). No encoder sends that much for a list within
  the limit: a literal costs about its size, a reference a byte or two for 32 or more,
  and encoders use Huffman only where it is shorter.
- `max_continuations` 8: CONTINUATION frames per header block (nghttp2's default),
  against floods of empty ones.
- `header_table_size` 4096: SETTINGS_HEADER_TABLE_SIZE, the RFC's default and
  everyone's: the most dynamic-table memory a peer can make a connection hold.

Flow control and output
- `conn_held_max` 64 MiB per connection, `process_held_max` 512 MiB per frontend process
  (`HeldBudget`): response bytes waiting for a peer's flow-control window. Past either,
  the connection's new streams get REFUSED_STREAM (costing reset tokens); a connection
  that stays past its bound with no window opened for `held_stall` 30 s gets GOAWAY
  ENHANCE_YOUR_CALM. What it held goes when the connection ends.
- `held_refusal_cost` 10: a stream refused because its connection holds that much
  costs 10 reset tokens, not 1. A peer that keeps its windows shut and goes on opening
  streams (the zero-window attack) sends each request's body before it learns of the
  refusal: at 1 MiB a request the frontend read 1 GiB in the 1000 refusals before the
  bucket ran dry, about a second of one CPU. A client that is only slow to read gets
  transparent retries of REFUSED_STREAM and the 30 s stall rule.
- `read_pause_high` 1 MiB: when the transport holds more unsent output than this (the
  answers of PINGs, SETTINGS, RST_STREAMs a peer does not read), the connection stops
  reading until the transport drains to its low-water mark; with no progress for
  `output_stall` 30 s it is closed. (Go closes at 10,000 queued control frames,
  grpc-core stops reading at 10,000 induced frames.)
- `glitch_burst` 10000, `glitch_rate` 330/s: frames that do nothing useful (PING,
  SETTINGS after the first, PRIORITY, unknown types, empty DATA without END_STREAM,
  DATA on closed streams) drain a second bucket: nghttp2's glitch rate limit, same
  burst and rate. Empty: ENHANCE_YOUR_CALM. WINDOW_UPDATEs are never counted, however
  small: grpc-core's clients give back what they read in small connection-level
  updates, thousands a second on a busy connection (a rule against updates under
  1 KiB closed tritonclient's connections at 12k calls/s on 16 cores); a flood of them
  asks for no answer and holds no memory, and the work per read is bounded anyway.
- `max_settings` 32 entries per SETTINGS frame (nghttp2's default): ENHANCE_YOUR_CALM.

Time
- `handshake_timeout` 10 s: the client preface and its first SETTINGS (Go's preface
  timeout; grpc-core's handshake timeout is 120 s, which a slowloris enjoys).
- `header_block_timeout` 10 s: a header block started must be complete.
- `idle_timeout` 300 s: a connection with no stream open for that long gets GOAWAY
  NO_ERROR (this frontend's HTTP/1.1 idle timeout; a gRPC client reconnects on its next
  call).
- `close_grace` 2 s: after a GOAWAY for an error, the connection is aborted if the peer
  has not let its output drain, so nothing a non-reading peer holds outlives it.

Connections
- `max_connections` 4096 per frontend process for the gRPC listener: one more is
  accepted, sent SETTINGS and GOAWAY ENHANCE_YOUR_CALM ("too many connections"), and
  closed (h2o's default is 1024, nginx's 512 per worker).
"""

from __future__ import annotations


class Limits:
    """One connection's limits (see the module docstring); keyword arguments replace
    the defaults."""

    max_streams = 250
    reset_burst = 1000
    reset_rate = 33.0
    streams_per_read = 32
    frames_per_read = 1024
    max_header_list = 16 << 10
    max_header_block = 32 << 10
    max_continuations = 8
    header_table_size = 4096
    conn_held_max = 64 << 20
    process_held_max = 512 << 20
    held_stall = 30.0
    held_refusal_cost = 10
    read_pause_high = 1 << 20
    output_stall = 30.0
    glitch_burst = 10000
    glitch_rate = 330.0
    max_settings = 32
    handshake_timeout = 10.0
    header_block_timeout = 10.0
    idle_timeout = 300.0
    close_grace = 2.0
    max_connections = 4096

    def __init__(self, **values):
        for name, value in values.items():
            if not hasattr(Limits, name):
                raise TypeError(f"unknown HTTP/2 limit {name!r}")
            setattr(self, name, value)


DEFAULT_LIMITS = Limits()


class TokenBucket:
    """`burst` tokens, refilled at `rate` per second up to `burst`; take() spends one
    (or `n`) and says whether there was enough. Time is given by the caller."""

    __slots__ = ("burst", "rate", "tokens", "stamp")

    def __init__(self, burst: float, rate: float, now: float):
        self.burst = burst
        self.rate = rate
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float, n: float = 1.0) -> bool:
        tokens = self.tokens + (now - self.stamp) * self.rate
        self.stamp = now
        if tokens > self.burst:
            tokens = self.burst
        if tokens < n:
            self.tokens = 0.0
            return False
        self.tokens = tokens - n
        return True


class HeldBudget:
    """Response bytes all the connections of a process hold for peers that have not
    opened their windows; each connection adds and takes back its own."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int = Limits.process_held_max):
        self.limit = limit
        self.held = 0

    def over(self) -> bool:
        return self.held >= self.limit


PROCESS_BUDGET = HeldBudget()  # shared by every connection of this process
