//! `narad bench --consume`: queue-mode consumers beside the producers. Each of the W consumer
//! workers long-polls one topic (`GET …/consume?wait=2s`, keep-alive) and acks every message it is
//! handed (`POST …/ack`); it stops once the producers are done and two of its polls in a row came back
//! empty. Every produced payload carries the time its request was sent (`{"t":<ns since the bench
//! started>,"bench":"x…"}`), so each delivery gives a send → delivered latency: an upper bound of
//! accept → delivered by the produce's own latency (reported beside it).

#[cfg(not(madsim))]
pub use driver::run;

/// A payload of `bytes` bytes (at least the stamp) stamped with `sent_ns`: `{"t":N,"bench":"x…"}`.
pub fn stamped_payload(bytes: usize, sent_ns: u64) -> Vec<u8> {
    let head = format!("{{\"t\":{sent_ns},\"bench\":\"");
    let tail = "\"}";
    let mut payload = Vec::with_capacity(bytes.max(head.len() + tail.len()));
    payload.extend_from_slice(head.as_bytes());
    payload.resize(bytes.saturating_sub(tail.len()).max(head.len()), b'x');
    payload.extend_from_slice(tail.as_bytes());
    payload
}

/// The stamp of a delivered message's JSON (`payload.t`).
#[cfg_attr(madsim, allow(dead_code))] // The workers that read it run outside madsim.
fn stamp_of(message: &serde_json::Value) -> Option<u64> {
    message["payload"]["t"].as_u64()
}

/// The consumer workers (outside madsim, as the producers' are).
#[cfg(not(madsim))]
mod driver {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::super::client::{exchange, Connection};
    use super::super::http1;
    use super::super::report::{ConsumeFigures, LatencySummary};
    use super::super::workload::{Plan, LATENCY_SAMPLES_MAX};
    use super::stamp_of;

    /// How long one consume waits for a message.
    const POLL_WAIT: &str = "2s";
    /// Empty polls in a row that end a worker once the producers are done.
    const EMPTY_POLLS_TO_STOP: u32 = 2;

    #[derive(Default)]
    struct Tally {
        delivered: u64,
        acked: u64,
        errors: BTreeMap<String, u64>,
        latencies_ns: Vec<u64>,
        first: Option<Instant>,
        last: Option<Instant>,
    }

    /// Runs `workers` consumers until the producers are `done` and each saw two empty polls.
    pub async fn run(
        plan: &Plan,
        addrs: &[SocketAddr],
        workers: usize,
        start: Instant,
        done: Arc<AtomicBool>,
    ) -> ConsumeFigures {
        let samples_max = LATENCY_SAMPLES_MAX / workers.max(1);
        let tasks: Vec<_> = (0..workers)
            .map(|index| {
                let addr = addrs[index % addrs.len()];
                let target = format!("/v1/topics/{}", plan.topic_name(index % plan.topics));
                let host = (plan.authority.clone(), plan.authorization.clone());
                let done = done.clone();
                tokio::spawn(worker(addr, target, host, start, done, samples_max))
            })
            .collect();
        let mut all = Tally::default();
        for task in tasks {
            let Ok(one) = task.await else { continue };
            all.delivered += one.delivered;
            all.acked += one.acked;
            for (kind, count) in one.errors {
                *all.errors.entry(kind).or_default() += count;
            }
            all.latencies_ns.extend(one.latencies_ns);
            all.first = match (all.first, one.first) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            all.last = all.last.max(one.last);
        }
        let elapsed_s = match (all.first, all.last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first).as_secs_f64(),
            _ => 0.0,
        };
        ConsumeFigures {
            workers,
            delivered: all.delivered,
            acked: all.acked,
            elapsed_s,
            errors: all.errors,
            latency: LatencySummary::from_nanos(all.latencies_ns),
        }
    }

    async fn worker(
        addr: SocketAddr,
        target: String,
        (authority, authorization): (String, Option<String>),
        start: Instant,
        done: Arc<AtomicBool>,
        samples_max: usize,
    ) -> Tally {
        let headers: Vec<(&str, &str)> = authorization
            .as_deref()
            .map(|value| ("Authorization", value))
            .into_iter()
            .collect();
        let mut tally = Tally::default();
        let mut connection: Option<Connection> = None;
        let consume = http1::request(
            "GET",
            &format!("{target}/consume?wait={POLL_WAIT}"),
            &authority,
            &headers,
            b"",
        );
        let mut empty = 0;
        loop {
            let finished = done.load(Ordering::Relaxed);
            tally.first.get_or_insert_with(Instant::now);
            let response = match exchange(&mut connection, addr, &consume).await {
                Ok(response) => response,
                Err(kind) => {
                    *tally.errors.entry(format!("consume {kind}")).or_default() += 1;
                    if finished {
                        empty += 1;
                    }
                    if empty >= EMPTY_POLLS_TO_STOP {
                        break;
                    }
                    continue;
                }
            };
            if response.status == 204 {
                if finished {
                    empty += 1;
                    if empty >= EMPTY_POLLS_TO_STOP {
                        break;
                    }
                }
                continue;
            }
            if response.status != 200 {
                *tally
                    .errors
                    .entry(format!("consume status {}", response.status))
                    .or_default() += 1;
                continue;
            }
            empty = 0;
            let now = Instant::now();
            tally.delivered += 1;
            tally.last = Some(now);
            let Ok(message) = serde_json::from_slice::<serde_json::Value>(&response.body) else {
                *tally.errors.entry("consume body".into()).or_default() += 1;
                continue;
            };
            if let Some(sent_ns) = stamp_of(&message) {
                if tally.latencies_ns.len() < samples_max {
                    let sent = start + Duration::from_nanos(sent_ns);
                    let nanos = now.saturating_duration_since(sent).as_nanos();
                    tally
                        .latencies_ns
                        .push(u64::try_from(nanos).unwrap_or(u64::MAX));
                }
            }
            let Some(handle) = message["receipt_handle"].as_str() else {
                *tally
                    .errors
                    .entry("consume without a handle".into())
                    .or_default() += 1;
                continue;
            };
            let ack = http1::request(
                "POST",
                &format!("{target}/ack?receipt_handle={handle}"),
                &authority,
                &headers,
                b"",
            );
            match exchange(&mut connection, addr, &ack).await {
                Ok(response) if response.status == 204 => tally.acked += 1,
                Ok(response) => {
                    *tally
                        .errors
                        .entry(format!("ack status {}", response.status))
                        .or_default() += 1
                }
                Err(kind) => *tally.errors.entry(format!("ack {kind}")).or_default() += 1,
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_payload_is_json_of_the_asked_size_carrying_its_stamp() {
        for bytes in [0, 10, 64, 256, 1000] {
            let payload = stamped_payload(bytes, 123_456_789);
            let value: serde_json::Value = serde_json::from_slice(&payload).expect("JSON");
            let message = serde_json::json!({ "payload": value });
            assert_eq!(stamp_of(&message), Some(123_456_789), "{bytes}");
            assert!(
                payload.len() == bytes || bytes < 30,
                "{bytes}: {}",
                payload.len()
            );
        }
    }
}
