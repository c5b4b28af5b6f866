"""Publish a few orders, consume them with a handler that sometimes fails, stop cleanly.

    python docs/examples/client_example.py --nsqd-tcp-address=127.0.0.1:4150

Run from a checkout (or with nsqtw installed) against any nsqd.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from twisted.internet import defer, task

from nsqtw.client import Config, Consumer, Message, Producer


async def main(reactor: Any, nsqd: str, count: int) -> None:
    # A producer: one connection per address, a Deferred per publish that fires on nsqd's OK.
    producer = Producer([nsqd], reactor=reactor)
    await producer.publish("orders", json.dumps({"id": 0}).encode())
    await producer.multi_publish("orders", [json.dumps({"id": i}).encode() for i in range(1, count)])
    await producer.deferred_publish("orders", 0.5, json.dumps({"id": "late"}).encode())

    done: defer.Deferred[None] = defer.Deferred()
    seen: set[Any] = set()

    async def handle(message: Message) -> None:
        """Returning FINs the message; raising REQueues it (with backoff)."""
        order = json.loads(message.body)
        if order["id"] == 3 and message.attempts == 1:
            raise RuntimeError("order 3 fails once: it comes back with attempts=2")
        await task.deferLater(reactor, 0.01)  # some asynchronous work
        seen.add(order["id"])
        print(f"order {order['id']} (attempt {message.attempts})", flush=True)
        if len(seen) == count + 1 and not done.called:
            done.callback(None)

    config = Config(max_in_flight=10, default_requeue_delay=0.1, backoff_multiplier=0.1)
    consumer = Consumer("orders", "billing", handle, config, nsqd_tcp_addresses=[nsqd], reactor=reactor)
    consumer.start()
    await done
    await consumer.stop()  # CLS, wait for what the handler holds, close
    await producer.stop()
    print(f"received {consumer.stats.messages_received}, finished {consumer.stats.messages_finished},"
          f" requeued {consumer.stats.messages_requeued}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, args.nsqd_tcp_address, args.count)))
