//! The ingress WAL's settings, and how its files are named.

use crate::codec::wal::{FRAME_HEADER_BYTES, FRAME_PAYLOAD_BYTES_MAX, PREP_TRAILER_BYTES};
use crate::cohort::CohortWait;
use crate::disk::IoLane;
use crate::ids::Seq;
use crate::planted::Plant;

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;

/// Default of [`WalConfig::commit_delay_us_max`]. Deviates from the spec (whose group commit fires on
/// every append): with N closed-loop producers a flush that starts the moment the previous one completes
/// carries only the few that came back meanwhile, so flushes settle near N/2 records and each produce
/// waits about 1.5 fsyncs. Waiting briefly for the answered cohort to come back makes one flush carry
/// all N (see the module documentation for the figures behind the value).
pub const COMMIT_DELAY_US_MAX_DEFAULT: u64 = 1_000;

/// Default of [`WalConfig::commit_delay_flush_bytes_max`]: 256 KiB. Measured: 16 workers sending
/// batches of 100 × 1 KiB flush ≈ 600 KiB at a time, and waiting for their cohort cost 5–40% of MB/s
/// (the batches' return trip is long and the disk idles meanwhile); 64 single 1 KiB produces flush
/// ≈ 35 KiB.
pub const COMMIT_DELAY_FLUSH_BYTES_MAX_DEFAULT: usize = 256 * 1024;

/// Default of [`WalConfig::commit_siblings_min`].
pub const COMMIT_SIBLINGS_MIN_DEFAULT: usize = 4;

/// Default of [`WalConfig::commit_delay_flush_percent`]: two and a half flushes. Measured side by side
/// (`narad bench`, 64 workers, 1 KiB single produces, five alternating rounds on this 2-core machine):
/// against one flush (100%), group commits grow from 34 to 56 records, msgs/s median 41.0k → 47.8k and
/// server CPU per record 33.0 → 27.0 µs. A cohort of 64 callers answered at once needs longer than one
/// flush to come back when the node and its clients share two cores (every answer and every new
/// request takes CPU), and each flush it splits into costs an fsync and its wake-ups. At 8 workers the
/// cohort comes back whole first and nothing changes (13.5k msgs/s either way); 400% gains nothing
/// more (the 1 ms cap binds).
pub const COMMIT_DELAY_FLUSH_PERCENT_DEFAULT: u32 = 250;

/// Name of the spare segment prepared off the append path (`storage.ingress_wal_prealloc`).
pub const PREP_FILE_NAME: &str = "next-segment.prep";

/// Suffix of a segment file; the stem is its first sequence number as 20 decimal digits.
pub const SEGMENT_SUFFIX: &str = ".wal";

/// Digits in a segment file's stem (enough for `u64::MAX`).
pub const SEGMENT_STEM_DIGITS: usize = 20;

/// The file name of the segment whose first record is `first`: `00000000000000000042.wal`.
pub fn segment_file_name(first: Seq) -> String {
    named_segment("", first)
}

/// `dir` joined (as [`crate::disk::join`] does) with [`segment_file_name`], built in one allocation
/// without `core::fmt`: a flush names its segment, so this runs once per group commit, and formatting
/// with padding cost ~2,700 instructions a call.
fn named_segment(dir: &str, first: Seq) -> String {
    let mut digits = [b'0'; SEGMENT_STEM_DIGITS];
    let mut rest = first.0;
    // u64::MAX has 20 digits, so the loop fits; it stops at the last non-zero digit and the leading
    // ones stay '0' (a small sequence number costs a few divisions, not twenty).
    for slot in digits.iter_mut().rev() {
        *slot = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let mut path = Vec::with_capacity(dir.len() + 1 + SEGMENT_STEM_DIGITS + SEGMENT_SUFFIX.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir.as_bytes());
        path.push(b'/');
    }
    path.extend_from_slice(&digits);
    path.extend_from_slice(SEGMENT_SUFFIX.as_bytes());
    String::from_utf8(path).expect("a str, a slash and ASCII digits are UTF-8")
}

/// The first sequence number a segment file name encodes, or `None` for any other file.
pub fn parse_segment_file_name(name: &str) -> Option<Seq> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    if stem.len() != SEGMENT_STEM_DIGITS || !stem.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    stem.parse::<u64>().ok().map(Seq)
}

/// The I/O lanes the WAL emits requests on. Requests of one lane run in order; lanes run concurrently,
/// so preparing a segment or serving a read never waits behind a group commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalLanes {
    /// Group commits, rolls and the open-time repair: strictly one request at a time.
    pub append: IoLane,
    /// Preparing `next-segment.prep`.
    pub prepare: IoLane,
    /// Reads for the dispatcher.
    pub read: IoLane,
    /// Deleting compacted segments.
    pub compact: IoLane,
}

impl Default for WalLanes {
    fn default() -> Self {
        WalLanes {
            append: IoLane(0),
            prepare: IoLane(1),
            read: IoLane(2),
            compact: IoLane(3),
        }
    }
}

/// Settings of one ingress WAL. Defaults are the spec's constants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalConfig {
    /// Directory of the segments on the [`crate::disk::Disk`] (`/`-separated, relative to its root).
    pub dir: String,
    /// A segment rolls before its frames would pass this size (64 MiB). A prepared segment is this long
    /// including its 16-byte trailer, so its frames stop 16 bytes earlier.
    pub segment_bytes_max: u64,
    /// The largest record (frame payload) accepted (16 MiB).
    pub record_bytes_max: usize,
    /// Capacity each reusable staging buffer keeps between flushes (4 MiB); a larger flush grows a
    /// buffer for its own duration only.
    pub staging_bytes_max: usize,
    /// Bytes staged but not yet durable (staged, queued behind a roll or in flight) above which a new
    /// append is refused with [`super::AppendError::Overloaded`] (64 MiB).
    pub unflushed_bytes_max: usize,
    /// Group-commit backstop (`ingress_wal_sync_interval_ms`, 10 ms): the latest a staged record waits
    /// for a flush to start when the append lane is free.
    pub sync_interval_ms: u64,
    /// Longest a flush waits for its cohort (`storage.ingress_wal_commit_delay_us`, µs; 0 = off, the
    /// spec's wake per append). After a flush that answered `K >= commit_siblings_min` appends, the next
    /// one waits until `K` appends have arrived or `min(this, commit_delay_flush_percent of the last
    /// flush's duration)` has passed; see the module documentation. Must stay below the backstop.
    pub commit_delay_us_max: u64,
    /// A cohort wait also lasts at most this percentage of the duration of the flush that set it.
    pub commit_delay_flush_percent: u32,
    /// A flush that wrote at least this many bytes sets no cohort wait: it is bound by the disk's
    /// bandwidth, not by the fsync, and a wait would only idle the disk.
    pub commit_delay_flush_bytes_max: usize,
    /// The fewest appends a flush must have answered for the next one to wait for their return
    /// (PostgreSQL's `commit_siblings`): below it the load is too light for waiting to pay.
    pub commit_siblings_min: usize,
    /// `storage.ingress_wal_prealloc` (off by default): prepare each next segment off the append path.
    pub prealloc: bool,
    /// Writes into a prepared segment go in runs of whole frames of at most this many bytes, each
    /// written and synced before the next (16 MiB); recovery uses the same value as its tear window.
    /// Must not change between a crash and the next open.
    pub prepared_write_run_bytes_max: u64,
    /// A fully dispatched active segment at least this large is rotated so compaction can reclaim it
    /// (1 MiB).
    pub rotate_dispatched_active_after_bytes: u64,
    /// Distance between the entries of each segment's sparse seq → offset index (64 KiB).
    pub index_interval_bytes: u64,
    /// Disk reads in flight at once; a read beyond it is refused with [`super::WalReadError::Busy`] (16).
    pub reads_in_flight_max: usize,
    /// The lanes requests go on.
    pub lanes: WalLanes,
    /// The bug planted in this WAL (simulator only; [`Plant::NONE`] everywhere else).
    pub plant: Plant,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            dir: "ingress/produce".to_string(),
            segment_bytes_max: 64 * MIB,
            record_bytes_max: FRAME_PAYLOAD_BYTES_MAX,
            staging_bytes_max: 4 * MIB as usize,
            unflushed_bytes_max: 64 * MIB as usize,
            sync_interval_ms: 10,
            commit_delay_us_max: COMMIT_DELAY_US_MAX_DEFAULT,
            commit_siblings_min: COMMIT_SIBLINGS_MIN_DEFAULT,
            commit_delay_flush_percent: COMMIT_DELAY_FLUSH_PERCENT_DEFAULT,
            commit_delay_flush_bytes_max: COMMIT_DELAY_FLUSH_BYTES_MAX_DEFAULT,
            prealloc: false,
            prepared_write_run_bytes_max: 16 * MIB,
            rotate_dispatched_active_after_bytes: MIB,
            index_interval_bytes: 64 * 1024,
            reads_in_flight_max: 16,
            lanes: WalLanes::default(),
            plant: Plant::NONE,
        }
    }
}

/// Why a [`WalConfig`] cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `record_bytes_max` is zero or above the frame format's 16 MiB.
    #[error("record_bytes_max {0} is not in 1..=16 MiB")]
    RecordLimit(usize),
    /// A segment cannot hold one largest frame plus a prepared segment's trailer.
    #[error("segment_bytes_max {segment_bytes_max} cannot hold a {frame_bytes_max}-byte frame and a trailer")]
    SegmentTooSmall {
        /// The configured segment size.
        segment_bytes_max: u64,
        /// The largest frame.
        frame_bytes_max: u64,
    },
    /// The unflushed limit cannot hold one largest frame.
    #[error("unflushed_bytes_max {0} cannot hold one largest frame")]
    UnflushedLimit(usize),
    /// A limit that must be positive is zero.
    #[error("{0} must be positive")]
    Zero(&'static str),
    /// The cohort wait is not shorter than the backstop it must stay under.
    #[error("commit_delay_us_max {commit_delay_us_max} must be below the {sync_interval_ms} ms backstop")]
    CommitDelayNotBelowBackstop {
        /// The configured cap, µs.
        commit_delay_us_max: u64,
        /// The backstop, ms.
        sync_interval_ms: u64,
    },
    /// Two lanes are the same, so a read or a preparation could queue behind a group commit.
    #[error("the WAL's four lanes must differ")]
    LanesShared,
}

impl WalConfig {
    /// The cohort wait these settings describe.
    pub fn cohort_wait(&self) -> CohortWait {
        CohortWait {
            delay_us_max: self.commit_delay_us_max,
            flush_percent: self.commit_delay_flush_percent,
            flush_bytes_max: self.commit_delay_flush_bytes_max as u64,
            siblings_min: self.commit_siblings_min,
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.record_bytes_max == 0 || self.record_bytes_max > FRAME_PAYLOAD_BYTES_MAX {
            return Err(ConfigError::RecordLimit(self.record_bytes_max));
        }
        let frame_bytes_max = self.frame_bytes_max();
        if self.segment_bytes_max < frame_bytes_max + PREP_TRAILER_BYTES as u64 {
            return Err(ConfigError::SegmentTooSmall {
                segment_bytes_max: self.segment_bytes_max,
                frame_bytes_max,
            });
        }
        if (self.unflushed_bytes_max as u64) < frame_bytes_max {
            return Err(ConfigError::UnflushedLimit(self.unflushed_bytes_max));
        }
        for (value, name) in [
            (self.sync_interval_ms, "sync_interval_ms"),
            (
                self.prepared_write_run_bytes_max,
                "prepared_write_run_bytes_max",
            ),
            (self.index_interval_bytes, "index_interval_bytes"),
            (self.reads_in_flight_max as u64, "reads_in_flight_max"),
            (self.commit_siblings_min as u64, "commit_siblings_min"),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.commit_delay_us_max >= self.sync_interval_ms.saturating_mul(1000) {
            return Err(ConfigError::CommitDelayNotBelowBackstop {
                commit_delay_us_max: self.commit_delay_us_max,
                sync_interval_ms: self.sync_interval_ms,
            });
        }
        let lanes = self.lanes;
        let all = [lanes.append, lanes.prepare, lanes.read, lanes.compact];
        for (index, lane) in all.iter().enumerate() {
            if all[index + 1..].contains(lane) {
                return Err(ConfigError::LanesShared);
            }
        }
        Ok(())
    }

    /// The largest frame: header plus the largest record.
    pub fn frame_bytes_max(&self) -> u64 {
        (FRAME_HEADER_BYTES + self.record_bytes_max) as u64
    }

    /// Where frames of a prepared segment must stop: its trailer's offset.
    pub fn prepared_write_limit(&self) -> u64 {
        self.segment_bytes_max - PREP_TRAILER_BYTES as u64
    }

    /// How far past a bad frame recovery still accepts valid frames as the remains of one torn run in
    /// a prepared segment: a run, or one frame larger than a run (which is written alone).
    pub fn tear_window_bytes(&self) -> u64 {
        self.prepared_write_run_bytes_max
            .max(self.frame_bytes_max())
    }

    /// The path of the segment whose first record is `first`.
    pub fn segment_path(&self, first: Seq) -> String {
        named_segment(&self.dir, first)
    }

    /// The path of the spare segment.
    pub fn prep_path(&self) -> String {
        crate::disk::join(&self.dir, PREP_FILE_NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_are_twenty_digit_first_seqs() {
        assert_eq!(segment_file_name(Seq(42)), "00000000000000000042.wal");
        assert_eq!(segment_file_name(Seq(u64::MAX)), "18446744073709551615.wal");
        assert_eq!(
            parse_segment_file_name("00000000000000000042.wal"),
            Some(Seq(42))
        );
        for other in [
            "42.wal",
            "0000000000000000004x.wal",
            "00000000000000000042.wal.tmp",
            "99999999999999999999.wal",
            PREP_FILE_NAME,
            "checkpoint",
        ] {
            assert_eq!(parse_segment_file_name(other), None, "{other}");
        }
    }

    #[test]
    fn segment_paths_are_the_dir_joined_with_the_padded_name() {
        for first in [0, 7, 42, 1_000_000_007, u64::MAX / 3, u64::MAX] {
            let expected_name = format!("{first:020}.wal");
            assert_eq!(segment_file_name(Seq(first)), expected_name);
            for dir in ["", "wal", "data/ingress"] {
                let config = WalConfig {
                    dir: dir.to_string(),
                    ..WalConfig::default()
                };
                assert_eq!(
                    config.segment_path(Seq(first)),
                    crate::disk::join(dir, &expected_name)
                );
            }
        }
    }

    #[test]
    fn defaults_are_the_spec_constants_and_valid() {
        let config = WalConfig::default();
        assert_eq!(config.segment_bytes_max, 64 * MIB);
        assert_eq!(config.record_bytes_max, 16 * MIB as usize);
        assert_eq!(config.staging_bytes_max, 4 * MIB as usize);
        assert_eq!(config.sync_interval_ms, 10);
        assert_eq!(config.commit_delay_us_max, 1_000);
        assert_eq!(config.commit_siblings_min, 4);
        assert_eq!(config.commit_delay_flush_percent, 250);
        assert_eq!(config.commit_delay_flush_bytes_max, 256 * 1024);
        assert!(!config.prealloc);
        assert_eq!(config.prepared_write_run_bytes_max, 16 * MIB);
        assert_eq!(config.rotate_dispatched_active_after_bytes, MIB);
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn validate_refuses_a_segment_smaller_than_a_frame_and_trailer() {
        let config = WalConfig {
            segment_bytes_max: 1000,
            record_bytes_max: 980,
            ..WalConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::SegmentTooSmall {
                segment_bytes_max: 1000,
                frame_bytes_max: 1000
            })
        );
        let shared = WalConfig {
            lanes: WalLanes {
                read: IoLane(0),
                ..WalLanes::default()
            },
            ..WalConfig::default()
        };
        assert_eq!(shared.validate(), Err(ConfigError::LanesShared));
    }

    #[test]
    fn validate_refuses_a_commit_delay_not_below_the_backstop_and_zero_siblings() {
        let long = WalConfig {
            commit_delay_us_max: 10_000,
            ..WalConfig::default()
        };
        assert_eq!(
            long.validate(),
            Err(ConfigError::CommitDelayNotBelowBackstop {
                commit_delay_us_max: 10_000,
                sync_interval_ms: 10
            })
        );
        let just_below = WalConfig {
            commit_delay_us_max: 9_999,
            ..WalConfig::default()
        };
        assert_eq!(just_below.validate(), Ok(()));
        let no_siblings = WalConfig {
            commit_siblings_min: 0,
            ..WalConfig::default()
        };
        assert_eq!(
            no_siblings.validate(),
            Err(ConfigError::Zero("commit_siblings_min"))
        );
    }
}
