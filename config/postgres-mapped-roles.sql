-- Least privilege on PostgreSQL for order-timeout acting on a shop's own
-- tables (orders.source = "mapped", docs/mapped-mode.md): two roles, neither
-- of which can touch what the mapping does not name.
--
--   order_timeout_owner  owns the service's bookkeeping tables (order_timeout_*,
--                        created next to the shop's): `order-timeout migrate up`
--                        runs as it; it has no right on the shop's own tables
--   order_timeout_serve  runs the service: `serve` with
--                        database.migrate_on_start = false runs as it; on the
--                        shop's tables it reads only the columns the mapping
--                        compares and writes only those it sets
--
-- Run it once, connected to the shop's database, as a superuser (or as the
-- owner of the shop's tables, with CREATEROLE), before the first migration:
--
--   psql -v ON_ERROR_STOP=1 -d mall -f config/postgres-mapped-roles.sql
--
-- after replacing the two role names, and the tables and columns of the
-- GRANTs on the shop's tables below with those your mapping.* names (these
-- are config/mall.toml's). Then give the roles passwords (ALTER ROLE …
-- PASSWORD '…'), migrate as the owner, serve as the other:
--
--   ORDER_TIMEOUT__DATABASE__URL=postgres://order_timeout_owner:…@HOST/mall order-timeout migrate up
--   ORDER_TIMEOUT__DATABASE__URL=postgres://order_timeout_serve:…@HOST/mall \
--   ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START=false order-timeout serve
--
-- A test (tests/api/mapped_roles.rs) runs this file verbatim, with the role
-- names replaced, against the mall's tables, and then serves as the second
-- role.

CREATE ROLE order_timeout_owner LOGIN;
CREATE ROLE order_timeout_serve LOGIN;

-- Both may connect (everyone may by default; a database that revoked that
-- from PUBLIC still lets these two in).
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO order_timeout_owner, order_timeout_serve',
                   current_database());
END
$$;

-- The owner creates the bookkeeping tables in the shop's schema
-- (PostgreSQL 15 and later give no one else CREATE on public); the other
-- role only finds them there.
GRANT USAGE, CREATE ON SCHEMA public TO order_timeout_owner;
GRANT USAGE ON SCHEMA public TO order_timeout_serve;

-- Row rights on the tables and sequences the owner's migrations create, and
-- only on those: the domain events' outbox, the audit trail (whose old rows
-- `audit.retention` deletes) and the record of the migrations themselves.
ALTER DEFAULT PRIVILEGES FOR ROLE order_timeout_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO order_timeout_serve;
ALTER DEFAULT PRIVILEGES FOR ROLE order_timeout_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO order_timeout_serve;

-- The shop's orders: read the columns the statements compare (id_column,
-- status_column, each kind's since_column or deadline_column), write the
-- ones a transition sets (status_column, stamp_column, a fulfillment
-- flag_column, which need reading too if a kind compares them). UPDATE on
-- some column is also what SELECT … FOR UPDATE needs to lock an order.
GRANT SELECT (id, status, create_time, delivery_time),
      UPDATE (status, modify_time)
    ON oms_order TO order_timeout_serve;

-- mapping.stock.*: the items' order, SKU and quantity read; the stock row's
-- key read and its reserved column (and available_column, if mapped) given
-- back.
GRANT SELECT (order_id, product_sku_id, product_quantity)
    ON oms_order_item TO order_timeout_serve;
GRANT SELECT (id, lock_stock), UPDATE (lock_stock)
    ON pms_sku_stock TO order_timeout_serve;

-- mapping.release_sql, if you use it: the columns its statements read and
-- write, the same way, and nothing more.

-- The zone the shop's zone-less columns (timestamp without time zone) are
-- read in, when mapping.time_zone is empty, is the server's default, which
-- the service reads from the server's configuration files (pg_file_settings,
-- readable by superusers only unless granted; pg_read_all_settings does not
-- reach it). Leave these two out if you set mapping.time_zone, or if every
-- time column the mapping names is a timestamptz.
GRANT SELECT ON pg_file_settings TO order_timeout_serve;
GRANT EXECUTE ON FUNCTION pg_show_all_file_settings() TO order_timeout_serve;
