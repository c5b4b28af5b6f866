"""``nsqtw``: NSQ's command-line tools as subcommands, with the Go tools' flags.

    nsqtw tail     (nsq_tail)      print a topic's messages
    nsqtw pub      (to_nsq)        publish stdin, one message per line
    nsqtw stat     (nsq_stat)      a channel's stats, polled
    nsqtw to-file  (nsq_to_file)   archive topics to (rotated, gzipped) files
    nsqtw to-http  (nsq_to_http)   GET or POST each message to HTTP endpoints
    nsqtw to-nsq   (nsq_to_nsq)    copy messages to other nsqd nodes

``nsqtw <subcommand> --help`` lists a subcommand's flags. See docs/tools.md.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from nsqtw import __version__

#: subcommand -> (module under nsqtw.tools, the Go tool it mirrors)
SUBCOMMANDS = {
    "tail": ("tail", "nsq_tail"),
    "pub": ("pub", "to_nsq"),
    "stat": ("stat", "nsq_stat"),
    "to-file": ("to_file", "nsq_to_file"),
    "to-http": ("to_http", "nsq_to_http"),
    "to-nsq": ("to_nsq", "nsq_to_nsq"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "-help", "help"):
        sys.stdout.write(__doc__.split("\n\n", 1)[1] if __doc__ else "")
        return 0 if args else 2
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
