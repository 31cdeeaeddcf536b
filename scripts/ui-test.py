#!/usr/bin/env python3
"""The operator's page /ui in a real browser: Debian's Chromium, headless,
driven by Playwright, against the release binary.

For each delay mode (ttl, then plugin) the binary serves on a PostgreSQL
database and a broker vhost of its own, with an admin token. Orders are
placed through the API: some due in 10, 25 and 40 minutes (the chart's
bars), some with a 1-second window while the payment consumer is paused, so
that they stay overdue, one cancelled by the buyer (its transitions for the
lookup); two messages the router parks (no x-delay, a body that is not
JSON). Then the page is opened, which asks for the token; the token is
typed in; and what the page shows must equal what the API answers:
the instance, delay mode and broker nodes, each kind's waiting and overdue
orders (/admin/overview), the due-in-the-next-hour totals and the bars
minute by minute (/admin/deadlines), every role's paused state
(/admin/status) and the parked messages by reason. Pause is clicked on a
role and /admin/status must say it is paused, resume and it must say it
runs; an order is looked up and its status and transitions must equal
/admin/orders/{id}, an unknown one must show the API's error. The page may
log no error but failed loads (the 401 before the token), and may request
nothing from another origin. A screenshot of the page is saved. The
shadow mode card stays hidden there (/admin/shadow answers 409).

Then one run in shadow mode (`orders.shadow`, on a shop's own table: the
mapping of tests/api/cron.rs) on a database and vhost of its own: four
orders due in a second; the sweeper decides three of them, then a cron-like
UPDATE closes one and the shop takes a late payment for another, one stays
open; the cron closed the fourth before its deadline, which its timer finds.
Once /admin/shadow counts all that, the card must show the API's counts,
both latenesses and the first orders of each list.

    .venv/bin/python scripts/ui-test.py [--binary target/release/order-timeout]
        [--modes ttl,plugin] [--screenshot target/ui-test/ui.png]
        [--shadow-screenshot target/ui-test/ui-shadow.png]

`--screenshot docs/images/ui.png` renews the documentation's picture.
Needs Playwright (rabbitmq/examples/python/requirements.txt), /usr/bin/chromium
(`make browser`), psql, the local RabbitMQ (AMQP 5672, management API 15672,
guest/guest) and PostgreSQL (127.0.0.1:5432, user postgres, trust). A plugin
mode run on a broker without the delayed-message plugin is skipped, saying so,
unless ORDER_TIMEOUT_REQUIRE_PLUGIN is set.
"""

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

from checks import Checks, Failed

ROOT = Path(__file__).resolve().parent.parent
MGMT = "http://127.0.0.1:15672/api"
GUEST = "Basic " + base64.b64encode(b"guest:guest").decode()
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The entry exchange: `amqp.prefix`, left at its default.
ENTRY = "order.timeouts"
# The role whose pause and resume are clicked: one the scenario does not need.
CLICKED_ROLE = "receipt"


def http(method, url, body=None, auth=None, timeout=10):
    """One request; the status and the answer (JSON when it is)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, method=method, data=data)
    if auth:
        req.add_header("authorization", auth)
    if body is not None or method in ("POST", "PUT"):
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text) if text else None
    except json.JSONDecodeError:
        return status, text


def run(cmd, env=None, timeout=60):
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise Failed(f"{' '.join(map(str, cmd))} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(what, check, within=30.0, every=0.2):
    """Polls `check` until it returns something true; that value."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {within:.0f} s waiting for {what}")
        time.sleep(every)


def plugin_available():
    status, overview = http("GET", f"{MGMT}/overview", auth=GUEST)
    if status != 200:
        raise Failed(f"the management API at {MGMT} answered {status}")
    return any(t.get("name") == "x-delayed-message" for t in overview.get("exchange_types", []))


class Service:
    """The release binary serving on a database and vhost of its own, named
    after the run (its delay mode, or `shadow`): `setup` runs on the new
    database before it starts, `settings` are more of its environment."""

    def __init__(self, binary, mode, work, cleanups, name=None, setup=(), settings=None):
        self.mode = mode
        self.name = name = name or mode
        self.token = "ui-admin-" + secrets.token_hex(16)
        run_id = f"{os.getpid()}-{name}-{secrets.token_hex(3)}"
        self.database = f"ot_ui_test_{run_id.replace('-', '_')}"
        # `ot-test-`: `make test` removes the plugin timers of deleted test vhosts.
        self.vhost = f"ot-test-ui-{run_id}"
        self.instance = f"ui-test-{name}"
        self.env = env = {k: v for k, v in os.environ.items() if not k.startswith("ORDER_TIMEOUT")}
        psql = ["psql", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"]
        run(psql + [f'CREATE DATABASE "{self.database}"'], env=env)
        cleanups.append(lambda: run(psql + [f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'], env=env))
        self.psql = ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres", "-d", self.database]
        for statement in setup:
            self.sql(statement)
        vhost = urllib.parse.quote(self.vhost, safe="")
        status, _ = http("PUT", f"{MGMT}/vhosts/{vhost}", {}, GUEST)
        if status not in (201, 204):
            raise Failed(f"cannot create vhost {self.vhost} through {MGMT}: {status}")
        cleanups.append(lambda: http("DELETE", f"{MGMT}/vhosts/{vhost}", None, GUEST))
        http("PUT", f"{MGMT}/permissions/{vhost}/guest", {"configure": ".*", "write": ".*", "read": ".*"}, GUEST)
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        env.update(
            ORDER_TIMEOUT__DATABASE__URL=f"postgres://postgres@127.0.0.1:5432/{self.database}",
            ORDER_TIMEOUT__AMQP__URL=f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
            ORDER_TIMEOUT__AMQP__DELAY_MODE=mode,
            ORDER_TIMEOUT__AMQP__INSTANCE=self.instance,
            ORDER_TIMEOUT__HTTP__BIND=f"127.0.0.1:{port}",
            ORDER_TIMEOUT__HTTP__ADMIN_TOKENS=self.token,
            # Overdue as soon as the deadline passed, so the page shows some.
            ORDER_TIMEOUT__METRICS__OVERDUE_AFTER="0s",
            ORDER_TIMEOUT__LOG__FORMAT="json",
        )
        env.update(settings or {})
        self.log_path = work / f"serve-{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT)
        cleanups.append(self.stop)

        def ready():
            if self.proc.poll() is not None:
                raise Failed(f"serve exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                return http("GET", self.base + "/readyz", timeout=2)[0] == 200
            except OSError:
                return False

        wait(f"{name}: the service ready (/readyz)", ready, within=90)

    def sql(self, statement):
        """One statement on the service's database, as the shop would run it."""
        return run(self.psql + ["-At", "-c", statement], env=self.env).stdout.strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def api(self, method, path, body=None):
        return http(method, self.base + path, body, auth=f"Bearer {self.token}")

    def ok(self, method, path, body=None, expect=(200, 201)):
        status, answer = self.api(method, path, body)
        if status not in expect:
            raise Failed(f"{method} {path} answered {status}: {answer}")
        return answer


def publish(service, routing_key, headers, payload):
    """A message to the entry exchange, through the management API."""
    vhost = urllib.parse.quote(service.vhost, safe="")
    body = {
        "properties": {"content_type": "application/json", "delivery_mode": 2, "headers": headers},
        "routing_key": routing_key,
        "payload": payload,
        "payload_encoding": "string",
    }
    status, answer = http("POST", f"{MGMT}/exchanges/{vhost}/{ENTRY}/publish", body, GUEST)
    if status != 200 or not answer.get("routed"):
        raise Failed(f"publishing to {ENTRY} in {service.vhost}: {status} {answer}")


def prepare(service, checks):
    """Orders and parked messages; what the page must show of them."""
    m = service.mode
    service.ok("PUT", "/inventory/UI", {"available": 1000})
    # Shared: the sweeper leaves a paused consumer's kind alone too.
    service.ok("POST", "/admin/pause/payment", {"reason": "ui-test: keeps the overdue orders overdue"})
    due = {"10m": 3, "25m": 2, "40m": 1}
    for window, count in due.items():
        for _ in range(count):
            service.ok("POST", "/orders", {"items": [{"sku": "UI", "quantity": 1}], "payment_window": window})
    overdue = 2
    for _ in range(overdue):
        service.ok("POST", "/orders", {"items": [{"sku": "UI", "quantity": 1}], "payment_window": "1s"})
    cancelled = service.ok("POST", "/orders", {"items": [{"sku": "UI", "quantity": 2}], "payment_window": "10m"})["id"]
    service.ok("POST", f"/orders/{cancelled}/cancel")
    paid = service.ok("POST", "/orders", {"items": [{"sku": "UI", "quantity": 1}], "payment_window": "10m"})["id"]
    service.ok("POST", f"/orders/{paid}/pay")
    publish(service, "payment", {}, json.dumps({"order_id": "1", "kind": "payment"}))
    publish(service, "payment", {}, json.dumps({"order_id": "2", "kind": "payment"}))
    publish(service, "payment", {"x-delay": 60000}, "not json")

    def settled():
        _, o = service.api("GET", "/admin/overview")
        pay = next((k for k in o.get("kinds", []) if k["kind"] == "payment"), {})
        return o if pay.get("overdue") == overdue and o["parked"].get("read") == 3 else None

    o = wait(f"{m}: the overdue orders and the parked messages in /admin/overview", settled, every=0.5)
    pay = next(k for k in o["kinds"] if k["kind"] == "payment")
    checks.eq(f"{m}: /admin/overview: payment orders waiting", pay["waiting"], sum(due.values()) + overdue)
    checks.eq(
        f"{m}: /admin/overview: parked by reason",
        o["parked"]["by_reason"],
        [{"reason": "missing_delay", "count": 2}, {"reason": "invalid_body", "count": 1}],
    )
    return {"cancelled": cancelled, "paid": paid, "due": due, "overdue": overdue}


def page_state(page):
    """What the page shows, read from its ids and data attributes."""
    return page.evaluate(
        """() => {
      const text = (sel) => { const e = document.querySelector(sel); return e ? e.textContent.trim() : null; };
      const kinds = {};
      for (const card of document.querySelectorAll('#kinds [data-kind]')) {
        if (card.tagName === 'svg') continue;
        const f = (name) => text(`#kinds article[data-kind="${card.dataset.kind}"] [data-field="${name}"]`);
        kinds[card.dataset.kind] = {
          waiting: f('waiting'), overdue: f('overdue'), due_total: f('due-total'),
          bars: [...card.querySelectorAll('rect[data-minute]')].map(r => [r.dataset.minute, Number(r.dataset.due)]),
        };
      }
      const roles = {};
      for (const tr of document.querySelectorAll('#roles tr[data-role]')) roles[tr.dataset.role] = tr.dataset.paused === 'true';
      const parked = {};
      for (const tr of document.querySelectorAll('#parked tr[data-reason]')) parked[tr.dataset.reason] = Number(tr.querySelector('[data-field="count"]').textContent);
      return {
        refreshes: Number(document.getElementById('updated').dataset.count),
        instance: text('#instance'), mode: text('#delay-mode'),
        nodes: document.getElementById('broker-nodes').dataset.nodes,
        kinds, roles, parked, parked_total: text('#parked-total'),
        deadlines_error: document.getElementById('deadlines-error').hidden ? null : text('#deadlines-error'),
        error: document.getElementById('error').hidden ? null : text('#error'),
      };
    }"""
    )


def refreshes(page):
    return page_state(page)["refreshes"]


def next_refresh(page, after):
    wait("the page's next refresh", lambda: refreshes(page) > after, within=15)


def expected_state(service):
    """What the page must show, from the API."""
    _, overview = service.api("GET", "/admin/overview")
    d_status, deadlines = service.api("GET", "/admin/deadlines?next=1h")
    _, status = service.api("GET", "/admin/status")
    kinds = {}
    for k in overview["kinds"]:
        kinds[k["kind"]] = {"waiting": str(k["waiting"]), "overdue": str(k["overdue"])}
    if d_status == 200:
        for k in deadlines["kinds"]:
            if k["kind"] in kinds:
                kinds[k["kind"]]["due_total"] = str(k["total"])
                kinds[k["kind"]]["bars"] = [[m["start"], m["due"]] for m in k["minutes"]]
    return {
        "instance": overview["instance"],
        "mode": overview["delay_mode"],
        "nodes": ",".join(overview["broker"]["nodes"]),
        "kinds": kinds,
        "roles": {r["role"]: r["paused"] for r in status["roles"]},
        "parked": {r["reason"]: r["count"] for r in overview["parked"]["by_reason"]},
        "parked_total": str(overview["parked"]["total"]),
        "deadlines": (d_status, deadlines),
    }


def shown_as_expected(page, service, checks):
    """The page against the API. Both read the same numbers, but at moments
    apart: a difference is read again after the page's next refresh, and
    only one that lasts three refreshes fails."""
    m = service.mode
    for attempt in range(3):
        shown, expected = page_state(page), expected_state(service)
        d_status, deadlines = expected.pop("deadlines")
        got = {k: shown[k] for k in ("instance", "mode", "nodes", "roles", "parked", "parked_total")}
        got["kinds"] = {
            kind: {f: v for f, v in values.items() if d_status == 200 or f in ("waiting", "overdue")}
            for kind, values in shown["kinds"].items()
        }
        if got == expected:
            break
        if attempt == 2:
            checks.eq(f"{m}: the page shows what the API answers", got, expected)
        next_refresh(page, shown["refreshes"])
    checks.eq(f"{m}: page: no error", shown["error"], None)
    checks.eq(f"{m}: page: the instance", shown["instance"], service.instance)
    checks.eq(f"{m}: page: the delay mode", shown["mode"], m)
    checks.ok(f"{m}: page: the broker's nodes ({shown['nodes']})", bool(shown["nodes"]))
    checks.eq(f"{m}: page: every kind", sorted(shown["kinds"]), ["fulfillment", "payment", "receipt"])
    checks.ok(f"{m}: page: payment overdue equals /admin/overview, and is not zero", shown["kinds"]["payment"]["overdue"] not in (None, "0"))
    checks.eq(f"{m}: page: fulfillment waiting equals /admin/overview (the paid order)", shown["kinds"]["fulfillment"]["waiting"], "1")
    checks.eq(f"{m}: page: every role's paused state equals /admin/status", shown["roles"], expected["roles"])
    checks.eq(f"{m}: page: parked by reason equals /admin/overview", shown["parked"], {"missing_delay": 2, "invalid_body": 1})
    if d_status == 200:
        pay = shown["kinds"]["payment"]
        checks.eq(f"{m}: page: bars per minute equal /admin/deadlines", pay["bars"], expected["kinds"]["payment"]["bars"])
        checks.ok(f"{m}: page: the chart has bars ({len(pay['bars'])})", len(pay["bars"]) >= 3)
        checks.eq(f"{m}: page: due in the next hour equals /admin/deadlines (10, 25, 40 minutes, and the cancelled order's not)", pay["due_total"], "6")
    else:
        print(f"  --  {m}: GET /admin/deadlines answered {d_status} ({deadlines}): the chart is not checked")
        checks.ok(f"{m}: page: says the deadlines could not be read", bool(shown["deadlines_error"]))


def click_pause_and_resume(page, service, checks):
    m, role = service.mode, CLICKED_ROLE
    row = f'#roles tr[data-role="{role}"]'
    checks.eq(f"{m}: {role} runs before the click", page.get_attribute(row, "data-paused"), "false")
    page.click(f'{row} button[data-action="pause"]')
    page.wait_for_selector(f'{row}[data-paused="true"]', timeout=15000)
    _, status = service.api("GET", "/admin/status")
    state = next(r for r in status["roles"] if r["role"] == role)
    checks.eq(f"{m}: click on pause: /admin/status says {role} is paused", state["paused"], True)
    checks.eq(f"{m}: the pause's reason says where it came from", state["pauses"][0]["reason"], "paused from the page /ui")
    page.click(f'{row} button[data-action="resume"]')
    page.wait_for_selector(f'{row}[data-paused="false"]', timeout=15000)
    _, status = service.api("GET", "/admin/status")
    state = next(r for r in status["roles"] if r["role"] == role)
    checks.eq(f"{m}: click on resume: /admin/status says {role} runs", state["paused"], False)


def look_up(page, service, checks, order_id):
    m = service.mode
    status, answer = service.api("GET", f"/admin/orders/{order_id}")
    page.fill("#order-id", order_id)
    page.click("#lookup")
    if status != 200:
        print(f"  --  {m}: GET /admin/orders/{order_id} answered {status} ({answer}): the lookup is not checked")
        page.wait_for_selector("#order-error:not([hidden])", timeout=15000)
        checks.ok(f"{m}: lookup: the page shows the API's error", answer.get("error", "") in page.text_content("#order-error"))
        return False
    page.wait_for_selector(f'#order[data-id="{order_id}"]', timeout=15000)
    shown_status = page.text_content('#order [data-field="status"]').strip()
    checks.eq(f"{m}: lookup {order_id}: the status equals /admin/orders", shown_status, answer["status"])
    rows = page.evaluate(
        """() => [...document.querySelectorAll('#order-transitions tr[data-index]')].map(tr =>
             ['event', 'from', 'to', 'cause', 'at'].map(f => tr.querySelector(`[data-field="${f}"]`).textContent))"""
    )
    none = "–"
    expected = [[t["event"], t["from"] or none, t["to"] or none, t["cause"] or none, t["at"]] for t in answer["transitions"]]
    checks.eq(f"{m}: lookup {order_id}: the transitions equal /admin/orders", rows, expected)
    checks.ok(f"{m}: lookup {order_id}: it has transitions ({len(rows)})", len(rows) >= 1)
    events = page.evaluate(
        """() => [...document.querySelectorAll('#order-events tr')].filter(tr => tr.querySelector('[data-field]'))
             .map(tr => tr.querySelector('[data-field="event"]').textContent)"""
    )
    checks.eq(f"{m}: lookup {order_id}: the events equal /admin/orders", events, [e["event"] for e in answer["events"]])
    # An id no order has: the API's own words.
    status, missing = service.api("GET", "/admin/orders/999999999")
    page.fill("#order-id", "999999999")
    page.click("#lookup")
    page.wait_for_selector("#order-error:not([hidden])", timeout=15000)
    checks.eq(f"{m}: lookup of an unknown order: 404", status, 404)
    checks.eq(f"{m}: lookup of an unknown order: the page shows the API's error", page.text_content("#order-error"), missing["error"])
    # Back to the real one, for the screenshot.
    page.fill("#order-id", order_id)
    page.click("#lookup")
    page.wait_for_selector(f'#order[data-id="{order_id}"]', timeout=15000)
    return True


@contextlib.contextmanager
def opened(playwright, service, checks, work):
    """The page in a browser of its own, the token typed in, read once.
    Yields the page and a check of what it logged and requested, for the end."""
    m = service.name
    profile = tempfile.mkdtemp(prefix="ui-test-chromium-", dir=work)
    context = playwright.chromium.launch_persistent_context(
        profile,
        executable_path=CHROMIUM,
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1200, "height": 900},
    )
    try:
        page = context.new_page()
        problems, foreign = [], []
        page.on("console", lambda msg: msg.type == "error" and "Failed to load resource" not in msg.text and problems.append(msg.text))
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: r.url.startswith(service.base + "/") or foreign.append(r.url))
        page.goto(service.base + "/ui")
        page.wait_for_selector("#auth:not([hidden])", timeout=15000)
        checks.ok(f"{m}: without a token the page asks for one", "token" in page.text_content("#auth-message"))
        checks.eq(f"{m}: and shows no number", page.text_content("#instance").strip(), "…")
        page.fill("#token", service.token)
        page.click("#token-save")
        # Polled from here: the page's policy forbids the string a
        # `wait_for_function` would evaluate inside it.
        wait(f"{m}: the page's first reading", lambda: refreshes(page) >= 1, within=15)
        checks.ok(f"{m}: with the token the page reads the API", page.is_hidden("#auth"))
        checks.eq(
            f"{m}: the token is kept in this tab's sessionStorage",
            page.evaluate("sessionStorage.getItem('order-timeout.admin-token')"),
            service.token,
        )

        def clean():
            checks.eq(f"{m}: the page logged no error (script, policy)", problems, [])
            checks.eq(f"{m}: the page requested nothing from another origin", foreign, [])

        yield page, clean
    finally:
        context.close()


def save(page, screenshot, m):
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshot), full_page=True)
    print(f"  --  {m}: screenshot {screenshot} ({screenshot.stat().st_size // 1024} KiB)")


def browse(playwright, service, checks, work, facts, screenshot):
    m = service.mode
    with opened(playwright, service, checks, work) as (page, clean):
        # The first reading may precede the page's chart: one more refresh.
        next_refresh(page, refreshes(page))
        shown_as_expected(page, service, checks)
        status, answer = service.api("GET", "/admin/shadow")
        checks.eq(f"{m}: /admin/shadow answers 409 on owned orders", (status, "error" in answer), (409, True))
        checks.ok(f"{m}: page: no shadow mode card", page.is_hidden("#shadow"))
        click_pause_and_resume(page, service, checks)
        looked_up = look_up(page, service, checks, facts["cancelled"])
        if screenshot:
            save(page, screenshot, m)
        clean()
        return looked_up


# ---- shadow mode -------------------------------------------------------------

# The shop's tables and the mapping onto them: tests/api/cron.rs's
# `schema(Backend::Postgres)` and `mapping()`, said as the environment says them.
SHOP_SCHEMA = [
    "CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, "
    "deadline TIMESTAMPTZ(3) NOT NULL, confirm_by TIMESTAMPTZ(3), "
    "cancelled_at TIMESTAMPTZ(3), cancelled_by VARCHAR(16), cron_run BIGINT)",
    "CREATE TABLE shop_order_lines (order_id BIGINT NOT NULL, sku BIGINT NOT NULL, qty INT NOT NULL)",
    "CREATE INDEX shop_order_lines_order ON shop_order_lines (order_id)",
    "CREATE TABLE shop_stock (sku BIGINT PRIMARY KEY, on_hand BIGINT NOT NULL, reserved BIGINT NOT NULL)",
    "CREATE TABLE shop_stock_moves (order_id BIGINT NOT NULL, by_whom VARCHAR(16) NOT NULL)",
    "INSERT INTO shop_stock VALUES (1, 10000, 0), (2, 10000, 0), (3, 10000, 0), (4, 10000, 0)",
]
SHOP_MAPPING = {
    "ORDER_TIMEOUT__ORDERS__SOURCE": "mapped",
    "ORDER_TIMEOUT__MAPPING__TABLE": "shop_orders",
    "ORDER_TIMEOUT__MAPPING__STATUS_COLUMN": "status",
    "ORDER_TIMEOUT__MAPPING__STAMP_COLUMN": "cancelled_at",
    "ORDER_TIMEOUT__MAPPING__PAYMENT__FROM": "pending",
    "ORDER_TIMEOUT__MAPPING__PAYMENT__TO": "cancelled",
    "ORDER_TIMEOUT__MAPPING__PAYMENT__DEADLINE_COLUMN": "deadline",
    "ORDER_TIMEOUT__MAPPING__RECEIPT__FROM": "shipped",
    "ORDER_TIMEOUT__MAPPING__RECEIPT__TO": "completed",
    "ORDER_TIMEOUT__MAPPING__RECEIPT__DEADLINE_COLUMN": "confirm_by",
    "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_TABLE": "shop_order_lines",
    "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_ORDER_COLUMN": "order_id",
    "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_SKU_COLUMN": "sku",
    "ORDER_TIMEOUT__MAPPING__STOCK__ITEMS_QUANTITY_COLUMN": "qty",
    "ORDER_TIMEOUT__MAPPING__STOCK__TABLE": "shop_stock",
    "ORDER_TIMEOUT__MAPPING__STOCK__ID_COLUMN": "sku",
    "ORDER_TIMEOUT__MAPPING__STOCK__RESERVED_COLUMN": "reserved",
    "ORDER_TIMEOUT__MAPPING__STOCK__AVAILABLE_COLUMN": "on_hand",
    "ORDER_TIMEOUT__MAPPING__RELEASE_SQL": "INSERT INTO shop_stock_moves (order_id, by_whom) VALUES ($1, 'service')",
}
SHADOW = {
    "ORDER_TIMEOUT__ORDERS__SHADOW": "true",
    # The sweeper decides as soon as a deadline passes: no order needs a timer.
    "ORDER_TIMEOUT__SWEEPER__ENABLED": "true",
    "ORDER_TIMEOUT__SWEEPER__INTERVAL": "200ms",
    "ORDER_TIMEOUT__SWEEPER__GRACE": "0s",
}
# The shop's cron: its own conditional cancel, stamped by its hand.
CRON = (
    "UPDATE shop_orders SET status = 'cancelled', cancelled_at = CURRENT_TIMESTAMP, cancelled_by = 'cron' "
    "WHERE status = 'pending' AND id = {id}"
)
SHADOW_COUNTS = ["would_close", "shop_closed_after_us", "shop_closed_before_us", "closed_early", "still_open", "disagreements"]
SHADOW_LISTS = ["early", "disagreements", "still_open"]


def shadow_report(service):
    return service.ok("GET", "/admin/shadow", expect=(200,))


def payment_counts(body):
    r = next((k["report"] for k in body["kinds"] if k["kind"] == "payment"), {})
    return {f: r.get(f) for f in SHADOW_COUNTS}


def prepare_shadow(service, checks):
    """Four orders of the shop's, due in a second: one the cron closes once
    the service has decided it, one left open, one paid late, one the cron
    closes before its deadline, whose timer then finds it closed."""
    m = service.name
    service.sql(
        "INSERT INTO shop_orders (id, status, deadline) VALUES "
        + ", ".join(f"({i}, 'pending', CURRENT_TIMESTAMP + INTERVAL '1 second')" for i in (1, 2, 3, 4))
    )
    service.sql(CRON.format(id=4))
    # Order 4's timer, as the checkout publishes it: the sweeper passes
    # over a closed order, so only a timer records a close before it.
    publish(service, "payment", {"x-delay": 1500}, json.dumps({"order_id": "4", "kind": "payment"}))
    wait(f"{m}: the service would close orders 1, 2 and 3", lambda: payment_counts(shadow_report(service))["would_close"] == 3, within=15)
    service.sql(CRON.format(id=1))
    service.sql("UPDATE shop_orders SET status = 'paid' WHERE id = 3")
    expected = {
        "would_close": 3,
        "shop_closed_after_us": 1,
        "shop_closed_before_us": 1,
        "closed_early": 1,
        "still_open": 1,
        "disagreements": 1,
    }

    def reported():
        body = shadow_report(service)
        return body if payment_counts(body) == expected else None

    body = wait(f"{m}: /admin/shadow reports the cron's closes and the late payment", reported, within=15)
    checks.eq(f"{m}: /admin/shadow: payment's counts", payment_counts(body), expected)
    pay = next(k["report"] for k in body["kinds"] if k["kind"] == "payment")
    checks.eq(
        f"{m}: /admin/shadow: the first orders of each list",
        {lst: [(o["order_id"], o["status"]) for o in pay["first_" + lst]] for lst in SHADOW_LISTS},
        {"early": [("4", "cancelled")], "disagreements": [("3", "paid")], "still_open": [("2", None)]},
    )


def shadow_state(page):
    """The shadow mode card as the page shows it."""
    return page.evaluate(
        """() => {
      const box = document.getElementById('shadow');
      const kinds = {};
      for (const card of document.querySelectorAll('#shadow-kinds article[data-kind]')) {
        const counts = {};
        for (const dd of card.querySelectorAll('dd[data-field]')) counts[dd.dataset.field] = dd.textContent.trim();
        const lateness = {};
        for (const tr of card.querySelectorAll('tr[data-who]')) {
          lateness[tr.dataset.who] = Object.fromEntries([...tr.querySelectorAll('[data-field]')].map(td => [td.dataset.field, td.textContent]));
        }
        const lists = [...card.querySelectorAll('tr[data-list]')].map(tr =>
          [tr.dataset.list, ...['order', 'status', 'after'].map(f => tr.querySelector(`[data-field="${f}"]`).textContent)]);
        kinds[card.dataset.kind] = { counts, lateness, lists };
      }
      const error = document.getElementById('shadow-error');
      return {
        refreshes: Number(document.getElementById('updated').dataset.count),
        hidden: box.hidden, error: error.hidden ? null : error.textContent, kinds,
      };
    }"""
    )


def shadow_shown(body):
    """What the card must show of a report: every value as text, "–" for none."""
    shown = lambda v: "–" if v is None else str(v)
    return {
        k["kind"]: {
            "counts": {f: shown(k["report"][f]) for f in SHADOW_COUNTS},
            "lateness": {
                who: {f: shown(k["report"][key][f]) for f in ("n", "p50", "p99", "max")}
                for who, key in (("shop", "shop_late_ms"), ("ours", "our_late_ms"))
            },
            "lists": [
                [lst, o["order_id"], shown(o["status"]), shown(o["after_deadline_ms"])]
                for lst in SHADOW_LISTS
                for o in k["report"]["first_" + lst]
            ],
        }
        for k in body["kinds"]
    }


def ticking(kinds):
    """The card without what grows with the clock (how long past its deadline
    an open order is), and those values apart, by kind and order."""
    steady, open_for = {}, {}
    for kind, card in kinds.items():
        lists = []
        for lst, order, status, after in card["lists"]:
            if lst == "still_open":
                open_for[(kind, order)] = int(after)
                after = "ticks"
            lists.append([lst, order, status, after])
        steady[kind] = {**card, "lists": lists}
    return steady, open_for


def browse_shadow(playwright, service, checks, work, screenshot):
    m = service.name
    with opened(playwright, service, checks, work) as (page, clean):
        for attempt in range(3):
            # The page first: its reading is the older one.
            shown = shadow_state(page)
            expected = shadow_shown(shadow_report(service))
            (got, got_open), (want, want_open) = ticking(shown["kinds"]), ticking(expected)
            if not shown["hidden"] and got == want and got_open.keys() == want_open.keys():
                break
            if attempt == 2:
                checks.eq(f"{m}: page: the shadow mode card shows", shown["hidden"], False)
                checks.eq(f"{m}: page: the shadow mode card shows what /admin/shadow answers", got, want)
            next_refresh(page, shown["refreshes"])
        checks.eq(f"{m}: page: the shadow mode card shows", shown["hidden"], False)
        checks.eq(f"{m}: page: no error on the card", shown["error"], None)
        checks.eq(f"{m}: page: every mapped kind", sorted(shown["kinds"]), ["payment", "receipt"])
        checks.eq(f"{m}: page: the counts, the lateness and the first orders equal /admin/shadow", got, want)
        # An open order's time past its deadline grows: read by the page
        # at its last refresh, no later than the API's answer and a refresh before it.
        for key, ms in want_open.items():
            checks.ok(f"{m}: page: {key[0]} order {key[1]} open {got_open[key]} ms past its deadline, /admin/shadow {ms} ms", 0 <= ms - got_open[key] <= 2 * 5000)
        pay = shown["kinds"]["payment"]
        checks.eq(
            f"{m}: page: payment's counts",
            pay["counts"],
            {"would_close": "3", "shop_closed_after_us": "1", "shop_closed_before_us": "1", "closed_early": "1", "still_open": "1", "disagreements": "1"},
        )
        checks.eq(
            f"{m}: page: the orders closed early, disagreed on and still open",
            [row[:3] for row in pay["lists"]],
            [["early", "4", "cancelled"], ["disagreements", "3", "paid"], ["still_open", "2", "–"]],
        )
        checks.ok(f"{m}: page: order 4 closed before its deadline ({pay['lists'][0][3]} ms)", int(pay["lists"][0][3]) < 0)
        checks.eq(f"{m}: page: the shop's lateness of its 2 closes, ours of 3", (pay["lateness"]["shop"]["n"], pay["lateness"]["ours"]["n"]), ("2", "3"))
        if screenshot:
            save(page, screenshot, m)
        clean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "order-timeout"))
    parser.add_argument("--modes", default="ttl,plugin")
    parser.add_argument("--screenshot", default=str(ROOT / "target" / "ui-test" / "ui.png"), help="taken in the last mode run")
    parser.add_argument("--shadow-screenshot", default=str(ROOT / "target" / "ui-test" / "ui-shadow.png"), help="of the shadow mode run")
    args = parser.parse_args()
    checks = Checks()
    cleanups = []
    work = Path(tempfile.mkdtemp(prefix="ui-test-"))
    cleanups.append(lambda: shutil.rmtree(work, ignore_errors=True))
    try:
        if not Path(CHROMIUM).exists():
            raise Failed(f"{CHROMIUM} is missing: `make browser` installs Debian's chromium")
        modes = [m for m in args.modes.split(",") if m]
        if "plugin" in modes and not plugin_available():
            if os.environ.get("ORDER_TIMEOUT_REQUIRE_PLUGIN"):
                raise Failed("ORDER_TIMEOUT_REQUIRE_PLUGIN is set but the broker offers no x-delayed-message exchange type")
            print("ui-test: SKIPPED plugin mode: the broker offers no x-delayed-message exchange type")
            modes.remove("plugin")
        unchecked = []
        with sync_playwright() as playwright:
            for i, mode in enumerate(modes):
                print(f"ui-test: {mode} mode")
                service = Service(args.binary, mode, work, cleanups)
                facts = prepare(service, checks)
                shot = Path(args.screenshot) if i == len(modes) - 1 else None
                if not browse(playwright, service, checks, work, facts, shot):
                    unchecked.append(mode)
                service.stop()
            # Shadow mode once, in ttl mode: the card shows the report the
            # database keeps, which the sweeper fills with no timer at all
            # (order 4's aside, which the router takes alike in either mode
            # and which goes with the vhost in ttl mode); the delay mode is
            # not what it tests.
            print("ui-test: shadow mode (ttl)")
            service = Service(args.binary, "ttl", work, cleanups, name="shadow", setup=SHOP_SCHEMA, settings={**SHOP_MAPPING, **SHADOW})
            prepare_shadow(service, checks)
            browse_shadow(playwright, service, checks, work, Path(args.shadow_screenshot))
            service.stop()
        if unchecked:
            print(f"ui-test: the order lookup was not checked in {', '.join(unchecked)} mode: GET /admin/orders/{{id}} is not served")
    except Exception as e:  # a check, or the browser's own error
        print(f"ui-test: FAILED: {e}", file=sys.stderr)
        for log in sorted(work.glob("serve-*.log")):
            print(f"ui-test: the end of {log.name}:\n{log.read_text()[-3000:]}", file=sys.stderr)
        print(f"ui-test: {checks.passed} passed, 1 failed")
        return 1
    finally:
        for undo in reversed(cleanups):
            try:
                undo()
            except Exception as e:  # cleanup goes on whatever fails
                print(f"ui-test: cleanup: {e}", file=sys.stderr)
    print(f"ui-test: {checks.passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
