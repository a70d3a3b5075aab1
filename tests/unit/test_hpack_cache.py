"""transport/h2_hpack.py's HeaderDecoder: HPACK decoding under a cap on the decoded
header list, behind a cache of decoded blocks.

A cached block is not decoded again, which is only right for a block whose decoding
leaves the connection's dynamic table as it was. The property test runs streams of
header blocks, as clients encode them (indexed fields, literals with and without
indexing, never-indexed ones, Huffman or not, table size updates), through hpack's own
decoder, through HeaderDecoder with its cache and through HeaderDecoder decoding every
block afresh, side by side: every block must decode the same in all three, and with a
small cap, the cached and the fresh decoder must refuse the same blocks and keep the
same table. The RFC 7541 errors h2spec checks each end in CompressionError.
"""

from __future__ import annotations

import hpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from frontend.transport.h2_hpack import (CompressionError, HeaderDecoder,
                                         HeaderListTooLarge, hpack_int)

NAMES = [b":method", b":path", b":authority", b"content-type", b"te", b"user-agent",
         b"grpc-timeout", b"x-custom", b"x-another-one"]
# few values, so that header lists repeat and the encoder indexes into its table
VALUES = st.one_of(st.sampled_from([b"POST", b"/s/Method", b"application/grpc", b"x"]),
                   st.sampled_from([b"1", b"2"]), st.binary(min_size=0, max_size=24))


def _string(data: bytes) -> bytes:
    return hpack_int(len(data), 7) + data


def literal(name: bytes, value: bytes, never: bool = False) -> bytes:
    """A literal field, new name, without indexing (or never indexed): RFC 7541 6.2.2."""
    return (b"\x10" if never else b"\x00") + _string(name) + _string(value)


def indexed_literal(name: bytes, value: bytes) -> bytes:
    """A literal with incremental indexing, new name (RFC 7541 6.2.1)."""
    return b"\x40" + _string(name) + _string(value)


# one step of a client: a header list its encoder turns into a block (indexing what
# it likes, Huffman or not), a hand-made block of literals that are not indexed, an
# indexed-only repeat of the last block, or a change of the encoder's table size
FIELD = st.tuples(st.sampled_from(NAMES), VALUES, st.booleans())
STEP = st.one_of(
    st.tuples(st.just("encode"), st.lists(FIELD, min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("literals"), st.lists(FIELD, min_size=1, max_size=4), st.just(0)),
    st.tuples(st.just("repeat"), st.just(None), st.just(0)),
    # an earlier block sent again after the table may have changed: its indices may
    # now name other entries, or none (then all decoders must refuse it)
    st.tuples(st.just("old"), st.integers(0, 40), st.just(0)),
    # an earlier header list encoded again: mostly indexed fields by now
    st.tuples(st.just("reencode"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("resize"), st.sampled_from([0, 64, 256, 4096]), st.just(0)),
)


def _blocks(steps):
    """The header blocks a client sends for `steps`."""
    encoder = hpack.Encoder()
    last = None
    sent = []
    lists = []
    for kind, arg, huffman in steps:
        if kind == "reencode":
            if not lists:
                continue
            kind, arg = "encode", lists[arg % len(lists)]
        if kind == "encode":
            lists.append(arg)
            headers = [hpack.NeverIndexedHeaderTuple(n, v) if never else (n, v)
                       for n, v, never in arg]
            block = encoder.encode(headers, huffman=huffman)
        elif kind == "literals":
            block = b"".join(literal(n, v, never) for n, v, never in arg)
        elif kind == "repeat":
            if last is None:
                continue
            block = last
        elif kind == "old":
            if not sent:
                continue
            block = sent[arg % len(sent)]
        else:
            # the next encoded block announces it (hpack's encoder loses an
            # announcement when the same size is set twice: sizes here change; and it
            # announces every change, where RFC 7541 4.2 allows two per block)
            if arg != encoder.header_table_size and len(encoder.table_size_changes) < 2:
                encoder.header_table_size = arg
            continue
        last = block
        sent.append(block)
        yield block


def _outcome(decode):
    try:
        return decode()
    except (hpack.HPACKError, CompressionError):
        return "refused"
    except HeaderListTooLarge as e:
        return ("too large", e.size)


@settings(max_examples=2 * settings.default.max_examples, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=30))
# a cached block that names a dynamic entry, sent again after an entry was added: the
# index now names the new entry, and the cache must have been emptied
@example([("encode", [(b"x-a", b"1", False)], False), ("reencode", 0, False),
          ("encode", [(b"x-b", b"2", False)], False), ("old", 1, 0)])
def test_the_cache_decodes_every_block_as_a_fresh_decoder_and_hpack_do(steps):
    plain = hpack.Decoder()
    plain.max_header_list_size = 1 << 24
    cached = HeaderDecoder(max_list=1 << 24)
    fresh = HeaderDecoder(max_list=1 << 24)
    for block in _blocks(steps):
        expected = _outcome(lambda: tuple(plain.decode(block, raw=True)))
        fresh.cache.clear()
        assert _outcome(lambda: fresh.decode(block)[0]) == expected
        assert _outcome(lambda: cached.decode(block)[0]) == expected
        if expected == "refused":
            return  # a connection error: the connection would end here
        assert cached.entries == fresh.entries
        # the same bytes once more: from the cache when the block left the table alone
        if block in cached.cache:
            assert cached.decode(block)[0] == tuple(plain.decode(block, raw=True))


@settings(max_examples=settings.default.max_examples, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=30), st.integers(40, 400))
def test_with_a_small_cap_cached_and_fresh_decoders_refuse_alike_and_keep_one_table(
        steps, cap):
    cached = HeaderDecoder(max_list=cap)
    fresh = HeaderDecoder(max_list=cap)
    for block in _blocks(steps):
        fresh.cache.clear()
        want = _outcome(lambda: fresh.decode(block))
        assert _outcome(lambda: cached.decode(block)) == want
        if want == "refused":
            return
        # a list past the cap leaves the table as a full decode would
        assert cached.entries == fresh.entries and cached.table_bytes == fresh.table_bytes
        if isinstance(want, tuple) and want[0] != "too large":
            assert sum(len(n) + len(v) + 32 for n, v in want[0]) <= cap


def test_a_repeated_block_is_decoded_once_and_a_table_change_empties_the_cache():
    encoder = hpack.Encoder()
    d = HeaderDecoder()
    calls = []
    inner = d._decode
    d._decode = lambda block: calls.append(block) or inner(block)
    headers = [(b":method", b"POST"), (b":path", b"/s/M"), (b"te", b"trailers")]
    first = encoder.encode(headers)  # literals with incremental indexing: not cached
    again = encoder.encode(headers)  # indexed fields only
    for block in (first, again, again, bytearray(again), again):
        assert d.decode(block)[0] == ((b":method", b"POST"), (b":path", b"/s/M"),
                                      (b"te", b"trailers"))
    assert calls == [first, again]  # the repeats came from the cache
    changed = encoder.encode(headers + [(b"x-new", b"1")])  # adds a table entry
    d.decode(changed)
    assert d.cache == {}  # entries cached before may now name other fields
    d.decode(again)
    assert calls[-1] == again


def test_big_blocks_and_many_blocks_keep_the_cache_small():
    d = HeaderDecoder()
    big = literal(b"x-big", b"v" * (HeaderDecoder.CACHE_BLOCK_BYTES + 1))
    d.decode(big)
    assert d.cache == {}
    for i in range(HeaderDecoder.CACHE_BLOCKS + 5):
        d.decode(literal(b"x-n", b"%d" % i))
    assert 0 < len(d.cache) <= HeaderDecoder.CACHE_BLOCKS


def test_references_to_a_table_entry_count_what_they_expand_to():
    """HPACK amplification: a 4 KiB entry, referenced 4,000 times in a 4,000-byte
    block, is a 16 MB header list; it is refused as such, at the cost of reading the
    block, not of building the list, and the cache does not keep it."""
    d = HeaderDecoder(max_list=16384)
    d.decode(indexed_literal(b"x-big", b"v" * 4000))
    assert len(d.entries) == 1
    block = b"\xbe" * 4000  # index 62: the newest dynamic entry
    for _ in range(2):
        with pytest.raises(HeaderListTooLarge) as e:
            d.decode(block)
        assert e.value.size == 4000 * (5 + 4000 + 32) and block not in d.cache
    # within the cap, the same references decode
    assert d.decode(b"\xbe" * 3)[0] == ((b"x-big", b"v" * 4000),) * 3


def test_a_list_past_the_cap_still_changes_the_table_as_the_encoder_expects():
    d = HeaderDecoder(max_list=100)
    with pytest.raises(HeaderListTooLarge):
        d.decode(indexed_literal(b"x-a", b"1" * 80) + indexed_literal(b"x-b", b"2"))
    # both literals went into the table, as the peer's encoder believes
    assert list(d.entries) == [(b"x-b", b"2"), (b"x-a", b"1" * 80)]
    assert d.decode(b"\xbe")[0] == ((b"x-b", b"2"),)


@pytest.mark.parametrize("block, why", [
    (b"\x80", "indexed field with index 0 (RFC 7541 6.1)"),
    (b"\xbe", "indexed field past the table (2.3.3)"),
    (b"\x7f\x00" + _string(b"v"), "literal whose name index is past the table (2.3.3)"),
    (b"\x82\x20", "table size update after a field (4.2)"),
    (b"\x20\x20\x20\x82", "three table size updates (4.2: at most two)"),
    (b"\x3f\xe2\x1f", "table size update over SETTINGS_HEADER_TABLE_SIZE (6.3)"),
    (b"\x00\x81\x1f\xff" + _string(b"v"), "Huffman padding longer than 7 bits (5.2)"),
    (b"\x00\x81\x00" + _string(b"v"), "Huffman padded with zeros (5.2)"),
    (b"\x00\x84\xff\xff\xff\xff" + _string(b"v"), "Huffman string with EOS (5.2)"),
    (b"\x00\x05ab", "truncated string"),
    (b"\xff\xff\xff\xff\xff\xff\x01", "integer past 2**28"),
    (b"\xff", "truncated integer"),
])
def test_rfc7541_errors_are_compression_errors(block, why):
    with pytest.raises(CompressionError):
        HeaderDecoder().decode(block)


def test_two_size_updates_at_the_start_are_allowed():
    d = HeaderDecoder()
    d.decode(indexed_literal(b"x-a", b"1"))
    assert d.decode(b"\x20\x3f\xe1\x1f\x82")[0] == ((b":method", b"GET"),)
    assert d.table_max == 4096 and not d.entries  # shrunk to 0 on the way: evicted


@pytest.mark.parametrize("headers, problem", [
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a")], None),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"x-Upper", b"1")], "invalid header name"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"), (b":test", b"1")],
     "unknown pseudo-header"),
    ([(b":status", b"200"), (b":method", b"POST"), (b":scheme", b"http"),
      (b":path", b"/a")], "unknown pseudo-header"),
    ([(b":method", b"POST"), (b"x", b"1"), (b":scheme", b"http"), (b":path", b"/a")],
     "pseudo-header after a regular header"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"connection", b"keep-alive")], "connection-specific header"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"te", b"gzip")], "te other than"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"")], "missing"),
    ([(b":scheme", b"http"), (b":path", b"/a")], "missing :method"),
    ([(b":method", b"POST"), (b":path", b"/a")], "missing"),
    ([(b":method", b"POST"), (b":scheme", b"http")], "missing"),
    ([(b":method", b"POST"), (b":method", b"POST"), (b":scheme", b"http"),
      (b":path", b"/a")], "duplicate :method"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"x", b"a\nb")], "invalid value"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"x", b" a")], "invalid value"),
    ([(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/a"),
      (b"content-length", b"-1")], "invalid content-length"),
])
def test_request_field_rules_of_rfc9113(headers, problem):
    from frontend.transport.h2_hpack import request_problem
    got, _ = request_problem(headers)
    assert (got is None) if problem is None else (got is not None and problem in got)
