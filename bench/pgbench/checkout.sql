-- One checkout a statement at a time, as the service sent it on PostgreSQL
-- before checkout-one-statement.sql (and as it still does on MariaDB and
-- SQLite): the conditional stock reservation, the order, its line, the outbox
-- row of its payment timeout, its `created` domain event and its audit row, in
-- one transaction. One line of 1-3 units of one of 64 SKUs, as `make bench` orders.
-- (The event's body is built by json_build_object: pgbench would read a
-- colon in a JSON literal as a variable.)
\set sku random(1, 64)
\set q random(1, 3)
BEGIN;
UPDATE inventory SET available = available - :q, reserved = reserved + :q, updated_at_ms = 1 WHERE sku = 'S' || :sku AND available >= :q;
INSERT INTO orders (status, pay_deadline_ms, created_at_ms, version, updated_at_ms) VALUES ('pending_payment', 4000000000000, 1, 0, 1) RETURNING id \gset
INSERT INTO order_items (order_id, sku, quantity) VALUES (:id, 'S' || :sku, :q);
INSERT INTO outbox (order_id, kind, due_at_ms, created_at_ms, attempts) VALUES (:id, 'payment', 4000000000000, 1, 0);
INSERT INTO order_timeout_events (message_id, order_id, event, body, created_at_ms, attempts) VALUES (md5(random()::text), :id::text, 'created', json_build_object('version', 1, 'event', 'created', 'order_id', :id::text, 'at', '2026-12-01T20.00.00.000Z', 'cause', 'customer', 'from', NULL, 'to', 'pending_payment')::text, 1, 0);
INSERT INTO order_events (order_id, event, from_status, to_status, cause, at_ms) VALUES (:id, 'created', NULL, 'pending_payment', 'api', 1);
COMMIT;
