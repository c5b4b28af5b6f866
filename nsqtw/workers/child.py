"""A worker process (``python -m nsqtw.workers.child INDEX``), started by the core's
:class:`~nsqtw.workers.pool.WorkerPool`: it serves V2 clients from the node's TCP socket.

It finds the listening socket and its link to the core at fixed file
descriptors (:data:`~nsqtw.workers.pool.LISTEN_FD`, ``LINK_FD``) and the
core's options in its environment. It logs to stderr, as the core's
``twistd -n`` does, and dies with the core (``PR_SET_PDEATHSIG``): a worker
never outlives the process that owns its clients' topics.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
from typing import Any

#: prctl's option that has the kernel signal a process when its parent dies
_PR_SET_PDEATHSIG = 1
#: how long a stopping worker waits for its clients' connections to close
_CLOSE_WAIT = 5.0


def die_with_parent() -> None:
    """Be killed (SIGKILL) when the core dies, as its own threads would be (Linux; elsewhere
    the link's end stops the worker instead)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the core died before the request took hold
        os._exit(1)


def main(argv: list[str]) -> None:
    from nsqtw.workers.pool import LINK_FD, LISTEN_FD, OPTIONS_ENV, decode_options

    index = int(argv[1])
    die_with_parent()
    options = decode_options(os.environ.pop(OPTIONS_ENV))
    from nsqtw.net.reactor import install_for_daemon
    from nsqtw.net.tls import keep_openssl_out

    keep_openssl_out(options.needs_openssl)
    install_for_daemon()
    from twisted.logger import globalLogBeginner, textFileLogObserver

    from nsqtw.log import start_daemon

    start_daemon("nsqd", False, options.log_level, options.log_prefix, {"nodaemon": True})
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)

    from twisted.internet import reactor

    from nsqtw.heap import keep_long_lived_old, return_big_blocks
    from nsqtw.net.busypoll import busy_poll_of
    from nsqtw.net.eager import InheritedPort
    from nsqtw.net.tls import build_server_tls
    from nsqtw.protocol.auth import authorizer_for
    from nsqtw.protocol.v2 import V2Factory
    from nsqtw.workers.link import LinkFactory
    from nsqtw.workers.remote import RemoteNode

    r: Any = reactor
    node = RemoteNode(options, r, index)
    node.tls = build_server_tls(options)
    node.auth = authorizer_for(options, r)
    r.adoptStreamConnection(LINK_FD, socket.AF_UNIX, LinkFactory(node.link))
    os.close(LINK_FD)
    port = InheritedPort(LISTEN_FD, V2Factory(node, r), r)
    port.startListening()
    os.close(LISTEN_FD)
    poll = busy_poll_of(r)
    if poll is not None:
        poll.limit = options.busy_poll
    keep_long_lived_old()
    return_big_blocks()

    def stop() -> None:
        port.stopListening()  # type: ignore[no-untyped-call]
        waited = [0.0]

        def closed() -> None:
            if node.conns and waited[0] < _CLOSE_WAIT:
                waited[0] += 0.01
                r.callLater(0.01, closed)
                return
            node.link.flush()
            r.callLater(0, r.stop)

        closed()

    node.on_stop = stop
    # SIGTERM and SIGINT are the core's to act on: a terminal's ^C and a service manager's
    # SIGTERM reach the whole group, and the core stops its workers in order
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    r.run(installSignalHandlers=False)


if __name__ == "__main__":
    main(sys.argv)
