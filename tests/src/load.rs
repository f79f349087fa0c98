//! Producer threads for the crash and disk-failure tests: each sends produces to whatever address the
//! shared [`Target`] holds, registers every call and its outcome in the test's [`SharedLedger`] (which
//! gives each record its id and self-checking payload), and keeps going through node restarts.
//! [`replay_all`] reads every partition back as the ledger's [`Observation`].
//!
//! A producer is keyed (key `k<n mod 13>` for its record `n`) or keyless, and sends single produces
//! (the payload as the raw body) or batches (payloads base64 in the JSON body) whose sizes cycle
//! through 1..=max. When the node is down ([`Target::set`] with `None`) or a request fails, it waits
//! for the target to change (bounded, [`RETRY_WAIT`]) instead of spinning. A call whose connection
//! could not be opened was never sent: it is not registered.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine as _;
use narad_core::{Offset, PartitionId, TopicId};

use crate::conn::Conn;
use crate::ledger::{judge, Observation, Outcome, Record, Served, SharedLedger, INCARNATION};
use crate::START_TIMEOUT;

/// How long a producer waits after a failed request before it tries again (less if the target
/// changes).
pub const RETRY_WAIT: Duration = Duration::from_millis(20);
/// Distinct keys of keyed producers.
pub const KEYS: u64 = 13;
/// The most records one partition's replay reads.
pub const REPLAY_RECORDS_MAX: u64 = 10_000_000;

/// The node's current address, `None` while it is down.
#[derive(Debug)]
pub struct Target {
    state: Mutex<(u64, Option<SocketAddr>)>,
    changed: Condvar,
}

impl Target {
    /// A target at `addr`.
    pub fn new(addr: SocketAddr) -> Arc<Target> {
        Arc::new(Target {
            state: Mutex::new((0, Some(addr))),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Option<SocketAddr>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the address (`None`: down) and wakes every waiting producer.
    pub fn set(&self, addr: Option<SocketAddr>) {
        let mut state = self.lock();
        state.0 += 1;
        state.1 = addr;
        self.changed.notify_all();
    }

    /// Waits (at most `timeout`) for an address; returns it with its generation.
    pub fn wait_up(&self, timeout: Duration) -> Option<(u64, SocketAddr)> {
        let state = self.lock();
        let (state, _) = self
            .changed
            .wait_timeout_while(state, timeout, |state| state.1.is_none())
            .unwrap_or_else(|p| p.into_inner());
        state.1.map(|addr| (state.0, addr))
    }

    /// Waits (at most `timeout`) for the generation to move past `generation`.
    pub fn wait_change(&self, generation: u64, timeout: Duration) {
        let state = self.lock();
        let _ = self
            .changed
            .wait_timeout_while(state, timeout, |state| state.0 == generation)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// Single produces or batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `POST /produce`, one record.
    Single,
    /// `POST /produce/batch`, 1..=max records (cycling).
    Batch {
        /// The largest batch.
        max: usize,
    },
}

/// One producer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerSpec {
    /// Unique name (of its thread).
    pub name: String,
    /// Keyed or keyless.
    pub keyed: bool,
    /// Single or batch.
    pub shape: Shape,
    /// A pause after every call (zero: as fast as the node answers), to bound a long test's records.
    pub gap: Duration,
}

impl ProducerSpec {
    /// The four kinds: keyed/keyless × single/batch, named `ks`, `us`, `kb`, `ub` plus `suffix`.
    pub fn all_kinds(suffix: &str, batch_max: usize) -> Vec<ProducerSpec> {
        let batch = Shape::Batch { max: batch_max };
        [
            ("ks", true, Shape::Single),
            ("us", false, Shape::Single),
            ("kb", true, batch),
            ("ub", false, batch),
        ]
        .into_iter()
        .map(|(name, keyed, shape)| ProducerSpec {
            name: format!("{name}{suffix}"),
            keyed,
            shape,
            gap: Duration::ZERO,
        })
        .collect()
    }
}

/// Counts of answers, shared by the producers.
#[derive(Debug, Default)]
pub struct Progress {
    counts: Mutex<Counts>,
    changed: Condvar,
}

/// Records by answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records answered 202.
    pub acked: u64,
    /// Records answered 5xx.
    pub failed_5xx: u64,
    /// Records whose connection failed mid-request.
    pub broken: u64,
    /// Records answered 4xx.
    pub refused: u64,
}

impl Progress {
    fn add(&self, update: impl FnOnce(&mut Counts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        update(&mut counts);
        self.changed.notify_all();
    }

    /// The counts now.
    pub fn counts(&self) -> Counts {
        *self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits (at most `timeout`) until `done(counts)`; returns the counts then.
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&Counts) -> bool) -> Counts {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (counts, _) = self
            .changed
            .wait_timeout_while(counts, timeout, |counts| !done(counts))
            .unwrap_or_else(|p| p.into_inner());
        *counts
    }
}

/// Running producers.
pub struct Producers {
    stop: Arc<AtomicBool>,
    progress: Arc<Progress>,
    handles: Vec<JoinHandle<()>>,
}

impl Producers {
    /// Starts one thread per spec, producing to `topic` at `target`, registering every call in
    /// `ledger`.
    pub fn start(
        topic: &str,
        target: &Arc<Target>,
        ledger: &SharedLedger,
        specs: Vec<ProducerSpec>,
    ) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let handles = specs
            .into_iter()
            .map(|spec| {
                let topic = topic.to_string();
                let target = target.clone();
                let stop = stop.clone();
                let progress = progress.clone();
                let ledger = ledger.clone();
                std::thread::Builder::new()
                    .name(format!("producer-{}", spec.name))
                    .spawn(move || produce(&topic, &target, &ledger, &spec, &stop, &progress))
                    .expect("spawn a producer thread")
            })
            .collect();
        Producers {
            stop,
            progress,
            handles,
        }
    }

    /// The shared answer counts.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Stops every producer; each finishes its call in flight and registers its outcome.
    pub fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for handle in self.handles {
            handle.join().expect("a producer thread panicked");
        }
    }
}

fn produce(
    topic: &str,
    target: &Target,
    ledger: &SharedLedger,
    spec: &ProducerSpec,
    stop: &AtomicBool,
    progress: &Progress,
) {
    let mut conn: Option<Conn> = None;
    let mut next = 0u64;
    let mut batches = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let Some((generation, addr)) = target.wait_up(START_TIMEOUT) else {
            break;
        };
        let conn = conn.get_or_insert_with(|| Conn::new(addr));
        conn.retarget(addr);
        if conn.connect().is_err() {
            // Never sent, so not registered: a copy of it would be a phantom.
            target.wait_change(generation, RETRY_WAIT);
            continue;
        }
        let count = match spec.shape {
            Shape::Single => 1,
            Shape::Batch { max } => {
                batches += 1;
                1 + batches % max.max(1)
            }
        };
        let keys = (next..next + count as u64)
            .map(|n| spec.keyed.then(|| format!("k{}", n % KEYS)))
            .collect();
        next += count as u64;
        let (attempt, records) = ledger.begin(topic, keys);
        let answer = match spec.shape {
            Shape::Single => {
                let record = &records[0];
                let path = match &record.key {
                    Some(key) => format!("/v1/topics/{topic}/produce?key={key}"),
                    None => format!("/v1/topics/{topic}/produce"),
                };
                conn.post(&path, &record.payload)
            }
            Shape::Batch { .. } => conn.request(
                "POST",
                &format!("/v1/topics/{topic}/produce/batch"),
                &[("Content-Type", "application/json")],
                batch_body(&records).as_bytes(),
            ),
        };
        let judged = judge(&answer);
        ledger.complete(attempt, judged.clone());
        if !spec.gap.is_zero() {
            pause(spec.gap);
        }
        let records_count = records.len() as u64;
        match (judged.0, &answer) {
            (Outcome::Accepted, _) => progress.add(|c| c.acked += records_count),
            (Outcome::Refused, _) => progress.add(|c| c.refused += records_count),
            (Outcome::Pending | Outcome::Failed | Outcome::TimedOut, Ok(_)) => {
                progress.add(|c| c.failed_5xx += records_count);
                target.wait_change(generation, RETRY_WAIT);
            }
            (Outcome::Pending | Outcome::Failed | Outcome::TimedOut, Err(_)) => {
                progress.add(|c| c.broken += records_count);
                target.wait_change(generation, RETRY_WAIT);
            }
        }
    }
}

/// A batch body: each record's payload base64-encoded (payloads are binary), and its key if keyed.
fn batch_body(records: &[Record]) -> String {
    let messages: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            let payload = base64::engine::general_purpose::STANDARD.encode(&record.payload);
            match &record.key {
                Some(key) => serde_json::json!({
                    "key": key, "payload": payload, "payload_encoding": "base64"
                }),
                None => serde_json::json!({"payload": payload, "payload_encoding": "base64"}),
            }
        })
        .collect();
    serde_json::json!({ "messages": messages }).to_string()
}

/// The payload bytes of a consumed message: base64 when it says so, else a JSON string's text, else
/// the embedded JSON value's text.
fn consumed_payload(message: &serde_json::Value) -> Result<Vec<u8>, String> {
    match (message.get("payload_encoding"), &message["payload"]) {
        (Some(serde_json::Value::String(encoding)), serde_json::Value::String(text))
            if encoding == "base64" =>
        {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|error| format!("payload is not base64 ({error}): {message}"))
        }
        (None, serde_json::Value::String(text)) => Ok(text.clone().into_bytes()),
        (None, serde_json::Value::Null) => Err(format!("no payload: {message}")),
        (None, raw) => Ok(raw.to_string().into_bytes()),
        (Some(encoding), _) => Err(format!("payload_encoding {encoding}: {message}")),
    }
}

/// Reads every record of partitions `0..partitions` of `topic` by replay (offset 0 up to the first
/// 204), on one keep-alive connection, each copy with the key it is served with. An unexpected answer
/// is an error naming it.
pub fn replay_all(addr: SocketAddr, topic: &str, partitions: u32) -> Result<Observation, String> {
    replay_incarnation(addr, topic, INCARNATION, partitions)
}

/// Reads every record of `topic` like [`replay_all`], labelling each copy as served from the ledger's
/// `incarnation` of it ([`SharedLedger::recreated`]): the current one, the only one a replay reads.
pub fn replay_incarnation(
    addr: SocketAddr,
    topic: &str,
    incarnation: TopicId,
    partitions: u32,
) -> Result<Observation, String> {
    let mut conn = Conn::new(addr);
    let mut replay = Observation::default();
    let name: Arc<str> = Arc::from(topic);
    for partition in 0..partitions {
        for offset in 0..REPLAY_RECORDS_MAX {
            let path = format!("/v1/topics/{topic}/consume?partition={partition}&offset={offset}");
            // A GET is safe to repeat once on a fresh connection.
            let response = conn
                .get(&path)
                .or_else(|_| conn.get(&path))
                .map_err(|error| format!("GET {path}: {error}"))?;
            match response.status {
                204 => break,
                200 => {
                    let json: serde_json::Value = serde_json::from_slice(&response.body)
                        .map_err(|error| format!("GET {path}: {error}: {}", response.text()))?;
                    let payload =
                        consumed_payload(&json).map_err(|error| format!("GET {path}: {error}"))?;
                    let key = match &json["key"] {
                        serde_json::Value::Null => None,
                        serde_json::Value::String(key) => Some(key.as_bytes()),
                        other => return Err(format!("GET {path}: key {other} is not a string")),
                    };
                    replay.served.push(
                        Served::new(
                            name.clone(),
                            incarnation,
                            PartitionId(partition),
                            Offset(offset),
                            payload,
                        )
                        .with_key(key),
                    );
                }
                status => return Err(format!("GET {path}: {status} {}", response.text())),
            }
        }
    }
    Ok(replay)
}

/// Waits for `duration` of real time (black-box tests poll a real process's metrics).
#[allow(clippy::disallowed_methods)] // Polling a real process needs real time.
pub fn pause(duration: Duration) {
    std::thread::sleep(duration);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_bodies_carry_payloads_in_base64_and_keys_when_keyed() {
        let ledger = SharedLedger::new();
        let (_, records) = ledger.begin("t", vec![Some("k0".into()), None]);
        let body: serde_json::Value = serde_json::from_str(&batch_body(&records)).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0]["key"], "k0");
        assert!(messages[1].get("key").is_none());
        for (message, record) in messages.iter().zip(&records) {
            assert_eq!(message["payload_encoding"], "base64");
            assert_eq!(consumed_payload(message), Ok(record.payload.clone()));
            assert_eq!(narad_sim::payload::decode(&record.payload), Ok(record.id));
        }
    }

    #[test]
    fn consumed_payloads_decode_base64_text_and_embedded_json() {
        let consumed = |json: &str| consumed_payload(&serde_json::from_str(json).unwrap());
        assert_eq!(
            consumed(r#"{"payload":"AP8=","payload_encoding":"base64"}"#),
            Ok(vec![0, 0xff])
        );
        assert_eq!(consumed(r#"{"payload":"a\u0000<"}"#), Ok(b"a\0<".to_vec()));
        assert_eq!(
            consumed(r#"{"payload":{"a":1}}"#),
            Ok(b"{\"a\":1}".to_vec())
        );
        assert!(consumed(r#"{"payload":"x","payload_encoding":"hex"}"#).is_err());
        assert!(consumed(r#"{"offset":1}"#).is_err());
    }

    #[test]
    fn the_four_kinds_have_distinct_names() {
        let specs = ProducerSpec::all_kinds("0", 8);
        let names: Vec<&str> = specs.iter().map(|spec| spec.name.as_str()).collect();
        assert_eq!(names, ["ks0", "us0", "kb0", "ub0"]);
        assert_eq!(specs[2].shape, Shape::Batch { max: 8 });
    }

    #[test]
    fn a_target_wakes_waiters_when_it_comes_back() {
        let target = Target::new(SocketAddr::from(([127, 0, 0, 1], 1)));
        target.set(None);
        assert_eq!(target.wait_up(Duration::from_millis(1)), None);
        let waiter = {
            let target = target.clone();
            std::thread::spawn(move || target.wait_up(Duration::from_secs(30)))
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], 2));
        target.set(Some(addr));
        assert_eq!(waiter.join().unwrap(), Some((2, addr)));
    }
}
