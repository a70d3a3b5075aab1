"""HPACK (RFC 7541) for h2.py: request header blocks decoded under a cap on the
decoded header list, the RFC 9113 8.2-8.3 rules on request fields, and the literal
encoding the responses use.

`HeaderDecoder` decodes a connection's header blocks against its dynamic table. It
counts each field as RFC 7541 4.1 does (name + value + 32 octets) while decoding, for
what a dynamic-table reference expands to as much as for a literal, and once the list
passes its cap it keeps decoding only to keep the table right: nothing more is
collected, and the block ends in HeaderListTooLarge (a stream error) rather than in
megabytes of references. Every malformation RFC 7541 names (index 0 or past the table,
a table size update after a field, more than two of them, or larger than the
SETTINGS_HEADER_TABLE_SIZE we advertised, a truncated string or integer, a Huffman
string with EOS or bad padding) is a CompressionError: the connection's
COMPRESSION_ERROR. Huffman strings are decoded by hpack's table-driven decoder.

Decoded blocks that leave the dynamic table as it was are cached: a client sends the
same few bytes for every call once its headers are indexed, and such a block decodes
the same for as long as the table stays as it is. The cache is emptied whenever a block
changes the table. Only blocks within the cap are cached, with the verdict on their
fields, so a cache hit costs a dict lookup and no more checks.
"""

from __future__ import annotations

import re
from collections import deque

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC = HeaderTable.STATIC_TABLE  # ((name, value), ...), RFC 7541 Appendix A
N_STATIC = len(STATIC)
ENTRY_OVERHEAD = 32  # RFC 7541 4.1


class CompressionError(Exception):
    """The header block breaks RFC 7541: a connection error COMPRESSION_ERROR."""


class HeaderListTooLarge(Exception):
    """The decoded header list is larger than the cap (`size` octets, counted as
    RFC 7541 4.1 does); the dynamic table was kept right."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"received metadata size exceeds hard limit ({size} vs. {limit})")
        self.size = size
        self.limit = limit


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """RFC 7541 5.1: `value` with an N-bit prefix; `first` holds the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing with a new name, no Huffman."""
    return (b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value)


def _int(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """An HPACK integer at `pos` whose prefix is `mask`'s bits: (value, next position).
    More than four continuation octets (values past 2**28) is refused, as grpc-core
    refuses "malicious varint encoding": no header needs them."""
    value = block[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 21:
            raise CompressionError("HPACK integer too long")


def _string(block: bytes, pos: int) -> tuple[bytes, int]:
    huffman = block[pos] & 0x80
    length, pos = _int(block, pos, 0x7F)
    stop = pos + length
    if stop > len(block):
        raise CompressionError("truncated string literal")
    data = block[pos:stop]
    if huffman:
        try:
            data = decode_huffman(data)
        except HPACKDecodingError as e:
            raise CompressionError(f"Huffman: {e}") from None
    return data, stop


class HeaderDecoder:
    """A connection's HPACK decoder (see the module docstring). decode() gives
    (headers, problem, content_length): the fields as ((name, value), ...) bytes, why
    they are no valid request (None when they are) and the content-length they give."""

    CACHE_BLOCKS = 64
    CACHE_BLOCK_BYTES = 4096

    def __init__(self, max_list: int = 16 << 10, table_size: int = 4096):
        self.max_list = max_list
        self.max_table = table_size  # SETTINGS_HEADER_TABLE_SIZE, as advertised
        self.table_max = table_size  # the encoder's current choice, at most that
        self.entries: deque[tuple[bytes, bytes]] = deque()  # newest first
        self.table_bytes = 0
        self.cache: dict[bytes, tuple] = {}

    def decode(self, block) -> tuple:
        if type(block) is not bytes:
            block = bytes(block)
        hit = self.cache.get(block)
        if hit is not None:
            return hit
        try:
            headers, size, changed = self._decode(block)
        except IndexError:
            raise CompressionError("truncated header block") from None
        if changed:
            self.cache.clear()  # cached blocks may name entries that moved
        if size > self.max_list:
            raise HeaderListTooLarge(size, self.max_list)
        headers = tuple(headers)
        result = (headers, *request_problem(headers))
        if not changed and len(block) <= self.CACHE_BLOCK_BYTES:
            if len(self.cache) >= self.CACHE_BLOCKS:
                self.cache.clear()
            self.cache[block] = result
        return result

    def _decode(self, block: bytes) -> tuple[list, int, bool]:
        """(fields within the cap, the list's full size, whether the table changed)."""
        headers = []
        size = 0
        cap = self.max_list
        changed = False
        updates = 0
        fields = False
        pos, end = 0, len(block)
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed field (6.1)
                index, pos = _int(block, pos, 0x7F)
                name, value = self._entry(index)
            elif first & 0x40:  # literal with incremental indexing (6.2.1)
                name, value, pos = self._literal(block, pos, 0x3F)
                self._add(name, value)
                changed = True
            elif first & 0x20:  # dynamic table size update (6.3)
                if fields or updates == 2:
                    raise CompressionError("dynamic table size update after a field")
                new, pos = _int(block, pos, 0x1F)
                if new > self.max_table:
                    raise CompressionError(
                        f"dynamic table size {new} over SETTINGS_HEADER_TABLE_SIZE")
                self.table_max = new
                self._evict()
                updates += 1
                changed = True
                continue
            else:  # literal without indexing or never indexed (6.2.2, 6.2.3)
                name, value, pos = self._literal(block, pos, 0x0F)
            fields = True
            size += len(name) + len(value) + ENTRY_OVERHEAD
            if size <= cap:
                headers.append((name, value))
        return headers, size, changed

    def _literal(self, block: bytes, pos: int, mask: int) -> tuple[bytes, bytes, int]:
        index, pos = _int(block, pos, mask)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= N_STATIC:
            return STATIC[index - 1]
        i = index - N_STATIC - 1
        if 0 <= i < len(self.entries):
            return self.entries[i]
        raise CompressionError(f"invalid table index {index}")

    def _add(self, name: bytes, value: bytes) -> None:
        size = len(name) + len(value) + ENTRY_OVERHEAD
        if size > self.table_max:  # RFC 7541 4.4: an entry too large empties the table
            self.entries.clear()
            self.table_bytes = 0
            return
        self.entries.appendleft((name, value))
        self.table_bytes += size
        self._evict()

    def _evict(self) -> None:
        entries = self.entries
        while self.table_bytes > self.table_max:
            name, value = entries.pop()
            self.table_bytes -= len(name) + len(value) + ENTRY_OVERHEAD


# -- RFC 9113 8.2 and 8.3: what makes a request's fields malformed ----------------------

_BAD_NAME = re.compile(rb"[\x00-\x20A-Z:\x7f-\xff]")
_BAD_VALUE = re.compile(rb"[\x00\r\n]|\A[ \t]|[ \t]\Z")
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection",
                                  b"transfer-encoding", b"upgrade"))
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":path", b":authority"))


def field_problem(name: bytes, value: bytes) -> str | None:
    """Why a regular field is malformed (RFC 9113 8.2.1, 8.2.2), or None."""
    if not name or _BAD_NAME.search(name):
        return f"invalid header name {name[:40]!r}"
    if _BAD_VALUE.search(value):
        return f"invalid value of header {name[:40]!r}"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific header {name.decode()!r}"
    if name == b"te" and value != b"trailers":
        return "te other than 'trailers'"
    return None


def request_problem(headers) -> tuple[str | None, int | None]:
    """(why the request's fields are malformed or None, its content-length or None)."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    length = None
    for name, value in headers:
        if name[:1] == b":":
            if regular:
                return "pseudo-header after a regular header", None
            if name not in _REQUEST_PSEUDO:
                return f"unknown pseudo-header {name[:40]!r}", None
            if name in pseudo:
                return f"duplicate {name.decode()}", None
            pseudo[name] = value
            continue
        regular = True
        problem = field_problem(name, value)
        if problem is not None:
            return problem, None
        if name == b"content-length":
            if not value.isdigit() or (length is not None and int(value) != length):
                return "invalid content-length", None
            length = int(value)
    method = pseudo.get(b":method")
    if method is None:
        return "missing :method", None
    if method == b"CONNECT":
        if b":scheme" in pseudo or b":path" in pseudo or b":authority" not in pseudo:
            return "malformed CONNECT", None
    elif b":scheme" not in pseudo or not pseudo.get(b":path"):
        return "missing :scheme or :path", None
    return None, length


def trailer_problem(headers) -> str | None:
    """Why request trailers are malformed (no pseudo-headers, RFC 9113 8.1), or None."""
    for name, value in headers:
        if name[:1] == b":":
            return "pseudo-header in trailers"
        problem = field_problem(name, value)
        if problem is not None:
            return problem
    return None
