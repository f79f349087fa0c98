//! Recovery at open, as a pure step: the driver lists the WAL directory and hands each segment's bytes
//! over, oldest first; [`WalRecovery`] checks them and returns the opened [`IngressWal`] (whose first
//! output is the repair request) or a loud [`OpenError`].
//!
//! Protocol:
//! 1. [`WalRecovery::new`] with the settings and the stored (synced) checkpoint.
//! 2. [`WalRecovery::plan`] with the names in the directory; it returns the segment file names to read,
//!    oldest first (other names are ignored; `next-segment.prep` is scheduled for removal).
//! 3. For each planned name in order, read the whole file and pass it to [`WalRecovery::feed_segment`].
//!    Only the last segment's bytes are kept (for the repair), so memory stays at about two segments.
//! 4. [`WalRecovery::finish`] returns [`Opened`].
//!
//! Rules:
//! - Segment names must be dense: each starts where the previous ended; every frame carries the
//!   sequence number its position implies. Anything else is an [`OpenError`].
//! - A bad frame ends a segment's records. In a segment other than the last, that is corruption, unless
//!   the rest up to a prepared segment's trailer is all zeros (a clean prepared segment).
//! - In the last segment, a bad frame followed by no valid frame is a torn tail: it is truncated. A bad
//!   frame followed by valid frames is a torn tail only when the segment ends in the `NWPREP01` trailer
//!   and every valid frame starts within [`WalConfig::tear_window_bytes`] of the bad one (one torn run
//!   of a prepared segment); otherwise it is corruption.
//! - Repair (the actor's first request, on the append lane): truncate a torn tail, rewrite the last
//!   segment's recovered frames and sync them (after an fsync failure the page cache may still show
//!   bytes that never reached the disk: writing them again makes what recovery saw durable before
//!   anything is appended behind it), remove a leftover spare, sync the directory. An empty directory
//!   gets its first segment, `00000000000000000000.wal`.
//! - A stored checkpoint above the recovered next sequence number is an open error; one below the oldest
//!   segment starts dispatch at that segment, with [`WalWarning::CheckpointBelowOldestSegment`].

use std::collections::BTreeMap;

use super::config::{parse_segment_file_name, ConfigError, WalConfig, PREP_FILE_NAME};
use super::{IngressWal, Recovered, Segment, Tail, WalWarning};
use crate::codec::wal::{
    decode_frame, decode_frame_header, decode_prep_trailer, FRAME_HEADER_BYTES, FRAME_MAGIC,
    PREP_TRAILER_BYTES,
};
use crate::codec::DecodeError;
use crate::disk::IoOp;
use crate::error::IoFault;
use crate::ids::Seq;

/// Why the WAL refuses to open. Every variant but `Io` means the files are not what the WAL writes:
/// the node must not start on them silently.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The settings are inconsistent.
    #[error("invalid ingress WAL settings: {0}")]
    Config(#[from] ConfigError),
    /// The driver could not list or read the directory.
    #[error("reading {path}: {fault}")]
    Io {
        /// The path.
        path: String,
        /// The fault.
        fault: IoFault,
    },
    /// A bad frame that is not a torn tail.
    #[error("corrupt ingress WAL segment {segment} at offset {offset}: {error} (valid frames follow: {followed_by_valid_frames})")]
    Corrupt {
        /// The segment's file name.
        segment: String,
        /// Byte offset of the bad frame.
        offset: u64,
        /// What was wrong with it.
        error: DecodeError,
        /// Valid frames follow it (a hole, not a tail).
        followed_by_valid_frames: bool,
    },
    /// A valid frame carries another sequence number than its position implies.
    #[error("ingress WAL segment {segment} at offset {offset}: frame has seq {found}, expected {expected}")]
    SeqMismatch {
        /// The segment's file name.
        segment: String,
        /// Byte offset of the frame.
        offset: u64,
        /// The implied sequence number.
        expected: Seq,
        /// The frame's.
        found: Seq,
    },
    /// A segment does not start where the previous one ended.
    #[error(
        "ingress WAL segments are not dense: {segment} starts at {found}, expected {expected}"
    )]
    NotDense {
        /// The segment's file name.
        segment: String,
        /// Where the previous segment ended.
        expected: Seq,
        /// Where this one starts.
        found: Seq,
    },
    /// The stored checkpoint is past every record the WAL holds.
    #[error("ingress dispatch checkpoint {checkpoint} is above the WAL's next sequence number {next_seq}")]
    CheckpointAhead {
        /// The stored checkpoint.
        checkpoint: Seq,
        /// The recovered next sequence number.
        next_seq: Seq,
    },
}

/// A torn tail that recovery truncates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The (last) segment's first sequence number.
    pub segment: Seq,
    /// Where the first bad frame started: the new length.
    pub offset: u64,
    /// Bytes cut off.
    pub bytes_dropped: u64,
}

/// What recovery found, for the open log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments on disk after open.
    pub segments: usize,
    /// Records recovered.
    pub records: u64,
    /// The next sequence number (every recovered record is below it).
    pub next_seq: Seq,
    /// The torn tail truncated, if any.
    pub torn_tail: Option<TornTail>,
    /// A leftover `next-segment.prep` is removed.
    pub removed_prep_file: bool,
    /// The directory held no segment: the first one is created.
    pub created_first_segment: bool,
    /// Files in the directory that are not the WAL's (for example the checkpoint), left alone.
    pub ignored_files: Vec<String>,
    /// Where dispatch starts.
    pub dispatch_start: Seq,
}

/// The result of a successful recovery.
#[derive(Debug)]
pub struct Opened {
    /// The actor; its first outputs are any warning, then the repair request.
    pub wal: IngressWal,
    /// What was found.
    pub report: RecoveryReport,
}

/// Recovery in progress: see the module documentation for the protocol.
#[derive(Debug)]
pub struct WalRecovery {
    config: WalConfig,
    checkpoint: Seq,
    planned: Option<Vec<(String, Seq)>>,
    fed: usize,
    prep_found: bool,
    ignored: Vec<String>,
    segments: BTreeMap<Seq, Segment>,
    last_bytes: Vec<u8>,
    torn: Option<TornTail>,
    records: u64,
}

impl WalRecovery {
    /// Starts recovering with the settings and the stored, synced dispatch checkpoint.
    pub fn new(config: WalConfig, checkpoint: Seq) -> Result<WalRecovery, OpenError> {
        config.validate()?;
        Ok(WalRecovery {
            config,
            checkpoint,
            planned: None,
            fed: 0,
            prep_found: false,
            ignored: Vec::new(),
            segments: BTreeMap::new(),
            last_bytes: Vec::new(),
            torn: None,
            records: 0,
        })
    }

    /// Takes the directory listing; returns the segment file names to feed, oldest first.
    pub fn plan(&mut self, names: &[String]) -> Vec<String> {
        assert!(self.planned.is_none(), "plan once");
        let mut segments: Vec<(String, Seq)> = Vec::new();
        for name in names {
            if let Some(first) = parse_segment_file_name(name) {
                segments.push((name.clone(), first));
            } else if name == PREP_FILE_NAME {
                self.prep_found = true;
            } else {
                self.ignored.push(name.clone());
            }
        }
        segments.sort_by_key(|&(_, first)| first);
        let names = segments.iter().map(|(name, _)| name.clone()).collect();
        self.planned = Some(segments);
        names
    }

    /// Takes the whole content of the next planned segment.
    pub fn feed_segment(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), OpenError> {
        let planned = self.planned.as_ref().expect("plan before feeding segments");
        assert!(self.fed < planned.len(), "more segments fed than planned");
        let (planned_name, first) = planned[self.fed].clone();
        assert_eq!(name, planned_name, "segments are fed in plan order");
        let is_last = self.fed + 1 == planned.len();
        self.fed += 1;
        if let Some((_, previous)) = self.segments.last_key_value() {
            if previous.next != first {
                return Err(OpenError::NotDense {
                    segment: name.to_string(),
                    expected: previous.next,
                    found: first,
                });
            }
        }
        let scanned = scan_segment(&self.config, name, first, &bytes, is_last)?;
        self.records += scanned.segment.next.0 - first.0;
        if let Some(offset) = scanned.torn_at {
            self.torn = Some(TornTail {
                segment: first,
                offset,
                bytes_dropped: bytes.len() as u64 - offset,
            });
        }
        if is_last {
            let mut bytes = bytes;
            bytes.truncate(scanned.segment.data_end as usize);
            self.last_bytes = bytes;
        }
        self.segments.insert(first, scanned.segment);
        Ok(())
    }

    /// Checks the checkpoint against what was recovered and builds the actor with its repair request.
    pub fn finish(self) -> Result<Opened, OpenError> {
        let planned = self.planned.expect("plan before finishing");
        assert_eq!(self.fed, planned.len(), "every planned segment is fed");
        let config = self.config;
        let mut segments = self.segments;
        let mut repair = Vec::new();
        let created_first_segment = segments.is_empty();
        if created_first_segment {
            repair.push(IoOp::CreateDirAll {
                dir: config.dir.clone(),
            });
            repair.push(IoOp::Create {
                path: config.segment_path(Seq(0)),
            });
            segments.insert(Seq(0), Segment::empty(Seq(0)));
        } else {
            let (_, last) = segments.last_key_value().expect("not empty");
            let path = config.segment_path(last.first);
            if let Some(torn) = &self.torn {
                repair.push(IoOp::SetLen {
                    path: path.clone(),
                    len: torn.offset,
                });
            }
            let rewrite = !self.last_bytes.is_empty();
            if rewrite {
                repair.push(IoOp::WriteAt {
                    path: path.clone(),
                    offset: 0,
                    data: self.last_bytes,
                });
            }
            if rewrite || self.torn.is_some() {
                repair.push(IoOp::SyncData { path });
            }
        }
        if self.prep_found {
            repair.push(IoOp::Remove {
                path: config.prep_path(),
            });
        }
        repair.push(IoOp::SyncDir {
            dir: config.dir.clone(),
        });
        let (&oldest, _) = segments.first_key_value().expect("not empty");
        let (_, last) = segments.last_key_value().expect("not empty");
        let next_seq = last.next;
        if self.checkpoint > next_seq {
            return Err(OpenError::CheckpointAhead {
                checkpoint: self.checkpoint,
                next_seq,
            });
        }
        let warning =
            (self.checkpoint < oldest).then_some(WalWarning::CheckpointBelowOldestSegment {
                checkpoint: self.checkpoint,
                oldest_segment: oldest,
            });
        let dispatch_start = self.checkpoint.max(oldest);
        let tail = Tail {
            first: last.first,
            end: last.data_end,
            limit: last.prepared_limit.unwrap_or(config.segment_bytes_max),
            prepared: last.prepared_limit.is_some(),
        };
        let report = RecoveryReport {
            segments: segments.len(),
            records: self.records,
            next_seq,
            torn_tail: self.torn,
            removed_prep_file: self.prep_found,
            created_first_segment,
            ignored_files: self.ignored,
            dispatch_start,
        };
        let recovered = Recovered {
            segments,
            tail,
            next_seq,
            checkpoint: self.checkpoint,
            dispatch_start,
            repair,
            warning,
        };
        Ok(Opened {
            wal: IngressWal::from_recovered(config, recovered),
            report,
        })
    }
}

/// One segment checked.
struct Scanned {
    segment: Segment,
    /// `Some(offset)`: a torn tail to truncate there.
    torn_at: Option<u64>,
}

/// The write limit of a prepared segment, when `bytes` ends in a trailer that points at itself.
fn trailer_limit(bytes: &[u8]) -> Option<u64> {
    let len = bytes.len();
    if len < PREP_TRAILER_BYTES {
        return None;
    }
    let limit = decode_prep_trailer(&bytes[len - PREP_TRAILER_BYTES..]).ok()?;
    (limit == (len - PREP_TRAILER_BYTES) as u64).then_some(limit)
}

/// Checks one segment's frames; see the module documentation for the rules.
fn scan_segment(
    config: &WalConfig,
    name: &str,
    first: Seq,
    bytes: &[u8],
    is_last: bool,
) -> Result<Scanned, OpenError> {
    let mut segment = Segment::empty(first);
    segment.file_len = bytes.len() as u64;
    let mut pos = 0usize;
    let mut seq = first;
    let error = loop {
        if pos == bytes.len() {
            segment.next = seq;
            segment.data_end = pos as u64;
            return Ok(Scanned {
                segment,
                torn_at: None,
            });
        }
        match decode_frame(&bytes[pos..]) {
            Ok(frame) if frame.seq == seq => {
                segment.note_frame(seq, pos as u64, config.index_interval_bytes);
                pos += frame.encoded_len();
                seq = seq.next();
            }
            Ok(frame) => {
                return Err(OpenError::SeqMismatch {
                    segment: name.to_string(),
                    offset: pos as u64,
                    expected: seq,
                    found: frame.seq,
                })
            }
            Err(error) => break error,
        }
    };
    let bad = pos;
    segment.next = seq;
    segment.data_end = bad as u64;
    let limit = trailer_limit(bytes).filter(|&limit| bad as u64 <= limit);
    let region_end = limit.map_or(bytes.len(), |limit| limit as usize);
    if let Some(limit) = limit {
        if bytes[bad..region_end].iter().all(|&byte| byte == 0) {
            // A prepared segment whose frames end here: the rest is still the zero fill.
            segment.prepared_limit = Some(limit);
            return Ok(Scanned {
                segment,
                torn_at: None,
            });
        }
    }
    // An intact header tells where the bad frame ends: its own payload is not searched (a payload may
    // legitimately contain bytes that look like frames).
    let search_from = match decode_frame_header(&bytes[bad..region_end]) {
        Ok(header) => bad + header.frame_len(),
        Err(_) => bad + 1,
    };
    let follower = furthest_follower(bytes, bad, search_from, region_end, seq);
    let torn = is_last
        && match follower {
            None => true,
            Some(start) => limit.is_some() && ((start - bad) as u64) < config.tear_window_bytes(),
        };
    if !torn {
        return Err(OpenError::Corrupt {
            segment: name.to_string(),
            offset: bad as u64,
            error,
            followed_by_valid_frames: follower.is_some(),
        });
    }
    segment.file_len = bad as u64;
    Ok(Scanned {
        segment,
        torn_at: Some(bad as u64),
    })
}

/// The start of the furthest valid frame in `bytes[from..end)` that could have been written after a
/// bad frame at `bad` expected to carry `expected`: its sequence number is above `expected` and no
/// higher than the bytes in between could hold (each frame takes at least 21 bytes).
fn furthest_follower(
    bytes: &[u8],
    bad: usize,
    from: usize,
    end: usize,
    expected: Seq,
) -> Option<usize> {
    let region = &bytes[..end];
    let magic = FRAME_MAGIC.to_be_bytes();
    let mut furthest = None;
    let mut pos = from;
    while pos + FRAME_HEADER_BYTES < end {
        if region[pos..pos + 4] == magic {
            if let Ok(frame) = decode_frame(&region[pos..]) {
                let seq_max = expected
                    .0
                    .saturating_add(((pos - bad) / (FRAME_HEADER_BYTES + 1)) as u64);
                if frame.seq > expected && frame.seq.0 <= seq_max {
                    furthest = Some(pos);
                }
            }
        }
        pos += 1;
    }
    furthest
}
