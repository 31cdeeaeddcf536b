// The operator's page: reads the admin API every few seconds and draws it.
// Everything shown comes from the API with the admin token the operator gave
// (kept in this tab's sessionStorage), or none on an anonymous loopback
// service. Text goes in with textContent only: nothing from the API is ever
// parsed as markup.
"use strict";

(function () {
  const REFRESH_MS = 5000;
  const TOKEN_KEY = "order-timeout.admin-token";
  const SVG = "http://www.w3.org/2000/svg";
  const MINUTE = 60000;

  let refreshes = 0;
  let lookedUp = null;
  let timer = null;

  const $ = (id) => document.getElementById(id);

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  // One admin call: the parsed answer and its status; a 401 asks for a token.
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (method !== "GET") {
      // The API refuses a state-changing request that does not say JSON.
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    const resp = await fetch(path, init);
    let data = null;
    try {
      data = await resp.json();
    } catch (e) {
      data = { error: "HTTP " + resp.status + " (not JSON)" };
    }
    if (resp.status === 401 || resp.status === 403) {
      askForToken(data && data.error);
    }
    return { status: resp.status, data };
  }

  function failure(answer) {
    return (answer.data && answer.data.error) || "HTTP " + answer.status;
  }

  function askForToken(message) {
    $("auth").hidden = false;
    if (message) $("auth-message").textContent = message;
  }

  function show(id, message) {
    const el = $(id);
    el.hidden = !message;
    el.textContent = message || "";
  }

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  // A table row; a cell is a node, a value, or [field, value] for a cell
  // the test reads by its data-field. An absent value shows as "–".
  function row(cells, attrs) {
    const tr = el("tr", null, attrs);
    const shown = (v) => (v === null || v === undefined ? "–" : v);
    for (const cell of cells) {
      if (cell instanceof Node) {
        const td = el("td");
        td.appendChild(cell);
        tr.appendChild(td);
      } else if (Array.isArray(cell)) {
        tr.appendChild(el("td", shown(cell[1]), { "data-field": cell[0] }));
      } else {
        tr.appendChild(el("td", shown(cell)));
      }
    }
    return tr;
  }

  function fill(tbody, rows, empty, columns) {
    tbody.replaceChildren(...rows);
    if (!rows.length) {
      const td = el("td", empty, { colspan: String(columns), class: "muted" });
      const tr = el("tr");
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
  }

  // An empty table with these column heads, for rows that `fill` puts in.
  function table(heads, attrs) {
    const t = el("table", null, attrs);
    const tr = el("tr");
    for (const h of heads) tr.appendChild(el("th", h));
    t.appendChild(el("thead")).appendChild(tr);
    t.appendChild(el("tbody"));
    return t;
  }

  function duration(ms) {
    if (ms === null || ms === undefined) return "–";
    const s = Math.round(ms / 1000);
    if (Math.abs(s) < 120) return s + " s";
    const m = Math.round(s / 60);
    if (Math.abs(m) < 120) return m + " min";
    return (m / 60).toFixed(1) + " h";
  }

  // ---- the first screen ----------------------------------------------------

  async function refresh() {
    try {
      const [overview, deadlines, shadow] = await Promise.all([
        api("GET", "/admin/overview"),
        api("GET", "/admin/deadlines?next=1h"),
        api("GET", "/admin/shadow"),
      ]);
      if (overview.status !== 200) {
        show("error", "GET /admin/overview: " + failure(overview));
        return;
      }
      show("error", null);
      $("auth").hidden = true;
      drawOverview(overview.data);
      if (deadlines.status === 200) {
        show("deadlines-error", null);
        drawDeadlines(deadlines.data);
      } else {
        show("deadlines-error", "GET /admin/deadlines: " + failure(deadlines));
      }
      // 409: not in shadow mode, which is the usual case: no card at all.
      $("shadow").hidden = shadow.status === 409;
      if (shadow.status === 200) {
        show("shadow-error", null);
        drawShadow(shadow.data);
      } else if (shadow.status !== 409) {
        show("shadow-error", "GET /admin/shadow: " + failure(shadow));
      }
      if (lookedUp !== null) await lookup(lookedUp);
      refreshes += 1;
      const updated = $("updated");
      updated.dataset.count = String(refreshes);
      updated.textContent = "updated " + new Date().toLocaleTimeString() + ", every " + REFRESH_MS / 1000 + " s";
    } catch (e) {
      show("error", "the service did not answer: " + e.message);
    }
  }

  function drawOverview(o) {
    $("instance").textContent = o.instance;
    $("delay-mode").textContent = o.delay_mode || "not resolved yet";
    $("now").textContent = o.now;
    $("overdue-after").textContent = duration(o.overdue_after_ms);
    const nodes = $("broker-nodes");
    nodes.textContent = o.broker.nodes.length ? o.broker.nodes.join(", ") : "–";
    nodes.dataset.nodes = o.broker.nodes.join(",");
    const state = $("broker-state");
    state.dataset.reachable = String(o.broker.reachable);
    state.dataset.connected = String(o.broker.connected);
    state.textContent = !o.broker.connected ? "disconnected" : o.broker.reachable ? "connected" : "connected, management API unreadable";
    state.className = "badge " + (o.broker.connected && o.broker.reachable ? "ok" : "bad");
    state.title = o.broker.error || "";
    drawKinds(o.kinds);
    drawRoles(o.roles);
    drawParked(o.parked);
  }

  function drawKinds(kinds) {
    const box = $("kinds");
    for (const k of kinds) {
      let card = box.querySelector('[data-kind="' + k.kind + '"]');
      if (!card) {
        card = el("article", null, { class: "kind", "data-kind": k.kind });
        card.appendChild(el("h3", k.kind));
        const numbers = el("dl", null, { class: "numbers" });
        for (const [field, label] of [["waiting", "waiting"], ["overdue", "overdue"], ["due-total", "due next hour"]]) {
          const d = el("div");
          d.appendChild(el("dt", label));
          d.appendChild(el("dd", "–", { "data-field": field }));
          numbers.appendChild(d);
        }
        card.appendChild(numbers);
        card.appendChild(el("div", null, { class: "chart", "data-chart": k.kind }));
        box.appendChild(card);
      }
      card.querySelector('[data-field="waiting"]').textContent = k.waiting;
      const overdue = card.querySelector('[data-field="overdue"]');
      overdue.textContent = k.overdue;
      overdue.classList.toggle("alarm", k.overdue > 0);
    }
  }

  function drawDeadlines(d) {
    for (const k of d.kinds) {
      const card = $("kinds").querySelector('[data-kind="' + k.kind + '"]');
      if (!card) continue;
      card.querySelector('[data-field="due-total"]').textContent = k.total;
      card.dataset.pastDeadline = String(k.overdue);
      const chart = card.querySelector(".chart");
      chart.replaceChildren(bars(k.kind, k.minutes, Date.parse(d.now), d.next_ms));
    }
  }

  // One bar per minute of the window, as inline SVG; its height is the
  // minute's count against the busiest minute's.
  function bars(kind, minutes, now, nextMs) {
    const first = Math.floor(now / MINUTE) * MINUTE;
    const slots = Math.max(1, Math.ceil((now + nextMs - first) / MINUTE));
    // About the size it is drawn at, so that its labels stay readable.
    const width = 320, height = 64, axis = 12, top = 4;
    const slot = width / slots;
    const max = Math.max(1, ...minutes.map((m) => m.due));
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + width + " " + (height + axis));
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", kind + ": deadlines per minute in the next " + duration(nextMs));
    svg.setAttribute("data-kind", kind);
    const base = document.createElementNS(SVG, "line");
    for (const [k, v] of [["x1", 0], ["x2", width], ["y1", height], ["y2", height], ["class", "axis"]]) base.setAttribute(k, v);
    svg.appendChild(base);
    for (const m of minutes) {
      const start = Date.parse(m.start);
      const i = Math.round((start - first) / MINUTE);
      const h = Math.max(1, ((height - top) * m.due) / max);
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("x", (i * slot + 0.5).toFixed(1));
      rect.setAttribute("y", (height - h).toFixed(1));
      rect.setAttribute("width", Math.max(1, slot - 1).toFixed(1));
      rect.setAttribute("height", h.toFixed(1));
      rect.setAttribute("data-minute", m.start);
      rect.setAttribute("data-due", String(m.due));
      const title = document.createElementNS(SVG, "title");
      title.textContent = m.start.slice(11, 16) + " UTC: " + m.due + " due";
      rect.appendChild(title);
      svg.appendChild(rect);
    }
    for (const [x, label, anchor] of [[0, "now", "start"], [width / 2, "+" + duration(nextMs / 2), "middle"], [width, "+" + duration(nextMs), "end"]]) {
      const text = document.createElementNS(SVG, "text");
      text.setAttribute("x", x);
      text.setAttribute("y", height + axis - 2);
      text.setAttribute("text-anchor", anchor);
      text.textContent = label;
      svg.appendChild(text);
    }
    if (!minutes.length) {
      const text = document.createElementNS(SVG, "text");
      text.setAttribute("x", width / 2);
      text.setAttribute("y", height / 2);
      text.setAttribute("text-anchor", "middle");
      text.setAttribute("class", "muted");
      text.textContent = "no deadline in the next " + duration(nextMs);
      svg.appendChild(text);
    }
    return svg;
  }

  // Shadow mode's counts per kind, as the report names them, and the lists
  // of its first orders that stand out.
  const SHADOW_COUNTS = [
    ["would_close", "would close"],
    ["shop_closed_after_us", "shop closed after us"],
    ["shop_closed_before_us", "shop closed before us"],
    ["closed_early", "closed before their deadline"],
    ["still_open", "still open"],
    ["disagreements", "disagreements"],
  ];
  const SHADOW_LISTS = [["early", "closed early"], ["disagreements", "disagreement"], ["still_open", "still open"]];

  function drawShadow(s) {
    const box = $("shadow-kinds");
    for (const k of s.kinds) {
      let card = box.querySelector('[data-kind="' + k.kind + '"]');
      if (!card) {
        card = el("article", null, { class: "kind", "data-kind": k.kind });
        card.appendChild(el("h3", k.kind));
        const numbers = el("dl", null, { class: "numbers" });
        for (const [field, label] of SHADOW_COUNTS) {
          const d = el("div");
          d.appendChild(el("dt", label));
          d.appendChild(el("dd", "–", { "data-field": field }));
          numbers.appendChild(d);
        }
        card.appendChild(numbers);
        card.appendChild(table(["lateness", "orders", "p50 ms", "p99 ms", "max ms"], { "data-table": "lateness" }));
        card.appendChild(table(["list", "order", "shop's status", "ms after its deadline"], { "data-table": "first" }));
        box.appendChild(card);
      }
      const r = k.report;
      for (const [field] of SHADOW_COUNTS) card.querySelector('[data-field="' + field + '"]').textContent = r[field];
      // What to look into before a cut-over: an early cron, a late payment.
      for (const field of ["closed_early", "disagreements"]) {
        card.querySelector('[data-field="' + field + '"]').classList.toggle("alarm", r[field] > 0);
      }
      const spread = (who, label, l) => row([label, ["n", l.n], ["p50", l.p50], ["p99", l.p99], ["max", l.max]], { "data-who": who });
      fill(card.querySelector('[data-table="lateness"]').tBodies[0],
        [spread("shop", "the shop's", r.shop_late_ms), spread("ours", "ours", r.our_late_ms)], "", 5);
      const rows = [];
      for (const [list, label] of SHADOW_LISTS) {
        for (const o of r["first_" + list]) {
          rows.push(row([label, ["order", o.order_id], ["status", o.status], ["after", o.after_deadline_ms]],
            { "data-list": list }));
        }
      }
      fill(card.querySelector('[data-table="first"]').tBodies[0], rows, "no order closed early, disagreed on or left open", 4);
    }
  }

  function drawRoles(roles) {
    const rows = roles.map((r) => {
      const state = !r.enabled ? "disabled" : r.paused ? "paused" : "running";
      const by = r.pauses.map((p) => p.scope + ": " + p.by + (p.reason ? " (" + p.reason + ")" : "")).join("; ");
      const buttons = el("span", null, { class: "actions" });
      for (const action of ["pause", "resume"]) {
        const b = el("button", action, { type: "button", "data-action": action, "data-role": r.role });
        b.disabled = !r.enabled || (action === "pause" ? r.paused : !r.paused);
        b.addEventListener("click", () => act(action, r.role, b));
        buttons.appendChild(b);
      }
      return row(
        [r.role, ["state", state], r.since, by || null, buttons],
        { "data-role": r.role, "data-paused": String(r.paused), class: state },
      );
    });
    fill($("roles").tBodies[0], rows, "no role", 5);
  }

  async function act(action, role, button) {
    button.disabled = true;
    const body = action === "pause" ? { reason: "paused from the page /ui" } : {};
    const answer = await api("POST", "/admin/" + action + "/" + encodeURIComponent(role), body);
    show("roles-error", answer.status === 200 ? null : "POST /admin/" + action + "/" + role + ": " + failure(answer));
    await refresh();
  }

  function drawParked(p) {
    $("parked").dataset.checked = String(p.checked);
    $("parked-queue").textContent = p.queue;
    $("parked-total").textContent = p.checked ? p.total : "?";
    $("parked-total").dataset.total = String(p.total);
    let note = "";
    if (!p.checked) note = "not read: " + (p.error || "unknown");
    else if (p.read < p.total) note = "(reasons of the first " + p.read + ")";
    $("parked-note").textContent = note;
    const rows = p.by_reason.map((r) => row([r.reason, ["count", r.count]], { "data-reason": r.reason }));
    fill($("parked").tBodies[0], rows, p.checked ? "none" : "not read", 2);
  }

  // ---- one order -----------------------------------------------------------

  async function lookup(id) {
    const answer = await api("GET", "/admin/orders/" + encodeURIComponent(id));
    if (answer.status !== 200) {
      show("order-error", failure(answer));
      $("order").hidden = true;
      $("order").dataset.id = "";
      return;
    }
    show("order-error", null);
    drawOrder(answer.data);
  }

  function drawOrder(o) {
    const box = $("order");
    box.hidden = false;
    box.dataset.id = o.id;
    const put = (field, value) => (box.querySelector('[data-field="' + field + '"]').textContent = value);
    put("id", o.id);
    put("status", o.status);
    put("source", o.source + (o.status_raw ? " (" + o.status_raw + " in the shop's table)" : ""));
    put("now", o.now);
    fill($("order-deadlines").tBodies[0],
      (o.deadlines || []).map((d) => row([d.kind, d.at, d.passed ? "yes" : "no"], { "data-kind": d.kind })),
      "no deadline", 3);
    fill($("order-waiting").tBodies[0],
      (o.waiting || []).map((w) => row([w.kind, w.due_at, duration(w.due_in_ms)], { "data-kind": w.kind })),
      "nothing waiting", 3);
    fill($("order-transitions").tBodies[0],
      (o.transitions || []).map((t, i) => row(
        [["at", t.at], ["event", t.event], ["from", t.from], ["to", t.to], ["cause", t.cause], t.kind,
          t.late_ms === null || t.late_ms === undefined ? null : duration(t.late_ms), t.instance, t.detail],
        { "data-index": String(i) })),
      "no transition", 9);
    fill($("order-events").tBodies[0],
      (o.events || []).map((e) => row([["event", e.event], ["state", e.state], e.at, e.reason])),
      "no event", 4);
    $("order-parked-note").textContent = o.parked_checked ? "" : "the parked queue was not read: " + (o.parked_error || "unknown");
    fill($("order-parked").tBodies[0],
      (o.parked || []).map((p) => row([p.kind, ["reason", p.reason], ["parked_by", p.parked_by], p.queue, p.at])),
      o.parked_checked ? "none" : "not read", 5);
  }

  // ---- start ---------------------------------------------------------------

  function start() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token").value.trim();
      if (value) sessionStorage.setItem(TOKEN_KEY, value);
      $("token").value = "";
      refresh();
    });
    $("lookup-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const id = $("order-id").value.trim();
      if (!id) return;
      lookedUp = id;
      lookup(id);
    });
    refresh();
    timer = setInterval(refresh, REFRESH_MS);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
  window.addEventListener("pagehide", () => clearInterval(timer));
})();
