"""Drive pynsq (a real NSQ client from PyPI) against a daemon, synchronously.

pynsq runs on tornado's IOLoop; each helper here runs a fresh loop until the
expected traffic happened or a deadline passed, so tests stay bounded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import nsq
import tornado.ioloop

logging.getLogger("nsq").setLevel(logging.CRITICAL)


def run_until(loop: tornado.ioloop.IOLoop, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout

    def check() -> None:
        if done() or time.monotonic() > deadline:
            loop.stop()
        else:
            loop.call_later(0.01, check)

    loop.call_later(0.01, check)
    loop.start()


def fresh_loop() -> tornado.ioloop.IOLoop:
    loop = tornado.ioloop.IOLoop()
    loop.make_current()
    return loop


def publish(address: str, topic: str, bodies: list[bytes], mpub: bool = False,
            timeout: float = 10.0, **writer_kw: Any) -> list[Any]:
    """Publish with nsq.Writer; returns the responses (each b'OK' or an error).

    ``writer_kw`` go to pynsq's connections (tls_v1, snappy, deflate, auth_secret...).
    """
    loop = fresh_loop()
    results: list[Any] = []
    writer = nsq.Writer([address], **writer_kw)

    def cb(conn: Any, data: Any) -> None:
        results.append(data)

    def go() -> None:
        if not writer.conns:
            loop.call_later(0.02, go)
            return
        if mpub:
            writer.mpub(topic, list(bodies), callback=cb)
        else:
            for b in bodies:
                writer.pub(topic, b, callback=cb)

    loop.call_later(0.02, go)
    expected = 1 if mpub else len(bodies)
    run_until(loop, lambda: len(results) >= expected, timeout)
    for conn in list(writer.conns.values()):
        conn.close()
    loop.close(all_fds=True)
    return results


def consume(address: str | None, topic: str, channel: str, count: int,
            handler: Callable[[Any], bool | None] | None = None,
            timeout: float = 10.0, **reader_kw: Any) -> list[Any]:
    """Consume with nsq.Reader until ``count`` messages arrived (or timeout).

    ``address`` is one nsqd's TCP address; None to find nsqd nodes through
    ``lookupd_http_addresses=[...]`` in ``reader_kw`` instead.

    ``handler`` may return False to let pynsq REQ the message, None to leave
    it for the handler to finish (async), True (default) to FIN it.
    """
    loop = fresh_loop()
    got: list[Any] = []

    def on_message(msg: Any) -> Any:
        got.append(msg)
        if handler is None:
            return True
        return handler(msg)

    if address is not None:
        reader_kw["nsqd_tcp_addresses"] = [address]
    reader = nsq.Reader(topic=topic, channel=channel, message_handler=on_message, **reader_kw)
    run_until(loop, lambda: len(got) >= count, timeout)
    # let the last FIN/REQ leave before closing
    loop.call_later(0.1, loop.stop)
    loop.start()
    reader.close()
    loop.call_later(0.1, loop.stop)
    loop.start()
    loop.close(all_fds=True)
    return got
