//! Where a burst's time goes: while the bench waits for the drain it reads,
//! every [`CPU_EVERY`] on a thread of its own ([`CpuTrace`]), the CPU time of
//! each process on the machine that takes part (broker, database, service,
//! the bench itself), and samples every [`SAMPLE_EVERY`] where the due timers
//! are (still in the TTL levels, in the ingest queue, or ready in the work
//! queue) and how many orders are overdue. CPU over a window is read at its
//! edges exactly, interpolated between the readings around each.
//! From those samples [`Profile::limit`] names the resource that held the burst
//! back and says by how much it falls short of the target.

use std::time::Duration;

use anyhow::Context as _;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use serde_json::{Value, json};

use order_timeout::amqp::topology::{LEVELS, Names};
use order_timeout::domain::TimeoutKind;

/// How often the drain is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// How often the CPU is read, apart from the drain's samples: a drain sample
/// waits for database counts that a saturated database answers late, and a
/// burst window is only a second or two.
pub const CPU_EVERY: Duration = Duration::from_millis(50);

/// The burst rate aimed for, cancels per second.
pub const TARGET_BURST_PER_S: f64 = 10_000.0;

/// Who used the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// RabbitMQ (the node under test's `beam.smp`, or every one when its
    /// pid is not known).
    Broker,
    /// PostgreSQL (every `postgres` process); SQLite runs inside the service.
    Database,
    /// The service under test.
    Service,
    /// This bench (HTTP clients, progress queries, this sampler).
    Bench,
}

impl Role {
    const ALL: [Role; 4] = [Role::Broker, Role::Database, Role::Service, Role::Bench];

    fn as_str(self) -> &'static str {
        match self {
            Role::Broker => "broker",
            Role::Database => "database",
            Role::Service => "service",
            Role::Bench => "bench",
        }
    }
}

/// CPU seconds used so far, per role and by the whole machine.
#[derive(Debug, Clone, Default)]
pub struct Cpu {
    /// Per role, in [`Role::ALL`] order.
    by_role: [f64; 4],
    /// The whole machine: busy and total CPU seconds over all cores.
    busy_s: f64,
    total_s: f64,
}

impl Cpu {
    /// CPU seconds of one role so far.
    pub fn seconds(&self, role: Role) -> f64 {
        self.by_role[role as usize]
    }

    /// Reads `/proc` now (Linux). `service` is the pid of the service under
    /// test (none once it is stopped), `broker` that of the broker's node when known.
    pub fn read(service: Option<u32>, broker: Option<u32>, ticks: f64) -> Self {
        let mut cpu = Cpu::default();
        let me = std::process::id();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                let Some((head, rest)) = stat.rsplit_once(')') else {
                    continue;
                };
                let comm = head.split_once('(').map(|(_, c)| c).unwrap_or("");
                let role = if Some(pid) == service {
                    Role::Service
                } else if pid == me {
                    Role::Bench
                } else if comm == "beam.smp" && broker.is_none_or(|b| b == pid) {
                    Role::Broker
                } else if comm == "postgres" {
                    Role::Database
                } else {
                    continue;
                };
                let fields: Vec<&str> = rest.split_whitespace().collect();
                let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
                let used = tick(11).unwrap_or(0.0) + tick(12).unwrap_or(0.0);
                cpu.by_role[role as usize] += used / ticks;
            }
        }
        // The first line of /proc/stat: user nice system idle iowait irq softirq steal.
        if let Some(line) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string))
        {
            let v: Vec<f64> = line
                .split_whitespace()
                .skip(1)
                .take(8)
                .filter_map(|f| f.parse().ok())
                .collect();
            if v.len() == 8 {
                let idle = v[3] + v[4];
                let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
                cpu.busy_s = busy / ticks;
                cpu.total_s = (busy + idle) / ticks;
            }
        }
        cpu
    }
}

impl Cpu {
    /// The reading a fraction `f` of the way from `a` to `b`.
    fn between_readings(a: &Cpu, b: &Cpu, f: f64) -> Cpu {
        let mix = |x: f64, y: f64| x + (y - x) * f;
        let mut by_role = [0.0; 4];
        for (i, r) in by_role.iter_mut().enumerate() {
            *r = mix(a.by_role[i], b.by_role[i]);
        }
        Cpu {
            by_role,
            busy_s: mix(a.busy_s, b.busy_s),
            total_s: mix(a.total_s, b.total_s),
        }
    }
}

/// CPU readings every [`CPU_EVERY`] from a thread of their own, while a drain
/// is watched: no database query stands between two of them.
pub struct CpuTrace {
    readings: std::sync::Arc<std::sync::Mutex<Vec<(i64, Cpu)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CpuTrace {
    /// Starts reading (see [`Cpu::read`] for `service` and `broker`).
    pub fn start(service: Option<u32>, broker: Option<u32>, ticks: f64) -> Self {
        use std::sync::atomic::Ordering;
        let readings = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (readings, stop) = (readings.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let reading = Self::read(service, broker, ticks);
                    if let Ok(mut r) = readings.lock() {
                        r.push(reading);
                    }
                    std::thread::sleep(CPU_EVERY);
                }
                // One more once stopped: the drain ended (its last cancel
                // committed) before, so the readings cover it whatever the
                // phase of the last one in the loop.
                if let Ok(mut r) = readings.lock() {
                    r.push(Self::read(service, broker, ticks));
                }
            })
        };
        Self {
            readings,
            stop,
            thread: Some(thread),
        }
    }

    /// One reading, stamped when it was taken (epoch ms).
    fn read(service: Option<u32>, broker: Option<u32>, ticks: f64) -> (i64, Cpu) {
        let at = order_timeout::domain::Millis::now().0;
        (at, Cpu::read(service, broker, ticks))
    }

    /// Stops reading; the readings so far and one taken now, oldest first.
    pub fn finish(mut self) -> Vec<(i64, Cpu)> {
        self.halt();
        self.readings
            .lock()
            .map(|mut r| std::mem::take(&mut *r))
            .unwrap_or_default()
    }

    fn halt(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for CpuTrace {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One look at the drain.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When (epoch ms).
    pub at_ms: i64,
    /// Orders cancelled so far.
    pub cancelled: i64,
    /// Orders still `pending_payment` whose deadline has passed.
    pub overdue: i64,
    /// Messages in all TTL levels, or ready in the native stage's wait queue
    /// (0 in plugin mode; timers the wait queue holds are not counted).
    pub levels: u32,
    /// Messages ready in the ingest queue.
    pub ingest: u32,
    /// Messages ready in the payment work queue.
    pub work: u32,
}

/// Counts messages with passive declares on its own connection to the run's
/// vhost, one channel per queue and all at once: a level queue busy
/// dead-lettering answers late, and the others should not wait for it.
pub struct Depths {
    _conn: Connection,
    /// The delay stage's queues (the TTL levels, the native wait queue, none
    /// in plugin mode), then ingest, then work.payment.
    queues: Vec<(String, Channel)>,
}

impl Depths {
    /// Opens a channel per queue of `prefix` on `conn` (the run's vhost), in
    /// delay mode `mode`.
    pub async fn new(conn: Connection, prefix: &str, mode: &str) -> anyhow::Result<Self> {
        let names = Names::new(prefix);
        let mut wanted: Vec<String> = match mode {
            "ttl" => (0..LEVELS).map(|l| names.level(l)).collect(),
            "native" => vec![names.wait()],
            _ => Vec::new(),
        };
        wanted.push(names.ingest());
        wanted.push(names.work(TimeoutKind::Payment));
        let mut queues = Vec::with_capacity(wanted.len());
        for queue in wanted {
            queues.push((queue, conn.create_channel().await?));
        }
        Ok(Self {
            _conn: conn,
            queues,
        })
    }

    async fn ready(channel: &Channel, queue: &str) -> anyhow::Result<u32> {
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("passive declare of {queue}"))?;
        Ok(q.message_count())
    }

    /// (levels, ingest, work.payment) now.
    pub async fn read(&self) -> anyhow::Result<(u32, u32, u32)> {
        let counts = futures_util::future::try_join_all(
            self.queues
                .iter()
                .map(|(q, channel)| Self::ready(channel, q)),
        )
        .await?;
        let n = counts.len();
        let levels = counts[..n - 2].iter().sum();
        Ok((levels, counts[n - 2], counts[n - 1]))
    }
}

/// Machine CPU milliseconds per cancel over a burst's window, and the
/// database's part of them (PostgreSQL's processes; zero on SQLite, which runs
/// inside the process that cancels).
#[derive(Debug, Clone, Copy)]
pub struct CpuPerCancel {
    /// Every process on the machine.
    pub machine_ms: f64,
    /// The database's processes.
    pub database_ms: f64,
}

/// What a drain's watch took: its samples and its CPU readings.
pub type Drained = (Vec<Sample>, Vec<(i64, Cpu)>);

/// The samples of one drain and what they say.
pub struct Profile {
    samples: Vec<Sample>,
    /// The CPU readings of the same drain ([`CpuTrace`]), oldest first.
    cpu: Vec<(i64, Cpu)>,
}

/// CPU used over a window, in cores.
struct Cores {
    by_role: [f64; 4],
    busy: f64,
    total: f64,
    wall_s: f64,
    /// Machine CPU seconds (all processes) spent in the window.
    busy_s: f64,
}

impl Cores {
    /// The CPU used between readings `a` and `b`, taken `wall_s` apart.
    fn between(a: &Cpu, b: &Cpu, wall_s: f64) -> Self {
        let mut by_role = [0.0; 4];
        for (i, r) in by_role.iter_mut().enumerate() {
            *r = (b.by_role[i] - a.by_role[i]) / wall_s;
        }
        Self {
            by_role,
            busy: (b.busy_s - a.busy_s) / wall_s,
            total: (b.total_s - a.total_s) / wall_s,
            wall_s,
            busy_s: b.busy_s - a.busy_s,
        }
    }

    /// Busy for at least 90 % of the window.
    fn saturated(&self) -> bool {
        self.busy >= 0.9 * self.total
    }

    /// Machine CPU milliseconds per operation, `n` operations in the window.
    fn ms_per(&self, n: usize) -> f64 {
        self.busy_s * 1000.0 / n.max(1) as f64
    }

    /// CPU milliseconds of one role per operation, `n` operations in the window.
    fn role_ms_per(&self, role: Role, n: usize) -> f64 {
        self.by_role[role as usize] * self.wall_s * 1000.0 / n.max(1) as f64
    }

    /// "broker 0.97, database 0.41, …" for a verdict.
    fn share(&self) -> String {
        Role::ALL
            .iter()
            .map(|r| format!("{} {:.2}", r.as_str(), self.by_role[*r as usize]))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Cores per process, for the JSON.
    fn by_process(&self) -> serde_json::Map<String, Value> {
        Role::ALL
            .iter()
            .map(|r| {
                let cores = round2(self.by_role[*r as usize]);
                (r.as_str().to_string(), json!(cores))
            })
            .collect()
    }
}

impl Profile {
    /// Wraps the samples and the CPU readings taken during one drain.
    pub fn new((samples, cpu): Drained) -> Self {
        Self { samples, cpu }
    }

    /// The CPU reading at `ms`, interpolated between the two around it.
    fn cpu_at(&self, ms: i64) -> Option<Cpu> {
        let after = self.cpu.iter().position(|(at, _)| *at >= ms)?;
        let (b_at, b) = &self.cpu[after];
        if after == 0 {
            return (*b_at == ms).then(|| b.clone());
        }
        let (a_at, a) = &self.cpu[after - 1];
        let f = (ms - a_at) as f64 / (b_at - a_at).max(1) as f64;
        Some(Cpu::between_readings(a, b, f))
    }

    /// CPU between `from_ms` and `to_ms` exactly, from the readings
    /// around each.
    fn cores(&self, from_ms: i64, to_ms: i64) -> Option<Cores> {
        let wall_s = (to_ms - from_ms) as f64 / 1000.0;
        let (a, b) = (self.cpu_at(from_ms)?, self.cpu_at(to_ms)?);
        (wall_s > 0.0).then(|| Cores::between(&a, &b, wall_s))
    }

    /// CPU per cancel between the first and last cancel (epoch ms), `cancels`
    /// of them: the same window and arithmetic as [`Profile::limit`]'s, so
    /// that the service's and the baseline's figures compare.
    pub fn cpu_per_cancel(
        &self,
        (first_ms, last_ms): (i64, i64),
        cancels: usize,
    ) -> Option<CpuPerCancel> {
        let cores = self.cores(first_ms, last_ms)?;
        Some(CpuPerCancel {
            machine_ms: cores.ms_per(cancels),
            database_ms: cores.role_ms_per(Role::Database, cancels),
        })
    }

    /// The limit of the burst between its first and last cancel (epoch ms), as
    /// JSON, with a sentence for the table. `cancels` is the burst's cancels,
    /// `rate` its measured cancels per second, `offered` what it asked for.
    pub fn limit(
        &self,
        mode: &str,
        (first_ms, last_ms): (i64, i64),
        cancels: usize,
        rate: f64,
        offered: f64,
    ) -> Value {
        let Some(cores) = self.cores(first_ms, last_ms) else {
            return json!({ "verdict": "not enough samples in the burst window" });
        };
        let cpu_ms_per_cancel = cores.ms_per(cancels);
        let database_ms_per_cancel = cores.role_ms_per(Role::Database, cancels);
        let cores_at_target = cpu_ms_per_cancel * TARGET_BURST_PER_S / 1000.0;
        // The moment most orders were overdue: where were their timers?
        let peak = self
            .samples
            .iter()
            .filter(|s| s.at_ms >= first_ms && s.at_ms <= last_ms)
            .max_by_key(|s| s.overdue);
        let (overdue, levels, ingest, work) = peak
            .map(|s| (s.overdue, s.levels, s.ingest, s.work))
            .unwrap_or_default();
        let machine_cores = cores.total;
        let saturated = cores.saturated();
        let waiting_in = if overdue == 0 {
            "nowhere (no order was overdue at any sample)"
        } else if i64::from(work) * 2 >= overdue {
            "the work queue: the consumer and the database were behind"
        } else if i64::from(ingest) * 2 >= overdue {
            "the ingest queue: the router was behind"
        } else if mode == "plugin" {
            // The plugin's timers are in no queue: what is nowhere else is there.
            "the plugin's delay stage: the broker released due timers more slowly than they fell due"
        } else if mode == "native" {
            // Held timers are not counted by a passive declare: likewise.
            "the native stage: the wait queue released due timers, or the deferrer moved them into due, more slowly than they fell due"
        } else {
            "the TTL levels: the broker moved due timers out of the levels more slowly than they fell due"
        };
        let share = cores.share();
        let kept_up = rate >= 0.9 * offered;
        let verdict = if kept_up {
            format!(
                "none reached: the service kept up with the offered {offered:.0}/s \
                 (CPU {:.2} of {:.0} cores busy: {}); raise --burst to find the limit",
                cores.busy, machine_cores, share,
            )
        } else {
            format!(
                "at the peak {overdue} orders were overdue, waiting in {waiting_in} \
             (levels {levels}, ingest {ingest}, work {work}); CPU {:.2} of {:.0} cores busy \
             ({}){}; {cpu_ms_per_cancel:.2} ms of machine CPU per cancel, so {:.0}/s would \
             need {cores_at_target:.1} cores",
                cores.busy,
                machine_cores,
                share,
                if saturated { ", saturated" } else { "" },
                TARGET_BURST_PER_S,
            )
        };
        json!({
            "kept_up": kept_up,
            "window_s": (cores.wall_s * 100.0).round() / 100.0,
            "cores_busy": round2(cores.busy),
            "cores": round2(machine_cores),
            "cpu_saturated": saturated,
            "cores_by_process": cores.by_process(),
            "machine_cpu_ms_per_cancel": round2(cpu_ms_per_cancel),
            "database_cpu_ms_per_cancel": round2(database_ms_per_cancel),
            "cores_needed_at_target": round2(cores_at_target),
            "target_per_s": TARGET_BURST_PER_S,
            "short_of_target_by": round2(TARGET_BURST_PER_S / rate.max(1.0)),
            "peak_overdue": { "orders": overdue, "in_levels": levels, "in_ingest": ingest, "in_work_queue": work },
            "verdict": verdict,
        })
    }

    /// The samples from `from_ms` on, about one per second, for the JSON.
    pub fn series(&self, from_ms: i64) -> Value {
        let mut out = Vec::new();
        let mut next = i64::MIN;
        for s in self.samples.iter().filter(|s| s.at_ms >= from_ms) {
            if s.at_ms >= next {
                out.push(json!({
                    "t_ms": s.at_ms - from_ms,
                    "cancelled": s.cancelled,
                    "overdue": s.overdue,
                    "levels": s.levels,
                    "ingest": s.ingest,
                    "work": s.work,
                }));
                next = s.at_ms + 1000;
            }
        }
        Value::Array(out)
    }
}

/// What the CPU did between two readings `wall_s` apart while `n` operations
/// went through at `rate` per second, against a target rate: cores per process,
/// machine CPU per operation, and the cores the target would need at that cost.
pub fn cpu_usage(a: &Cpu, b: &Cpu, wall_s: f64, n: usize, rate: f64, target: f64) -> Value {
    let cores = Cores::between(a, b, wall_s.max(1e-3));
    let ms_per_op = cores.ms_per(n);
    let saturated = cores.saturated();
    json!({
        "cores_busy": round2(cores.busy),
        "cores": round2(cores.total),
        "cpu_saturated": saturated,
        "cores_by_process": cores.by_process(),
        "machine_cpu_ms_per_op": round2(ms_per_op),
        "target_per_s": target,
        "cores_needed_at_target": round2(ms_per_op * target / 1000.0),
        "short_of_target_by": round2(target / rate.max(1.0)),
        "verdict": format!(
            "CPU {:.2} of {:.0} cores busy ({}){}; {ms_per_op:.2} ms of machine CPU \
             per order, so {target:.0}/s would need {:.1} cores",
            cores.busy,
            cores.total,
            cores.share(),
            if saturated { ", saturated" } else { "" },
            ms_per_op * target / 1000.0
        ),
    })
}

/// `x` to two decimals, as the reports give CPU figures.
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
