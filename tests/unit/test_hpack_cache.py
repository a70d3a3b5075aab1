"""frontend/h2.py's HeaderDecoder: hpack's decoder behind a cache of decoded blocks.

A cached block is not decoded again, which is only right for a block whose decoding
leaves the connection's dynamic table as it was. The property test runs streams of
header blocks, as clients encode them (indexed fields, literals with and without
indexing, never-indexed ones, Huffman or not, table size updates), through a plain
hpack decoder and through HeaderDecoder side by side: every block must decode the same.
"""

from __future__ import annotations

import hpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from frontend.h2 import HeaderDecoder, hpack_int, leaves_table_alone

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


# one step of a client: a header list its encoder turns into a block (indexing what
# it likes, Huffman or not), a hand-made block of literals that are not indexed, an
# indexed-only repeat of the last block, or a change of the encoder's table size
FIELD = st.tuples(st.sampled_from(NAMES), VALUES, st.booleans())
STEP = st.one_of(
    st.tuples(st.just("encode"), st.lists(FIELD, min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("literals"), st.lists(FIELD, min_size=1, max_size=4), st.just(0)),
    st.tuples(st.just("repeat"), st.just(None), st.just(0)),
    # an earlier block sent again after the table may have changed: its indices may
    # now name other entries, or none (then both decoders must refuse it)
    st.tuples(st.just("old"), st.integers(0, 40), st.just(0)),
    # an earlier header list encoded again: mostly indexed fields by now
    st.tuples(st.just("reencode"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("resize"), st.sampled_from([0, 64, 256, 4096]), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=30))
# a cached block that names a dynamic entry, sent again after an entry was added: the
# index now names the new entry, and the cache must have been emptied
@example([("encode", [(b"x-a", b"1", False)], False), ("reencode", 0, False),
          ("encode", [(b"x-b", b"2", False)], False), ("old", 1, 0)])
def test_the_cache_decodes_every_block_as_hpack_does(steps):
    encoder = hpack.Encoder()
    plain = hpack.Decoder()
    plain.max_header_list_size = 1 << 24
    cached = HeaderDecoder()
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
            # announcement when the same size is set twice: sizes here change)
            if arg != encoder.header_table_size:
                encoder.header_table_size = arg
            continue
        expected = _outcome(lambda: tuple(plain.decode(block, raw=True)))
        assert _outcome(lambda: cached.decode(block)) == expected
        if expected == "refused":
            return  # a connection error: the connection would end here
        last = block
        sent.append(block)
        # the same bytes once more: from the cache when the block left the table alone
        if leaves_table_alone(block):
            assert cached.decode(block) == tuple(plain.decode(block, raw=True))


def _outcome(decode):
    try:
        return decode()
    except hpack.HPACKError:
        return "refused"


def test_a_repeated_block_is_decoded_once_and_a_table_change_empties_the_cache():
    encoder = hpack.Encoder()
    d = HeaderDecoder()
    calls = []
    inner = d.hpack.decode
    d.hpack.decode = lambda block, raw: calls.append(block) or inner(block, raw=raw)
    headers = [(b":method", b"POST"), (b":path", b"/s/M"), (b"te", b"trailers")]
    first = encoder.encode(headers)  # literals with incremental indexing: not cached
    again = encoder.encode(headers)  # indexed fields only
    assert not leaves_table_alone(first) and leaves_table_alone(again)
    for block in (first, again, again, bytearray(again), again):
        assert d.decode(block) == ((b":method", b"POST"), (b":path", b"/s/M"),
                                   (b"te", b"trailers"))
    assert calls == [first, again]  # the repeats came from the cache
    changed = encoder.encode(headers + [(b"x-new", b"1")])  # adds a table entry
    d.decode(changed)
    assert d.cache == {}  # entries cached before may now name other fields
    d.decode(again)
    assert calls[-1] == again


def test_leaves_table_alone_reads_every_representation():
    assert leaves_table_alone(b"\x82\x86\xbe")  # indexed, one beyond the static table
    assert leaves_table_alone(literal(b"a", b"b") + literal(b"c", b"d", never=True))
    assert leaves_table_alone(b"\x04" + _string(b"/path"))  # indexed name, no indexing
    assert leaves_table_alone(b"\x0f\x10" + _string(b"v"))  # name index 31: two bytes
    assert not leaves_table_alone(b"\x44" + _string(b"/p"))  # incremental indexing
    assert not leaves_table_alone(b"\x3f\xe1\x1f")  # dynamic table size update
    assert not leaves_table_alone(b"\x00\x05ab")  # truncated: not cached, whatever it is


def test_big_blocks_and_many_blocks_keep_the_cache_small():
    d = HeaderDecoder()
    big = literal(b"x-big", b"v" * (HeaderDecoder.CACHE_BLOCK_BYTES + 1))
    d.decode(big)
    assert d.cache == {}
    for i in range(HeaderDecoder.CACHE_BLOCKS + 5):
        d.decode(literal(b"x-n", b"%d" % i))
    assert 0 < len(d.cache) <= HeaderDecoder.CACHE_BLOCKS
