"""nsqtw's NSQ client library for Twisted: a :class:`Producer` and a :class:`Consumer`.

Works with any nsqd (Go or nsqtw). See docs/client.md for the guide and a
complete example; the behaviour follows go-nsq's where go-nsq and pynsq agree.

    from nsqtw.client import Config, Consumer, Producer
"""

from nsqtw.client.config import Config, ConfigError
from nsqtw.client.consumer import Consumer, ConsumerStats, Handler
from nsqtw.client.errors import ConnectionClosed, NoConnection, NSQClientError, NSQErrorResponse
from nsqtw.client.lookup import get_json, lookup_producers
from nsqtw.client.message import Message
from nsqtw.client.producer import Producer

__all__ = [
    "Config",
    "ConfigError",
    "ConnectionClosed",
    "Consumer",
    "ConsumerStats",
    "Handler",
    "Message",
    "NSQClientError",
    "NSQErrorResponse",
    "NoConnection",
    "Producer",
    "get_json",
    "lookup_producers",
]
