"""A child process's command line from a frozen spec struct, and back.

The scheduler's pools build a spec (shm/messages/roles.py) and hand it over as argv;
the child parses the same class. So the fields and their defaults are written once,
in the struct. Every field travels as `--field-name VALUE`, always (a `ps` listing
shows what a child was given): text fields as they are, everything else as JSON.
"""

from __future__ import annotations

import functools

import msgspec


class SpecError(ValueError):
    """A command line that does not spell the spec: an unknown flag, a missing value,
    a value of the wrong type, a required field left out."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def _text_fields(cls: type) -> frozenset[str]:
    """The fields whose values travel as plain text: `str`, or a choice of strings."""
    out = set()
    for field in msgspec.structs.fields(cls):
        info = msgspec.inspect.type_info(field.type)
        if isinstance(info, msgspec.inspect.StrType) or (
                isinstance(info, msgspec.inspect.LiteralType)
                and all(isinstance(v, str) for v in info.values)):
            out.add(field.name)
    return frozenset(out)


class ArgvSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen struct that spells itself as a command line (see the module)."""

    def to_argv(self) -> list[str]:
        text = _text_fields(type(self))
        out = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            out += [_flag(name),
                    value if name in text else msgspec.json.encode(value).decode()]
        return out

    @classmethod
    def from_argv(cls, argv: list[str]):
        """The spec `to_argv` spelled; SpecError names what is wrong."""
        text = _text_fields(cls)
        fields = {_flag(name): name for name in cls.__struct_fields__}
        raw = {}
        args = iter(argv)
        for flag in args:
            name = fields.get(flag)
            if name is None:
                raise SpecError(f"unknown argument {flag!r}")
            value = next(args, None)
            if value is None:
                raise SpecError(f"{flag} needs a value")
            try:
                raw[name] = value if name in text else msgspec.json.decode(value)
            except msgspec.DecodeError:
                raise SpecError(f"{flag}: not JSON: {value!r}") from None
        try:
            return msgspec.convert(raw, cls)
        except msgspec.ValidationError as exc:
            raise SpecError(str(exc)) from None
