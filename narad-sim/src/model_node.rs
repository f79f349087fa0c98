//! `ModelNode`: a deliberately minimal stand-in node, a **harness self-test, not the product**.
//!
//! Compiled for the harness's own tests only: on it they show that a run passes, that the checker
//! catches each failure category when a bug is planted, and that a seed replays exactly, independently
//! of the real node. It shares no code with narad-node and makes no claim about Narad's design beyond
//! the delivery contract, and it keeps the same seam contract as the real node (bit rot included).
//!
//! What it does: one append-only log file per partition (`log/<topic-id>/<partition>`), frames of
//! `len u32 · crc32(payload) u32 · crc32(len, payload crc) u32 · payload`. A produce (single or batch)
//! writes its frames, fsyncs every touched log, then advances each log's visible count (its high
//! watermark) and answers 202. A failed write or fsync latches the node: every later produce gets a
//! 5xx until restart (no fsync retry after EIO). Topics live in a `meta` file replaced atomically
//! (write `meta.tmp`, fsync, rename, fsync the directory); incarnation ids are never reused. One async
//! lock serializes everything: no group commit, no dispatch (the backlog is always 0).
//!
//! Damage: boot scans each log ([`scan`]). A frame that runs past the end of the file is a torn tail:
//! the log is truncated there. A frame that lies whole in the file but fails a CRC was struck by bit
//! rot: it keeps its offset as a lost slot, and the scan goes on behind it (behind a damaged header, at
//! the next position whose header checks out). Reads skip a frame that fails its CRC and serve the ones
//! behind it. So bit rot costs the records of the struck frame only ([`rot_unit`]), as it does in the
//! real node.
//!
//! Planted bugs it implements (model analogues of the real node's): `ack-before-fsync` (skips the
//! fsync), `fsync-retry-after-eio` (retries a failed fsync and trusts it), `skip-readback-crc` (serves
//! and recovers frames without checking their CRC), `stale-incarnation-into-recreated-topic` (logs are
//! keyed by topic name and survive a delete, so a recreated topic serves the old incarnation's records),
//! `roll-drops-batch-tail` (a batch's last record is acknowledged but never written). The checkpoint and
//! compaction bugs have no analogue here.
//!
//! Invariant reported through the observer: a log's visible frames never extend past its synced bytes.

use std::collections::BTreeMap;

use narad_core::disk::sim::SimDisk;
use narad_core::disk::Disk;
use narad_core::{IoFault, Offset, PartitionId, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

use crate::ledger::key_partition;
use crate::seam::{
    derive_seed, DiskLayout, NodeContext, NodeError, NodeStatus, Observer, PlantedBug,
    ProduceRecord, ReadBatch, ReadRecord, SimIo, SimNode, TopicInfo,
};

const META: &str = "meta";
const META_TMP: &str = "meta.tmp";
const META_MAGIC: &str = "narad-model-meta 1";
const LOG_DIR: &str = "log";
/// `len u32 · payload crc u32 · header crc u32`.
const FRAME_HEADER_BYTES: u64 = 12;
/// Largest payload the model accepts (the /v1 single-produce limit).
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
/// Most records in one batch (the /v1 batch limit).
pub const BATCH_RECORDS_MAX: usize = 1000;
/// Largest log file the model will scan at boot, a bound on one read.
const LOG_BYTES_MAX: u64 = 1 << 32;

#[derive(Clone, Debug)]
struct PartitionLog {
    path: String,
    /// Byte position and payload length of every frame written (a damaged one included), indexed by
    /// offset.
    frames: Vec<(u64, u32)>,
    /// Where the next frame goes.
    end_bytes: u64,
    /// Bytes covered by a successful fsync.
    synced_bytes: u64,
    /// Frames served to readers (the high watermark).
    visible: usize,
}

impl PartitionLog {
    fn visible_end_bytes(&self) -> u64 {
        match self.visible.checked_sub(1) {
            Some(last) => {
                let (at, len) = self.frames[last];
                at + FRAME_HEADER_BYTES + u64::from(len)
            }
            None => 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Topic {
    id: TopicId,
    logs: Vec<PartitionLog>,
    next_keyless: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Meta {
    next_topic_id: u64,
    topics: BTreeMap<String, (TopicId, u32)>,
}

impl Meta {
    fn encode(&self) -> Vec<u8> {
        let mut text = format!("{META_MAGIC}\nnext {}\n", self.next_topic_id);
        for (name, (id, partitions)) in &self.topics {
            text.push_str(&format!("topic {name} {} {partitions}\n", id.0));
        }
        let crc = crc32fast::hash(text.as_bytes());
        text.push_str(&format!("crc {crc:08x}\n"));
        text.into_bytes()
    }

    fn decode(bytes: &[u8]) -> Result<Meta, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "meta is not UTF-8".to_string())?;
        let body_end = text.rfind("crc ").ok_or("meta has no crc line")?;
        let (body, crc_line) = text.split_at(body_end);
        let stored = u32::from_str_radix(crc_line.trim_start_matches("crc ").trim(), 16)
            .map_err(|_| "meta crc line is malformed".to_string())?;
        if stored != crc32fast::hash(body.as_bytes()) {
            return Err("meta fails its crc".into());
        }
        let mut lines = body.lines();
        if lines.next() != Some(META_MAGIC) {
            return Err("meta has a wrong header".into());
        }
        let mut meta = Meta::default();
        for line in lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["next", next] => {
                    meta.next_topic_id = next.parse().map_err(|_| "bad next id".to_string())?
                }
                ["topic", name, id, partitions] => {
                    let id = id.parse().map_err(|_| "bad topic id".to_string())?;
                    let partitions = partitions
                        .parse()
                        .map_err(|_| "bad partition count".to_string())?;
                    meta.topics
                        .insert((*name).to_string(), (TopicId(id), partitions));
                }
                _ => return Err(format!("meta line {line:?} is malformed")),
            }
        }
        Ok(meta)
    }
}

struct ModelState {
    meta: Meta,
    topics: BTreeMap<String, Topic>,
    latched: Option<IoFault>,
    rng: ChaCha8Rng,
}

struct Shared {
    disk: SimDisk,
    io: SimIo,
    observer: Observer,
    bug: Option<PlantedBug>,
    state: tokio::sync::Mutex<ModelState>,
}

/// The model node's handle (see the module documentation). Cloning shares the node.
#[derive(Clone)]
pub struct ModelNode {
    shared: Arc<Shared>,
}

fn failed(fault: &IoFault) -> NodeError {
    NodeError::Failed(format!("i/o: {fault}"))
}

impl Shared {
    fn topic_dir(&self, name: &str, id: TopicId) -> String {
        if self.bug == Some(PlantedBug::StaleIncarnationIntoRecreatedTopic) {
            format!("{LOG_DIR}/name-{name}")
        } else {
            format!("{LOG_DIR}/{}", id.0)
        }
    }

    async fn write_meta(&self, meta: &Meta) -> Result<(), IoFault> {
        let bytes = meta.encode();
        self.io.wait(META_TMP, false).await;
        self.disk.create(META_TMP)?;
        self.io.wait(META_TMP, false).await;
        self.disk.write_at(META_TMP, 0, &bytes)?;
        self.io.wait(META_TMP, true).await;
        self.disk.sync_data(META_TMP)?;
        self.io.wait(META, false).await;
        self.disk.rename(META_TMP, META)?;
        self.io.wait("", true).await;
        self.disk.sync_dir("")
    }

    async fn read_meta(&self) -> Result<Meta, String> {
        self.io.wait(META, false).await;
        let len = match self.disk.len(META) {
            Ok(len) => len,
            Err(IoFault::NotFound) => {
                return Ok(Meta {
                    next_topic_id: 1,
                    topics: BTreeMap::new(),
                })
            }
            Err(fault) => return Err(format!("meta: {fault}")),
        };
        let bytes = self
            .disk
            .read_at(META, 0, len as usize)
            .map_err(|fault| format!("meta: {fault}"))?;
        Meta::decode(&bytes)
    }

    /// Scans a log file (see [`scan`]); truncates (and fsyncs) a torn tail.
    async fn recover_log(&self, path: String) -> Result<PartitionLog, String> {
        self.io.wait(&path, false).await;
        let len = self.disk.len(&path).map_err(|f| format!("{path}: {f}"))?;
        if len > LOG_BYTES_MAX {
            return Err(format!("{path}: {len} bytes is past the scan limit"));
        }
        let image = self
            .disk
            .read_at(&path, 0, len as usize)
            .map_err(|f| format!("{path}: {f}"))?;
        let check_crc = self.bug != Some(PlantedBug::SkipReadbackCrc);
        let scanned = scan(&image, check_crc);
        for (offset, slot) in scanned.frames.iter().enumerate() {
            if !slot.intact {
                self.observer.event(
                    "node",
                    format_args!("recover {path}: frame {offset} damaged at byte {}", slot.at),
                );
            }
        }
        let at = scanned.end_bytes;
        if at < len {
            self.observer.event(
                "node",
                format_args!("recover {path}: truncate {len} -> {at} bytes"),
            );
            self.io.wait(&path, false).await;
            self.disk
                .set_len(&path, at)
                .map_err(|f| format!("{path}: {f}"))?;
            self.io.wait(&path, true).await;
            self.disk
                .sync_data(&path)
                .map_err(|f| format!("{path}: {f}"))?;
        }
        let frames: Vec<(u64, u32)> = scanned
            .frames
            .iter()
            .map(|slot| (slot.at, slot.len))
            .collect();
        Ok(PartitionLog {
            path,
            visible: frames.len(),
            frames,
            end_bytes: at,
            synced_bytes: at,
        })
    }

    async fn fresh_log(&self, path: String) -> Result<PartitionLog, IoFault> {
        self.io.wait(&path, false).await;
        self.disk.create(&path)?;
        Ok(PartitionLog {
            path,
            frames: Vec::new(),
            end_bytes: 0,
            synced_bytes: 0,
            visible: 0,
        })
    }

    fn check_invariants(&self, topic: &str, topic_state: &Topic) {
        for (partition, log) in topic_state.logs.iter().enumerate() {
            if log.visible_end_bytes() > log.synced_bytes {
                self.observer.violation(
                    "hwm-above-synced",
                    format_args!(
                        "{topic}/{partition}: visible to byte {} but synced to {}",
                        log.visible_end_bytes(),
                        log.synced_bytes
                    ),
                );
            }
        }
    }

    async fn produce(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        records: Vec<ProduceRecord>,
    ) -> Result<(), NodeError> {
        if records.is_empty() || records.len() > BATCH_RECORDS_MAX {
            return Err(NodeError::Refused(format!(
                "a batch holds 1..={BATCH_RECORDS_MAX} records"
            )));
        }
        if records.iter().any(|r| r.payload.len() > PAYLOAD_BYTES_MAX) {
            return Err(NodeError::Refused("payload too large".into()));
        }
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        if let Some(fault) = &state.latched {
            return Err(NodeError::Failed(format!("log latched after {fault}")));
        }
        let Some(topic_state) = state.topics.get_mut(topic) else {
            return Err(NodeError::Refused(format!("topic {topic} not found")));
        };
        let partitions = topic_state.logs.len() as u32;
        if let Some(PartitionId(p)) = partition {
            if p >= partitions {
                return Err(NodeError::Refused(format!("partition {p} out of range")));
            }
        }
        let count = records.len();
        let mut by_partition: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut frames_by_partition: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (index, record) in records.into_iter().enumerate() {
            if self.bug == Some(PlantedBug::RollDropsBatchTail) && count > 1 && index == count - 1 {
                continue;
            }
            let target = match (partition, &record.key) {
                (Some(PartitionId(p)), _) => p,
                (None, Some(key)) => key_partition(key, partitions).0,
                (None, None) => {
                    let p = topic_state.next_keyless;
                    topic_state.next_keyless = (p + 1) % partitions;
                    p
                }
            };
            encode_frame(by_partition.entry(target).or_default(), &record.payload);
            frames_by_partition
                .entry(target)
                .or_default()
                .push(record.payload.len() as u32);
        }
        // Write every touched log, then fsync each, then make the frames visible.
        for (&p, bytes) in &by_partition {
            let log = &mut topic_state.logs[p as usize];
            self.io.wait(&log.path, false).await;
            if let Err(fault) = self.disk.write_at(&log.path, log.end_bytes, bytes) {
                self.observer.event(
                    "node",
                    format_args!("write {} failed: {fault}; latched", log.path),
                );
                state.latched = Some(fault.clone());
                return Err(failed(&fault));
            }
            let mut at = log.end_bytes;
            for &len in &frames_by_partition[&p] {
                log.frames.push((at, len));
                at += FRAME_HEADER_BYTES + u64::from(len);
            }
            log.end_bytes = at;
        }
        for &p in by_partition.keys() {
            let log = &mut topic_state.logs[p as usize];
            if self.bug != Some(PlantedBug::AckBeforeFsync) {
                self.io.wait(&log.path, true).await;
                if let Err(fault) = self.disk.sync_data(&log.path) {
                    let retried = self.bug == Some(PlantedBug::FsyncRetryAfterEio)
                        && self.disk.sync_data(&log.path).is_ok();
                    if !retried {
                        self.observer.event(
                            "node",
                            format_args!("fsync {} failed: {fault}; latched", log.path),
                        );
                        state.latched = Some(fault.clone());
                        return Err(failed(&fault));
                    }
                    self.observer.event(
                        "node",
                        format_args!("fsync {} failed: {fault}; retried (planted bug)", log.path),
                    );
                }
            }
            log.synced_bytes = log.end_bytes;
            log.visible = log.frames.len();
        }
        self.observer.event(
            "node",
            format_args!(
                "accept {topic}#{} records={count} partitions={:?}",
                topic_state.id,
                by_partition.keys().collect::<Vec<_>>()
            ),
        );
        self.check_invariants(topic, topic_state);
        Ok(())
    }

    async fn create_topic(&self, name: &str, partitions: u32) -> Result<TopicInfo, NodeError> {
        if partitions == 0 {
            return Err(NodeError::Refused("partitions must be positive".into()));
        }
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        if state.meta.topics.contains_key(name) {
            return Err(NodeError::Refused(format!("topic {name} exists")));
        }
        let id = TopicId(state.meta.next_topic_id);
        let dir = self.topic_dir(name, id);
        self.disk.create_dir_all(&dir).map_err(|f| failed(&f))?;
        let mut logs = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            let path = format!("{dir}/{p}");
            let reuse = self.bug == Some(PlantedBug::StaleIncarnationIntoRecreatedTopic)
                && self.disk.len(&path).is_ok();
            let log = if reuse {
                self.recover_log(path).await.map_err(NodeError::Failed)?
            } else {
                self.fresh_log(path).await.map_err(|f| failed(&f))?
            };
            logs.push(log);
        }
        self.io.wait(&dir, true).await;
        self.disk.sync_dir(&dir).map_err(|f| failed(&f))?;
        let mut meta = state.meta.clone();
        meta.next_topic_id += 1;
        meta.topics.insert(name.to_string(), (id, partitions));
        self.write_meta(&meta).await.map_err(|f| failed(&f))?;
        state.meta = meta;
        let next_keyless = state.rng.random_range(0..partitions);
        state.topics.insert(
            name.to_string(),
            Topic {
                id,
                logs,
                next_keyless,
            },
        );
        self.observer.event(
            "node",
            format_args!("create {name}#{id} partitions={partitions}"),
        );
        Ok(TopicInfo { id, partitions })
    }

    async fn delete_topic(&self, name: &str) -> Result<(), NodeError> {
        let mut guard = self.state.lock().await;
        let state = &mut *guard;
        let Some(&(id, _)) = state.meta.topics.get(name) else {
            return Err(NodeError::Refused(format!("topic {name} not found")));
        };
        let mut meta = state.meta.clone();
        meta.topics.remove(name);
        self.write_meta(&meta).await.map_err(|f| failed(&f))?;
        state.meta = meta;
        let removed = state.topics.remove(name);
        self.observer
            .event("node", format_args!("delete {name}#{id}"));
        if self.bug == Some(PlantedBug::StaleIncarnationIntoRecreatedTopic) {
            return Ok(());
        }
        // Best effort: the incarnation is gone from meta already; orphan files are harmless.
        if let Some(topic) = removed {
            for log in &topic.logs {
                let _ = self.disk.remove(&log.path);
            }
            let _ = self.disk.sync_dir(&self.topic_dir(name, id));
        }
        Ok(())
    }

    async fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: Offset,
        records_max: usize,
    ) -> Result<ReadBatch, NodeError> {
        let guard = self.state.lock().await;
        let Some(topic_state) = guard.topics.get(topic) else {
            return Err(NodeError::Refused(format!("topic {topic} not found")));
        };
        let Some(log) = topic_state.logs.get(partition.0 as usize) else {
            return Err(NodeError::Refused("partition out of range".into()));
        };
        let check_crc = self.bug != Some(PlantedBug::SkipReadbackCrc);
        let start = (from.0 as usize).min(log.visible);
        let end = log.visible.min(start.saturating_add(records_max));
        let mut records = Vec::with_capacity(end - start);
        if start < end {
            self.io.wait(&log.path, false).await;
        }
        for offset in start..end {
            let (at, len) = log.frames[offset];
            let bytes = self
                .disk
                .read_at(
                    &log.path,
                    at,
                    (FRAME_HEADER_BYTES + u64::from(len)) as usize,
                )
                .map_err(|f| failed(&f))?;
            if found_at(&bytes, 0, check_crc) != Found::Frame(len) {
                // Bit rot: this frame's record is lost, the ones behind it are served.
                self.observer.event(
                    "node",
                    format_args!("read {}: frame {offset} fails its crc, skipped", log.path),
                );
                continue;
            }
            records.push(ReadRecord {
                offset: Offset(offset as u64),
                payload: bytes[FRAME_HEADER_BYTES as usize..].to_vec(),
                committed_at_ms: None,
            });
        }
        Ok(ReadBatch {
            topic_id: topic_state.id,
            records,
            high_watermark: Offset(log.visible as u64),
        })
    }
}

/// Appends one frame holding `payload` to `out`.
fn encode_frame(out: &mut Vec<u8>, payload: &[u8]) {
    let mut header = [0u8; FRAME_HEADER_BYTES as usize];
    header[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    header[4..8].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
    let header_crc = crc32fast::hash(&header[..8]);
    header[8..].copy_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
}

/// What lies at a byte of a log image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    /// A whole frame that checks out: its payload length.
    Frame(u32),
    /// A whole frame whose header checks out but whose payload fails its CRC: its payload length.
    DamagedPayload(u32),
    /// A whole header, inside the image, that fails its CRC or declares an impossible length.
    DamagedHeader,
    /// The end of the image, or a frame that runs past it (a torn tail).
    End,
}

/// The payload length a whole header at `at` declares, when it checks out (with `check_crc` false,
/// the planted `skip-readback-crc`, any length within the limits is trusted).
fn header_at(image: &[u8], at: usize, check_crc: bool) -> Option<u32> {
    let header = image.get(at..at.checked_add(FRAME_HEADER_BYTES as usize)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?);
    let header_crc = u32::from_le_bytes(header[8..].try_into().ok()?);
    if check_crc && crc32fast::hash(&header[..8]) != header_crc {
        return None;
    }
    (len != 0 && len as usize <= PAYLOAD_BYTES_MAX).then_some(len)
}

/// Classifies the bytes at `at`. A torn write keeps a prefix of what was written and nothing behind
/// it, so a header or frame cut by the end of the image is a torn tail, and a whole one that fails a
/// check was damaged in place.
fn found_at(image: &[u8], at: u64, check_crc: bool) -> Found {
    let Ok(at) = usize::try_from(at) else {
        return Found::End;
    };
    let header_end = at.saturating_add(FRAME_HEADER_BYTES as usize);
    if header_end > image.len() {
        return Found::End;
    }
    let Some(len) = header_at(image, at, check_crc) else {
        return Found::DamagedHeader;
    };
    let Some(payload) = image.get(header_end..header_end + len as usize) else {
        return Found::End;
    };
    let payload_crc = u32::from_le_bytes(
        image[at + 4..at + 8]
            .try_into()
            .expect("a header holds a payload crc"),
    );
    if check_crc && crc32fast::hash(payload) != payload_crc {
        return Found::DamagedPayload(len);
    }
    Found::Frame(len)
}

/// One frame slot of a scanned log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    /// Its first byte.
    at: u64,
    /// Its payload length (for a damaged header: the bytes up to the next frame).
    len: u32,
    /// Whether it checks out.
    intact: bool,
}

/// A log image as recovery reads it.
#[derive(Debug, PartialEq, Eq)]
struct Scanned {
    /// Every frame slot in offset order, damaged ones included.
    frames: Vec<Slot>,
    /// Where the frames end: a torn tail (if any) starts here.
    end_bytes: u64,
}

/// Walks a log image frame by frame (see the module documentation): a damaged frame is a lost slot,
/// a damaged header ends where the next header that checks out starts (a payload is at least one
/// byte), or at the end of the image.
fn scan(image: &[u8], check_crc: bool) -> Scanned {
    let image_len = image.len() as u64;
    let mut frames = Vec::new();
    let mut at = 0u64;
    loop {
        let (len, intact, next) = match found_at(image, at, check_crc) {
            Found::End => break,
            Found::Frame(len) => (len, true, at + FRAME_HEADER_BYTES + u64::from(len)),
            Found::DamagedPayload(len) => (len, false, at + FRAME_HEADER_BYTES + u64::from(len)),
            Found::DamagedHeader => {
                let first = at + FRAME_HEADER_BYTES + 1;
                let next = (first..image_len)
                    .find(|&p| header_at(image, p as usize, check_crc).is_some())
                    .unwrap_or(image_len.max(at + FRAME_HEADER_BYTES));
                let len = u32::try_from(next - at - FRAME_HEADER_BYTES)
                    .expect("a log image is below the scan limit");
                (len, false, next)
            }
        };
        frames.push(Slot { at, len, intact });
        at = next;
    }
    Scanned {
        frames,
        end_bytes: at,
    }
}

/// The frame of a log image that holds byte `offset` ([`DiskLayout::rot_unit`]): a flip there costs
/// that frame's record only.
fn rot_unit(image: &[u8], offset: u64) -> Option<(u64, u64)> {
    scan(image, true)
        .frames
        .iter()
        .map(|slot| (slot.at, slot.at + FRAME_HEADER_BYTES + u64::from(slot.len)))
        .find(|&(start, end)| start <= offset && offset < end)
}

impl SimNode for ModelNode {
    fn name() -> &'static str {
        "model"
    }

    fn layout() -> DiskLayout {
        // One log plays both roles: WAL and partition faults all strike it.
        DiskLayout {
            wal_prefix: format!("{LOG_DIR}/"),
            partition_prefix: format!("{LOG_DIR}/"),
            journal_prefix: None,
            rot_unit,
        }
    }

    fn supports(bug: PlantedBug) -> bool {
        match bug {
            PlantedBug::AckBeforeFsync
            | PlantedBug::FsyncRetryAfterEio
            | PlantedBug::SkipReadbackCrc
            | PlantedBug::StaleIncarnationIntoRecreatedTopic
            | PlantedBug::RollDropsBatchTail => true,
            // The model node has no dispatcher of its own and no cluster.
            PlantedBug::CheckpointSkipsInflight
            | PlantedBug::CompactAheadOfSyncedCheckpoint
            | PlantedBug::RerouteInflight
            | PlantedBug::DiscardWithoutLeaderConfirm
            | PlantedBug::FourTwelveAsFailure
            | PlantedBug::OwnerIgnoresTrailingIds
            | PlantedBug::CommitAfterCallerGaveUp
            | PlantedBug::RemoteAckBeforeFsync
            | PlantedBug::NeverMarkDead
            | PlantedBug::LegacyResendKeepsIds => false,
            // Nor an owner journal.
            PlantedBug::VisibleBeforeJournalSync | PlantedBug::TrimJournalAheadOfPartitionSync => {
                false
            }
            // Nor queue-mode consume.
            PlantedBug::CursorPastLeases => false,
            // Nor retention.
            PlantedBug::RetentionDeletesUnexpired | PlantedBug::RetentionDeletesJournalNeeded => {
                false
            }
            // Nor partition moves.
            PlantedBug::FreezeNotRecheckedUnderLock
            | PlantedBug::SwitchBeforeTailCopied
            | PlantedBug::ReclaimBeforeSwitchConfirmed
            | PlantedBug::MoveDropsAckedAhead => false,
        }
    }

    async fn start(ctx: NodeContext) -> Result<Self, String> {
        let rng = ChaCha8Rng::seed_from_u64(derive_seed(ctx.seed, &format!("model/{}", ctx.boot)));
        let shared = Shared {
            disk: ctx.disk,
            io: ctx.io,
            observer: ctx.observer,
            bug: ctx.plant_bug,
            state: tokio::sync::Mutex::new(ModelState {
                meta: Meta::default(),
                topics: BTreeMap::new(),
                latched: None,
                rng,
            }),
        };
        shared
            .disk
            .create_dir_all(LOG_DIR)
            .map_err(|f| format!("{LOG_DIR}: {f}"))?;
        let meta = shared.read_meta().await?;
        let mut topics = BTreeMap::new();
        {
            let mut state = shared.state.lock().await;
            for (name, &(id, partitions)) in &meta.topics {
                let dir = shared.topic_dir(name, id);
                let mut logs = Vec::with_capacity(partitions as usize);
                for p in 0..partitions {
                    logs.push(shared.recover_log(format!("{dir}/{p}")).await?);
                }
                let next_keyless = state.rng.random_range(0..partitions);
                topics.insert(
                    name.clone(),
                    Topic {
                        id,
                        logs,
                        next_keyless,
                    },
                );
            }
            shared.observer.event(
                "node",
                format_args!("boot {}: recovered {} topics", ctx.boot, topics.len()),
            );
            state.meta = meta;
            state.topics = topics;
        }
        Ok(ModelNode {
            shared: Arc::new(shared),
        })
    }

    async fn create_topic(&self, name: &str, partitions: u32) -> Result<TopicInfo, NodeError> {
        self.shared.create_topic(name, partitions).await
    }

    async fn delete_topic(&self, name: &str) -> Result<(), NodeError> {
        self.shared.delete_topic(name).await
    }

    async fn describe_topic(&self, name: &str) -> Result<Option<TopicInfo>, NodeError> {
        let state = self.shared.state.lock().await;
        Ok(state
            .meta
            .topics
            .get(name)
            .map(|&(id, partitions)| TopicInfo { id, partitions }))
    }

    async fn produce(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        record: ProduceRecord,
    ) -> Result<(), NodeError> {
        self.shared.produce(topic, partition, vec![record]).await
    }

    async fn produce_batch(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        records: Vec<ProduceRecord>,
    ) -> Result<(), NodeError> {
        self.shared.produce(topic, partition, records).await
    }

    async fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: Offset,
        records_max: usize,
    ) -> Result<ReadBatch, NodeError> {
        self.shared.read(topic, partition, from, records_max).await
    }

    async fn status(&self) -> NodeStatus {
        NodeStatus {
            ready: true,
            backlog_records: 0,
            // Never: the model recovers from the page cache (it has no fsyncgate rewrite), so a
            // process restart after a failed fsync would adopt bytes a power loss then takes away.
            // Its latch holds until the next crash, as it always did.
            latched: false,
            leader: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_and_rejects_damage() {
        let meta = Meta {
            next_topic_id: 4,
            topics: BTreeMap::from([
                ("a".to_string(), (TopicId(1), 3)),
                ("b".to_string(), (TopicId(3), 1)),
            ]),
        };
        let bytes = meta.encode();
        assert_eq!(Meta::decode(&bytes), Ok(meta));
        let mut damaged = bytes.clone();
        damaged[25] ^= 1;
        assert!(Meta::decode(&damaged).is_err());
        assert!(Meta::decode(&bytes[..bytes.len() - 3]).is_err());
    }

    /// Three frames of 3, 4 and 5 payload bytes: at 0, 15 and 31, ending at 48.
    fn three_frames() -> Vec<u8> {
        let mut image = Vec::new();
        for payload in [&b"abc"[..], b"defg", b"hijkl"] {
            encode_frame(&mut image, payload);
        }
        image
    }

    fn slot(at: u64, len: u32, intact: bool) -> Slot {
        Slot { at, len, intact }
    }

    #[test]
    fn frames_are_found_and_a_torn_tail_ends_them() {
        let image = three_frames();
        assert_eq!(found_at(&image, 0, true), Found::Frame(3));
        assert_eq!(found_at(&image, 15, true), Found::Frame(4));
        assert_eq!(found_at(&image, 48, true), Found::End, "end of log");
        assert_eq!(found_at(&image[..40], 31, true), Found::End, "torn payload");
        assert_eq!(found_at(&image[..36], 31, true), Found::End, "torn header");
        assert_eq!(
            scan(&image[..40], true),
            Scanned {
                frames: vec![slot(0, 3, true), slot(15, 4, true)],
                end_bytes: 31,
            }
        );
    }

    #[test]
    fn a_rotten_payload_is_a_lost_slot_and_the_frames_behind_it_stay() {
        let mut rotten = three_frames();
        rotten[28] ^= 1;
        assert_eq!(found_at(&rotten, 15, true), Found::DamagedPayload(4));
        assert_eq!(
            found_at(&rotten, 15, false),
            Found::Frame(4),
            "skip-readback-crc trusts it"
        );
        assert_eq!(
            scan(&rotten, true),
            Scanned {
                frames: vec![slot(0, 3, true), slot(15, 4, false), slot(31, 5, true)],
                end_bytes: 48,
            }
        );
    }

    #[test]
    fn a_rotten_header_is_skipped_up_to_the_next_header_that_checks_out() {
        for byte in 15..27 {
            let mut rotten = three_frames();
            rotten[byte] ^= 0x10;
            assert_eq!(
                found_at(&rotten, 15, true),
                Found::DamagedHeader,
                "byte {byte}"
            );
            assert_eq!(
                scan(&rotten, true),
                Scanned {
                    frames: vec![slot(0, 3, true), slot(15, 4, false), slot(31, 5, true)],
                    end_bytes: 48,
                },
                "byte {byte}"
            );
        }
        // The last frame's header: nothing checks out behind it.
        let mut rotten = three_frames();
        rotten[31] ^= 1;
        assert_eq!(scan(&rotten, true).frames.last(), Some(&slot(31, 5, false)));
    }

    #[test]
    fn the_rot_unit_is_the_frame_holding_the_byte() {
        let image = three_frames();
        assert_eq!(rot_unit(&image, 0), Some((0, 15)));
        assert_eq!(rot_unit(&image, 14), Some((0, 15)));
        assert_eq!(rot_unit(&image, 15), Some((15, 31)));
        assert_eq!(rot_unit(&image, 47), Some((31, 48)));
        assert_eq!(rot_unit(&image, 48), None);
        let mut rotten = image.clone();
        rotten[16] ^= 1;
        assert_eq!(rot_unit(&rotten, 40), Some((31, 48)), "behind earlier rot");
    }
}
