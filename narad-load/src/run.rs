//! The bench itself: create the topics, run the workers, scrape `/metrics` around the measured window,
//! wait for the dispatch backlog to drain, and build the [`Report`].
//!
//! Scheduling: every request takes a ticket from one counter. Closed loop, a worker sends as soon as
//! its previous request was answered. With `--rate`, ticket `i` is due at `start + i / requests_per_s`
//! and its latency counts from that moment. A request is measured when it is due at or after the end
//! of the warm-up; with `--count`, measured requests also claim one of `ceil(count / batch)` slots and
//! the workers stop when none is left; with `--duration`, no request due after the end is sent.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs as _};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio::time::Instant;

use super::client::{exchange, Connection};
use super::http1;
use super::report::{LatencySummary, NodeFigures, Report};
use super::scrape::Scrape;
use super::workload::{batch_body, payload, Plan, Stop, TopicPicker, LATENCY_SAMPLES_MAX};
use super::BenchArgs;

/// How often the backlog gauge is read while waiting for it to drain.
const DRAIN_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Topic creations in flight at once (one connection each).
const CREATES_IN_FLIGHT: usize = 16;
/// Owner-side fdatasyncs (partition logs and the owner journal), when the node exports the counter;
/// counted instead of [`PARTITION_FSYNC_COUNTS`], which it covers.
const OWNER_FSYNCS: &str = "narad_owner_fsyncs_total";
/// Partition-log fsync counters the node may export (summed when present).
const PARTITION_FSYNC_COUNTS: [&str; 2] = [
    "narad_storage_fsync_duration_seconds_count",
    "narad_partition_fsync_duration_seconds_count",
];

/// `narad bench`: runs the plan and prints the report. Exit code 0 when every request succeeded,
/// 1 when any failed (the report is printed anyway), 2 for bad flags.
pub fn main(args: BenchArgs) -> ExitCode {
    let plan = match Plan::from_args(&args) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("narad bench: {error}");
            return ExitCode::from(2);
        }
    };
    let mut builder = if plan.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(plan.threads);
        builder
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("narad bench: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(plan.clone())) {
        Ok(report) => {
            print!("{}", report.render(plan.output));
            if plan.output == super::OutputFormat::Json {
                println!();
            }
            if report.errors_total() > 0 || report.requests_ok == 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("narad bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// What every worker shares.
struct Shared {
    plan: Plan,
    /// The nodes; worker `i` loads `addrs[i mod n]`.
    addrs: Vec<SocketAddr>,
    start: Instant,
    measure_start: Instant,
    /// No request due at or after this is sent (`--duration`).
    end: Option<Instant>,
    /// Seconds between two due times (`--rate`).
    interval_s: Option<f64>,
    tickets: AtomicU64,
    /// Measured requests still to send (`--count`).
    requests_left: AtomicU64,
    payload: Vec<u8>,
    /// Each topic's single-produce request when it never changes (keyless).
    fixed_requests: Option<Vec<Vec<u8>>>,
}

impl Shared {
    fn request(&self, ticket: u64, topic: usize) -> Vec<u8> {
        if let Some(requests) = &self.fixed_requests {
            return requests[topic].clone();
        }
        let plan = &self.plan;
        let stamped;
        let payload = match plan.consume {
            Some(_) => {
                let sent_ns = Instant::now()
                    .saturating_duration_since(self.start)
                    .as_nanos();
                stamped = super::consume::stamped_payload(
                    plan.payload_bytes,
                    u64::try_from(sent_ns).unwrap_or(u64::MAX),
                );
                &stamped
            }
            None => &self.payload,
        };
        let first = ticket * plan.messages_per_request();
        match plan.batch {
            Some(batch) => {
                let keys: Vec<Option<String>> =
                    (first..first + batch as u64).map(|m| plan.key(m)).collect();
                http1::request(
                    "POST",
                    &plan.target(topic),
                    &plan.authority,
                    &plan.headers(&[("Content-Type", "application/json")]),
                    &batch_body(payload, &keys),
                )
            }
            None => {
                let target = match plan.key(first) {
                    Some(key) => format!("{}?key={key}", plan.target(topic)),
                    None => plan.target(topic),
                };
                http1::request(
                    "POST",
                    &target,
                    &plan.authority,
                    &plan.headers(&[]),
                    payload,
                )
            }
        }
    }
}

/// One worker's counts.
#[derive(Default)]
struct Tally {
    requests_ok: u64,
    errors: BTreeMap<String, u64>,
    latencies_ns: Vec<u64>,
    last_done: Option<Instant>,
}

/// Runs a bench against a node.
pub async fn run(plan: Plan) -> anyhow::Result<Report> {
    let addrs = plan
        .authorities
        .iter()
        .map(|authority| resolve(authority))
        .collect::<anyhow::Result<Vec<SocketAddr>>>()?;
    let addr = addrs[0];
    ensure_topics(addr, &plan).await?;
    eprintln!("narad bench: producing ({})...", plan.describe());
    let per_request = plan.messages_per_request();
    let requests_left = match plan.stop {
        Stop::Count(count) => count.div_ceil(per_request),
        Stop::After(_) => u64::MAX,
    };
    let start = Instant::now();
    let measure_start = start + plan.warmup;
    let end = match plan.stop {
        Stop::After(duration) => Some(measure_start + duration),
        Stop::Count(_) => None,
    };
    let payload = payload(plan.payload_bytes);
    // Consumed payloads carry their send time: no two requests are the same.
    let fixed_requests =
        (plan.batch.is_none() && plan.keys == 0 && plan.consume.is_none()).then(|| {
            (0..plan.topics)
                .map(|topic| {
                    http1::request(
                        "POST",
                        &plan.target(topic),
                        &plan.authority,
                        &plan.headers(&[]),
                        &payload,
                    )
                })
                .collect()
        });
    let shared = Arc::new(Shared {
        interval_s: plan.rate_per_s.map(|rate| per_request as f64 / rate),
        plan: plan.clone(),
        addrs: addrs.clone(),
        start,
        measure_start,
        end,
        tickets: AtomicU64::new(0),
        requests_left: AtomicU64::new(requests_left),
        payload,
        fixed_requests,
    });
    let scraped = addrs.clone();
    let before = tokio::spawn(async move {
        tokio::time::sleep_until(measure_start).await;
        scrape_all(&scraped).await
    });
    let samples_max = LATENCY_SAMPLES_MAX / plan.workers;
    let producing_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumers = plan.consume.map(|consumers| {
        let (plan, addrs, done) = (plan.clone(), addrs.clone(), producing_done.clone());
        eprintln!("narad bench: consuming with {consumers} workers beside the producers...");
        tokio::spawn(
            async move { super::consume::run(&plan, &addrs, consumers, start, done).await },
        )
    });
    let workers: Vec<_> = (0..plan.workers)
        .map(|index| tokio::spawn(worker(shared.clone(), index, samples_max)))
        .collect();
    let mut tally = Tally::default();
    for handle in workers {
        let one = handle.await.context("a bench worker panicked")?;
        tally.requests_ok += one.requests_ok;
        for (kind, count) in one.errors {
            *tally.errors.entry(kind).or_default() += count;
        }
        tally.latencies_ns.extend(one.latencies_ns);
        tally.last_done = tally.last_done.max(one.last_done);
    }
    producing_done.store(true, Ordering::Relaxed);
    let consume = match consumers {
        Some(task) => Some(task.await.context("the consumers panicked")?),
        None => None,
    };
    let finished = tally.last_done.unwrap_or_else(Instant::now);
    let elapsed_s = finished
        .saturating_duration_since(measure_start)
        .as_secs_f64();
    let before = before.await.context("the metrics task panicked")?;
    let (after, drained, backlog) = drain_all(&addrs, plan.drain_timeout).await;
    let node = match (before, after) {
        (Ok(before), Ok(after)) => Some(node_figures(&before, &after, drained, backlog)),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("narad bench: cannot read /metrics: {error:#}");
            None
        }
    };
    let messages_ok = tally.requests_ok * per_request;
    Ok(Report {
        description: plan.describe(),
        elapsed_s,
        requests_ok: tally.requests_ok,
        messages_ok,
        payload_bytes_ok: messages_ok * plan.payload_bytes as u64,
        errors: tally.errors,
        latency: LatencySummary::from_nanos(tally.latencies_ns),
        node,
        consume,
    })
}

async fn worker(shared: Arc<Shared>, index: usize, samples_max: usize) -> Tally {
    let addr = shared.addrs[index % shared.addrs.len()];
    let mut tally = Tally::default();
    let mut connection: Option<Connection> = None;
    let mut topics = TopicPicker::new(shared.plan.topics, index);
    loop {
        let ticket = shared.tickets.fetch_add(1, Ordering::Relaxed);
        let due = match shared.interval_s {
            Some(interval_s) => shared.start + Duration::from_secs_f64(ticket as f64 * interval_s),
            None => Instant::now(),
        };
        if shared.end.is_some_and(|end| due >= end) {
            break;
        }
        let measured = due >= shared.measure_start;
        if measured && !claim(&shared.requests_left) {
            break;
        }
        if shared.interval_s.is_some() {
            tokio::time::sleep_until(due).await;
        }
        let request = shared.request(ticket, topics.next_topic());
        let outcome = exchange(&mut connection, addr, &request)
            .await
            .map(|response| response.status);
        let done = Instant::now();
        if !measured {
            continue;
        }
        tally.last_done = Some(done);
        match outcome {
            Ok(status) if (200..300).contains(&status) => {
                tally.requests_ok += 1;
                if tally.latencies_ns.len() < samples_max {
                    let nanos = done.saturating_duration_since(due).as_nanos();
                    tally
                        .latencies_ns
                        .push(u64::try_from(nanos).unwrap_or(u64::MAX));
                }
            }
            Ok(status) => *tally.errors.entry(format!("status {status}")).or_default() += 1,
            Err(kind) => *tally.errors.entry(kind).or_default() += 1,
        }
    }
    tally
}

/// Takes one slot from `left`; false when none is left.
fn claim(left: &AtomicU64) -> bool {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

fn resolve(authority: &str) -> anyhow::Result<SocketAddr> {
    authority
        .to_socket_addrs()
        .with_context(|| format!("resolving {authority}"))?
        .next()
        .with_context(|| format!("{authority} resolves to no address"))
}

/// Creates the plan's topics, [`CREATES_IN_FLIGHT`] at a time; an existing one (409) is used as it
/// is.
async fn ensure_topics(addr: SocketAddr, plan: &Plan) -> anyhow::Result<()> {
    let names: Arc<[String]> = plan.topic_names().into();
    let next = Arc::new(AtomicUsize::new(0));
    let creators: Vec<_> = (0..CREATES_IN_FLIGHT.min(names.len()))
        .map(|_| {
            let (names, next) = (names.clone(), next.clone());
            let (authority, partitions) = (plan.authority.clone(), plan.partitions);
            let authorization = plan.authorization.clone();
            tokio::spawn(async move {
                let mut connection: Option<Connection> = None;
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(name) = names.get(index) else {
                        return anyhow::Ok(());
                    };
                    create_topic(
                        &mut connection,
                        addr,
                        (&authority, authorization.as_deref()),
                        name,
                        partitions,
                    )
                    .await?;
                }
            })
        })
        .collect();
    for creator in creators {
        creator.await.context("a topic-creating task panicked")??;
    }
    Ok(())
}

/// Creates one topic on `connection` (opened first if needed or closed); 409 (it exists) is fine.
async fn create_topic(
    connection: &mut Option<Connection>,
    addr: SocketAddr,
    (authority, authorization): (&str, Option<&str>),
    name: &str,
    partitions: u32,
) -> anyhow::Result<()> {
    let body = serde_json::json!({"name": name, "partitions": partitions}).to_string();
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(authorization.map(|value| ("Authorization", value)));
    let request = http1::request("POST", "/v1/topics", authority, &headers, body.as_bytes());
    if connection.as_ref().is_none_or(Connection::is_closed) {
        let fresh = Connection::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        *connection = Some(fresh);
    }
    let open = connection.as_mut().expect("connected above");
    let response = match open.exchange(&request).await {
        Ok(response) => response,
        Err(error) => {
            *connection = None;
            return Err(error).with_context(|| format!("creating topic {name}"));
        }
    };
    match response.status {
        201 | 409 => Ok(()),
        status => bail!(
            "creating topic {name}: {status} {}",
            String::from_utf8_lossy(&response.body).trim()
        ),
    }
}

/// The nodes' metrics as one scrape: counters and histogram buckets add up over the nodes.
async fn scrape_all(addrs: &[SocketAddr]) -> anyhow::Result<Scrape> {
    let mut text = String::new();
    for addr in addrs {
        text.push_str(&scrape_text(*addr).await?);
        text.push('\n');
    }
    Ok(Scrape::parse(&text))
}

/// [`drain`] on every node; the scrapes joined, whether all drained, the backlogs summed.
async fn drain_all(addrs: &[SocketAddr], timeout: Duration) -> (anyhow::Result<Scrape>, bool, f64) {
    let mut all_drained = true;
    let mut backlog_sum = 0.0;
    for addr in addrs {
        let (_, drained, backlog) = drain(*addr, timeout).await;
        all_drained &= drained;
        backlog_sum += backlog;
    }
    (scrape_all(addrs).await, all_drained, backlog_sum)
}

async fn scrape_text(addr: SocketAddr) -> anyhow::Result<String> {
    let request = http1::request("GET", "/metrics", &addr.to_string(), &[], b"");
    let mut connection = Connection::connect(addr).await?;
    let response = connection.exchange(&request).await?;
    if response.status != 200 {
        bail!("GET /metrics answered {}", response.status);
    }
    Ok(String::from_utf8_lossy(&response.body).into_owned())
}

async fn scrape(addr: SocketAddr) -> anyhow::Result<Scrape> {
    Ok(Scrape::parse(&scrape_text(addr).await?))
}

/// Scrapes until the dispatch backlog reads 0 or `timeout` passes; the last scrape, whether it
/// drained, and the last backlog read.
async fn drain(addr: SocketAddr, timeout: Duration) -> (anyhow::Result<Scrape>, bool, f64) {
    let deadline = Instant::now() + timeout;
    loop {
        let scraped = scrape(addr).await;
        let backlog = scraped
            .as_ref()
            .ok()
            .and_then(|scrape| scrape.value("narad_ingress_dispatch_backlog_records"));
        let drained = backlog == Some(0.0);
        if drained || Instant::now() >= deadline {
            return (scraped, drained, backlog.unwrap_or(f64::NAN));
        }
        tokio::time::sleep(DRAIN_POLL_INTERVAL).await;
    }
}

fn node_figures(before: &Scrape, after: &Scrape, drained: bool, backlog: f64) -> NodeFigures {
    let delta = |name: &str| after.sum(name) - before.sum(name);
    let exported = |name: &str| after.samples.iter().any(|sample| sample.name == name);
    let partition_fsyncs = if exported(OWNER_FSYNCS) {
        Some(delta(OWNER_FSYNCS))
    } else {
        PARTITION_FSYNC_COUNTS
            .iter()
            .any(|name| exported(name))
            .then(|| PARTITION_FSYNC_COUNTS.iter().map(|name| delta(name)).sum())
    };
    let commits = delta("narad_ingress_wal_group_commit_records_count");
    let histogram = |name: &str| match (after.histogram(name), before.histogram(name)) {
        (Some(after), Some(before)) => Some(after.since(&before)),
        (Some(after), None) => Some(after),
        (None, _) => None,
    };
    let visible = histogram("narad_accept_to_visible_seconds");
    let wal_fsync = histogram("narad_ingress_wal_fsync_duration_seconds");
    let http_5xx = |scrape: &Scrape| {
        scrape
            .get(
                "narad_errors_total",
                &[("component", "http"), ("kind", "5xx")],
            )
            .unwrap_or(0.0)
    };
    NodeFigures {
        accepted_records: delta("narad_ingress_accepted_records_total"),
        wal_fsyncs: delta("narad_ingress_wal_fsync_duration_seconds_count"),
        partition_fsyncs,
        dispatch_commits: delta("narad_ingress_dispatch_commit_duration_seconds_count"),
        wal_fsync_p50_s: wal_fsync.as_ref().and_then(|h| h.quantile(0.50)),
        wal_fsync_p99_s: wal_fsync.as_ref().and_then(|h| h.quantile(0.99)),
        group_commit_records_mean: (commits > 0.0)
            .then(|| delta("narad_ingress_wal_group_commit_records_sum") / commits),
        accept_to_visible_p50_s: visible.as_ref().and_then(|h| h.quantile(0.50)),
        accept_to_visible_p99_s: visible.as_ref().and_then(|h| h.quantile(0.99)),
        accept_to_visible_p99_bound_s: visible.as_ref().and_then(|h| h.quantile_bound(0.99)),
        visible_records: visible.as_ref().map_or(0.0, |h| h.count()),
        http_5xx: http_5xx(after) - http_5xx(before),
        backlog_drained: drained,
        backlog_records: backlog,
    }
}
