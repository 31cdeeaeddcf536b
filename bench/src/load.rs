//! Load over HTTP, as clients would send it: stocking the SKUs, placing orders
//! with a number of requests in flight (recording when each was sent), and
//! paying the orders planned as paid before their deadlines.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use crate::ctx::RunCtx;
use crate::plan::{Job, STOCK, sku_name};
use order_timeout::domain::Millis;

/// Gives each of `skus` SKUs [`STOCK`] units through `PUT /inventory/<sku>`.
pub(crate) async fn stock(ctx: &RunCtx, base: &str, skus: usize) -> anyhow::Result<()> {
    for i in 0..skus {
        let resp = ctx
            .http
            .put(format!("{base}/inventory/{}", sku_name(i)))
            .json(&json!({ "available": STOCK }))
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("stocking {}: {}", sku_name(i), resp.status());
        }
    }
    Ok(())
}

/// What the placing clients share.
struct Shared {
    /// Every order to place, in order.
    jobs: Vec<Job>,
    /// The index of the next job to take.
    next: AtomicUsize,
    /// Orders placed so far, for the progress line.
    done: AtomicUsize,
    /// Set by the first client that fails: the others stop taking jobs.
    failed: AtomicBool,
}

/// What one client placed: (job index, order id, sent at epoch ms).
type Placed = Vec<(usize, i64, i64)>;

/// Places `jobs` with `clients` requests in flight; returns the order ids in job
/// order, and when each request was sent (epoch ms). `window_ms` fixes every window (calibration); otherwise each job's
/// planned deadline sets its window.
pub(crate) async fn place(
    ctx: &RunCtx,
    base: &str,
    jobs: &[Job],
    clients: usize,
    window_ms: Option<i64>,
    label: &str,
) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
    let shared = Arc::new(Shared {
        jobs: jobs.to_vec(),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
    });
    let mut workers = JoinSet::new();
    for _ in 0..clients.max(1) {
        let url = format!("{base}/orders");
        workers.spawn(place_some(shared.clone(), ctx.http.clone(), url, window_ms));
    }
    let progress = report_progress(shared.clone(), label.to_string());
    let placed = collect(&mut workers, jobs.len()).await;
    progress.abort();
    placed.map_err(|e| e.context(format!("{label} failed")))
}

/// One client: takes the next job until none is left or a client failed.
async fn place_some(
    shared: Arc<Shared>,
    http: reqwest::Client,
    url: String,
    window_ms: Option<i64>,
) -> anyhow::Result<Placed> {
    let mut placed = Vec::new();
    while !shared.failed.load(Ordering::Relaxed) {
        let i = shared.next.fetch_add(1, Ordering::Relaxed);
        let Some(job) = shared.jobs.get(i) else { break };
        let window = window_ms.unwrap_or(job.deadline_ms - Millis::now().0);
        if window < 1_000 {
            shared.failed.store(true, Ordering::Relaxed);
            bail!("order {i} would be due in {window} ms: checkout is slower than planned");
        }
        let body = json!({
            "items": [{ "sku": sku_name(job.sku), "quantity": job.quantity }],
            "payment_window": format!("{window}ms"),
        });
        let sent_ms = Millis::now().0;
        match post_order(&http, &url, &body).await {
            Ok(id) => placed.push((i, id, sent_ms)),
            Err(e) => {
                shared.failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        shared.done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(placed)
}

/// `POST /orders`; the new order's id.
async fn post_order(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<i64> {
    let resp = http.post(url).json(body).send().await?;
    let status = resp.status();
    let doc: Value = resp.json().await?;
    if status != reqwest::StatusCode::CREATED {
        bail!("POST /orders answered {status}: {doc}");
    }
    doc["id"]
        .as_str()
        .and_then(|s| s.parse::<i64>().ok())
        .with_context(|| format!("POST /orders: no string id in {doc}"))
}

/// Prints how many orders are placed every 2 s until aborted.
fn report_progress(shared: Arc<Shared>, label: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let n = shared.jobs.len();
        let start = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let d = shared.done.load(Ordering::Relaxed);
            println!(
                "{label}: {d}/{n} placed ({:.0}/s)",
                d as f64 / start.elapsed().as_secs_f64()
            );
        }
    })
}

/// Waits for every client; the ids and send times of `n` jobs in job order, or
/// the first error.
async fn collect(
    workers: &mut JoinSet<anyhow::Result<Placed>>,
    n: usize,
) -> anyhow::Result<(Vec<i64>, Vec<i64>)> {
    let mut ids = vec![0_i64; n];
    let mut sent = vec![0_i64; n];
    let mut first_error = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(placed)) => {
                for (i, id, sent_ms) in placed {
                    ids[i] = id;
                    sent[i] = sent_ms;
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(anyhow::anyhow!("a client task failed: {e}"));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((ids, sent)),
    }
}

/// Pays the orders planned as paid, before their deadlines.
pub(crate) async fn pay(
    ctx: &RunCtx,
    base: &str,
    jobs: &[Job],
    ids: &[i64],
    clients: usize,
) -> anyhow::Result<()> {
    let targets: Arc<Vec<(i64, i64)>> = Arc::new(
        jobs.iter()
            .zip(ids)
            .filter(|(j, _)| j.paid)
            .map(|(j, id)| (*id, j.deadline_ms))
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = JoinSet::new();
    for _ in 0..clients.max(1) {
        let (targets, next, http, base) = (
            targets.clone(),
            next.clone(),
            ctx.http.clone(),
            base.to_string(),
        );
        workers.spawn(async move {
            while let Some((id, deadline)) =
                targets.get(next.fetch_add(1, Ordering::Relaxed)).copied()
            {
                if deadline - Millis::now().0 < 500 {
                    bail!(
                        "order {id} would be paid within 500 ms of its deadline: too slow to plan"
                    );
                }
                let resp = http
                    .post(format!("{base}/orders/{id}/pay"))
                    // The API asks every POST to say JSON, body or not.
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .send()
                    .await?;
                if resp.status() != reqwest::StatusCode::OK {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    bail!("POST /orders/{id}/pay answered {status}: {text}");
                }
            }
            Ok(())
        });
    }
    while let Some(joined) = workers.join_next().await {
        joined.context("a payment task failed")??;
    }
    println!("paid: {} orders before their deadlines", targets.len());
    Ok(())
}
