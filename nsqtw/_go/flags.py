"""Go's ``flag`` package and the TOML ``--config`` files of NSQ's Go programs.

nsqd, nsqlookupd and nsqadmin share one way of reading their settings: Go
``flag`` syntax on the command line (``-flag value``, ``--flag=value``, bare
bools), then a TOML file whose keys are the flags' ``cfg`` names, then the
defaults. This module is that machinery, with the flag value kinds those
programs define (durations, log levels, nsqd's ``--tls-required`` and
``--tls-min-version``); each program supplies only its table of
:class:`Flag` records, its defaults and its start-up checks (a
:class:`FlagSet`).
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.python import usage

from nsqtw._go.duration import format_duration, parse_duration
from nsqtw._go.strconv import (
    INT64_MAX,
    INT64_MIN,
    PARSE,
    RANGE,
    NumError,
    parse_bool,
    parse_float,
    parse_int,
)
from nsqtw._go.strconv import quote as _quote
from nsqtw.log import LEVELS

__all__ = [
    "ACTIVE",
    "NOT_YET_ACTIVE",
    "NO_EFFECT",
    "TLS_MIN_VERSIONS",
    "TLS_NOT_REQUIRED",
    "TLS_REQUIRED",
    "TLS_REQUIRED_EXCEPT_HTTP",
    "TLS_VERSION_NAMES",
    "Flag",
    "FlagSet",
    "GoFlagsTwistdOptions",
    "HelpRequested",
    "OptionsError",
    "make_flag",
]

#: a flag's status in ``--help``, the docs and ``/config``
ACTIVE = "active"
NOT_YET_ACTIVE = "accepted, not yet active"
#: accepted for compatibility, deliberately without effect
NO_EFFECT = "accepted, no effect"

#: ``tls_required`` values, as nsqd numbers them.
TLS_NOT_REQUIRED = 0
TLS_REQUIRED = 1
TLS_REQUIRED_EXCEPT_HTTP = 2

#: ``--tls-min-version`` names and the TLS protocol numbers nsqd stores
#: (the same numbers as :class:`ssl.TLSVersion`).
TLS_MIN_VERSIONS: Mapping[str, int] = {
    "ssl3.0": 0x0300,
    "tls1.0": 0x0301,
    "tls1.1": 0x0302,
    "tls1.2": 0x0303,
    "tls1.3": 0x0304,
}
TLS_VERSION_NAMES = {v: k for k, v in TLS_MIN_VERSIONS.items()}


class OptionsError(Exception):
    """A flag or config value the Go program would refuse; ``str()`` is one line for the user."""


class HelpRequested(Exception):
    """``-h``/``--help`` was given: the caller prints :func:`usage_text` and exits 0."""


@dataclass(frozen=True)
class Flag:
    """One flag of a Go program: what the parser, ``--help``, the docs and ``/config`` need to know."""

    name: str
    attribute: str
    default: Any
    kind: str
    help: str
    status: str
    #: key in the ``--config`` file (nsqd's ``cfg`` name); ``None``: not read from the file
    toml_key: str | None
    #: how the default reads in ``--help`` and the docs
    default_text: str

    @property
    def repeatable(self) -> bool:
        return self.kind in ("strings", "floats")

    @property
    def is_bool(self) -> bool:
        """Bool-like flags take no separate argument (``-flag`` means true)."""
        return self.kind in ("bool", "tls-required")


def _default_text(kind: str, value: Any) -> str:
    if kind == "duration":
        return format_duration(value)
    if kind == "bool":
        return "true" if value else "false"
    if kind in ("strings", "floats"):
        return ",".join(str(v) for v in value) if value else "(none)"
    if kind == "tls-required":
        return {0: "false", 1: "true", 2: "tcp-https"}[value]
    if kind == "tls-min-version":
        return TLS_VERSION_NAMES[value]
    if kind == "string":
        return _quote(value)
    if kind == "float":  # Go's %v: 1, not 1.0
        return repr(float(value)).removesuffix(".0")
    return str(value)


def make_flag(
    name: str,
    kind: str,
    help: str,
    status: str = NOT_YET_ACTIVE,
    toml_key: str | None = "",
    default_text: str | None = None,
    *,
    base: Any,
) -> Flag:
    """One flag record; its default is read from ``base`` (an options object)."""
    attribute = name.replace("-", "_")
    default = getattr(base, attribute)
    if toml_key == "":
        toml_key = attribute
    if default_text is None:
        default_text = _default_text(kind, default)
    return Flag(name, attribute, default, kind, help, status, toml_key, default_text)


#: a value failed to parse; ``str()`` is the reason the caller places in its message
_ValueError = NumError


def _go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 0, 64)`` as the flag package uses it (0x, 0o, 0b, 0 prefixes)."""
    return parse_int(text, 0)


def _decimal_int(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 10, 64)``, used for integers written as strings in the file."""
    return parse_int(text, 10)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError:
        raise _ValueError(PARSE) from None


def _log_level(text: str) -> str:
    level = text.lower()
    if level not in LEVELS:
        raise _ValueError(
            f"invalid log level {_quote(text)} (debug, info, warn, error, fatal)"
        )
    return level


def _tls_required(text: str) -> int:
    lowered = text.lower()
    if lowered == "tcp-https":
        return TLS_REQUIRED_EXCEPT_HTTP
    try:
        return TLS_REQUIRED if parse_bool(lowered) else TLS_NOT_REQUIRED
    except _ValueError:
        raise _ValueError("must be true, false or tcp-https") from None


def _tls_min_version(text: str) -> int | None:
    """Version number for a name; ``None`` for empty, which keeps the current value (as nsqd)."""
    lowered = text.lower()
    if lowered == "":
        return None
    try:
        return TLS_MIN_VERSIONS[lowered]
    except KeyError:
        raise _ValueError(
            f"unknown TLS version {_quote(text)} (ssl3.0, tls1.0, tls1.1, tls1.2 or tls1.3)"
        ) from None


def _floats(text: str) -> list[float]:
    return [parse_float(part) for part in text.split(",")]


_SCALAR_PARSERS: Mapping[str, Callable[[str], Any]] = {
    "bool": parse_bool,
    "int": _go_int,
    "float": parse_float,
    "string": str,
    "duration": _duration,
    "log-level": _log_level,
    "tls-required": _tls_required,
}


# --- command line -----------------------------------------------------------------


def _parse_command_line(argv: Sequence[str], by_name: Mapping[str, Flag],
                        program: str) -> dict[str, Any]:
    """Go ``flag`` package parsing: the flags given on the command line, by attribute.

    ``-flag value``, ``-flag=value``, ``--flag value`` and ``--flag=value`` all
    work; bool flags never take the next argument.  Unlike nsqd (which ignores
    them) positional arguments are an error, since they are always a mistake.
    """
    given: dict[str, Any] = {}
    args = list(argv)
    bare_bool = ""
    while args:
        arg = args.pop(0)
        if bare_bool and (len(arg) < 2 or arg[0] != "-"):
            raise OptionsError(
                f"unexpected argument {_quote(arg)}: a bool flag takes its value"
                f" with =, as in -{bare_bool}={arg}"
            )
        bare_bool = ""
        if len(arg) < 2 or arg[0] != "-":
            raise OptionsError(
                f"unexpected argument {_quote(arg)}: {program} takes only flags"
            )
        dashes = 2 if arg[1] == "-" else 1
        if dashes == 2 and len(arg) == 2:
            if args:
                raise OptionsError(
                    f"unexpected argument {_quote(args[0])}: {program} takes only flags"
                )
            break
        name = arg[dashes:]
        if not name or name[0] in "-=":
            raise OptionsError(f"bad flag syntax: {arg}")
        value: str | None = None
        if "=" in name:
            name, value = name.split("=", 1)
        flag = by_name.get(name)
        if flag is None:
            if name in ("h", "help"):
                raise HelpRequested()
            raise OptionsError(f"flag provided but not defined: -{name}")
        if flag.is_bool:
            text = "true" if value is None else value
            try:
                parsed = _SCALAR_PARSERS[flag.kind](text)
            except _ValueError as e:
                raise OptionsError(
                    f"invalid boolean value {_quote(text)} for -{name}: {e}"
                ) from None
            given[flag.attribute] = parsed
            if value is None:
                bare_bool = name
            continue
        if value is None:
            if not args:
                raise OptionsError(f"flag needs an argument: -{name}")
            value = args.pop(0)
        try:
            if flag.kind == "strings":
                given[flag.attribute] = given.get(flag.attribute, ()) + (value,)
            elif flag.kind == "floats":
                merged = list(given.get(flag.attribute, ())) + _floats(value)
                # nsqd keeps percentiles largest first
                given[flag.attribute] = tuple(sorted(merged, reverse=True))
            elif flag.kind == "tls-min-version":
                version = _tls_min_version(value)
                if version is not None:
                    given[flag.attribute] = version
            else:
                given[flag.attribute] = _SCALAR_PARSERS[flag.kind](value)
        except _ValueError as e:
            raise OptionsError(
                f"invalid value {_quote(value)} for flag -{name}: {e}"
            ) from None
    return given


# --- config file ------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _go_sprint(value: Any) -> str:
    """``fmt.Sprintf("%v", v)`` for the TOML scalars nsqd formats before re-parsing."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _coerce_config(flag: Flag, value: Any) -> Any:
    """Turn one TOML value into the attribute's type, as nsqd's option resolution does.

    Durations may be strings (``"60s"``) or integers, which nsqd reads as
    milliseconds; list flags take a TOML array or one comma-separated string.
    """
    kind = flag.kind
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            return parse_bool(value)
        raise _ValueError("want true or false")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT64_MIN <= value <= INT64_MAX:
                raise _ValueError(RANGE)
            return value
        if isinstance(value, str):
            return _decimal_int(value)
        raise _ValueError("want an integer")
    if kind == "string":
        if isinstance(value, str):
            return value
        raise _ValueError("want a string")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            return parse_float(value)
        raise _ValueError("want a number")
    if kind == "duration":
        if isinstance(value, str):
            return _duration(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value / 1000.0
        raise _ValueError('want a duration string like "60s" or integer milliseconds')
    if kind == "strings":
        if isinstance(value, str):
            return tuple(value.split(","))
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise _ValueError("want an array of strings")
    if kind == "floats":
        if isinstance(value, str):
            return tuple(parse_float(part.strip()) for part in value.split(","))
        if isinstance(value, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
        ):
            return tuple(float(v) for v in value)
        raise _ValueError("want an array of numbers")
    if kind == "log-level":
        return _log_level(_go_sprint(value))
    if kind == "tls-required":
        return _tls_required(_go_sprint(value))
    if kind == "tls-min-version":
        return _tls_min_version(_go_sprint(value))
    raise AssertionError(kind)  # pragma: no cover


def _load_config(path: str, by_toml_key: Mapping[str, Flag]) -> dict[str, Any]:
    """Read ``path`` as nsqd reads its ``--config``: known keys are used, others ignored."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        reason = e.strerror or str(e)
        raise OptionsError(f"failed to load config file {path} - {reason}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        reason = " ".join(str(e).split())
        raise OptionsError(f"failed to load config file {path} - {reason}") from None
    values: dict[str, Any] = {}
    for key, raw in data.items():
        flag = by_toml_key.get(key)
        if flag is None:
            continue
        try:
            value = _coerce_config(flag, raw)
        except _ValueError as e:
            raise OptionsError(
                f"config file {path}: invalid value {_describe(raw)} for {key}: {e}"
            ) from None
        if value is not None:
            values[flag.attribute] = value
    return values


_KIND_ARG = {
    "bool": "",
    "int": " int",
    "float": " float",
    "string": " string",
    "duration": " duration",
    "strings": " value",
    "floats": " value",
    "log-level": " level",
    "tls-required": "",
    "tls-min-version": " version",
}


#: how zero values read in ``--help``: Go prints no "(default ...)" for them
_ZERO_DEFAULTS = frozenset({"false", '""', "0", "0s", "(none)"})


class FlagSet:
    """One Go program's flags (nsqd's, nsqlookupd's, nsqadmin's) and how it resolves them.

    The Go flag syntax, the TOML ``--config`` merge and the ``--help`` listing
    are the same for every daemon nsqtw replaces; only the table, the
    defaults and the start-up checks differ.
    """

    def __init__(self, program: str, flags: tuple[Flag, ...],
                 defaults: Callable[[str | None], Any],
                 validate: Callable[[Any], None]) -> None:
        self.program = program
        self.flags = flags
        self.defaults = defaults
        self.validate = validate
        self.by_name: Mapping[str, Flag] = {f.name: f for f in flags}
        self.by_toml_key: Mapping[str, Flag] = {f.toml_key: f for f in flags if f.toml_key}

    def parse(self, argv: Sequence[str], hostname: str | None = None) -> Any:
        """Resolve options from ``argv``: command line, then ``--config`` file, then default.

        Raises :class:`OptionsError` (one line) for anything the Go program
        would refuse, and :class:`HelpRequested` for ``-h``/``--help``.
        """
        given = _parse_command_line(argv, self.by_name, self.program)
        base = self.defaults(hostname)
        from_file: dict[str, Any] = {}
        config_path = given.get("config", "")
        if config_path:
            from_file = _load_config(config_path, self.by_toml_key)
        opts = dataclasses.replace(base, **{**from_file, **given})
        self.validate(opts)
        return opts

    def usage(self, command: str) -> str:
        """The ``--help`` listing: every flag with its argument, meaning and default."""
        lines = [
            f"Usage: {command} [flags]",
            "",
            "Flags take Go syntax: -flag value, -flag=value, --flag value or --flag=value;",
            "a bool flag alone means true (--flag=false turns it off).",
            "Priority: command line, then the --config file, then the default.",
            "",
        ]
        for f in self.flags:
            lines.append(f"  --{f.name}{_KIND_ARG[f.kind]}")
            extra = " (repeatable)" if f.repeatable else ""
            # Go's flag package leaves out a default that is its type's zero value
            default = "" if f.default_text in _ZERO_DEFAULTS else f" (default {f.default_text})"
            lines.append(f"        {f.help}{extra}{default}")
        return "\n".join(lines) + "\n"


    def print_defaults(self, command: str) -> str:
        """Go's ``flag.PrintDefaults`` listing, for the command-line tools (``Usage of nsq_tail:``)."""
        lines = [f"Usage of {command}:"]
        for f in sorted(self.flags, key=lambda f: f.name):
            head = f"  -{f.name}{_GO_ARG.get(f.kind, _KIND_ARG[f.kind])}"
            head += "\t" if len(f.name) == 1 and f.is_bool else "\n    \t"
            default = "" if f.default_text in _ZERO_DEFAULTS else f" (default {f.default_text})"
            lines.append(head + f.help + default)
        return "\n".join(lines) + "\n"


#: how Go's flag package names a flag's argument when the kind differs from _KIND_ARG
_GO_ARG = {"strings": " value", "floats": " value", "log-level": " string"}


class GoFlagsTwistdOptions(usage.Options):
    """twistd's options for a plugin whose flags use Go syntax (see :class:`FlagSet`).

    twistd's getopt cannot read ``-mem-queue-size=5`` style flags, so
    :meth:`parseOptions` hands the arguments to :attr:`flagset` and keeps
    the result in :attr:`resolved`.
    """

    synopsis = "[flags]"
    #: the flag table; set by subclasses
    flagset: FlagSet
    #: the twistd plugin name, used in --help and error lines
    command = "nsqtw"

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.resolved: Any = self.flagset.defaults(None)

    def parseOptions(self, options: Sequence[str] | None = None) -> None:
        if options is None:
            options = sys.argv[1:]
        try:
            self.resolved = self.flagset.parse(list(options))
        except HelpRequested:
            sys.stdout.write(self.getUsage())
            raise SystemExit(0) from None
        except OptionsError as e:
            sys.stderr.write(f"{self.command}: {e}\n")
            raise SystemExit(1) from None
        for f in dataclasses.fields(self.resolved):
            self[f.name] = getattr(self.resolved, f.name)
        self.postOptions()  # type: ignore[no-untyped-call]

    def getUsage(self, width: int | None = None) -> str:
        return self.flagset.usage(f"twistd {self.command}")
