-- Least privilege on MariaDB/MySQL for order-timeout acting on a shop's own
-- tables (orders.source = "mapped", docs/mapped-mode.md): two users, neither
-- of which can touch what the mapping does not name.
--
--   order_timeout_owner  creates and migrates the service's bookkeeping
--                        tables (order_timeout_*, next to the shop's):
--                        `order-timeout migrate up` runs as it; it may create
--                        those six tables and no other, and has no right on
--                        the shop's own tables
--   order_timeout_serve  runs the service: `serve` with
--                        database.migrate_on_start = false runs as it; on the
--                        shop's tables it reads only the columns the mapping
--                        compares and writes only those it sets
--
-- MariaDB and MySQL have no default privileges and no wildcards in table
-- names, and refuse a grant on a table that does not exist yet unless it
-- includes CREATE. So the setup has two files, both run as root (or a user
-- with the GRANT OPTION on the shop's database), connected to it:
--
--   1. this one, once, before the first migration: the users, the owner's
--      rights on the bookkeeping tables it is to create (CREATE among them),
--      the serving user's column rights on the shop's tables;
--   2. config/mariadb-mapped-roles-after-migrate.sql, after
--      `order-timeout migrate up`: the serving user's row rights on the
--      bookkeeping tables, which exist by then.
--
--   mariadb -uroot mall < config/mariadb-mapped-roles.sql
--   mariadb -uroot mall -e "ALTER USER order_timeout_owner IDENTIFIED BY '…' ACCOUNT UNLOCK;
--                           ALTER USER order_timeout_serve IDENTIFIED BY '…' ACCOUNT UNLOCK"
--   ORDER_TIMEOUT__DATABASE__URL=mysql://order_timeout_owner:…@HOST/mall order-timeout migrate up
--   mariadb -uroot mall < config/mariadb-mapped-roles-after-migrate.sql
--   ORDER_TIMEOUT__DATABASE__URL=mysql://order_timeout_serve:…@HOST/mall \
--   ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START=false order-timeout serve
--
-- (`mysql` instead of `mariadb` on MySQL.) Before running it, replace the two
-- user names (in both files), the host '%' with where the service connects
-- from, and the tables and columns of the GRANTs on the shop's tables below
-- with those your mapping.* names (these are config/mall.toml's). The users
-- are created locked, without a password, until you give them one and
-- unlock them (the second line above). A release whose migrations add a
-- bookkeeping table adds its lines to both files: run the new lines of this
-- one before its `migrate up`, the other file after.
--
-- `order-timeout doctor`, run as the serving user, names any privilege on
-- the shop's columns its mapping needs and lacks, with the GRANT that gives
-- it. A test (tests/api/mapped_roles.rs) runs both files verbatim, with the
-- user names replaced, against the mall's tables, and then serves as the
-- second user.

CREATE USER 'order_timeout_owner'@'%' ACCOUNT LOCK;
CREATE USER 'order_timeout_serve'@'%' ACCOUNT LOCK;

-- The owner's tables, named one by one, before they exist: CREATE to make
-- them, ALTER, INDEX and DROP for later migrations and `migrate down`, row
-- rights for the record of the migrations (order_timeout_migrations). With
-- CREATE on these names only, it cannot make any other table.
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_migrations TO 'order_timeout_owner'@'%';
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_events TO 'order_timeout_owner'@'%';
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_audit TO 'order_timeout_owner'@'%';
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_pauses TO 'order_timeout_owner'@'%';
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_zone_checks TO 'order_timeout_owner'@'%';
GRANT CREATE, ALTER, INDEX, DROP, SELECT, INSERT, UPDATE, DELETE
    ON order_timeout_shadow TO 'order_timeout_owner'@'%';

-- The shop's orders: read the columns the statements compare (id_column,
-- status_column, each kind's since_column or deadline_column), write the
-- ones a transition sets (status_column, stamp_column, a fulfillment
-- flag_column, which needs reading too: it is compared with NULL).
GRANT SELECT (id, status, create_time, delivery_time),
      UPDATE (status, modify_time)
    ON oms_order TO 'order_timeout_serve'@'%';

-- mapping.stock.*: the items' order, SKU and quantity read; the stock row's
-- key read and its reserved column (and available_column, if mapped) read
-- and given back.
GRANT SELECT (order_id, product_sku_id, product_quantity)
    ON oms_order_item TO 'order_timeout_serve'@'%';
GRANT SELECT (id, lock_stock), UPDATE (lock_stock)
    ON pms_sku_stock TO 'order_timeout_serve'@'%';

-- mapping.release_sql, if you use it: the columns its statements read and
-- write, the same way, and nothing more.

-- The time zone needs no grant here: the server's default zone is read from
-- @@global.time_zone, which every user may read, and a named zone
-- (mapping.time_zone = "Asia/Shanghai", or a server whose default is one)
-- is resolved by the server from its time zone tables, which it reads for
-- any user; they must be loaded, once, server-wide (docs/mapped-mode.md,
-- Time zones).
