//! Least privilege on the database: `config/postgres-roles.sql`, run as an
//! operator would, makes a role that owns the schema and migrates, and a role
//! with row rights only that `serve` runs as. The whole cycle runs as the
//! latter; a migration attempted as it fails saying what to do.

use std::process::{Command, Stdio};
use std::time::Duration;

use std::io::Write as _;

use crate::helpers::*;

const BIN: &str = env!("CARGO_BIN_EXE_order-timeout");

/// The roles and the database the file made: removed on drop.
pub(crate) struct Made {
    pub(crate) database: String,
    pub(crate) roles: [String; 2],
}

impl Drop for Made {
    fn drop(&mut self) {
        let sql = format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE); DROP ROLE IF EXISTS {}; DROP ROLE IF EXISTS {};",
            self.database, self.roles[0], self.roles[1]
        );
        let _ = psql("postgres", &sql);
    }
}

/// Runs SQL (psql's meta-commands included) as the superuser.
pub(crate) fn psql(database: &str, sql: &str) -> Result<String, String> {
    let mut command = Command::new("psql");
    command
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", database])
        .args(["-v", "ON_ERROR_STOP=1", "-q", "-f", "-"]);
    piped(command, sql)
}

/// Runs a database client with `sql` on its standard input: what it printed,
/// as `Ok` when it exited 0, else as the error.
pub(crate) fn piped(mut command: Command, sql: &str) -> Result<String, String> {
    let name = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{name}: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(sql.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

async fn database_roles(backend: Backend, mode: DelayMode) {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..12];
    let (owner, serve, database) = (
        format!("ot_test_own_{id}"),
        format!("ot_test_srv_{id}"),
        format!("ot_test_db_{id}"),
    );
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/postgres-roles.sql"
    ))
    .unwrap();
    let sql = file
        .replace("order_timeout_owner", &owner)
        .replace("order_timeout_serve", &serve)
        .replace("order_timeout", &database);
    let _made = Made {
        database: database.clone(),
        roles: [owner.clone(), serve.clone()],
    };
    psql("postgres", &sql).unwrap_or_else(|e| panic!("config/postgres-roles.sql: {e}"));
    let url = |role: &str| format!("postgres://{role}@127.0.0.1:5432/{database}");

    // The owner migrates.
    let out = Command::new(BIN)
        .args(["migrate", "up"])
        .env("ORDER_TIMEOUT__DATABASE__URL", url(&owner))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    // The serve role cannot, and is told why and what to do.
    let out = Command::new(BIN)
        .args(["migrate", "up"])
        .env("ORDER_TIMEOUT__DATABASE__URL", url(&serve))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("permission denied")
            && said.contains("run the migrations as the role that owns the schema"),
        "{said}"
    );

    // ... and runs the whole cycle on row rights alone.
    let app = spawn_app(
        Spawn::new(backend, mode)
            .env("ORDER_TIMEOUT__DATABASE__URL", url(&serve))
            .env("ORDER_TIMEOUT__DATABASE__MIGRATE_ON_START", "false")
            .env("ORDER_TIMEOUT__SWEEPER__ENABLED", "true"),
    )
    .await;
    app.put_stock("A", 3).await;
    let unpaid = app.order(&[("A", 2)], "1s").await;
    let paid = app.order(&[("A", 1)], "1s").await;
    assert_eq!(app.post(&paid, "pay").await.0, 200);
    app.wait_status(&unpaid, "cancelled", Duration::from_secs(20))
        .await;
    let stock = app.stock("A").await;
    assert_eq!(
        (&stock["available"], &stock["reserved"], &stock["sold"]),
        (
            &serde_json::json!(2),
            &serde_json::json!(0),
            &serde_json::json!(1)
        ),
        "{stock}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_row_rights_ttl() {
    run(Backend::Postgres, DelayMode::Ttl, database_roles).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_row_rights_plugin() {
    run(Backend::Postgres, DelayMode::Plugin, database_roles).await
}
