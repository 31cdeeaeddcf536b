-- One checkout as the service sends it on PostgreSQL (store::checkout without
-- an Idempotency-Key): one data-modifying statement, its own transaction (no
-- BEGIN, no COMMIT). It locks the line's stock row and reads it, reserves the
-- line only when no line is short, and only when every line was reserved
-- inserts the order, its line, the outbox row of its payment timeout, its
-- `created` domain event and its audit row; it answers the order id, or the
-- first short line. One round trip instead of the eight of checkout.sql (the
-- service's clock read comes before either). One line of 1-3 units of one of
-- 64 SKUs, as `make bench` orders. The event's body is the service's, made
-- in Rust and split around the order id; here its two halves are literals
-- (E'' strings, \072 for a colon: pgbench would read `:1` as a variable).
\set sku random(1, 64)
\set q random(1, 3)
WITH line (n, sku, quantity) AS (VALUES (0, ('S' || :sku)::varchar, (:q)::bigint)), stock AS MATERIALIZED (SELECT sku, available FROM inventory WHERE sku IN ('S' || :sku) ORDER BY sku FOR UPDATE), short AS (SELECT line.n, line.sku, stock.available FROM line LEFT JOIN stock ON stock.sku = line.sku WHERE stock.available IS NULL OR stock.available < line.quantity), r AS (UPDATE inventory SET available = available - line.quantity, reserved = reserved + line.quantity, updated_at_ms = 1 FROM line WHERE inventory.sku IN ('S' || :sku) AND inventory.sku = line.sku AND inventory.available >= line.quantity AND NOT EXISTS (SELECT FROM short) RETURNING inventory.sku), o AS (INSERT INTO orders (status, pay_deadline_ms, created_at_ms, version, updated_at_ms) SELECT 'pending_payment', 4000000000000, 1, 0, 1 WHERE (SELECT count(*) FROM r) = 1 RETURNING id), i AS (INSERT INTO order_items (order_id, sku, quantity) SELECT o.id, line.sku, line.quantity FROM o, line), b AS (INSERT INTO outbox (order_id, kind, due_at_ms, created_at_ms, attempts) SELECT id, 'payment', 4000000000000, 1, 0 FROM o), e AS (INSERT INTO order_timeout_events (message_id, order_id, event, body, created_at_ms, attempts) SELECT md5(random()::text), id::text, 'created', E'{"version"\0721,"event"\072"created","order_id"\072"' || id::text || E'","at"\072"2026-12-01T20\07200\07200.000Z","cause"\072"buyer","from"\072null,"to"\072"pending_payment"}', 1, 0 FROM o), a AS (INSERT INTO order_events (order_id, event, from_status, to_status, cause, at_ms) SELECT id, 'created', NULL, 'pending_payment', 'api', 1 FROM o) SELECT (SELECT id FROM o) AS id, (SELECT sku FROM short ORDER BY n LIMIT 1) AS short_sku, (SELECT available FROM short ORDER BY n LIMIT 1) AS available;
