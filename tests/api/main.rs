//! Integration tests: one binary, real RabbitMQ, real databases.
//! Each test gets its own vhost and database (see `helpers`).

mod helpers;

/// Runs a scenario `async fn name(Backend, DelayMode)` once in each delay
/// mode, the database rotated: TTL mode on SQLite (the embedded default, and
/// the tier `make check` runs), plugin mode on PostgreSQL, or on MariaDB where
/// the scenario names it (`each_mode!(name, MariaDb)`; skipped, saying so,
/// without the plugin), native mode on PostgreSQL (skipped, saying so, before
/// RabbitMQ 4.3). The databases are crossed with each other only in the tests
/// about the database itself (store, mapped tables, zones): see
/// docs/development.md.
macro_rules! each_mode {
    ($name:ident) => {
        each_mode!(@ $name, Postgres, postgres_plugin);
    };
    ($name:ident, Postgres) => {
        each_mode!(@ $name, Postgres, postgres_plugin);
    };
    ($name:ident, MariaDb) => {
        each_mode!(@ $name, MariaDb, mariadb_plugin);
    };
    (@ $name:ident, $plugin:ident, $plugin_test:ident) => {
        mod $name {
            use crate::helpers::{Backend, DelayMode, run};
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite_ttl() {
                run(Backend::Sqlite, DelayMode::Ttl, super::$name).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $plugin_test() {
                run(Backend::$plugin, DelayMode::Plugin, super::$name).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres_native() {
                run(Backend::Postgres, DelayMode::Native, super::$name).await
            }
        }
    };
}

// By concern:
mod audit_retention; // a mapped table's audit trail deleted past audit.retention, in batches
mod auth; // who may call what, tokens never logged
mod broker_limits; // silent broker nodes, padded and oversized bodies
mod catch_up; // one due delivery applies every order of its kind already due
mod clocks; // the database's clock decides, whatever an instance's host clock says
mod control; // pause and resume each role while running; ctl
mod core; // the core promises, every backend and delay mode
mod cron; // beside a shop's cron job on its table; doctor's dry run of the first start
mod cross_site; // what a web page may not make the API do: 415, 403, 421
mod dashboard; // the Grafana dashboard's queries name real metrics
mod deadlines; // the deadlines ahead, minute by minute: /admin/deadlines and due_next
mod encodings; // x-delay: the type each publisher example sends, every integer type read
mod events; // domain events: each committed transition told once, consumer examples
mod examples; // publishers in other languages (Python, Node, curl)
mod fuzz_entry; // generated messages at the entry: each scheduled or parked, none lost
mod gauges; // pending and overdue orders read from the database; broker roles connected
mod hardening; // failure paths a well-formed flow never reaches
mod hostile_input; // garbage on the AMQP side is parked, consumption goes on
mod http_limits; // slow clients, floods, request timeouts
mod idempotency; // checkout retries with an Idempotency-Key
mod instances; // several instances; SIGTERM and SIGKILL of a real process
mod lifecycle; // the whole order lifecycle, races and refusals
mod mapped; // a shop's own tables: the mall schema, UUID ids, mappings refused by name
mod mapped_indexes; // a shop's table in production: the index each kind needs, doctor's advice, the plans
mod mapped_roles; // least privilege on a shop's database: column rights on the mapped columns
mod mapped_roles_mariadb; // the same on MariaDB: its two scripts, before and after the migration; doctor names a missing grant
mod metrics; // every documented metric after a timeout cycle
mod migrations; // instances starting at once on an empty database take turns migrating; --version
mod native; // the native stage (RabbitMQ 4.3+): mode switches, held timers counted, restarts
mod openapi; // the OpenAPI document matches what the API does
mod outages; // the broker and the database go away and come back
mod reload; // settings reloaded while running: SIGHUP, /admin/reload, ctl reload
mod roles; // least privilege on the database: serve on row rights only
mod routes; // the authorization matrix over every route, and every spelling of one
mod seasons_e2e; // a database whose clock crosses a spring jump (libfaketime): none closed early, all within 1 s
mod settings; // the binary's contracts: settings, doctor, demo
mod shadow; // shadow mode beside a real cron: the shop's tables untouched, the report against the table's truth
mod shared_pauses; // pauses kept in the database: across restarts and instances; per-instance pauses
mod stages; // the delay stages on the real plugin, TTL and quorum queues
mod statuses; // status columns of every type: MariaDB ENUM, PostgreSQL enums, char(n)
mod story; // one order's whole story: GET /admin/orders/{id}, ctl order
mod tls; // amqps:// end to end
mod topology; // definitions, quorum queues, rabbitmq.conf
mod tracing; // OpenTelemetry traces across the broker, to a real OTLP/HTTP receiver; off sends nothing
mod ui; // the operator's page /ui, served open under its policy; /admin/overview
mod upgrade; // the previous release and this one side by side (make test-upgrade)
mod zones; // a mapped shop's time zone, and deadlines stored in whole seconds
