"""A probe of the ``--workers`` design's riskiest path, before it is built (docs/architecture.md).

One hot topic under topic ownership: worker processes take the clients'
connections and their one-message publishes, and each forwards what it took in
a reactor turn to the topic's owner process as one frame; the owner
acknowledges each frame and the worker answers every publish in it with OK.
This measures how many one-message round trips a second that path carries and
what CPU each side spends per message, with Go's ``bench_writer`` as the
client, so the design can be weighed on a many-core machine:

    python benchmarks/forward_probe.py --workers=8 --seconds=20 [--busy-poll=0.0002] &
    GO/bench_writer -nsqd-tcp-address=127.0.0.1:4150 -batch-size=1 -runfor=6s -topic=t

``--busy-poll`` runs every process on nsqtw's reactor, spinning that many
seconds before it sleeps. Only what ``bench_writer`` sends is understood:
IDENTIFY (answered OK, as by an nsqd without feature negotiation), PUB and
MPUB. The
owner does no topic work, so its CPU per message is the forwarding's alone: a
topic's own per-message cost (``benchmarks/pub_cpu.py``) comes on top. At the
end every process prints its messages and CPU, and the owner the totals.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
from collections import deque
from typing import Any, cast

_U32 = struct.Struct(">I")
_OK = struct.pack(">ii", 6, 0) + b"OK"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _install_reactor(busy_poll: float) -> None:
    """Twisted's epoll reactor, or with ``busy_poll`` (seconds) nsqtw's, spinning that long before it sleeps."""
    if busy_poll <= 0:
        from twisted.internet import epollreactor

        epollreactor.install()
        return
    from nsqtw.net.busypoll import busy_poll_of
    from nsqtw.net.epollreactor import install

    install()
    from twisted.internet import reactor

    poll = busy_poll_of(reactor)
    assert poll is not None
    poll.limit = busy_poll


def _server(make: Any) -> Any:
    from twisted.internet.protocol import ServerFactory

    return cast(Any, ServerFactory.forProtocol(make))


def worker(listener: socket.socket, link: socket.socket, seconds: float, index: int, busy_poll: float) -> None:
    _install_reactor(busy_poll)
    from twisted.internet import reactor
    from twisted.internet.interfaces import IReactorSocket
    from twisted.internet.protocol import Protocol

    from nsqtw.protocol.wire import V2Parser

    taken: list[bytes] = []
    waiting: list[tuple[Any, int]] = []
    sent: deque[list[tuple[Any, int]]] = deque()
    counts = {"messages": 0}

    class Link(Protocol):
        buf = b""

        def dataReceived(self, data: bytes) -> None:
            buf = self.buf + data
            done = len(buf) // 4
            self.buf = buf[done * 4:]
            for _ in range(done):
                for client, n in sent.popleft():
                    client.transport.write(_OK * n)

    link_proto = Link()
    flush_due = [False]

    def flush() -> None:
        flush_due[0] = False
        if not taken:
            return
        body = b"".join([_U32.pack(len(taken))] + [_U32.pack(len(b)) + b for b in taken])
        assert link_proto.transport is not None
        link_proto.transport.write(_U32.pack(len(body)) + body)
        counts["messages"] += len(taken)
        sent.append(list(waiting))
        taken.clear()
        waiting.clear()

    class Client(Protocol):
        def connectionMade(self) -> None:
            self.parser = V2Parser(1 << 20, 5 << 20)

        def dataReceived(self, data: bytes) -> None:
            self.parser.feed(data)
            while True:
                cmd = self.parser.next_command()
                if cmd is None:
                    break
                bodies = cmd.messages if cmd.name == b"MPUB" else [cmd.body] if cmd.name == b"PUB" else None
                if bodies is None:
                    # IDENTIFY gets nsqd's answer to a client without feature negotiation
                    error = b"E_INVALID the probe takes only PUB and MPUB"
                    assert self.transport is not None
                    self.transport.write(_OK if cmd.name == b"IDENTIFY" else
                                         struct.pack(">ii", 4 + len(error), 1) + error)
                    continue
                taken.extend(b for b in bodies if b is not None)
                waiting.append((self, 1))
            if taken and not flush_due[0]:
                flush_due[0] = True
                reactor.callLater(0, flush)

    sockets = IReactorSocket(reactor)
    sockets.adoptStreamConnection(link.fileno(), socket.AF_UNIX, _server(lambda: link_proto))
    sockets.adoptStreamPort(listener.fileno(), socket.AF_INET, _server(Client))
    link.close()
    listener.close()
    reactor.callLater(seconds, reactor.stop)
    reactor.run()
    print(f"worker {index}: {counts['messages']:,} messages, {_cpu():.2f}s CPU", flush=True)


def owner(links: list[socket.socket], seconds: float, busy_poll: float) -> tuple[int, float]:
    _install_reactor(busy_poll)
    from twisted.internet import reactor
    from twisted.internet.interfaces import IReactorSocket
    from twisted.internet.protocol import Protocol

    total = {"messages": 0, "frames": 0}

    class Peer(Protocol):
        buf = b""

        def dataReceived(self, data: bytes) -> None:
            buf = self.buf + data
            pos = 0
            acks = []
            while len(buf) - pos >= 4:
                size = _U32.unpack_from(buf, pos)[0]
                if len(buf) - pos - 4 < size:
                    break
                n = _U32.unpack_from(buf, pos + 4)[0]
                total["messages"] += n
                total["frames"] += 1
                acks.append(_U32.pack(n))
                pos += 4 + size
            self.buf = buf[pos:]
            if acks and self.transport is not None:
                self.transport.write(b"".join(acks))

    for link in links:
        IReactorSocket(reactor).adoptStreamConnection(link.fileno(), socket.AF_UNIX, _server(Peer))
        link.close()
    start = _cpu()
    reactor.callLater(seconds, reactor.stop)
    reactor.run()
    used = _cpu() - start
    print(f"owner: {total['messages']:,} messages in {total['frames']:,} frames, {used:.2f}s CPU", flush=True)
    return total["messages"], used


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--tcp-address", default="127.0.0.1:4150")
    p.add_argument("--seconds", type=float, default=20.0, help="how long the processes run")
    p.add_argument("--busy-poll", type=float, default=0.0,
                   help="seconds each process's reactor spins before it sleeps (nsqtw's reactor; 0: Twisted's epoll)")
    a = p.parse_args(argv)
    host, _, port = a.tcp_address.rpartition(":")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, int(port)))
    listener.listen(1024)
    listener.setblocking(False)
    print(f"forward_probe: {a.workers} workers on {a.tcp_address}, one owner, {a.seconds:.0f}s, "
          f"busy poll {a.busy_poll * 1e6:.0f} µs", flush=True)
    links: list[socket.socket] = []
    pids: list[int] = []
    for i in range(a.workers):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pid = os.fork()
        if pid == 0:
            mine.close()
            for other in links:
                other.close()
            worker(listener, theirs, a.seconds, i, a.busy_poll)
            os._exit(0)
        theirs.close()
        links.append(mine)
        pids.append(pid)
    listener.close()
    for link in links:
        link.setblocking(False)
    messages, used = owner(links, a.seconds, a.busy_poll)
    for pid in pids:
        os.waitpid(pid, 0)
    t = os.times()
    children = t.children_user + t.children_system
    if messages:
        print(f"per message: owner {used / messages * 1e6:.2f} µs, workers {children / messages * 1e6:.2f} µs",
              flush=True)


if __name__ == "__main__":
    main()
