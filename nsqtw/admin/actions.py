"""What changes the cluster or the admin: create, pause, empty, delete and tombstone through the JSON
API (each reported per request made, and notified to ``--notification-http-endpoint``), and
``/config/:opt``. Every action requires an admin user where ``--admin-user`` names some."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Any

from twisted.internet.defer import ensureDeferred

from nsqtw._go.json import go_json
from nsqtw.admin.cluster import ActionReport, QueryFailed
from nsqtw.admin.options import FLAGS
from nsqtw.admin.routes import ADMIN_APP, AdminBase, admin_route, basic_auth_user, decode_struct, warn_message
from nsqtw.http.base import APIError, Marshal
from nsqtw.log import LEVELS, level_number, set_level
from nsqtw.names import is_valid_channel_name, is_valid_topic_name


class AdminActions(AdminBase):
    """The JSON API's POST and DELETE routes, and ``/config``."""

    def _notify(self, request: Any, action: str, topic: str, channel: str = "",
                node: str = "") -> None:
        """POST nsqadmin's AdminAction JSON to --notification-http-endpoint, never waiting for it."""
        endpoint = self.options.notification_http_endpoint
        if not endpoint:
            return
        host = request.getHeader(b"host")
        scheme = "https" if request.isSecure() or request.getHeader(b"x-scheme") == b"https" \
            else "http"
        peer = request.getClientAddress()
        user = basic_auth_user(request) or self._user(request)
        event: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            event["channel"] = channel
        if node:
            event["node"] = node
        event["timestamp"] = int(time.time())
        if user:
            event["user"] = user
        event.update(
            remote_ip=f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}",
            user_agent=(request.getHeader(b"user-agent") or b"").decode("latin-1"),
            url=f"{scheme}://{(host or b'').decode('latin-1')}{request.uri.decode('latin-1')}",
            via=self.hostname,
        )
        d = self.client.post(endpoint, go_json(event), {"Content-Type": "application/json"})
        ensureDeferred(d).addErrback(
            lambda f: self.log.error("failed to POST notification - {error}",
                                     error=f.getErrorMessage()))

    @admin_route(ADMIN_APP, "/api/topics", ("POST",))
    def create(self, request: Any) -> Any:
        return self._run(request, self._create)

    async def _create(self, request: Any) -> Any:
        self._require_admin(request)
        body = self._json_body(request, ("topic", "channel"))
        topic, channel = body["topic"], body["channel"]
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise APIError(400, "INVALID_CHANNEL")
        report = await self.cluster.create_topic_channel(topic, channel, self.lookupds)
        self._notify(request, "create_topic", topic)
        if channel:
            self._notify(request, "create_channel", topic, channel)
        return self._reported(report)

    def _reported(self, report: ActionReport) -> Marshal:
        """An action's answer: nsqadmin's ``message``, and nsqtw's ``results``, one per request made."""
        for m in report.errors:
            self.log.warn("{message}", message=m)
        return Marshal({"message": warn_message(report.errors), "results": report.results})

    @admin_route(ADMIN_APP, "/api/topics/<topic>", ("POST",))
    def topic_action(self, request: Any, topic: str) -> Any:
        return self._run(request, self._action, topic, "")

    @admin_route(ADMIN_APP, "/api/topics/<topic>/<channel>", ("POST",))
    def channel_action(self, request: Any, topic: str, channel: str) -> Any:
        return self._run(request, self._action, topic, channel)

    async def _action(self, request: Any, topic: str, channel: str) -> Any:
        self._require_admin(request)
        action = self._json_body(request, ("action",))["action"]
        if action not in ("pause", "unpause", "empty"):
            raise APIError(400, "INVALID_ACTION")
        try:
            report = await self.cluster.topic_channel_action(
                action, topic, channel, self.lookupds, self.nsqds)
        except QueryFailed as e:
            self.log.error("failed to {action} topic/channel - {error}", action=action, error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        self._notify(request, f"{action}_{'channel' if channel else 'topic'}", topic, channel)
        return self._reported(report)

    @admin_route(ADMIN_APP, "/api/topics/<topic>", ("DELETE",))
    def delete_topic(self, request: Any, topic: str) -> Any:
        return self._run(request, self._delete, topic, "")

    @admin_route(ADMIN_APP, "/api/topics/<topic>/<channel>", ("DELETE",))
    def delete_channel(self, request: Any, topic: str, channel: str) -> Any:
        return self._run(request, self._delete, topic, channel)

    async def _delete(self, request: Any, topic: str, channel: str) -> Any:
        self._require_admin(request)
        try:
            if channel:
                report = await self.cluster.delete_channel(topic, channel, self.lookupds, self.nsqds)
            else:
                report = await self.cluster.delete_topic(topic, self.lookupds, self.nsqds)
        except QueryFailed as e:
            what = "channel" if channel else "topic"
            self.log.error("failed to delete {what} - {error}", what=what, error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        self._notify(request, "delete_channel" if channel else "delete_topic", topic, channel)
        return self._reported(report)

    @admin_route(ADMIN_APP, "/api/nodes/<node>", ("DELETE",))
    def tombstone(self, request: Any, node: str) -> Any:
        return self._run(request, self._tombstone, node)

    async def _tombstone(self, request: Any, node: str) -> Any:
        self._require_admin(request)
        try:
            topic = decode_struct(self._body(request, 1024 * 1024), ("topic",))["topic"]
        except ValueError:
            raise APIError(400, "INVALID_BODY") from None
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        report = await self.cluster.tombstone_node_for_topic(topic, node, self.lookupds)
        self._notify(request, "tombstone_topic_producer", topic, node=node)
        return self._reported(report)

    # -- /config ---------------------------------------------------------------------

    @admin_route(ADMIN_APP, "/config/<opt>", ("GET", "PUT"))
    def config(self, request: Any, opt: str) -> Any:
        return self._run(request, self._config, opt)

    def _config(self, request: Any, opt: str) -> Any:
        if self._cidr is not None:
            peer = request.getClientAddress()
            try:
                ip = ipaddress.ip_address(getattr(peer, "host", ""))
            except ValueError:
                self.log.error("failed to parse RemoteAddr {peer}", peer=str(peer))
                raise APIError(400, "INVALID_REMOTE_ADDR") from None
            if ip not in self._cidr:
                raise APIError(403, "FORBIDDEN")
        if request.method == b"PUT":
            read_max = 1024 * 1024 + 1
            body = self._body(request, read_max)
            if len(body) == read_max or not body:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is None:
                    addresses = []
                if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                    raise APIError(400, "INVALID_VALUE")
                self.lookupds = addresses
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").lower()
                if level not in LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                set_level(level)
            else:
                raise APIError(400, "INVALID_OPTION")
        return self._config_value(opt)

    def _config_value(self, opt: str) -> Any:
        if opt == "nsqlookupd_http_addresses":
            return Marshal(list(self.lookupds))
        if opt == "log_level":
            return Marshal(level_number())
        for flag in FLAGS:
            if flag.toml_key != opt:
                continue
            value = getattr(self.options, flag.attribute)
            if flag.kind == "string":
                return str(value)  # RespondV1 writes Go strings as they are
            if flag.kind == "duration":
                return Marshal(round(value * 1_000_000_000))
            if flag.kind == "strings":
                return Marshal(list(value))
            return Marshal(value)
        raise APIError(400, "INVALID_OPTION")
