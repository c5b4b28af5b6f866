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
  function url(path) { return BASE + path; }
  function enc(s) { return encodeURIComponent(s); }
  function duration(ns) {
    let s = Math.max(0, Math.floor((ns || 0) / 1e9));
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    return (d ? d + "d " : "") + (d || h ? h + "h " : "") + (d || h || m ? m + "m " : "") + s + "s";
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

  function chart(title, points, field, unit) {
    const values = points.map((p) => p[field]).filter((v) => v != null);
    const w = 320, h = 80, pad = 4;
    if (values.length < 2) {
      return `<figure class="chart" data-chart="${esc(field)}"><figcaption>${esc(title)}</figcaption>` +
        `<div class="nodata">collecting… (a point every ${esc(S.history_interval)}s)</div></figure>`;
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
    return `<figure class="chart" data-chart="${esc(field)}"><figcaption>${esc(title)}: ` +
      `<b data-field="${esc(field)}-last">${num(Math.round(last * 100) / 100)}</b> ${esc(unit)} ` +
      `<small>(max ${num(Math.round(max * 100) / 100)})</small></figcaption>` +
      `<svg viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(title)}">` +
      `<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="${pts.join(" ")}"/></svg></figure>`;
  }

  async function charts(topic, channel) {
    if (!S.history_interval) { return ""; }
    let q = "";
    if (topic) { q = `?topic=${enc(topic)}` + (channel ? `&channel=${enc(channel)}` : ""); }
    try {
      const h = await api(`/api/history${q}`);
      return `<section class="charts" id="charts">` +
        chart("message rate", h.points, "rate", "msg/s") +
        chart("depth", h.points, "depth", "messages") +
        (channel ? chart("in flight", h.points, "in_flight", "messages") : "") + `</section>`;
    } catch (e) {
      return "";
    }
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
      `<tr data-topic="${esc(t)}"><td>${link(`/topics/${enc(t)}`, t)}` +
      `${badge(inactive.topics && t in inactive.topics, "no producers")}</td></tr>`).join("");
    document.title = "Topics - nsqtw-admin";
    main.innerHTML = `<h1>Topics</h1>${warning(data.message)}${await charts("", "")}` +
      `<table id="topics"><thead><tr><th>Topic</th></tr></thead><tbody>${rows ||
        '<tr><td class="empty">no topics</td></tr>'}</tbody></table>`;
  }

  function depthCells(s) {
    return `<td data-field="depth">${num(s.depth)}</td><td data-field="memory_depth">${num(s.memory_depth)}</td>` +
      `<td data-field="backend_depth">${num(s.backend_depth)}</td>`;
  }

  async function topicView(main, topic) {
    let data;
    try {
      data = await api(`/api/topics/${enc(topic)}`);
    } catch (e) {
      if (/TOPIC_NOT_FOUND|failed to query any nsqd: $/.test(e.message)) {
        main.innerHTML = notFound(`Topic ${topic}`);
        return;
      }
      throw e;
    }
    if (!data.nodes) { main.innerHTML = notFound(`Topic ${topic}`); return; }
    document.title = `${topic} - nsqtw-admin`;
    const nodes = (data.nodes || []).map((n) =>
      `<tr data-node="${esc(n.node)}"><td>${link(`/nodes/${enc(n.node)}`, n.node)} ${badge(n.paused, "paused")}</td>` +
      depthCells(n) + `<td data-field="message_count">${num(n.message_count)}</td>` +
      `<td data-field="channels">${(n.channels || []).length}</td>` +
      (S.is_admin && S.nsqlookupd && S.nsqlookupd.length ?
        `<td><button class="small" data-tombstone="${esc(n.node)}">Tombstone</button></td>` : "<td></td>") +
      `</tr>`).join("");
    const channels = (data.channels || []).slice().sort((a, b) => a.channel_name < b.channel_name ? -1 : 1)
      .map((c) =>
        `<tr data-channel="${esc(c.channel_name)}"><td>${link(`/topics/${enc(topic)}/${enc(c.channel_name)}`, c.channel_name)}` +
        ` ${badge(c.paused, "paused")}</td>` + depthCells(c) +
        `<td data-field="in_flight_count">${num(c.in_flight_count)}</td>` +
        `<td data-field="deferred_count">${num(c.deferred_count)}</td>` +
        `<td data-field="requeue_count">${num(c.requeue_count)}</td>` +
        `<td data-field="timeout_count">${num(c.timeout_count)}</td>` +
        `<td data-field="message_count">${num(c.message_count)}</td>` +
        `<td data-field="client_count">${num(c.client_count)}</td></tr>`).join("");
    main.innerHTML = `<nav class="crumbs">${link("/topics", "Topics")} / ${esc(topic)}</nav>` +
      `<h1>Topic <span id="topic-name">${esc(topic)}</span> ${badge(data.paused, "paused")}</h1>` +
      warning(data.message) + `<div id="flash" class="alert" hidden></div>` +
      actions([{id: data.paused ? "unpause" : "pause", label: data.paused ? "Unpause topic" : "Pause topic"},
               {id: "empty", label: "Empty topic", danger: true},
               {id: "delete", label: "Delete topic", danger: true}]) +
      `<section class="totals" id="totals"><div><b data-field="depth">${num(data.depth)}</b> depth</div>` +
      `<div><b data-field="message_count">${num(data.message_count)}</b> messages</div>` +
      `<div><b data-field="channels">${(data.channels || []).length}</b> channels</div>` +
      `<div><b data-field="nodes">${(data.nodes || []).length}</b> nodes</div></section>` +
      (await charts(topic, "")) +
      graphite(`nonNegativeDerivative(sumSeries(${statsdKey("counter", `topic.${topic}.message_count`)}))`) +
      `<h2>Nodes</h2><table id="nodes"><thead><tr><th>Node</th><th>Depth</th><th>Memory</th><th>Backend</th>` +
      `<th>Messages</th><th>Channels</th><th></th></tr></thead><tbody>${nodes}</tbody></table>` +
      `<h2>Channels</h2><table id="channels"><thead><tr><th>Channel</th><th>Depth</th><th>Memory</th><th>Backend</th>` +
      `<th>In flight</th><th>Deferred</th><th>Requeued</th><th>Timed out</th><th>Messages</th><th>Clients</th>` +
      `</tr></thead><tbody>${channels || '<tr><td class="empty" colspan="10">no channels</td></tr>'}</tbody></table>`;
    const path = `/api/topics/${enc(topic)}`;
    bindActions(main, {
      pause: () => act(`Pause topic ${topic} on every node?`, "POST", path, {action: "pause"}),
      unpause: () => act(`Unpause topic ${topic}?`, "POST", path, {action: "unpause"}),
      empty: () => act(`Empty topic ${topic}: drop every message it holds?`, "POST", path, {action: "empty"}),
      delete: () => act(`Delete topic ${topic} and all its channels?`, "DELETE", path, null, "/topics"),
    });
    main.querySelectorAll("button[data-tombstone]").forEach((btn) => btn.addEventListener("click", () =>
      act(`Tombstone ${btn.dataset.tombstone} for topic ${topic} (lookupd stops listing it, the node deletes the topic)?`,
          "DELETE", `/api/nodes/${enc(btn.dataset.tombstone)}`, {topic: topic})));
  }

  async function channelView(main, topic, channel) {
    let data;
    try {
      data = await api(`/api/topics/${enc(topic)}/${enc(channel)}`);
    } catch (e) {
      if (/TOPIC_NOT_FOUND|failed to query any nsqd: $/.test(e.message)) {
        main.innerHTML = notFound(`Topic ${topic}`);
        return;
      }
      throw e;
    }
    if (!data.channel_name) { main.innerHTML = notFound(`Channel ${topic}/${channel}`); return; }
    document.title = `${topic}/${channel} - nsqtw-admin`;
    const nodes = (data.nodes || []).map((n) =>
      `<tr data-node="${esc(n.node)}"><td>${link(`/nodes/${enc(n.node)}`, n.node)} ${badge(n.paused, "paused")}</td>` +
      depthCells(n) + `<td data-field="in_flight_count">${num(n.in_flight_count)}</td>` +
      `<td data-field="deferred_count">${num(n.deferred_count)}</td>` +
      `<td data-field="requeue_count">${num(n.requeue_count)}</td>` +
      `<td data-field="timeout_count">${num(n.timeout_count)}</td>` +
      `<td data-field="message_count">${num(n.message_count)}</td>` +
      `<td data-field="client_count">${num(n.client_count)}</td></tr>`).join("");
    const clients = (data.clients || []).map((c) =>
      `<tr data-client="${esc(c.remote_address)}"><td>${esc(c.node)}</td>` +
      `<td>${esc(c.client_id)}<br><small>${esc(c.hostname)}</small></td>` +
      `<td data-field="remote_address">${esc(c.remote_address)}</td>` +
      `<td data-field="user_agent">${esc(c.user_agent || "")}<br><small>${esc(c.version)}</small></td>` +
      `<td data-field="ready_count">${num(c.ready_count)}</td>` +
      `<td data-field="in_flight_count">${num(c.in_flight_count)}</td>` +
      `<td data-field="message_count">${num(c.message_count)}</td>` +
      `<td data-field="finish_count">${num(c.finish_count)}</td>` +
      `<td data-field="requeue_count">${num(c.requeue_count)}</td>` +
      `<td data-field="flags">${[c.tls ? "TLS " + (c.tls_version || "") : "", c.snappy ? "snappy" : "",
        c.deflate ? "deflate" : "", c.sample_rate ? `sample ${c.sample_rate}%` : "",
        c.authed ? `auth ${c.auth_identity}` : ""].filter(Boolean).map(esc).join(", ")}</td>` +
      `<td data-field="connected">${duration(c.connected)}</td></tr>`).join("");
    main.innerHTML = `<nav class="crumbs">${link("/topics", "Topics")} / ` +
      `${link(`/topics/${enc(topic)}`, topic)} / ${esc(channel)}</nav>` +
      `<h1>Channel <span id="channel-name">${esc(channel)}</span> ${badge(data.paused, "paused")}</h1>` +
      warning(data.message) + `<div id="flash" class="alert" hidden></div>` +
      actions([{id: data.paused ? "unpause" : "pause", label: data.paused ? "Unpause channel" : "Pause channel"},
               {id: "empty", label: "Empty channel", danger: true},
               {id: "delete", label: "Delete channel", danger: true}]) +
      `<section class="totals" id="totals"><div><b data-field="depth">${num(data.depth)}</b> depth</div>` +
      `<div><b data-field="in_flight_count">${num(data.in_flight_count)}</b> in flight</div>` +
      `<div><b data-field="message_count">${num(data.message_count)}</b> messages</div>` +
      `<div><b data-field="client_count">${num(data.client_count)}</b> clients</div></section>` +
      (await charts(topic, channel)) +
      graphite(`nonNegativeDerivative(sumSeries(${statsdKey("counter", `topic.${topic}.channel.${channel}.message_count`)}))`) +
      `<h2>Nodes</h2><table id="nodes"><thead><tr><th>Node</th><th>Depth</th><th>Memory</th><th>Backend</th>` +
      `<th>In flight</th><th>Deferred</th><th>Requeued</th><th>Timed out</th><th>Messages</th><th>Clients</th>` +
      `</tr></thead><tbody>${nodes}</tbody></table>` +
      `<h2>Clients</h2><table id="clients"><thead><tr><th>Node</th><th>Client</th><th>Address</th>` +
      `<th>User agent / protocol</th><th>RDY</th><th>In flight</th><th>Messages</th><th>Finished</th>` +
      `<th>Requeued</th><th>TLS / compression</th><th>Connected</th></tr></thead>` +
      `<tbody>${clients || '<tr><td class="empty" colspan="11">no clients</td></tr>'}</tbody></table>`;
    const path = `/api/topics/${enc(topic)}/${enc(channel)}`;
    bindActions(main, {
      pause: () => act(`Pause channel ${channel} on every node?`, "POST", path, {action: "pause"}),
      unpause: () => act(`Unpause channel ${channel}?`, "POST", path, {action: "unpause"}),
      empty: () => act(`Empty channel ${channel}: drop every message it holds?`, "POST", path, {action: "empty"}),
      delete: () => act(`Delete channel ${channel}?`, "DELETE", path, null, `/topics/${enc(topic)}`),
    });
  }

  async function nodesView(main) {
    const data = await api("/api/nodes");
    document.title = "Nodes - nsqtw-admin";
    const lookupds = (S.nsqlookupd || []).length;
    const rows = (data.nodes || []).map((n) => {
      const http = `${n.broadcast_address}:${n.http_port}`;
      const topics = (n.topics || []).map((t) => t.tombstoned ? `<s title="tombstoned">${esc(t.topic)}</s>` :
        link(`/topics/${enc(t.topic)}`, t.topic)).join(", ");
      return `<tr data-node="${esc(http)}"><td>${link(`/nodes/${enc(http)}`, n.hostname)}</td>` +
        `<td>${esc(n.broadcast_address)}</td><td data-field="tcp_port">${esc(n.tcp_port)}</td>` +
        `<td data-field="http_port">${esc(n.http_port)}</td>` +
        `<td>${esc(n.version)} ${badge(n.out_of_date, "out of date")}</td>` +
        (lookupds ? `<td>${(n.remote_addresses || []).map(esc).join("<br>")}` +
          `${badge((n.remote_addresses || []).length !== lookupds, "not on every lookupd")}</td>` : "") +
        `<td data-field="topics">${topics}</td></tr>`;
    }).join("");
    main.innerHTML = `<h1>Nodes</h1>${warning(data.message)}<table id="nodes"><thead><tr><th>Hostname</th>` +
      `<th>Broadcast address</th><th>TCP port</th><th>HTTP port</th><th>Version</th>` +
      (lookupds ? "<th>Lookupd connections</th>" : "") + `<th>Topics</th></tr></thead><tbody>${rows ||
        '<tr><td class="empty" colspan="7">no nodes</td></tr>'}</tbody></table>`;
  }

  async function nodeView(main, node) {
    let data;
    try {
      data = await api(`/api/nodes/${enc(node)}`);
    } catch (e) {
      if (e.status === 404) { main.innerHTML = notFound(`Node ${node}`); return; }
      throw e;
    }
    document.title = `${node} - nsqtw-admin`;
    const rows = (data.topics || []).map((t) =>
      `<tr class="topic" data-topic="${esc(t.topic_name)}"><td>${link(`/topics/${enc(t.topic_name)}`, t.topic_name)}` +
      ` ${badge(t.paused, "paused")}</td>` + depthCells(t) + `<td></td>` +
      `<td data-field="message_count">${num(t.message_count)}</td><td></td></tr>` +
      (t.channels || []).map((c) =>
        `<tr class="channel" data-channel="${esc(t.topic_name)}/${esc(c.channel_name)}"><td>↳ ` +
        `${link(`/topics/${enc(t.topic_name)}/${enc(c.channel_name)}`, c.channel_name)} ${badge(c.paused, "paused")}</td>` +
        depthCells(c) + `<td data-field="in_flight_count">${num(c.in_flight_count)}</td>` +
        `<td data-field="message_count">${num(c.message_count)}</td>` +
        `<td data-field="clients">${num((c.clients || []).length)}</td></tr>`).join("")).join("");
    main.innerHTML = `<nav class="crumbs">${link("/nodes", "Nodes")} / ${esc(node)}</nav>` +
      `<h1>Node <span id="node-name">${esc(node)}</span></h1>${warning(data.message)}` +
      `<section class="totals" id="totals"><div><b data-field="total_messages">${num(data.total_messages)}</b> messages</div>` +
      `<div><b data-field="total_clients">${num(data.total_clients)}</b> clients</div>` +
      `<div><b data-field="topics">${(data.topics || []).length}</b> topics</div></section>` +
      `<table id="node-topics"><thead><tr><th>Topic / channel</th><th>Depth</th><th>Memory</th><th>Backend</th>` +
      `<th>In flight</th><th>Messages</th><th>Clients</th></tr></thead><tbody>${rows ||
        '<tr><td class="empty" colspan="7">no topics</td></tr>'}</tbody></table>`;
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
      (producers[t.topic] = producers[t.topic] || []).push({node: `${n.broadcast_address}:${n.http_port}`,
                                                             tombstoned: t.tombstoned});
    }));
    const rows = Object.keys(producers).sort().map((t) =>
      `<tr data-topic="${esc(t)}"><td>${link(`/topics/${enc(t)}`, t)}</td><td>` +
      producers[t].map((p) => p.tombstoned ? `<s title="tombstoned">${esc(p.node)}</s> <span class="badge">tombstoned</span>` :
        link(`/nodes/${enc(p.node)}`, p.node)).join("<br>") + `</td></tr>`).join("");
    const orphans = Object.keys(inactive.topics || {}).sort().map((t) =>
      `<tr data-topic="${esc(t)}"><td>${esc(t)}</td><td>${(inactive.topics[t] || []).map(esc).join(", ")}</td>` +
      `<td>${S.is_admin ? `<button class="small danger" data-delete-topic="${esc(t)}">Delete</button>` : ""}</td></tr>`).join("");
    main.innerHTML = `<h1>Lookup</h1>${warning(nodes.message || inactive.message)}<div id="flash" class="alert" hidden></div>` +
      `<p>nsqlookupd: ${lookupds.map(esc).join(", ")}</p>` +
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
      `<section class="charts">${chart("rate", counter.rates, "rate", "msg/s")}</section>`;
  }

  // --- routing -----------------------------------------------------------------------------------

  function route() {
    let path = decodeURI(location.pathname);
    if (BASE && path.startsWith(BASE)) { path = path.slice(BASE.length); }
    const parts = path.split("/").filter((p) => p !== "");
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
