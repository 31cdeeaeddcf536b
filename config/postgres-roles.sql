-- Least privilege on PostgreSQL for order-timeout: the role that migrates owns
-- the schema; the role `serve` runs as has row rights only. Run as a superuser
-- (psql -v ON_ERROR_STOP=1 -f config/postgres-roles.sql), after replacing the
-- three names below (and adding passwords: ALTER ROLE … PASSWORD '…').
--
--   order_timeout_owner  migrates: `order-timeout migrate up` runs as it
--   order_timeout_serve  runs the service: `serve` with
--                        database.migrate_on_start = false runs as it
--   order_timeout        the database
--
-- A test (tests/api/roles.rs) runs this file verbatim, with the names
-- replaced, and then the whole timeout cycle as the serve role.

CREATE ROLE order_timeout_owner LOGIN;
CREATE ROLE order_timeout_serve LOGIN;
CREATE DATABASE order_timeout OWNER order_timeout_owner;
\connect order_timeout
-- The schema belongs to the owner (PostgreSQL 15 makes the database owner the
-- owner of public; earlier versions let everyone create in it: stop that).
ALTER SCHEMA public OWNER TO order_timeout_owner;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT CONNECT ON DATABASE order_timeout TO order_timeout_serve;
GRANT USAGE ON SCHEMA public TO order_timeout_serve;
-- Row rights on every table the owner's migrations create, now and later.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO order_timeout_serve;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO order_timeout_serve;
ALTER DEFAULT PRIVILEGES FOR ROLE order_timeout_owner IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO order_timeout_serve;
ALTER DEFAULT PRIVILEGES FOR ROLE order_timeout_owner IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO order_timeout_serve;
