"""``nsqtw``: NSQ's command-line tools as subcommands, with the Go tools' flags (docs/tools.md)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from nsqtw import __version__

#: subcommand -> (module under nsqtw.tools, the Go tool it mirrors, what it does)
SUBCOMMANDS = {
    "tail": ("tail", "nsq_tail", "print a topic's messages"),
    "pub": ("pub", "to_nsq", "publish stdin, one message per line"),
    "stat": ("stat", "nsq_stat", "a channel's stats, polled"),
    "to-file": ("to_file", "nsq_to_file", "archive topics to (rotated, gzipped) files"),
    "to-http": ("to_http", "nsq_to_http", "GET or POST each message to HTTP endpoints"),
    "to-nsq": ("to_nsq", "nsq_to_nsq", "copy messages to other nsqd nodes"),
}


def usage() -> str:
    """What ``nsqtw`` alone and ``nsqtw --help`` print: a usage line, then the subcommands."""
    lines = ["usage: nsqtw <command> [flags]", "", "commands:"]
    for name, (_, go_tool, what) in SUBCOMMANDS.items():
        lines.append(f"  {name:<8} {'(' + go_tool + ')':<14} {what}")
    lines += ["", "'nsqtw <command> --help' lists a command's flags; 'nsqtw --version' the version.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        # as go, git and Go's flag package: a missing command is a usage error
        sys.stderr.write(usage())
        return 2
    if args[0] in ("-h", "--help", "-help", "help"):
        sys.stdout.write(usage())
        return 0
    if args[0] in ("-version", "--version", "version"):
        print(f"nsqtw v{__version__}")
        return 0
    name = args[0]
    if name not in SUBCOMMANDS:
        sys.stderr.write(f"nsqtw: unknown subcommand {name!r}; one of {', '.join(SUBCOMMANDS)}\n")
        return 2
    module = importlib.import_module(f"nsqtw.tools.{SUBCOMMANDS[name][0]}")
    code: int = module.main(args[1:])
    return code


if __name__ == "__main__":
    raise SystemExit(main())
