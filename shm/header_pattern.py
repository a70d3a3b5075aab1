"""The regular expression of `--http-header-forward-pattern` / `--grpc-header-forward-
pattern`, compiled as Triton reads it, for the scheduler (which refuses a bad one at
start) and the frontends (which match header names with it).

Triton compiles the flag with RE2, case-insensitive (its docs: "By default, the regular
expression pattern matches headers with case-insensitive mode"), so `MY_HEADER.*`
matches the header `my_header_1`; a pattern that wants case to matter turns it back on
with RE2's `(?-i)`. Python's `re` takes the first as re.IGNORECASE, but refuses a flag
turned off for the rest of the pattern: a leading flag group that turns flags off,
`(?-i)` or `(?s-i)`, is rewritten as the scoped group Python has, `(?-i:...)`, which
means the same there. A pattern neither reads as RE2 does is refused, naming its flag.
"""

from __future__ import annotations

import re

# a leading RE2 flag group with flags to turn off: (?-i), (?s-i), (?-is)
_LEADING_FLAGS = re.compile(r"\(\?([a-zA-Z]*)-([a-zA-Z]+)\)")


def compile_forward_pattern(pattern: str | None, flag: str = "header forward pattern"
                            ) -> re.Pattern | None:
    """`pattern` compiled case-insensitively, as Triton's RE2; None for no pattern.
    Raises ValueError naming `flag` for a pattern Python cannot read as RE2 does."""
    if not pattern:
        return None
    source = pattern
    lead = _LEADING_FLAGS.match(pattern)
    if lead is not None:
        source = f"(?{lead[1]}-{lead[2]}:{pattern[lead.end():]})"
    try:
        return re.compile(source, re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"{flag}: invalid regular expression '{pattern}': {exc}"
                         ) from None
