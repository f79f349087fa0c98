//! `narad pub`, `narad sub` and `narad replay`.
//!
//! - `pub` posts the raw body to `/produce` (`--count` times, at most `--rate` per second) and counts
//!   the 202s. A 4xx stops it (the same request is refused again), as does an unreachable node; a
//!   5xx is counted and the run goes on (the node may recover: a 503 while it starts, say).
//! - `sub` in queue mode long-polls `/consume?wait=10s`, prints each message, then acks it: at least
//!   once, since a crash between the two redelivers it. `--peek` reads offsets instead, from the high
//!   watermark on, leasing nothing.
//! - `replay` reads offsets `[from, to)` of one partition and stops at the first 204.
//!
//! A replay read answered 410 (aged out, or a damaged frame) is reported and skipped: to the
//! partition's oldest retained offset when that is ahead, else to the next offset (a damaged frame
//! in the middle of the log: the README's delivery contract keeps every frame around it readable).

use std::io::{self, IsTerminal as _, Read as _};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use super::http::{topic_path, ApiError, Client, Reply};
use super::output::{print_line, print_message, Message, MessageFormat};
use crate::cli::{PubArgs, ReplayArgs, SubArgs};

/// How long one queue-mode consume waits for a message: the server's maximum (`CONSUME_WAIT_MAX`),
/// so an idle subscriber asks once every 10 s.
const QUEUE_WAIT: &str = "10s";

/// How long `sub --peek` waits before asking again when no partition had a new message.
const PEEK_PAUSE: Duration = Duration::from_millis(200);

/// Most offsets `sub --peek` reads from one partition before turning to the next, so that one busy
/// partition does not keep the others from being printed.
const PEEK_BATCH: u32 = 256;

/// `narad pub`.
pub fn publish(args: &PubArgs) -> anyhow::Result<()> {
    let body = message_body(args)?;
    let client = Client::new(&args.client)?;
    let path = format!("{}/produce", topic_path(&args.topic));
    let partition = args.partition.map(|partition| partition.to_string());
    let mut query = Vec::new();
    if let Some(key) = &args.key {
        query.push(("key", key.as_str()));
    }
    if let Some(partition) = &partition {
        query.push(("partition", partition.as_str()));
    }

    let progress = progress_bar(args.count);
    let pacer = Pacer::start(args.rate);
    let mut tally = Tally::default();
    for sent in 0..args.count {
        pacer.wait_turn(sent);
        match client.post(&path, &query, &body) {
            Ok(reply) if reply.status == 202 => tally.accepted += 1,
            Ok(reply) => {
                let error = reply.error();
                tally.failed += 1;
                let refused = (400..500).contains(&error.status);
                tally.first_error.get_or_insert_with(|| error.into());
                if refused {
                    break;
                }
            }
            Err(error) => {
                tally.failed += 1;
                tally.first_error.get_or_insert(error);
                break;
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    let elapsed = pacer.elapsed();

    if args.count == 1 {
        if let Some(error) = tally.first_error {
            return Err(error);
        }
    }
    let line = if args.client.json {
        serde_json::json!({
            "accepted": tally.accepted,
            "failed": tally.failed,
            "elapsed_ms": u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        })
        .to_string()
    } else {
        tally.summary(args.count, elapsed)
    };
    print_line(line.as_bytes())?;
    match tally.first_error {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// What `pub` sent and how it went.
#[derive(Debug, Default)]
struct Tally {
    accepted: u64,
    failed: u64,
    /// The first failure, reported after the summary.
    first_error: Option<anyhow::Error>,
}

impl Tally {
    /// The human summary of a run of `count` sends.
    fn summary(&self, count: u64, elapsed: Duration) -> String {
        if count == 1 {
            return format!("{} accepted", self.accepted);
        }
        let seconds = elapsed.as_secs_f64();
        let mut line = format!(
            "{} accepted, {} failed in {seconds:.2}s",
            self.accepted, self.failed
        );
        if seconds > 0.0 {
            line.push_str(&format!(" ({:.0} msg/s)", self.accepted as f64 / seconds));
        }
        let unsent = count.saturating_sub(self.accepted + self.failed);
        if unsent > 0 {
            line.push_str(&format!("; stopped with {unsent} not sent"));
        }
        line
    }
}

/// The message `pub` sends: the file's bytes, stdin's (`-`), or the argument's.
fn message_body(args: &PubArgs) -> anyhow::Result<Vec<u8>> {
    match (&args.file, args.message.as_deref()) {
        (Some(path), _) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
        }
        (None, Some("-")) => {
            let mut body = Vec::new();
            io::stdin()
                .lock()
                .read_to_end(&mut body)
                .context("cannot read the message from stdin")?;
            Ok(body)
        }
        (None, Some(message)) => Ok(message.as_bytes().to_vec()),
        (None, None) => bail!("no message: give it, `-` to read it from stdin, or --file FILE"),
    }
}

/// `pub`'s progress: a bar with the send rate on stderr for a run of several messages when a
/// person watches it; nothing otherwise (a pipe or a log would collect its redraws).
fn progress_bar(count: u64) -> ProgressBar {
    if count < 2 || !io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(count).with_style(style)
}

/// Holds `pub` to `--rate`: send `n` is due `n / rate` seconds after the start, so a slow answer
/// is caught up on instead of lowering the rate.
struct Pacer {
    start: Instant,
    rate: Option<u32>,
}

impl Pacer {
    #[allow(clippy::disallowed_methods)] // A client's rate and elapsed time are wall-clock time.
    fn start(rate: Option<u32>) -> Pacer {
        Pacer {
            start: Instant::now(),
            rate,
        }
    }

    /// Waits until send `sent` is due.
    #[allow(clippy::disallowed_methods)] // As above: pacing a real client needs the real clock.
    fn wait_turn(&self, sent: u64) {
        let Some(rate) = self.rate else { return };
        let due = self.start + Duration::from_secs_f64(sent as f64 / f64::from(rate));
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
    }

    /// Time since the start.
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// Sleeps `pause` between polls of a real node.
#[allow(clippy::disallowed_methods)] // Polling a real process needs a real pause.
fn pause(pause: Duration) {
    std::thread::sleep(pause);
}

/// `narad sub`.
pub fn subscribe(args: &SubArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let format = MessageFormat::from_flags(args.raw, args.client.json);
    if args.peek {
        peek(&client, args, format)
    } else {
        queue(&client, args, format)
    }
}

/// `sub` in queue mode: lease, print, ack, until `--count` messages (or forever).
fn queue(client: &Client, args: &SubArgs, format: MessageFormat) -> anyhow::Result<()> {
    let consume = format!("{}/consume", topic_path(&args.topic));
    let ack = format!("{}/ack", topic_path(&args.topic));
    let partition = args.partition.map(|partition| partition.to_string());
    let mut query = vec![("wait", QUEUE_WAIT)];
    if let Some(partition) = &partition {
        query.push(("partition", partition.as_str()));
    }
    let mut received = 0;
    while args.count.is_none_or(|count| received < count) {
        let reply = client.get(&consume, &query)?;
        match reply.status {
            200 => {}
            // Nothing arrived within the wait: ask again.
            204 => continue,
            _ => return Err(reply.error().into()),
        }
        let message = Message::parse(&reply.body)?;
        let handle = match (&message.receipt_handle, args.no_ack) {
            (_, true) => None,
            (Some(handle), false) => Some(handle.clone()),
            (None, false) => bail!("the node's queue-mode message has no receipt_handle to ack"),
        };
        print_message(format, &reply.body)?;
        received += 1;
        if let Some(handle) = handle {
            let acked = client.post(&ack, &[("receipt_handle", handle.as_str())], b"")?;
            match acked.status {
                204 => {}
                // The lease ran out first: the message is someone's again. Worth a word, not a stop.
                410 => eprintln!(
                    "narad: the lease {handle} ended before its ack ({}): the message will be \
                     delivered again",
                    acked.error_message()
                ),
                _ => {
                    return Err(anyhow::Error::new(acked.error()))
                        .with_context(|| format!("cannot ack {handle}"))
                }
            }
        }
    }
    Ok(())
}

/// `sub --peek`: every partition (or `--partition`'s) from its high watermark (or `--from`) on.
fn peek(client: &Client, args: &SubArgs, format: MessageFormat) -> anyhow::Result<()> {
    let stats = partition_stats(client, &args.topic, args.partition)?;
    let mut cursors: Vec<(u32, u64)> = stats
        .iter()
        .map(|stat| (stat.index, args.from.unwrap_or(stat.high_watermark)))
        .collect();
    let mut printed = 0;
    loop {
        let mut moved = false;
        for (partition, offset) in &mut cursors {
            for _ in 0..PEEK_BATCH {
                match read_at(client, &args.topic, *partition, *offset)? {
                    Read::Message(reply) => {
                        print_message(format, &reply.body)?;
                        printed += 1;
                        *offset += 1;
                        moved = true;
                        if args.count == Some(printed) {
                            return Ok(());
                        }
                    }
                    Read::End => break,
                    Read::Gone(error) => {
                        *offset = skip_gone(client, &args.topic, *partition, *offset, &error)?;
                        moved = true;
                    }
                }
            }
        }
        if !moved {
            pause(PEEK_PAUSE);
        }
    }
}

/// `narad replay`.
pub fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let format = MessageFormat::from_flags(args.raw, args.client.json);
    let to = match args.to {
        Some(to) => to,
        None => partition_stat(&client, &args.topic, args.partition)?.high_watermark,
    };
    let mut offset = args.from;
    while offset < to {
        match read_at(&client, &args.topic, args.partition, offset)? {
            Read::Message(reply) => {
                print_message(format, &reply.body)?;
                offset += 1;
            }
            Read::End => break,
            Read::Gone(error) => {
                offset = skip_gone(&client, &args.topic, args.partition, offset, &error)?;
            }
        }
    }
    Ok(())
}

/// One replay read.
enum Read {
    /// 200: the message's body.
    Message(Reply),
    /// 204: at or past the high watermark.
    End,
    /// 410: aged out or unreadable.
    Gone(ApiError),
}

/// Reads `topic`'s `partition` at `offset` (replay mode: no lease).
fn read_at(client: &Client, topic: &str, partition: u32, offset: u64) -> anyhow::Result<Read> {
    let (partition, offset) = (partition.to_string(), offset.to_string());
    let reply = client.get(
        &format!("{}/consume", topic_path(topic)),
        &[("partition", &partition), ("offset", &offset)],
    )?;
    match reply.status {
        200 => Ok(Read::Message(reply)),
        204 => Ok(Read::End),
        410 => Ok(Read::Gone(reply.error())),
        _ => Err(reply.error().into()),
    }
}

/// The offset to read after `offset` answered 410, reported on stderr.
fn skip_gone(
    client: &Client,
    topic: &str,
    partition: u32,
    offset: u64,
    error: &ApiError,
) -> anyhow::Result<u64> {
    let oldest = partition_stat(client, topic, partition)?.oldest_offset;
    let next = if oldest > offset { oldest } else { offset + 1 };
    eprintln!(
        "narad: partition {partition} offset {offset} is gone ({}); going on from offset {next}",
        error.message
    );
    Ok(next)
}

/// What replay needs of one partition's `partition_stats` entry.
#[derive(Clone, Copy, Debug, Deserialize)]
struct PartitionStat {
    index: u32,
    oldest_offset: u64,
    high_watermark: u64,
}

/// The stats of `topic`'s partitions (all of them, or `only`).
fn partition_stats(
    client: &Client,
    topic: &str,
    only: Option<u32>,
) -> anyhow::Result<Vec<PartitionStat>> {
    #[derive(Deserialize)]
    struct TopicStats {
        partition_stats: Vec<PartitionStat>,
    }
    let index = only.map(|index| index.to_string());
    let query: Vec<(&str, &str)> = index
        .as_deref()
        .map(|index| ("partition", index))
        .into_iter()
        .collect();
    let reply = client.get(&topic_path(topic), &query)?.expect(200)?;
    let stats = reply.json::<TopicStats>()?.partition_stats;
    if stats.is_empty() {
        bail!("topic {topic} has no partition to read");
    }
    Ok(stats)
}

/// The stats of `topic`'s `partition`.
fn partition_stat(client: &Client, topic: &str, partition: u32) -> anyhow::Result<PartitionStat> {
    partition_stats(client, topic, Some(partition))?
        .into_iter()
        .find(|stat| stat.index == partition)
        .ok_or_else(|| anyhow!("topic {topic} has no partition {partition}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_what_was_sent() {
        let tally = Tally {
            accepted: 20,
            failed: 0,
            first_error: None,
        };
        assert_eq!(tally.summary(1, Duration::ZERO), "20 accepted");
        assert_eq!(
            tally.summary(20, Duration::from_millis(500)),
            "20 accepted, 0 failed in 0.50s (40 msg/s)"
        );
        let stopped = Tally {
            accepted: 2,
            failed: 1,
            first_error: None,
        };
        assert_eq!(
            stopped.summary(10, Duration::ZERO),
            "2 accepted, 1 failed in 0.00s; stopped with 7 not sent"
        );
    }
}
