-- The second half of config/mariadb-mapped-roles.sql (read its header
-- first): the serving user's row rights on the service's bookkeeping tables,
-- which MariaDB and MySQL grant only on tables that exist. Run it as root,
-- connected to the shop's database, after the owner's
-- `order-timeout migrate up`, with the same user name and host replaced:
--
--   mariadb -uroot mall < config/mariadb-mapped-roles-after-migrate.sql
--
-- Running it again changes nothing.

-- The record of the migrations: read, so that `serve` and `doctor` see that
-- none is pending.
GRANT SELECT ON order_timeout_migrations TO 'order_timeout_serve'@'%';

-- The domain events' outbox (written with each transition, claimed,
-- published, deleted), the audit trail (written, read for an order's story,
-- its old rows deleted by `audit.retention`), the roles paused for every
-- instance, what the zone check found of a guessed zone, and what shadow
-- mode (orders.shadow) recorded.
GRANT SELECT, INSERT, UPDATE, DELETE ON order_timeout_events TO 'order_timeout_serve'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON order_timeout_audit TO 'order_timeout_serve'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON order_timeout_pauses TO 'order_timeout_serve'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON order_timeout_zone_checks TO 'order_timeout_serve'@'%';
GRANT SELECT, INSERT, UPDATE, DELETE ON order_timeout_shadow TO 'order_timeout_serve'@'%';
