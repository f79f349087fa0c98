//! The metastore's durable raft state, over the [`Disk`] seam (real files in the node, `SimDisk` in tests
//! and the simulator).
//!
//! Files under `metastore/` (relative to the disk root, which is the data directory):
//! - `log`: append-only frames `u32 len | u32 crc32(body) | body`, body = `u64 term | u64 index |
//!   u8 entry type | u32+data | u32+context` (big-endian). Every append is written then fdatasynced before
//!   raft hears it is persisted. A raft suffix overwrite (a new leader's conflicting entries) is just
//!   appended: on replay, an entry at or below the last one read replaces that suffix.
//! - `hardstate`: `u64 term | u64 vote | u64 commit | u32 crc32`, replaced atomically (tmp, fdatasync,
//!   rename, directory sync). Stored only when term or vote changes: commit need not be durable (a
//!   restarted single voter re-commits its log by winning an election; a follower learns it from the
//!   leader), and skipping it saves two syncs per proposal.
//! - `snapshot`: `u64 index | u64 term | u32 n + n×u64 voters | u32 n + n×u64 learners | u32+state |
//!   u32 crc32`, replaced atomically; then `log` is rewritten (atomically) with the entries above it.
//!   A crash between the two leaves the old log, whose entries at or below the snapshot are skipped.
//!
//! Recovery truncates a torn log tail (a short or checksum-failing last frame: the only write that can
//! be unfinished, since each append is synced before the next) and refuses to start on a gap in the
//! indexes or a damaged snapshot or hard state, which only corruption explains.
//!
//! Every operation is synchronous; the host runs them on the blocking pool, in the order of the
//! replica's persist requests.

use std::sync::Arc;

use narad_core::codec::Reader;
use narad_core::disk::{join, Disk};
use narad_core::error::IoFault;
use raft::eraftpb::{Entry, EntryType, HardState};

/// The metastore's directory under the data dir.
pub const DIR: &str = "metastore";
/// Largest entry body the log accepts (the replica's limit: a command carries at most a 1 MiB schema).
pub use narad_core::metastore::replica::ENTRY_BYTES_MAX;
/// Largest snapshot file read at start-up.
pub const SNAPSHOT_BYTES_MAX: u64 = 1024 * 1024 * 1024;
/// Most voters or learners a snapshot may list.
const MEMBERS_MAX: u32 = 1024;

const FRAME_HEADER_BYTES: usize = 8;
const HARD_STATE_BYTES: usize = 28;

/// Why the metastore could not open.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetaStorageError {
    /// The disk failed.
    #[error("metastore i/o on {path}: {fault}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        fault: IoFault,
    },
    /// A file is damaged in a way a crash cannot explain.
    #[error("metastore file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// A stored snapshot: the applied state at `index` (the replica's own type).
pub type StoredSnapshot = narad_core::metastore::replica::MetaSnapshot;

/// What start-up found on disk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovered {
    /// The last snapshot, if one was stored.
    pub snapshot: Option<StoredSnapshot>,
    /// The last stored hard state (default when none).
    pub hard_state: HardState,
    /// The log entries above the snapshot, in index order, without gaps.
    pub entries: Vec<Entry>,
    /// Bytes of torn tail cut from the log.
    pub torn_bytes: u64,
}

/// The open metastore files.
pub struct MetaDisk {
    disk: Arc<dyn Disk>,
    log_len: u64,
    /// Term and vote as last stored, so unchanged ones are not stored again.
    stored_term_vote: (u64, u64),
}

fn path(name: &str) -> String {
    join(DIR, name)
}

fn io(name: &str) -> impl Fn(IoFault) -> MetaStorageError + '_ {
    move |fault| MetaStorageError::Io {
        path: path(name),
        fault,
    }
}

fn corrupt(name: &str, reason: impl Into<String>) -> MetaStorageError {
    MetaStorageError::Corrupt {
        path: path(name),
        reason: reason.into(),
    }
}

impl MetaDisk {
    /// Opens (creating when absent) the metastore files and reads back what they hold.
    pub fn open(disk: Arc<dyn Disk>) -> Result<(MetaDisk, Recovered), MetaStorageError> {
        disk.create_dir_all(DIR).map_err(io(""))?;
        let names = disk.list(DIR).map_err(io(""))?;
        let has = |name: &str| names.iter().any(|entry| entry == name);

        let snapshot = if has("snapshot") {
            let bytes = read_all(disk.as_ref(), "snapshot", SNAPSHOT_BYTES_MAX)?;
            Some(decode_snapshot(&bytes).map_err(|reason| corrupt("snapshot", reason))?)
        } else {
            None
        };
        let mut hard_state = if has("hardstate") {
            let bytes = read_all(disk.as_ref(), "hardstate", HARD_STATE_BYTES as u64)?;
            decode_hard_state(&bytes).map_err(|reason| corrupt("hardstate", reason))?
        } else {
            HardState::default()
        };
        let stored_term_vote = (hard_state.term, hard_state.vote);

        if !has("log") {
            disk.create(&path("log")).map_err(io("log"))?;
            disk.sync_dir(DIR).map_err(io(""))?;
        }
        let log_bytes = read_all(disk.as_ref(), "log", u64::MAX)?;
        let snapshot_index = snapshot.as_ref().map_or(0, |snapshot| snapshot.index);
        let (entries, good_len) = replay_log(&log_bytes, snapshot_index)?;
        let torn_bytes = log_bytes.len() as u64 - good_len;
        if torn_bytes > 0 {
            disk.set_len(&path("log"), good_len).map_err(io("log"))?;
            disk.sync_data(&path("log")).map_err(io("log"))?;
        }
        // Commit is stored lazily: never below what the snapshot already applied.
        hard_state.commit = hard_state.commit.max(snapshot_index);
        let recovered = Recovered {
            snapshot,
            hard_state,
            entries,
            torn_bytes,
        };
        let meta_disk = MetaDisk {
            disk,
            log_len: good_len,
            stored_term_vote,
        };
        Ok((meta_disk, recovered))
    }

    /// Appends entries and fdatasyncs the log.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), IoFault> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        for entry in entries {
            encode_entry(&mut bytes, entry);
        }
        let log = path("log");
        self.disk.write_at(&log, self.log_len, &bytes)?;
        self.disk.sync_data(&log)?;
        self.log_len += bytes.len() as u64;
        Ok(())
    }

    /// Stores the hard state when its term or vote changed since the last store.
    pub fn store_hard_state(&mut self, hard_state: &HardState) -> Result<(), IoFault> {
        if (hard_state.term, hard_state.vote) == self.stored_term_vote {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity(HARD_STATE_BYTES);
        bytes.extend_from_slice(&hard_state.term.to_be_bytes());
        bytes.extend_from_slice(&hard_state.vote.to_be_bytes());
        bytes.extend_from_slice(&hard_state.commit.to_be_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_be_bytes());
        self.replace("hardstate", &bytes)?;
        self.stored_term_vote = (hard_state.term, hard_state.vote);
        Ok(())
    }

    /// Stores a snapshot, then rewrites the log to hold only `above` (the entries after it).
    pub fn store_snapshot(
        &mut self,
        snapshot: &StoredSnapshot,
        above: &[Entry],
    ) -> Result<(), IoFault> {
        self.replace("snapshot", &encode_snapshot(snapshot))?;
        let mut bytes = Vec::new();
        for entry in above {
            encode_entry(&mut bytes, entry);
        }
        self.replace("log", &bytes)?;
        self.log_len = bytes.len() as u64;
        Ok(())
    }

    /// Atomically replaces `name` with `bytes`: tmp file, fdatasync, rename, directory sync.
    fn replace(&self, name: &str, bytes: &[u8]) -> Result<(), IoFault> {
        let tmp = path(&format!("{name}.tmp"));
        self.disk.create(&tmp)?;
        self.disk.write_at(&tmp, 0, bytes)?;
        self.disk.sync_data(&tmp)?;
        self.disk.rename(&tmp, &path(name))?;
        self.disk.sync_dir(DIR)
    }
}

fn read_all(disk: &dyn Disk, name: &str, max: u64) -> Result<Vec<u8>, MetaStorageError> {
    let len = disk.len(&path(name)).map_err(io(name))?;
    if len > max {
        return Err(corrupt(name, format!("{len} bytes, above the {max} limit")));
    }
    let len = usize::try_from(len).map_err(|_| corrupt(name, "too large"))?;
    disk.read_at(&path(name), 0, len).map_err(io(name))
}

fn encode_entry(out: &mut Vec<u8>, entry: &Entry) {
    let mut body = Vec::with_capacity(29 + entry.data.len() + entry.context.len());
    body.extend_from_slice(&entry.term.to_be_bytes());
    body.extend_from_slice(&entry.index.to_be_bytes());
    body.push(entry.entry_type as u8);
    put_prefixed(&mut body, &entry.data);
    put_prefixed(&mut body, &entry.context);
    assert!(
        body.len() <= ENTRY_BYTES_MAX,
        "the replica refuses entries above ENTRY_BYTES_MAX"
    );
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_be_bytes());
    out.extend_from_slice(&body);
}

fn put_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Decodes one frame body; `None` when it is not a well-formed entry.
fn decode_entry(body: &[u8]) -> Option<Entry> {
    let mut reader = Reader::new(body);
    let term = reader.u64().ok()?;
    let index = reader.u64().ok()?;
    let entry_type = match reader.u8().ok()? {
        0 => EntryType::EntryNormal,
        1 => EntryType::EntryConfChange,
        2 => EntryType::EntryConfChangeV2,
        _ => return None,
    };
    let data = reader.u32_prefixed().ok()?.to_vec();
    let context = reader.u32_prefixed().ok()?.to_vec();
    reader.finish().ok()?;
    Some(Entry {
        term,
        index,
        entry_type,
        data: data.into(),
        context: context.into(),
        ..Entry::default()
    })
}

/// Reads the log's frames: the entries above `snapshot_index`, and the length of the good prefix.
fn replay_log(bytes: &[u8], snapshot_index: u64) -> Result<(Vec<Entry>, u64), MetaStorageError> {
    let mut entries: Vec<Entry> = Vec::new();
    let mut offset = 0usize;
    while let Some((entry, frame_len)) = next_frame(&bytes[offset..]) {
        offset += frame_len;
        if entry.index <= snapshot_index {
            continue;
        }
        // A rewritten suffix: the entry replaces everything from its index on.
        if let Some(position) = entries.iter().position(|kept| kept.index >= entry.index) {
            entries.truncate(position);
        }
        let expected = entries
            .last()
            .map_or(snapshot_index + 1, |last| last.index + 1);
        if entry.index != expected {
            return Err(corrupt(
                "log",
                format!("entry {} follows {}", entry.index, expected - 1),
            ));
        }
        entries.push(entry);
    }
    Ok((entries, offset as u64))
}

/// The next whole, checksum-valid frame and its length; `None` at the end or at a torn frame.
fn next_frame(bytes: &[u8]) -> Option<(Entry, usize)> {
    let mut reader = Reader::new(bytes);
    let len = reader.u32().ok()? as usize;
    let crc = reader.u32().ok()?;
    if len > ENTRY_BYTES_MAX {
        return None;
    }
    let body = reader.take(len).ok()?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    Some((decode_entry(body)?, FRAME_HEADER_BYTES + len))
}

fn decode_hard_state(bytes: &[u8]) -> Result<HardState, String> {
    let mut reader = Reader::new(bytes);
    let term = reader.u64().map_err(|e| e.to_string())?;
    let vote = reader.u64().map_err(|e| e.to_string())?;
    let commit = reader.u64().map_err(|e| e.to_string())?;
    let crc = reader.u32().map_err(|e| e.to_string())?;
    reader.finish().map_err(|e| e.to_string())?;
    if crc32fast::hash(&bytes[..24]) != crc {
        return Err("checksum mismatch".to_string());
    }
    Ok(HardState {
        term,
        vote,
        commit,
        ..HardState::default()
    })
}

fn encode_snapshot(snapshot: &StoredSnapshot) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(40 + snapshot.state.len());
    bytes.extend_from_slice(&snapshot.index.to_be_bytes());
    bytes.extend_from_slice(&snapshot.term.to_be_bytes());
    for ids in [&snapshot.voters, &snapshot.learners] {
        bytes.extend_from_slice(&(ids.len() as u32).to_be_bytes());
        for id in ids {
            bytes.extend_from_slice(&id.to_be_bytes());
        }
    }
    put_prefixed(&mut bytes, &snapshot.state);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

fn decode_snapshot(bytes: &[u8]) -> Result<StoredSnapshot, String> {
    let Some(body_len) = bytes.len().checked_sub(4) else {
        return Err("truncated".to_string());
    };
    let (body, crc) = bytes.split_at(body_len);
    if crc32fast::hash(body).to_be_bytes() != crc {
        return Err("checksum mismatch".to_string());
    }
    let mut reader = Reader::new(body);
    let text = |error: narad_core::codec::DecodeError| error.to_string();
    let index = reader.u64().map_err(text)?;
    let term = reader.u64().map_err(text)?;
    let mut id_lists = [Vec::new(), Vec::new()];
    for ids in &mut id_lists {
        let count = reader.u32().map_err(text)?;
        if count > MEMBERS_MAX {
            return Err(format!("{count} members listed"));
        }
        for _ in 0..count {
            ids.push(reader.u64().map_err(text)?);
        }
    }
    let state = reader.u32_prefixed().map_err(text)?.to_vec();
    reader.finish().map_err(text)?;
    let [voters, learners] = id_lists;
    Ok(StoredSnapshot {
        index,
        term,
        voters,
        learners,
        state,
    })
}

#[cfg(test)]
mod tests {
    use narad_core::disk::sim::{DiskFault, FaultRule, SimDisk};

    use super::*;

    fn entry(term: u64, index: u64, data: &[u8]) -> Entry {
        Entry {
            term,
            index,
            data: data.to_vec().into(),
            context: vec![index as u8].into(),
            ..Entry::default()
        }
    }

    fn open(disk: &SimDisk) -> (MetaDisk, Recovered) {
        MetaDisk::open(Arc::new(disk.clone())).unwrap()
    }

    fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..HardState::default()
        }
    }

    #[test]
    fn a_fresh_disk_opens_empty_with_an_empty_log_file() {
        let disk = SimDisk::new(1);
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered, Recovered::default());
        assert_eq!(disk.durable_image("metastore/log"), Some(Vec::new()));
    }

    #[test]
    fn synced_entries_and_hard_state_survive_a_crash() {
        let disk = SimDisk::new(2);
        let (mut meta, _) = open(&disk);
        let entries = vec![entry(1, 1, b""), entry(1, 2, b"create"), entry(2, 3, b"x")];
        meta.append(&entries[..2]).unwrap();
        meta.append(&entries[2..]).unwrap();
        meta.store_hard_state(&hard_state(2, 1, 3)).unwrap();
        disk.crash();
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered.entries, entries);
        assert_eq!(recovered.hard_state, hard_state(2, 1, 3));
        assert_eq!(recovered.torn_bytes, 0);
    }

    #[test]
    fn hard_state_is_stored_only_when_term_or_vote_changes() {
        let disk = SimDisk::new(3);
        let (mut meta, _) = open(&disk);
        meta.store_hard_state(&hard_state(1, 1, 0)).unwrap();
        let syncs = disk.stats().syncs;
        meta.store_hard_state(&hard_state(1, 1, 9)).unwrap();
        assert_eq!(disk.stats().syncs, syncs);
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered.hard_state, hard_state(1, 1, 0));
    }

    #[test]
    fn a_torn_tail_is_truncated_and_appends_continue_after_it() {
        let disk = SimDisk::new(4);
        let (mut meta, _) = open(&disk);
        meta.append(&[entry(1, 1, b"a")]).unwrap();
        let good = disk.durable_image("metastore/log").unwrap().len() as u64;
        // A half-written second frame, as a crash mid-append leaves it.
        let mut frame = Vec::new();
        encode_entry(&mut frame, &entry(1, 2, b"bb"));
        disk.write_at("metastore/log", good, &frame[..frame.len() - 1])
            .unwrap();
        disk.sync_data("metastore/log").unwrap();

        let (mut meta, recovered) = open(&disk);
        assert_eq!(recovered.entries, vec![entry(1, 1, b"a")]);
        assert_eq!(recovered.torn_bytes, frame.len() as u64 - 1);
        assert_eq!(disk.len("metastore/log").unwrap(), good);
        meta.append(&[entry(1, 2, b"c")]).unwrap();
        let (_meta, recovered) = open(&disk);
        assert_eq!(
            recovered.entries,
            vec![entry(1, 1, b"a"), entry(1, 2, b"c")]
        );
    }

    #[test]
    fn a_flipped_bit_in_the_last_frame_reads_as_a_torn_tail() {
        let disk = SimDisk::new(5);
        let (mut meta, _) = open(&disk);
        meta.append(&[entry(1, 1, b"a"), entry(1, 2, b"b")])
            .unwrap();
        let len = disk.len("metastore/log").unwrap();
        assert!(disk.rot("metastore/log", len - 1, 0));
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered.entries, vec![entry(1, 1, b"a")]);
    }

    #[test]
    fn a_rewritten_suffix_replaces_the_old_entries_on_replay() {
        let disk = SimDisk::new(6);
        let (mut meta, _) = open(&disk);
        meta.append(&[entry(1, 1, b"a"), entry(1, 2, b"b"), entry(1, 3, b"c")])
            .unwrap();
        meta.append(&[entry(2, 2, b"B")]).unwrap();
        let (_meta, recovered) = open(&disk);
        assert_eq!(
            recovered.entries,
            vec![entry(1, 1, b"a"), entry(2, 2, b"B")]
        );
    }

    #[test]
    fn a_gap_in_the_log_refuses_to_open() {
        let disk = SimDisk::new(7);
        let (mut meta, _) = open(&disk);
        meta.append(&[entry(1, 1, b"a"), entry(1, 3, b"c")])
            .unwrap();
        assert_eq!(
            MetaDisk::open(Arc::new(disk.clone())).err(),
            Some(MetaStorageError::Corrupt {
                path: "metastore/log".to_string(),
                reason: "entry 3 follows 1".to_string(),
            })
        );
    }

    #[test]
    fn a_snapshot_replaces_the_log_prefix() {
        let disk = SimDisk::new(8);
        let (mut meta, _) = open(&disk);
        let entries: Vec<Entry> = (1..=5).map(|index| entry(1, index, b"e")).collect();
        meta.append(&entries).unwrap();
        let snapshot = StoredSnapshot {
            index: 3,
            term: 1,
            voters: vec![1],
            learners: vec![],
            state: b"state".to_vec(),
        };
        meta.store_snapshot(&snapshot, &entries[3..]).unwrap();
        meta.append(&[entry(1, 6, b"f")]).unwrap();
        disk.crash();
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered.snapshot, Some(snapshot));
        assert_eq!(
            recovered.entries,
            vec![entry(1, 4, b"e"), entry(1, 5, b"e"), entry(1, 6, b"f")]
        );
        assert_eq!(recovered.hard_state.commit, 3);
    }

    #[test]
    fn entries_below_a_snapshot_are_skipped_when_the_log_rewrite_was_lost() {
        let disk = SimDisk::new(9);
        let (mut meta, _) = open(&disk);
        let entries: Vec<Entry> = (1..=4).map(|index| entry(1, index, b"e")).collect();
        meta.append(&entries).unwrap();
        let snapshot = StoredSnapshot {
            index: 2,
            term: 1,
            voters: vec![1],
            learners: vec![],
            state: b"s".to_vec(),
        };
        meta.replace("snapshot", &encode_snapshot(&snapshot))
            .unwrap();
        let (_meta, recovered) = open(&disk);
        assert_eq!(recovered.entries, entries[2..].to_vec());
    }

    #[test]
    fn a_damaged_snapshot_refuses_to_open() {
        let disk = SimDisk::new(10);
        let (mut meta, _) = open(&disk);
        meta.store_snapshot(
            &StoredSnapshot {
                index: 1,
                term: 1,
                voters: vec![1],
                learners: vec![],
                state: b"s".to_vec(),
            },
            &[],
        )
        .unwrap();
        assert!(disk.rot("metastore/snapshot", 3, 1));
        assert_eq!(
            MetaDisk::open(Arc::new(disk.clone())).err(),
            Some(MetaStorageError::Corrupt {
                path: "metastore/snapshot".to_string(),
                reason: "checksum mismatch".to_string(),
            })
        );
    }

    #[test]
    fn a_failed_sync_fails_the_append() {
        let disk = SimDisk::new(11);
        let (mut meta, _) = open(&disk);
        disk.add_fault(FaultRule {
            path_prefix: "metastore/log".to_string(),
            kind: DiskFault::SyncEio,
            chance_ppm: 1_000_000,
            remaining: Some(1),
        });
        assert_eq!(meta.append(&[entry(1, 1, b"a")]), Err(IoFault::Eio));
    }

    #[test]
    fn unsynced_appends_may_be_lost_but_never_leave_a_gap() {
        // Crash right after write, before sync: whatever survives must replay as a prefix.
        for seed in 0..32 {
            let disk = SimDisk::new(seed);
            let (mut meta, _) = open(&disk);
            meta.append(&[entry(1, 1, b"a")]).unwrap();
            let mut frames = Vec::new();
            for index in 2..=40 {
                encode_entry(&mut frames, &entry(1, index, &[7; 300]));
            }
            let len = disk.len("metastore/log").unwrap();
            disk.write_at("metastore/log", len, &frames).unwrap();
            disk.crash();
            let (_meta, recovered) = open(&disk);
            let indexes: Vec<u64> = recovered.entries.iter().map(|e| e.index).collect();
            let expected: Vec<u64> = (1..=indexes.len() as u64).collect();
            assert_eq!(indexes, expected, "seed {seed}");
        }
    }
}
