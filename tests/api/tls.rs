//! `amqps://` end to end: socat terminates TLS in front of the real broker with a
//! certificate made for the test; the service trusts it through
//! `amqp.tls_ca_file`, and refuses the same endpoint without it.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::helpers::*;

struct Terminator {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Terminator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The broker under test's `host:port` (`ORDER_TIMEOUT_TEST_BROKER`, 5672 by default).
fn broker_address() -> String {
    let url = BROKER.get();
    let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let authority = authority.split('/').next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.contains(':') {
        host_port.to_string()
    } else {
        format!("{host_port}:5672")
    }
}

/// A self-signed certificate for localhost and a socat TLS listener forwarding
/// to the broker under test.
fn terminator() -> Option<Terminator> {
    if !have("socat") || !have("openssl") {
        if std::env::var("ORDER_TIMEOUT_REQUIRE_EXAMPLES").is_ok() {
            panic!("socat and openssl are required under make test");
        }
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: amqps test needs socat and openssl (make test installs socat)"
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("ot-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    // A private CA, and a server certificate for localhost that it signs.
    let openssl = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "openssl {args:?}");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=order-timeout test CA",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "basicConstraints=critical,CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
        "-out",
        "cert.pem",
    ]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("socat")
        .arg(format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,cert={},key={}",
            dir.join("cert.pem").display(),
            dir.join("key.pem").display()
        ))
        .arg(format!("TCP:{}", broker_address()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some(Terminator { child, port, dir })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca() {
    let Some(tls) = terminator() else { return };
    let mut plain = spawn_app(Spawn::new(Backend::Sqlite, DelayMode::Ttl)).await;
    // Same vhost and database, now over TLS; the plain instance stops first.
    plain.stop().await;
    let amqps = format!("amqps://guest:guest@localhost:{}/{}", tls.port, plain.vhost);
    let ca = tls.dir.join("ca.pem").display().to_string();

    // Without the CA the self-signed certificate is refused.
    let mut untrusted = plain.env.clone();
    untrusted.insert("ORDER_TIMEOUT__AMQP__URL".into(), amqps.clone());
    let source = order_timeout::settings::SettingsSource {
        file: None,
        env: Some(untrusted),
    };
    let settings = order_timeout::settings::Settings::load(&source).unwrap();
    let refused = order_timeout::amqp::connect(&settings.amqp, "tls-check").await;
    assert!(
        refused.is_err(),
        "a self-signed certificate must not be trusted by default"
    );

    let app = plain
        .spawn_variant(&[
            ("ORDER_TIMEOUT__AMQP__URL", amqps),
            ("ORDER_TIMEOUT__AMQP__TLS_CA_FILE", ca),
        ])
        .await;
    app.put_stock("A", 2).await;
    let id = app.order(&[("A", 2)], "2s").await;
    let order = app
        .wait_status(&id, "cancelled", Duration::from_secs(8))
        .await;
    assert!(ms(&order, "cancelled_at") >= ms(&order, "pay_deadline"));
    assert_eq!(app.stock("A").await["available"], 2);
}
