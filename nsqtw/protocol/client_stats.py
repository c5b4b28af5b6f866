"""A V2 client's entry in ``/stats``: nsqd's fields in nsqd's order, its JSON text cached."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

from nsqtw._go.json import go_dumps
from nsqtw.core.commands import ClientState
from nsqtw.protocol.authz import ClientAuth

#: the go_stats fields :meth:`V2Protocol.stats_json` fills in each time, in its format's order
_STATS_COUNTERS = ("state", "ready_count", "in_flight_count", "message_count", "finish_count", "requeue_count")
#: stand-ins for them while the template is made
_STATS_MARK = 8_000_000_000_000_000_000


_V = TypeVar("_V")


class Shown(Generic[_V]):
    """A client field ``/stats`` shows, other than its counters: setting it remakes the connection's
    cached text when there is one (see :meth:`ClientStats.make_stats_text`), so
    :meth:`ClientStats.stats_json` need not compare them on every call (at 19,000 clients that
    check was a sixth of ``/stats``). The value is kept under ``_shown_<name>``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_shown_" + name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Shown[_V]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _V: ...

    def __get__(self, obj: object, owner: type | None = None) -> Shown[_V] | _V:
        if obj is None:
            return self
        value: _V = getattr(obj, self.slot)
        return value

    def __set__(self, obj: object, value: _V) -> None:
        setattr(obj, self.slot, value)
        obj.identity_version += 1  # type: ignore[attr-defined]
        if obj._stats_pieces is not None:  # type: ignore[attr-defined]
            # shown in /stats already (subscribed): its text is made again now, not by the next /stats
            obj._stats_pieces = obj._stats_made = None  # type: ignore[attr-defined]
            obj.make_stats_text()  # type: ignore[attr-defined]


class AuthView:
    """A client's AUTH fields as another process reported them (see :meth:`ClientStats.adopt`)."""

    def __init__(self, fields: dict[str, Any] | None) -> None:
        self.state = fields
        self._fields = fields or {}

    def stats(self) -> dict[str, Any]:
        return self._fields


class ClientStats:
    """The ``/stats`` side of :class:`~nsqtw.protocol.v2.V2Protocol` (a mixin: it reads the
    connection's fields)."""

    identifier = Shown[str]()
    hostname = Shown[str]()
    remote_address = Shown[str]()
    user_agent = Shown[str]()
    state: ClientState
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts = Shown[int]()
    msg_timeout: float
    #: read per delivery (``core/flight.py``): a plain attribute, compared by :meth:`stats_json`
    sample_rate: int
    tls = Shown[bool]()
    snappy = Shown[bool]()
    deflate = Shown[bool]()
    pub_counts: dict[str, int]
    auth: ClientAuth
    #: replaced, not changed in place, when TLS is agreed
    _tls_info = Shown[dict[str, Any]]()
    #: :meth:`stats_json`'s cache: the text around the counters (before the first, between each
    #: two, after the last), None when a :class:`Shown` field changed; and the other fields it
    #: shows, compared on each call (``sample_rate``, or it and the AUTH fields)
    _stats_pieces: tuple[str, str, str, str, str, str, str] | None = None
    _stats_key: object = None
    #: :meth:`stats_json`'s last text, and what it was made from: the counters, ``sample_rate`` and
    #: the AUTH answer (None once a :class:`Shown` field changed)
    _stats_text = ""
    _stats_made: tuple[Any, ...] | None = None
    #: how many times a :class:`Shown` field was set (:meth:`identity_key`)
    identity_version = 0

    def stats(self) -> dict[str, Any]:
        """This client's fields, every one present (the AUTH ones last), without ``pub_counts``."""
        out = self.go_stats()
        out.pop("pub_counts", None)
        auth = self.auth.stats()
        for key in auth:
            out.pop(key, None)
        out.update(auth)
        return out

    def go_stats(self, topic_filter: str = "") -> dict[str, Any]:
        """This client exactly as nsqd's ``/stats`` JSON has it, built in one go.

        Go's ``omitempty`` fields (AUTH's, and ``pub_counts`` narrowed to
        ``topic_filter``) sit after ``user_agent``. At 20,000 clients a
        ``/stats`` builds 20,000 of these, so it is one dict, not a copy of
        :meth:`stats` reordered.
        """
        tls = self._tls_info
        out: dict[str, Any] = {
            "client_id": self.identifier,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": int(self.state),
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        if self.auth.state is not None:
            for key, value in self.auth.stats().items():
                if value:
                    out[key] = value
        if self.pub_counts:
            counts = [{"topic": t, "count": n} for t, n in self.pub_counts.items()
                      if not topic_filter or t == topic_filter]
            if counts:
                out["pub_counts"] = counts
        out["tls"] = self.tls
        out["tls_cipher_suite"] = tls.get("tls_cipher_suite", "")
        out["tls_version"] = tls.get("tls_version", "")
        out["tls_negotiated_protocol"] = tls.get("tls_negotiated_protocol", "")
        out["tls_negotiated_protocol_is_mutual"] = tls.get("tls_negotiated_protocol_is_mutual", False)
        return out


    def stats_json(self, topic_filter: str = "") -> str:
        """``go_dumps(self.go_stats(topic_filter))``, byte for byte, at a fraction of its cost.

        A ``/stats`` at 20,000 clients spent about 40% of its time building and
        encoding client dicts whose text barely changes. The text is cached
        in pieces around the six counters (one f-string joins them: no
        template to parse per call), remade when any other field it shows has
        changed (setting a :class:`Shown` field drops it; ``sample_rate`` and
        the AUTH fields are compared); a client with ``pub_counts`` (a producer) is encoded in full.
        The last text is kept too: while the counters, ``sample_rate`` and the AUTH answer are
        the same objects as when it was made (an idle consumer between two polls) it is the
        answer, with no text made at all.
        """
        if self.pub_counts:
            return go_dumps(self.go_stats(topic_filter))
        made = self._text_inputs()
        if made == self._stats_made:
            return self._stats_text
        return self._make_text(made)

    def _text_inputs(self) -> tuple[Any, ...]:
        """What a consumer's text is made from, beyond its :class:`Shown` fields: compared with
        what the kept text was made from."""
        return (self.state, self.ready_count, self.in_flight_count, self.message_count, self.finish_count,
                self.requeue_count, self.sample_rate, self.auth.state)

    def _make_text(self, made: tuple[Any, ...]) -> str:
        """The text of the fields in ``made`` (as :meth:`stats_json` takes them), kept."""
        state, ready, in_flight, messages, finished, requeued, sample_rate, auth_state = made
        key = sample_rate if auth_state is None else (sample_rate, tuple(self.auth.stats().values()))
        pieces = self._stats_pieces
        if pieces is None or key != self._stats_key:
            pieces = self._stats_pieces = self._make_stats_pieces()
            self._stats_key = key
        head, p1, p2, p3, p4, p5, tail = pieces
        text = self._stats_text = (f"{head}{int(state)}{p1}{ready}{p2}{in_flight}{p3}{messages}{p4}{finished}"
                                   f"{p5}{requeued}{tail}")
        self._stats_made = made
        return text

    def make_stats_text(self) -> None:
        """Make :meth:`stats_json`'s cached text now.

        Made by the first ``/stats`` instead, 15,000 consumers' texts took
        that ``/stats`` from about 70 ms to 300-400 ms, the 19,000 of 1,900
        topics' channels to over a second. :meth:`subscribed` makes it as
        a client joins a channel; a :class:`Shown` field set after that (or
        :meth:`adopt`) makes it again.
        """
        if not self.pub_counts:
            self._make_text(self._text_inputs())

    def subscribed(self) -> None:
        """The client joined a channel (its state is ``SUBSCRIBED`` now): from now on ``/stats``
        shows it, so its text is made here, once, and an idle consumer's first ``/stats`` makes
        nothing; had a counter moved since, :meth:`stats_json` sees it and makes the text again.
        Called where SUB succeeds: ``V2Protocol`` and a worker's ``RemoteClient`` in the core."""
        self.make_stats_text()

    def identity_key(self) -> tuple[Any, ...]:
        """Equal while no field ``/stats`` shows but the counters changed (a worker sends
        :meth:`identity` to its core again when it moved)."""
        return (self.identity_version, self.sample_rate, self.auth.state)

    def identity(self) -> dict[str, Any]:
        """Those fields and ``msg_timeout``, for a worker's core to show and serve this client
        (:meth:`adopt` there)."""
        auth = self.auth
        return {"identifier": self.identifier, "hostname": self.hostname,
                "remote_address": self.remote_address, "connect_ts": self.connect_ts,
                "sample_rate": self.sample_rate, "deflate": self.deflate, "snappy": self.snappy,
                "user_agent": self.user_agent, "tls": self.tls, "tls_info": self._tls_info,
                "msg_timeout": self.msg_timeout,
                "auth": auth.stats() if auth.state is not None else None}

    def adopt(self, identity: dict[str, Any]) -> None:
        """Show the client another process serves: its :meth:`identity` (its text, if it was made,
        made again once, not at each field)."""
        shown = self._stats_pieces is not None
        self._stats_pieces = self._stats_made = None
        for name in ("identifier", "hostname", "remote_address", "connect_ts", "sample_rate", "deflate",
                     "snappy", "user_agent", "tls", "msg_timeout"):
            setattr(self, name, identity[name])
        self._tls_info = identity["tls_info"]
        self.auth = AuthView(identity["auth"])  # type: ignore[assignment]
        if shown:
            self.make_stats_text()

    def _make_stats_pieces(self) -> tuple[str, str, str, str, str, str, str]:
        fields = self.go_stats()
        for i, name in enumerate(_STATS_COUNTERS):
            fields[name] = _STATS_MARK + i
        text = go_dumps(fields)
        pieces = []
        for i, name in enumerate(_STATS_COUNTERS):
            # '"name":' cannot occur inside a JSON string (its quotes would be escaped there)
            before, _, text = text.partition(f'"{name}":{_STATS_MARK + i}')
            pieces.append(before + f'"{name}":')
        head, p1, p2, p3, p4, p5 = pieces
        return head, p1, p2, p3, p4, p5, text
