// nsqtw-admin's pages: one script, no build step, no library. Every view is drawn from the JSON
// API (/api/...) and redrawn every few seconds without reloading the page.
"use strict";

(function () {
  const S = window.NSQTW || {};
  const BASE = S.base_path && S.base_path !== "/" ? S.base_path : "";
  const REFRESH_MS = 3000;
  let timer = null;
  let generation = 0;

  // --- small helpers -------------------------------------------------------------------

  function esc(v) {
    return String(v == null ? "" : v).replace(/[&<>"']/g, (c) => ({
      "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  }
  function num(n) { return (n || 0).toLocaleString("en-US"); }
  // a path under --base-path; the front page is the base path itself, as nsqadmin routes it (no "/" after)
  function url(path) { return BASE && path === "/" ? BASE : BASE + path; }
  // one path segment (a topic, channel or node name): "#" in "tmp#ephemeral", ":" and "[" in "[::1]:4151"
  // are encoded here and decoded by route(), so every link opens the page of the name it shows
  function enc(s) { return encodeURIComponent(s); }
  // a node's HTTP address as the API names it: "host:port", an IPv6 address bracketed ("[::1]:4151")
  function hostPort(address, port) {
    const host = String(address || "");
    return `${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${port}`;
  }
  function nodeAddress(n) { return hostPort(n.broadcast_address, n.http_port); }
  function duration(ns) {
    // as Go prints a duration cut to whole seconds: 41s, 2m41s, 26h3m4s
    let s = Math.max(0, Math.floor((ns || 0) / 1e9));
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return (h ? h + "h" : "") + (h || m ? m + "m" : "") + s + "s";
  }

  class HTTPError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, options) {
    const resp = await fetch(url(path), Object.assign({headers: {"Accept": "application/json"}}, options || {}));
    const text = await resp.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = {message: text}; }
    if (!resp.ok) {
      throw new HTTPError(resp.status, (data && data.message) || resp.statusText);
    }
    return data;
  }

  function link(path, text, attrs) {
    return `<a href="${esc(url(path))}" data-nav ${attrs || ""}>${esc(text)}</a>`;
  }

  function warning(message) {
    return message ? `<div class="alert warning" id="warning">${esc(message)}</div>` : "";
  }

  function badge(on, text) { return on ? `<span class="badge">${esc(text)}</span>` : ""; }

  // --- charts (SVG, from /api/history) ------------------------------------------------------

  // Each chart is named by what it measures: "topic depth" is what waits in the topics' own
  // queues (not yet copied to channels), "channel backlog" what waits in their channels.
  function chart(title, points, field, unit, about) {
    const values = points.map((p) => p[field]).filter((v) => v != null);
    const w = 320, h = 80, pad = 4;
    const head = `<figure class="chart" data-chart="${esc(field)}"><figcaption>` +
      `<span class="chart-title">${esc(title)}</span>`;
    const foot = (about ? `<p class="about">${esc(about)}</p>` : "") + `</figure>`;
    if (values.length < 2) {
      return head + `</figcaption><div class="nodata">collecting… (a point every ${esc(S.history_interval)}s)</div>` +
        foot;
    }
    const max = Math.max(...values, 1);
    const pts = [];
    const usable = points.filter((p) => p[field] != null);
    const t0 = usable[0].ts, t1 = usable[usable.length - 1].ts || t0 + 1;
    usable.forEach((p) => {
      const x = pad + (w - 2 * pad) * ((p.ts - t0) / Math.max(t1 - t0, 1));
      const y = h - pad - (h - 2 * pad) * (p[field] / max);
      pts.push(`${x.toFixed(1)},${y.toFixed(1)}`);
    });
    const last = values[values.length - 1];
    return head + `: <b data-field="${esc(field)}-last">${num(Math.round(last * 100) / 100)}</b> ${esc(unit)} ` +
      `<small>(max ${num(Math.round(max * 100) / 100)})</small></figcaption>` +
      `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(title)}">` +
      `<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="${pts.join(" ")}"/></svg>` + foot;
  }

  async function charts(topic, channel) {
    if (!S.history_interval) { return ""; }
    let q = "";
    if (topic) { q = `?topic=${enc(topic)}` + (channel ? `&channel=${enc(channel)}` : ""); }
    let h;
    try {
      h = await api(`/api/history${q}`);
    } catch (e) {
      return "";
    }
    const p = h.points;
    let figures;
    if (channel) {
      figures = chart("channel message rate", p, "rate", "msg/s", `messages into channel ${channel} per second`) +
        chart("channel depth", p, "depth", "messages", `messages waiting in channel ${channel} (memory + disk)`) +
        chart("in flight", p, "in_flight", "messages", "messages sent to clients, not yet finished");
    } else {
      const where = topic ? `topic ${topic}` : "every topic";
      figures = chart("topic message rate", p, "rate", "msg/s", `messages published to ${where} per second`) +
        chart("topic depth", p, "depth", "messages", `messages in the queue of ${where}, not yet copied to channels`) +
        chart("channel backlog", p, "backlog", "messages",
              `messages waiting in the channels of ${where} (the sum of their depths)`);
    }
    return `<section class="charts" id="charts">${figures}</section>`;
  }

  function graphite(target) {
    if (!S.graph_enabled) { return ""; }
    const base = S.proxy_graphite ? url("/render") : S.graphite_url + "/render";
    const src = `${base}?colorList=blue&height=120&width=360&hideLegend=true&from=-2h` +
      `&target=${enc(target)}`;
    return `<img class="graphite" alt="graphite: ${esc(target)}" src="${esc(src)}">`;
  }

  function statsdKey(kind, key) {
    const prefix = (S.statsd_prefix || "").replace("%s", "*");
    const full = (prefix ? prefix + "." : "") + key;
    const fmt = kind === "counter" ? S.statsd_counter_format : S.statsd_gauge_format;
    return fmt ? fmt.replace("%s", full) : full;
  }

  // --- confirmation and actions ----------------------------------------------------------------

  function confirmBox(text) {
    return new Promise((resolve) => {
      const box = document.createElement("div");
      box.className = "modal";
      box.id = "confirm";
      box.innerHTML = `<div class="modal-body" role="dialog" aria-modal="true"><p>${esc(text)}</p>` +
        `<button id="confirm-ok" class="danger">Yes</button> <button id="confirm-cancel">Cancel</button></div>`;
      document.body.appendChild(box);
      const done = (ok) => { box.remove(); resolve(ok); };
      box.querySelector("#confirm-ok").addEventListener("click", () => done(true));
      box.querySelector("#confirm-cancel").addEventListener("click", () => done(false));
      box.querySelector("#confirm-ok").focus();
    });
  }

  async function act(question, method, path, body, after) {
    if (!(await confirmBox(question))) { return; }
    try {
      const answer = await api(path, {method: method, headers: {"Content-Type": "application/json"},
                                       body: body ? JSON.stringify(body) : undefined});
      flash(answer && answer.message ? answer.message : "done", answer && answer.message ? "warning" : "ok");
    } catch (e) {
      flash(`${e.status || ""} ${e.message}`, "error");
    }
    if (after) { navigate(after); } else { refresh(); }
  }

  function flash(text, kind) {
    const el = document.getElementById("flash");
    if (el) { el.className = `alert ${kind}`; el.textContent = text; el.hidden = false; }
  }

  function actions(buttons) {
    if (!S.is_admin) { return ""; }
    return `<div class="actions">` + buttons.map((b) =>
      `<button data-action="${esc(b.id)}" class="${b.danger ? "danger" : ""}">${esc(b.label)}</button>`).join(" ") +
      `</div>`;
  }

  function bindActions(root, handlers) {
    root.querySelectorAll("button[data-action]").forEach((btn) => {
      btn.addEventListener("click", () => handlers[btn.dataset.action]());
    });
  }

  // --- views ------------------------------------------------------------------------------------

  function notFound(what) {
    document.title = "404 - nsqtw-admin";
    return `<section class="notfound" id="not-found"><h1>404</h1><p>${esc(what)} not found.</p>` +
      `<p>${link("/topics", "All topics")}</p></section>`;
  }

  async function topicsView(main) {
    const [data, inactive] = await Promise.all([
      api("/api/topics"),
      S.nsqlookupd && S.nsqlookupd.length ? api("/api/topics?inactive=true").catch(() => ({topics: {}})) : {topics: {}}]);
    const rows = (data.topics || []).map((t) =>
      `<tr data-topic="${esc(t)}"><td>${link(`/topics/${enc(t)}`, t)} ` +
      `${badge(inactive.topics && t in inactive.topics, "no producers")}</td></tr>`).join("");
    document.title = "Topics - nsqtw-admin";
    main.innerHTML = `<h1>Topics</h1>${warning(data.message)}${await charts("", "")}` +
      `<table id="topics"><thead><tr><th>Topic</th></tr></thead><tbody>${rows ||
        '<tr><td class="empty">no topics</td></tr>'}</tbody></table>`;
  }

  // --- the cells the topic, channel and node pages share (named as nsqadmin names them) -------------

  // a node as nsqadmin writes it: "hostname:httpport (address:httpport)"
  function nodeHost(hostname, node) {
    if (!hostname) { return node; }
    return `${hostname}:${String(node).split(":").pop()} (${node})`;
  }

  // a consumer as nsqadmin writes it: "hostname:port (client id)"
  function clientHost(c) {
    const port = String(c.remote_address || "").split(":").pop();
    return `${c.hostname || ""}${port ? ":" + port : ""}` +
      (c.client_id && c.client_id !== c.hostname ? ` (${c.client_id})` : "");
  }

  function memDisk(s) {
    return `<td data-field="memory_disk"><span data-field="memory_depth">${num(s.memory_depth)}</span> + ` +
      `<span data-field="backend_depth">${num(s.backend_depth)}</span></td>`;
  }

  const TOPIC_HEAD = "<th>Depth</th><th>Memory + Disk</th><th>Messages</th><th>Channels</th>";

  function topicCells(t, channels) {
    return `<td data-field="depth">${num(t.depth)}</td>${memDisk(t)}` +
      `<td data-field="message_count">${num(t.message_count)}</td><td data-field="channels">${num(channels)}</td>`;
  }

  const CHANNEL_HEAD = "<th>Depth</th><th>Memory + Disk</th><th>In-Flight</th><th>Deferred</th><th>Requeued</th>" +
    "<th>Timed Out</th><th>Messages</th><th>Connections</th>";

  function channelCells(c) {
    return `<td data-field="depth">${num(c.depth)}</td>${memDisk(c)}` +
      `<td data-field="in_flight_count">${num(c.in_flight_count)}</td>` +
      `<td data-field="deferred_count">${num(c.deferred_count)}</td>` +
      `<td data-field="requeue_count">${num(c.requeue_count)}</td>` +
      `<td data-field="timeout_count">${num(c.timeout_count)}</td>` +
      `<td data-field="message_count">${num(c.message_count)}</td>` +
      `<td data-field="client_count">${num(c.client_count)}</td>`;
  }

  function clientHead(withNode) {
    return "<th>Client Host</th><th>User-Agent</th><th>Attributes</th>" + (withNode ? "<th>NSQd Host</th>" : "") +
      "<th>In-Flight</th><th>Ready Count</th><th>Finished</th><th>Requeued</th><th>Messages</th>" +
      "<th>Connected</th><th>Address</th>";
  }

  function clientAttributes(c) {
    const out = [];
    if (c.tls) { out.push(esc(`TLS ${c.tls_version || ""}`.trim())); }
    if (c.snappy) { out.push("snappy"); }
    if (c.deflate) { out.push("deflate"); }
    if (c.sample_rate) { out.push(`sampled ${esc(c.sample_rate)}%`); }
    if (c.authed) {
      const who = esc(c.auth_identity || "authed");
      out.push(c.auth_identity_url ? `<a href="${esc(c.auth_identity_url)}">${who}</a>` : who);
    }
    return out.map((a) => `<span class="badge">${a}</span>`).join(" ");
  }

  function clientRow(c, withNode) {
    return `<tr class="client" data-client="${esc(c.remote_address)}">` +
      `<td data-field="client_host">${esc(clientHost(c))}</td>` +
      `<td data-field="user_agent">${esc(c.user_agent || "")} <small>${esc(c.version)}</small></td>` +
      `<td data-field="attributes">${clientAttributes(c)}</td>` +
      (withNode ? `<td data-field="node">${link(`/nodes/${enc(c.node)}`, c.node)}</td>` : "") +
      `<td data-field="in_flight_count">${num(c.in_flight_count)}</td>` +
      `<td data-field="ready_count">${num(c.ready_count)}</td>` +
      `<td data-field="finish_count">${num(c.finish_count)}</td>` +
      `<td data-field="requeue_count">${num(c.requeue_count)}</td>` +
      `<td data-field="message_count">${num(c.message_count)}</td>` +
      `<td data-field="connected">${duration(c.connected)}</td>` +
      `<td data-field="remote_address">${esc(c.remote_address)}</td></tr>`;
  }

  // --- end-to-end latency (nodes run with --e2e-processing-latency-percentile) ---------------------

  // the quantiles any of the entries has, in the order they come
  function quantiles(entries) {
    const qs = [];
    entries.forEach((e) => ((e.e2e_processing_latency || {}).percentiles || []).forEach((p) => {
      if (!qs.includes(p.quantile)) { qs.push(p.quantile); }
    }));
    return qs;
  }

  // 0.99 -> "99th", 0.999 -> "99.9th"
  function quantileName(q) { return `${Number((q * 100).toFixed(2))}th`; }

  // nanoseconds as nsqadmin writes a latency: 812ns, 45us, 255.46ms, 1.50s, 2m3.00s
  function latency(ns) {
    let n = Math.max(0, Math.floor(ns || 0));
    let out = "";
    if (n >= 3600e9) { out += Math.floor(n / 3600e9) + "h"; n %= 3600e9; }
    if (n >= 60e9) { out += Math.floor(n / 60e9) + "m"; n %= 60e9; }
    if (n >= 1e9) { return out + (Math.floor(n / 1e6) / 1000).toFixed(2) + "s"; }
    if (n >= 1e6) { return out + (Math.floor(n / 1e3) / 1000).toFixed(2) + "ms"; }
    if (n >= 1e3) { return out + Math.floor(n / 1e3) + "us"; }
    return out + n + "ns";
  }

  // the group header over the latency columns, after `before` other columns (none without latencies)
  function e2eGroup(qs, before) {
    return qs.length ? `<tr class="group"><th colspan="${before}"></th>` +
      `<th colspan="${qs.length}">E2E Processing Latency</th></tr>` : "";
  }

  function e2eHead(qs) {
    return qs.map((q) => `<th title="end-to-end processing latency, ${esc(q)} quantile">${quantileName(q)}</th>`).join("");
  }

  function e2eCells(entry, qs) {
    const ps = (entry.e2e_processing_latency || {}).percentiles || [];
    return qs.map((q) => {
      const p = ps.find((x) => x.quantile === q);
      return `<td data-field="e2e-${esc(q)}">${p ? latency(p.average) : ""}</td>`;
    }).join("");
  }

  // --- replication (nodes run with --replicas=2; Go nsqd and --replicas=1 report none of it) ------------

  // milliseconds as a lag: 0ms, 850ms, 12.3s
  function lag(ms) {
    const n = Math.max(0, Math.floor(ms || 0));
    return n < 1000 ? `${n}ms` : `${(n / 1000).toFixed(1)}s`;
  }

  // where a node's copies of a topic are: "peer · in sync" and how far behind the peer is, or
  // "under-replicated" (red) with why: its replica is still connecting or being sent the topic's
  // unfinished messages, or there is none
  function replicaText(r) {
    const peer = r.peer ? `<span data-field="replica_peer">${link(`/nodes/${enc(r.peer)}`, r.peer)}</span> · ` : "";
    if (r.state === "in_sync") {
      return peer + `<span data-field="replica_state" class="in-sync">in sync</span> ` +
        `<small data-field="replica_lag">lag ${lag(r.lag_ms)}${r.unacked ? `, ${num(r.unacked)} unacked` : ""}</small>`;
    }
    const why = r.state === "connecting" ? "connecting" : r.state === "catching_up" ? "catching up" : "no replica";
    return peer + `<span data-field="replica_state" class="under-replicated" ` +
      `title="a publish to this topic here is not copied to another node (${esc(why)})">under-replicated</span> ` +
      `<small data-field="replica_why">${esc(why)}${r.unacked ? `, ${num(r.unacked)} unacked` : ""}</small>`;
  }

  function replicaCell(r) {
    return `<td data-field="replica">${r ? replicaText(r) : ""}</td>`;
  }

  // the Total row's: how many of the nodes that replicate the topic are under-replicated
  function replicaTotal(nodes) {
    const shown = nodes.filter((n) => n.replica);
    const under = shown.filter((n) => n.replica.state !== "in_sync").length;
    return `<td data-field="replica">` + (under ?
      `<span class="under-replicated">${num(under)} of ${num(shown.length)} under-replicated</span>` :
      `<span class="in-sync">all in sync</span>`) + `</td>`;
  }

  // a node's own replication: its counters, and the standbys it holds for other nodes (owner and topic
  // linked when the owner is a node the cluster knows: a lost one's page is gone)
  function replicationSection(r, known) {
    const rows = (r.standby || []).map((s) =>
      `<tr data-standby="${esc(s.owner)}/${esc(s.topic)}">` +
      `<td data-field="owner">${known.has(s.owner) ? link(`/nodes/${enc(s.owner)}`, s.owner) : esc(s.owner)}</td>` +
      `<td data-field="topic">${known.has(s.owner) ? link(`/topics/${enc(s.topic)}`, s.topic) : esc(s.topic)}</td>` +
      `<td data-field="messages">${num(s.messages)}</td><td data-field="bytes">${num(s.bytes)}</td>` +
      `<td data-field="disk_bytes">${num(s.disk_bytes)}</td>` +
      `<td data-field="taken_over">${s.taken_over ? '<span class="badge">taken over</span>' : "no"}</td></tr>`).join("");
    return `<h2>Replication</h2><section class="totals" id="replication">` +
      `<div title="publishes refused because no replica acknowledged their copy in time">` +
      `<b data-field="replica_refused">${num(r.replica_refused)}</b> refused for want of a replica</div>` +
      `<div title="publishes held by this node alone: no replica could be chosen for them">` +
      `<b data-field="unreplicated">${num(r.unreplicated)}</b> unreplicated</div>` +
      `<div title="topics of lost nodes whose copies this node delivered">` +
      `<b data-field="takeovers">${num(r.takeovers)}</b> takeovers</div></section>` +
      `<h3>Standbys: copies held for other nodes</h3><table id="standbys"><thead><tr><th>Owner</th><th class="name">Topic</th>` +
      `<th>Messages</th><th>Bytes</th><th>Disk Bytes</th><th>Taken Over</th></tr></thead>` +
      `<tbody>${rows || '<tr><td class="empty" colspan="6">none</td></tr>'}</tbody></table>`;
  }

  // the sum of the channels' depths: what waits in a topic's channels
  function backlog(channels) {
    return (channels || []).reduce((sum, c) => sum + (c.depth || 0), 0);
  }

  // nsqadmin's API answers "failed to query any nsqd: " when no node produces the topic. Over nsqlookupd
  // that means the lookupds know the topic (one they do not know is TOPIC_NOT_FOUND) and list no producer
  // for it: it was created on nsqlookupd only, or every node that has it is tombstoned for it. The topics
  // list and the node page link such a topic, so its page says that instead of a 404.
  function withoutProducers(e) {
    return Boolean(S.nsqlookupd && S.nsqlookupd.length) && /failed to query any nsqd: $/.test(e.message);
  }

  async function noProducersView(main, topic, channel) {
    const [inactive, nodes] = await Promise.all([
      api("/api/topics?inactive=true").catch(() => ({topics: {}})), api("/api/nodes").catch(() => ({nodes: []}))]);
    const channels = (inactive.topics || {})[topic] || [];
    const tombstoned = (nodes.nodes || []).filter((n) => (n.topics || []).some((t) => t.topic === topic && t.tombstoned))
      .map(nodeAddress);
    document.title = `${channel ? `${topic}/${channel}` : topic} - nsqtw-admin`;
    main.innerHTML = `<nav class="crumbs">${link("/topics", "Topics")} / ` +
      (channel ? `${link(`/topics/${enc(topic)}`, topic)} / ${esc(channel)}</nav>` +
                 `<h1>Channel <span id="channel-name">${esc(channel)}</span></h1>` :
                 `${esc(topic)}</nav><h1>Topic <span id="topic-name">${esc(topic)}</span></h1>`) +
      `<div id="flash" class="alert" hidden></div>` +
      (channel ? "" : actions([{id: "delete", label: "Delete topic", danger: true}])) +
      `<div class="alert notice" id="no-producers">No node produces topic ${esc(topic)} by nsqlookupd's account: ` +
      `it was created on nsqlookupd only, or every node that has it is tombstoned for it ` +
      `(see ${link("/lookup", "Lookup")}).</div>` +
      (tombstoned.length ? `<p id="tombstoned-on">Tombstoned on nsqlookupd for ` +
        tombstoned.map((n) => link(`/nodes/${enc(n)}`, n)).join(", ") + `.</p>` : "") +
      (channel ? "" : `<h2>Channels nsqlookupd knows</h2><table id="channels"><thead><tr><th>Channel</th></tr></thead>` +
        `<tbody>${channels.map((c) => `<tr data-channel="${esc(c)}"><td>${esc(c)}</td></tr>`).join("") ||
          '<tr><td class="empty">none</td></tr>'}</tbody></table>`);
    bindActions(main, {
      delete: () => act(`Delete topic ${topic} from every nsqlookupd?`, "DELETE", `/api/topics/${enc(topic)}`, null,
                        "/topics"),
    });
  }

  async function topicView(main, topic) {
    let data;
    try {
      data = await api(`/api/topics/${enc(topic)}`);
    } catch (e) {
      if (withoutProducers(e)) { await noProducersView(main, topic, ""); return; }
      if (/TOPIC_NOT_FOUND|failed to query any nsqd: $/.test(e.message)) {
        main.innerHTML = notFound(`Topic ${topic}`);
        return;
      }
      throw e;
    }
    if (!data.nodes) { main.innerHTML = notFound(`Topic ${topic}`); return; }
    document.title = `${topic} - nsqtw-admin`;
    const qs = quantiles(data.nodes || []), cqs = quantiles(data.channels || []);
    const tombstones = S.is_admin && S.nsqlookupd && S.nsqlookupd.length;
    // the Replica column only when a node of the topic runs with --replicas=2
    const replicas = (data.nodes || []).some((n) => n.replica);
    const nodes = (data.nodes || []).map((n) =>
      `<tr data-node="${esc(n.node)}"><td data-field="node">` +
      `${link(`/nodes/${enc(n.node)}`, nodeHost(n.hostname, n.node))} ${badge(n.paused, "paused")}</td>` +
      topicCells(n, (n.channels || []).length) + e2eCells(n, qs) + (replicas ? replicaCell(n.replica) : "") +
      (tombstones ? `<td><button class="small" data-tombstone="${esc(n.node)}" data-topic="${esc(topic)}">` +
        `Tombstone</button></td>` : "<td></td>") +
      `</tr>`).join("");
    const total = `<tr class="total" data-total><td>Total:</td>` + topicCells(data, (data.channels || []).length) +
      e2eCells(data, qs) + (replicas ? replicaTotal(data.nodes) : "") + `<td></td></tr>`;
    const channels = (data.channels || []).slice().sort((a, b) => a.channel_name < b.channel_name ? -1 : 1)
      .map((c) =>
        `<tr data-channel="${esc(c.channel_name)}"><td>${link(`/topics/${enc(topic)}/${enc(c.channel_name)}`, c.channel_name)}` +
        ` ${badge(c.paused, "paused")}</td>` + channelCells(c) + e2eCells(c, cqs) + `</tr>`).join("");
    main.innerHTML = `<nav class="crumbs">${link("/topics", "Topics")} / ${esc(topic)}</nav>` +
      `<h1>Topic <span id="topic-name">${esc(topic)}</span> ${badge(data.paused, "paused")}</h1>` +
      warning(data.message) + `<div id="flash" class="alert" hidden></div>` +
      actions([{id: data.paused ? "unpause" : "pause", label: data.paused ? "Unpause topic" : "Pause topic"},
               {id: "empty", label: "Empty topic", danger: true},
               {id: "delete", label: "Delete topic", danger: true}]) +
      `<section class="totals" id="totals">` +
      `<div title="messages in the topic's own queue, not yet copied to its channels">` +
      `<b data-field="depth">${num(data.depth)}</b> topic depth</div>` +
      `<div title="messages waiting in the topic's channels (the sum of their depths)">` +
      `<b data-field="backlog">${num(backlog(data.channels))}</b> channel backlog</div>` +
      `<div><b data-field="message_count">${num(data.message_count)}</b> messages</div>` +
      `<div><b data-field="channels">${(data.channels || []).length}</b> channels</div>` +
      `<div><b data-field="nodes">${(data.nodes || []).length}</b> nodes</div></section>` +
      (await charts(topic, "")) +
      graphite(`nonNegativeDerivative(sumSeries(${statsdKey("counter", `topic.${topic}.message_count`)}))`) +
      `<h2>Topic message queue</h2><table id="nodes"><thead>${e2eGroup(qs, 5)}` +
      `<tr><th>NSQd Host</th>${TOPIC_HEAD}${e2eHead(qs)}${replicas ? '<th class="replica">Replica</th>' : ""}<th></th>` +
      `</tr></thead><tbody>${nodes}${total}</tbody></table>` +
      `<h2>Channel message queues</h2><table id="channels"><thead>${e2eGroup(cqs, 9)}` +
      `<tr><th>Channel</th>${CHANNEL_HEAD}${e2eHead(cqs)}` +
      `</tr></thead><tbody>${channels || '<tr><td class="empty" colspan="9">no channels</td></tr>'}</tbody></table>`;
    const path = `/api/topics/${enc(topic)}`;
    bindActions(main, {
      pause: () => act(`Pause topic ${topic} on every node?`, "POST", path, {action: "pause"}),
      unpause: () => act(`Unpause topic ${topic}?`, "POST", path, {action: "unpause"}),
      empty: () => act(`Empty topic ${topic}: drop every message it holds?`, "POST", path, {action: "empty"}),
      delete: () => act(`Delete topic ${topic} and all its channels?`, "DELETE", path, null, "/topics"),
    });
    bindTombstones(main);
  }

  function bindTombstones(root) {
    root.querySelectorAll("button[data-tombstone]").forEach((btn) => {
      const topic = btn.dataset.topic;
      btn.addEventListener("click", () =>
        act(`Tombstone ${btn.dataset.tombstone} for topic ${topic} (lookupd stops listing it, the node deletes the topic)?`,
            "DELETE", `/api/nodes/${enc(btn.dataset.tombstone)}`, {topic: topic}));
    });
  }

  async function channelView(main, topic, channel) {
    let data;
    try {
      data = await api(`/api/topics/${enc(topic)}/${enc(channel)}`);
    } catch (e) {
      if (withoutProducers(e)) { await noProducersView(main, topic, channel); return; }
      if (/TOPIC_NOT_FOUND|failed to query any nsqd: $/.test(e.message)) {
        main.innerHTML = notFound(`Topic ${topic}`);
        return;
      }
      throw e;
    }
    if (!data.channel_name) { main.innerHTML = notFound(`Channel ${topic}/${channel}`); return; }
    document.title = `${topic}/${channel} - nsqtw-admin`;
    const qs = quantiles(data.nodes || []);
    const nodes = (data.nodes || []).map((n) =>
      `<tr data-node="${esc(n.node)}"><td data-field="node">` +
      `${link(`/nodes/${enc(n.node)}`, nodeHost(n.hostname, n.node))} ${badge(n.paused, "paused")}</td>` +
      channelCells(n) + e2eCells(n, qs) + `</tr>`).join("");
    const total = `<tr class="total" data-total><td>Total:</td>${channelCells(data)}${e2eCells(data, qs)}</tr>`;
    const clients = (data.clients || []).map((c) => clientRow(c, true)).join("");
    main.innerHTML = `<nav class="crumbs">${link("/topics", "Topics")} / ` +
      `${link(`/topics/${enc(topic)}`, topic)} / ${esc(channel)}</nav>` +
      `<h1>Channel <span id="channel-name">${esc(channel)}</span> ${badge(data.paused, "paused")}</h1>` +
      warning(data.message) + `<div id="flash" class="alert" hidden></div>` +
      actions([{id: data.paused ? "unpause" : "pause", label: data.paused ? "Unpause channel" : "Pause channel"},
               {id: "empty", label: "Empty channel", danger: true},
               {id: "delete", label: "Delete channel", danger: true}]) +
      `<section class="totals" id="totals">` +
      `<div title="messages waiting in the channel on every node (memory + disk)">` +
      `<b data-field="depth">${num(data.depth)}</b> channel depth</div>` +
      `<div><b data-field="in_flight_count">${num(data.in_flight_count)}</b> in flight</div>` +
      `<div><b data-field="deferred_count">${num(data.deferred_count)}</b> deferred</div>` +
      `<div><b data-field="message_count">${num(data.message_count)}</b> messages</div>` +
      `<div><b data-field="client_count">${num(data.client_count)}</b> clients</div></section>` +
      (await charts(topic, channel)) +
      graphite(`nonNegativeDerivative(sumSeries(${statsdKey("counter", `topic.${topic}.channel.${channel}.message_count`)}))`) +
      `<h2>Channel</h2><table id="nodes"><thead>${e2eGroup(qs, 9)}` +
      `<tr><th>NSQd Host</th>${CHANNEL_HEAD}${e2eHead(qs)}</tr></thead>` +
      `<tbody>${nodes}${total}</tbody></table>` +
      `<h2>Client connections</h2><table id="clients"><thead><tr>${clientHead(true)}</tr></thead>` +
      `<tbody>${clients || '<tr><td class="empty" colspan="11">no clients</td></tr>'}</tbody></table>`;
    const path = `/api/topics/${enc(topic)}/${enc(channel)}`;
    bindActions(main, {
      pause: () => act(`Pause channel ${channel} on every node?`, "POST", path, {action: "pause"}),
      unpause: () => act(`Unpause channel ${channel}?`, "POST", path, {action: "unpause"}),
      empty: () => act(`Empty channel ${channel}: drop every message it holds?`, "POST", path, {action: "empty"}),
      delete: () => act(`Delete channel ${channel}?`, "DELETE", path, null, `/topics/${enc(topic)}`),
    });
  }

  // a topic name, struck out and marked when the lookupds hold a tombstone for it on this node
  function topicName(t, tombstoned) {
    const name = link(`/topics/${enc(t)}`, t, tombstoned ? 'class="tombstoned" title="tombstoned on nsqlookupd"' : "");
    return tombstoned ? `<s data-tombstoned="${esc(t)}">${name}</s>` : name;
  }

  async function nodesView(main) {
    const data = await api("/api/nodes");
    document.title = "Nodes - nsqtw-admin";
    const lookupds = (S.nsqlookupd || []).length;
    const rows = (data.nodes || []).map((n) => {
      const http = nodeAddress(n);
      const topics = (n.topics || []).map((t) => topicName(t.topic, t.tombstoned)).join(" ");
      const conns = n.remote_addresses || [];
      return `<tr data-node="${esc(http)}"><td data-field="hostname">${link(`/nodes/${enc(http)}`, n.hostname)}</td>` +
        `<td data-field="broadcast_address">${link(`/nodes/${enc(http)}`, n.broadcast_address)}</td>` +
        `<td data-field="tcp_port">${esc(n.tcp_port)}</td>` +
        `<td data-field="http_port">${esc(n.http_port)}</td>` +
        `<td data-field="version">${esc(n.version)} ${badge(n.out_of_date, "out of date")}</td>` +
        (lookupds ? `<td data-field="lookupd_conns"><b>${conns.length}</b> <small>${conns.map(esc).join("<br>")}</small>` +
          `${badge(conns.length !== lookupds, "not on every lookupd")}</td>` : "") +
        `<td data-field="topics"><b>${(n.topics || []).length}</b> ${topics}</td></tr>`;
    }).join("");
    main.innerHTML = `<h1>Nodes (<span data-field="node_count">${(data.nodes || []).length}</span>)</h1>` +
      `${warning(data.message)}<table id="nodes"><thead><tr><th>Hostname</th>` +
      `<th>Broadcast Address</th><th>TCP Port</th><th>HTTP Port</th><th>Version</th>` +
      (lookupds ? "<th>Lookupd Conns.</th>" : "") + `<th>Topics</th></tr></thead><tbody>${rows ||
        '<tr><td class="empty" colspan="7">no nodes</td></tr>'}</tbody></table>`;
  }

  async function nodeView(main, node) {
    let data, producers;
    try {
      [data, producers] = await Promise.all([
        api(`/api/nodes/${enc(node)}`), api("/api/nodes").catch(() => ({nodes: []}))]);
    } catch (e) {
      if (e.status === 404) { main.innerHTML = notFound(`Node ${node}`); return; }
      throw e;
    }
    document.title = `${node} - nsqtw-admin`;
    const me = (producers.nodes || []).find((n) => nodeAddress(n) === node) || {};
    const tombstoned = new Set((me.topics || []).filter((t) => t.tombstoned).map((t) => t.topic));
    const tombstones = S.is_admin && S.nsqlookupd && S.nsqlookupd.length;
    const rows = (data.topics || []).map((t) => {
      const channels = t.channels || [];
      return `<tbody class="topic" data-topic="${esc(t.topic_name)}">` +
        `<tr><th>Topic</th>${TOPIC_HEAD}<th colspan="6"></th></tr>` +
        `<tr class="topic"><td>${topicName(t.topic_name, tombstoned.has(t.topic_name))} ${badge(t.paused, "paused")}` +
        `${tombstoned.has(t.topic_name) ? '<span class="badge tombstoned">tombstoned</span>' : ""}</td>` +
        topicCells(t, channels.length) +
        `<td colspan="6">${t.replica ? `<span data-field="replica">replica ${replicaText(t.replica)}</span> ` : ""}` +
        `${tombstones ? `<button class="small" data-tombstone="${esc(node)}" ` +
          `data-topic="${esc(t.topic_name)}">Tombstone</button>` : ""}</td></tr>` +
        (channels.length ? "" : '<tr><td class="empty" colspan="11">no channels</td></tr>') +
        channels.map((c) =>
          `<tr class="channel-head"><th>Channel</th>${CHANNEL_HEAD}<th colspan="2"></th></tr>` +
          `<tr class="channel" data-channel="${esc(t.topic_name)}/${esc(c.channel_name)}"><td>` +
          `${link(`/topics/${enc(t.topic_name)}/${enc(c.channel_name)}`, c.channel_name)} ${badge(c.paused, "paused")}</td>` +
          channelCells(c) + `<td colspan="2"></td></tr>` +
          ((c.clients || []).length ? `<tr class="client-head">${clientHead(false)}</tr>` +
            c.clients.map((cl) => clientRow(cl, false)).join("") :
            '<tr><td class="empty" colspan="11">no clients</td></tr>')).join("") + `</tbody>`;
    }).join("");
    main.innerHTML = `<nav class="crumbs">${link("/nodes", "Nodes")} / ${esc(node)}</nav>` +
      `<h1>Node <span id="node-name">${esc(me.hostname ? nodeHost(me.hostname, node) : node)}</span></h1>` +
      `${warning(data.message)}<div id="flash" class="alert" hidden></div>` +
      `<section class="totals" id="totals"><div><b data-field="total_messages">${num(data.total_messages)}</b> messages</div>` +
      `<div><b data-field="total_clients">${num(data.total_clients)}</b> clients</div>` +
      `<div><b data-field="topics">${(data.topics || []).length}</b> topics</div></section>` +
      (data.replication ? replicationSection(data.replication, new Set((producers.nodes || []).map(nodeAddress))) +
        "<h2>Topics</h2>" : "") +
      `<table id="node-topics">${rows || '<tbody><tr><td class="empty">no topics</td></tr></tbody>'}</table>`;
    bindTombstones(main);
  }

  async function lookupView(main) {
    const lookupds = S.nsqlookupd || [];
    document.title = "Lookup - nsqtw-admin";
    if (!lookupds.length) {
      main.innerHTML = `<h1>Lookup</h1><p class="empty">nsqtw-admin runs with --nsqd-http-address: no nsqlookupd to show.</p>`;
      return;
    }
    const [nodes, inactive] = await Promise.all([api("/api/nodes"), api("/api/topics?inactive=true")]);
    const producers = {};
    (nodes.nodes || []).forEach((n) => (n.topics || []).forEach((t) => {
      (producers[t.topic] = producers[t.topic] || []).push({node: nodeAddress(n), tombstoned: t.tombstoned});
    }));
    const rows = Object.keys(producers).sort().map((t) =>
      `<tr data-topic="${esc(t)}"><td>${link(`/topics/${enc(t)}`, t)}</td><td>` +
      producers[t].map((p) => p.tombstoned ?
        `<s data-tombstoned="${esc(p.node)}">${link(`/nodes/${enc(p.node)}`, p.node)}</s> ` +
        `<span class="badge tombstoned">tombstoned</span>` :
        link(`/nodes/${enc(p.node)}`, p.node)).join("<br>") + `</td></tr>`).join("");
    const orphans = Object.keys(inactive.topics || {}).sort().map((t) =>
      `<tr data-topic="${esc(t)}"><td>${esc(t)}</td><td>${(inactive.topics[t] || []).map(esc).join(", ")}</td>` +
      `<td>${S.is_admin ? `<button class="small danger" data-delete-topic="${esc(t)}">Delete</button>` : ""}</td></tr>`).join("");
    main.innerHTML = `<h1>Lookup</h1>${warning(nodes.message || inactive.message)}<div id="flash" class="alert" hidden></div>` +
      `<table id="lookupds"><thead><tr><th>nsqlookupd Host</th></tr></thead><tbody>` +
      lookupds.map((l) => `<tr data-lookupd="${esc(l)}"><td>${esc(l)}</td></tr>`).join("") + `</tbody></table>` +
      `<h2>Producers by topic</h2><table id="producers"><thead><tr><th>Topic</th><th>Nodes</th></tr></thead>` +
      `<tbody>${rows || '<tr><td class="empty" colspan="2">none</td></tr>'}</tbody></table>` +
      `<h2>Topics without producers</h2><table id="inactive"><thead><tr><th>Topic</th><th>Channels</th><th></th></tr></thead>` +
      `<tbody>${orphans || '<tr><td class="empty" colspan="3">none</td></tr>'}</tbody></table>` +
      (S.is_admin ? `<h2>Create a topic or channel</h2><form id="create"><input name="topic" placeholder="topic" required> ` +
        `<input name="channel" placeholder="channel (optional)"> <button type="submit">Create</button></form>` : "");
    main.querySelectorAll("button[data-delete-topic]").forEach((btn) => btn.addEventListener("click", () =>
      act(`Delete topic ${btn.dataset.deleteTopic}?`, "DELETE", `/api/topics/${enc(btn.dataset.deleteTopic)}`)));
    const form = main.querySelector("#create");
    if (form) {
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        const body = {topic: form.topic.value, channel: form.channel.value};
        act(`Create ${body.topic}${body.channel ? "/" + body.channel : ""} on every nsqlookupd?`, "POST", "/api/topics", body);
      });
    }
  }

  const counter = {last: null, rates: []};

  async function counterView(main) {
    const data = await api("/api/counter");
    let total = 0;
    Object.values(data.stats || {}).forEach((s) => { total += s.message_count; });
    const now = Date.now() / 1000;
    if (counter.last && now > counter.last.ts) {
      counter.rates.push({ts: now, rate: Math.max(0, (total - counter.last.total) / (now - counter.last.ts)), depth: 0});
      counter.rates = counter.rates.slice(-120);
    }
    counter.last = {ts: now, total: total};
    document.title = "Counter - nsqtw-admin";
    main.innerHTML = `<h1>Messages processed</h1>${warning(data.message)}` +
      `<div class="counter" id="counter" data-field="total">${num(total)}</div>` +
      `<p class="muted">the sum of every channel's message count over every node, updated every second</p>` +
      `<section class="charts">${chart("messages processed per second", counter.rates, "rate", "msg/s",
                                       "growth of the total above between two refreshes")}</section>`;
  }

  // --- routing -----------------------------------------------------------------------------------

  // the view for the address bar's path: each segment decoded on its own (decodeURIComponent), after the
  // base path's segments, so "/nodes/%5B%3A%3A1%5D%3A4151" is node "[::1]:4151"
  function route() {
    let parts;
    try {
      parts = location.pathname.split("/").filter((p) => p !== "").map(decodeURIComponent);
    } catch (e) {  // a malformed escape ("/topics/%E0%A4"): no page of ours
      return ["", async (main) => { main.innerHTML = notFound(`Page ${location.pathname}`); }, []];
    }
    const base = BASE.split("/").filter((p) => p !== "");
    if (base.every((b, i) => parts[i] === b)) { parts = parts.slice(base.length); }
    const path = "/" + parts.join("/");
    if (parts.length === 0 || (parts[0] === "topics" && parts.length === 1)) { return ["topics", topicsView, []]; }
    if (parts[0] === "topics" && parts.length === 2) { return ["topics", topicView, [parts[1]]]; }
    if (parts[0] === "topics" && parts.length === 3) { return ["topics", channelView, [parts[1], parts[2]]]; }
    if (parts[0] === "nodes" && parts.length === 1) { return ["nodes", nodesView, []]; }
    if (parts[0] === "nodes" && parts.length === 2) { return ["nodes", nodeView, [parts[1]]]; }
    if (parts[0] === "counter") { return ["counter", counterView, []]; }
    if (parts[0] === "lookup") { return ["lookup", lookupView, []]; }
    return ["", async (main) => { main.innerHTML = notFound(`Page ${path}`); }, []];
  }

  function header(active) {
    const items = [["topics", "/topics", "Topics"], ["nodes", "/nodes", "Nodes"],
                   ["counter", "/counter", "Counter"], ["lookup", "/lookup", "Lookup"]];
    document.getElementById("header").innerHTML = `<div class="brand">${link("/", "nsqtw-admin")}</div><nav>` +
      items.map(([k, p, t]) => link(p, t, k === active ? 'class="active"' : "")).join("") + `</nav>` +
      `<div class="version" title="speaks nsqadmin v${esc(S.version)}">v${esc(S.nsqtw_version)}` +
      `<span id="updated"></span></div>`;
  }

  async function refresh() {
    const mine = ++generation;
    const [active, view, args] = route();
    header(active);
    const main = document.getElementById("main");
    const scroll = window.scrollY;
    const scratch = document.createElement("main");
    try {
      await view(scratch, ...args);
      if (mine !== generation) { return; }
      // keep a message shown after an action until the next one
      const oldFlash = main.querySelector("#flash");
      const newFlash = scratch.querySelector("#flash");
      if (oldFlash && newFlash && !oldFlash.hidden) { newFlash.replaceWith(oldFlash); }
      main.replaceChildren(...scratch.childNodes);
      main.dataset.loaded = String(Date.now());
      const updated = document.getElementById("updated");
      if (updated) { updated.textContent = " · updated " + new Date().toLocaleTimeString(); }
    } catch (e) {
      if (mine !== generation) { return; }
      main.innerHTML = `<div class="alert error" id="error">${esc(e.status || "")} ${esc(e.message)}</div>`;
      main.dataset.loaded = String(Date.now());
    }
    window.scrollTo(0, scroll);
  }

  function schedule() {
    clearInterval(timer);
    const [active] = route();
    timer = setInterval(() => { if (!document.querySelector("#confirm")) { refresh(); } },
                        active === "counter" ? 1000 : REFRESH_MS);
  }

  function navigate(path) {
    history.pushState(null, "", url(path));
    refresh();
    schedule();
  }

  document.addEventListener("click", (ev) => {
    const a = ev.target.closest && ev.target.closest("a[data-nav]");
    if (!a || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.button !== 0) { return; }
    ev.preventDefault();
    history.pushState(null, "", a.getAttribute("href"));
    refresh();
    schedule();
  });
  window.addEventListener("popstate", () => { refresh(); schedule(); });

  refresh();
  schedule();
})();
