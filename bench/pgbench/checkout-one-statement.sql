-- The same checkout with its five inserts in one data-modifying statement
-- (PostgreSQL only): four round trips (BEGIN, the reservation, the inserts,
-- COMMIT) instead of eight. Not what the service does today: the experiment
-- that says what such a checkout path would allow.
\set sku random(1, 64)
\set q random(1, 3)
BEGIN;
UPDATE inventory SET available = available - :q, reserved = reserved + :q, updated_at_ms = 1 WHERE sku = 'S' || :sku AND available >= :q;
WITH o AS (INSERT INTO orders (status, pay_deadline_ms, created_at_ms, version, updated_at_ms) VALUES ('pending_payment', 4000000000000, 1, 0, 1) RETURNING id), i AS (INSERT INTO order_items (order_id, sku, quantity) SELECT id, 'S' || :sku, :q FROM o), b AS (INSERT INTO outbox (order_id, kind, due_at_ms, created_at_ms, attempts) SELECT id, 'payment', 4000000000000, 1, 0 FROM o), e AS (INSERT INTO order_timeout_events (message_id, order_id, event, body, created_at_ms, attempts) SELECT md5(random()::text), id::text, 'created', json_build_object('version', 1, 'event', 'created', 'order_id', id::text, 'at', '2026-12-01T20.00.00.000Z', 'cause', 'customer', 'from', NULL, 'to', 'pending_payment')::text, 1, 0 FROM o), a AS (INSERT INTO order_events (order_id, event, from_status, to_status, cause, at_ms) SELECT id, 'created', NULL, 'pending_payment', 'api', 1 FROM o) SELECT id FROM o;
COMMIT;
