//! `JournalReplay`: at start-up, before any partition log opens, every partition log gets back from
//! the owner journal what its own files may have lost, and the journal is emptied.
//!
//! # Contract
//! - **Scan.** Every journal segment is read in pieces of at most `read_bytes_max` (a piece grows to
//!   hold one whole entry), and every entry that decodes is indexed by its partition directory; the
//!   entry bytes themselves are not kept. A segment's scan ends at its first entry that does not
//!   decode: in the last segment that is the torn tail of a flush nobody was answered for; in a
//!   sealed one it is damage, reported ([`ReplayReport::damaged`]).
//! - **Rewrite.** For each directory, in name order, one at a time: its retained entries hold every
//!   record from the first one's offset on (the journal is trimmed only behind a partition sync), and
//!   everything before that offset is durable in the partition's own files. So the partition's files
//!   are cut back at the first entry's position (segments past its segment removed; the segment
//!   created anew when the entry starts it), every entry's frame is written again at its own segment
//!   and position (the bytes the partition log wrote, so a tear, a lost write or a half-persisted
//!   roll becomes the exact file a crash-free run would have left), and the touched segments and the
//!   directory are synced. Entries whose offsets do not continue the previous one are written anyway
//!   and reported ([`ReplayReport::gaps`]): the partition's own recovery then reports the hole.
//! - **Retained away.** A directory's leading entries in partition segments that are missing and
//!   older than every segment present are dropped ([`ReplayReport::retained_entries`]): retention
//!   removed those segments (it unlinks only segments synced in their own files, oldest first, a
//!   directory sync after each). Nothing else makes an older segment go missing while a younger one
//!   is present: the namespace of a directory survives a crash as a prefix of its operations
//!   (journaled metadata, as ext4 and XFS keep it, and as the simulated disk models it), so a segment
//!   whose creation a crash lost has no younger segment behind it. Without the rule, the journal,
//!   which trims whole segments only and may hold hours of a quiet node's entries, would bring back
//!   every removed segment it still holds at each restart.
//! - **Empty.** Once every directory is rewritten, every journal segment is removed and the
//!   directory synced; [`ReplayOutput::Done`] reports the next free sequence number.
//! - **Memory.** At most one piece (or one entry) of journal bytes at a time, plus the index (a few
//!   dozen bytes per retained entry; the journal itself is bounded by its trimming).
//! - Any I/O failure ends the replay with [`ReplayOutput::Failed`]: the node must not open partition
//!   logs over a journal it could not apply (nothing was removed from the journal before the end).
//!
//! # Polling order
//! After every `handle`, drain `poll_output`; one request at a time, on `lane`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::entry::{decode_entry, EntryDamage, ENTRY_HEADER_BYTES};
use super::{journal_segment_name, parse_journal_segment_name};
use crate::actor::Actor;
use crate::disk::{join, IoCompletion, IoId, IoLane, IoOp, IoReply, IoRequest};
use crate::error::IoFault;
use crate::ids::Offset;
use crate::partition::segment::{parse_segment_name, segment_name};
use crate::time::Instant;

/// The most journal bytes a replay reads at once (an entry larger than this is read whole).
pub const REPLAY_READ_BYTES_DEFAULT: usize = 4 * 1024 * 1024;

/// Settings of a [`JournalReplay`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayConfig {
    /// The journal's directory.
    pub dir: String,
    /// See [`REPLAY_READ_BYTES_DEFAULT`].
    pub read_bytes_max: usize,
    /// First io id.
    pub io_id_base: u64,
    /// The lane of every request.
    pub lane: IoLane,
}

impl ReplayConfig {
    /// The production defaults for the journal in `dir`.
    pub fn new(dir: impl Into<String>) -> Self {
        ReplayConfig {
            dir: dir.into(),
            read_bytes_max: REPLAY_READ_BYTES_DEFAULT,
            io_id_base: 0,
            lane: IoLane(0),
        }
    }
}

/// What a replay found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Journal segments found (and removed).
    pub segments: usize,
    /// Entries replayed.
    pub entries: u64,
    /// Frame bytes written back into partition logs.
    pub bytes: u64,
    /// Partition directories rewritten.
    pub logs: usize,
    /// Bytes past the last entry of the last segment that did not decode (a torn flush).
    pub torn_bytes: u64,
    /// Damage in a sealed segment: `(sequence number, byte position)`; entries behind it are lost.
    pub damaged: Vec<(u64, u64)>,
    /// Entries that do not continue their directory's previous entry: `(dir, expected, found)`.
    pub gaps: Vec<(String, Offset, Offset)>,
    /// Entries dropped because retention removed their partition segment (see the module docs).
    pub retained_entries: u64,
    /// The sequence number the running journal starts at.
    pub next_seq: u64,
}

/// The commands a [`JournalReplay`] emits.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayOutput {
    /// Run this request; feed back its completion.
    Io(IoRequest),
    /// Every partition log holds what the journal held; the journal is empty.
    Done(ReplayReport),
    /// The replay could not finish (the journal is left as it was found, but for rewrites).
    Failed(IoFault),
}

/// Where a retained entry lies.
#[derive(Clone, Copy, Debug)]
struct Loc {
    seq: u64,
    at: u64,
    len: u32,
    segment: Offset,
    position: u64,
    base: Offset,
    end: Offset,
}

#[derive(Debug)]
struct Scan {
    seqs: Vec<u64>,
    next: usize,
    len: u64,
    /// Where `carry` starts in the segment.
    at: u64,
    carry: Vec<u8>,
}

#[derive(Debug)]
enum Phase {
    Listing(IoId),
    Measuring(IoId, Scan),
    Reading(IoId, Scan),
    /// Listing directory `dir`'s segments.
    ListingLog(IoId),
    /// Cutting back the partition's files.
    Cutting(IoId),
    /// Reading entries `[from, to)` of the current directory.
    Copying(IoId, usize, usize),
    Writing(IoId, usize),
    Syncing(IoId),
    Emptying(IoId),
    Finished,
}

/// The start-up replay of the owner journal: see the module documentation.
#[derive(Debug)]
pub struct JournalReplay {
    config: ReplayConfig,
    phase: Phase,
    seqs: Vec<u64>,
    logs: BTreeMap<Arc<str>, Vec<Loc>>,
    /// Directories still to rewrite, in order; the first is the current one.
    pending: VecDeque<Arc<str>>,
    /// Segments of the current directory written (to sync).
    touched: BTreeSet<Offset>,
    report: ReplayReport,
    next_io: u64,
    outputs: VecDeque<ReplayOutput>,
}

impl JournalReplay {
    /// Starts the replay: the first request is queued.
    pub fn start(config: ReplayConfig) -> Self {
        assert!(config.read_bytes_max >= ENTRY_HEADER_BYTES);
        let mut replay = JournalReplay {
            next_io: config.io_id_base,
            config,
            phase: Phase::Finished,
            seqs: Vec::new(),
            logs: BTreeMap::new(),
            pending: VecDeque::new(),
            touched: BTreeSet::new(),
            report: ReplayReport::default(),
            outputs: VecDeque::new(),
        };
        let dir = replay.config.dir.clone();
        let io = replay.request(vec![
            IoOp::CreateDirAll { dir: dir.clone() },
            IoOp::List { dir },
        ]);
        replay.phase = Phase::Listing(io);
        replay
    }

    fn journal_path(&self, seq: u64) -> String {
        join(&self.config.dir, &journal_segment_name(seq))
    }

    fn request(&mut self, ops: Vec<IoOp>) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        self.outputs.push_back(ReplayOutput::Io(IoRequest {
            id,
            lane: self.config.lane,
            ops,
        }));
        id
    }

    fn fail(&mut self, fault: IoFault) {
        self.phase = Phase::Finished;
        self.outputs.push_back(ReplayOutput::Failed(fault));
    }

    fn on_io(&mut self, completion: IoCompletion) {
        let replies = match completion.result {
            Ok(replies) => replies,
            Err((_, fault)) => return self.fail(fault),
        };
        match std::mem::replace(&mut self.phase, Phase::Finished) {
            Phase::Listing(io) if io == completion.id => self.on_listed(replies),
            Phase::Measuring(io, scan) if io == completion.id => self.on_measured(scan, replies),
            Phase::Reading(io, scan) if io == completion.id => self.on_piece(scan, replies),
            Phase::ListingLog(io) if io == completion.id => self.on_log_listed(replies),
            Phase::Cutting(io) if io == completion.id => self.copy_from(0),
            Phase::Copying(io, from, to) if io == completion.id => {
                self.on_copied(from, to, replies)
            }
            Phase::Writing(io, next) if io == completion.id => self.copy_from(next),
            Phase::Syncing(io) if io == completion.id => {
                self.pending.pop_front();
                self.next_log();
            }
            Phase::Emptying(io) if io == completion.id => {
                let report = std::mem::take(&mut self.report);
                self.outputs.push_back(ReplayOutput::Done(report));
            }
            phase @ (Phase::Listing(_)
            | Phase::Measuring(..)
            | Phase::Reading(..)
            | Phase::ListingLog(_)
            | Phase::Cutting(_)
            | Phase::Copying(..)
            | Phase::Writing(..)
            | Phase::Syncing(_)
            | Phase::Emptying(_)
            | Phase::Finished) => self.phase = phase,
        }
    }

    // ---- scan ----

    fn on_listed(&mut self, replies: Vec<IoReply>) {
        let Some(IoReply::Names(names)) = replies.last() else {
            return self.fail(IoFault::Other("unexpected reply to list".into()));
        };
        let mut seqs: Vec<u64> = names
            .iter()
            .filter_map(|name| parse_journal_segment_name(name))
            .collect();
        seqs.sort_unstable();
        self.report.segments = seqs.len();
        self.report.next_seq = seqs.last().map_or(0, |&last| last + 1);
        self.seqs = seqs.clone();
        self.measure(Scan {
            seqs,
            next: 0,
            len: 0,
            at: 0,
            carry: Vec::new(),
        });
    }

    fn measure(&mut self, scan: Scan) {
        let Some(&seq) = scan.seqs.get(scan.next) else {
            self.pending = self.logs.keys().cloned().collect();
            return self.next_log();
        };
        let path = self.journal_path(seq);
        let io = self.request(vec![IoOp::Len { path }]);
        self.phase = Phase::Measuring(io, scan);
    }

    fn on_measured(&mut self, mut scan: Scan, replies: Vec<IoReply>) {
        let Some(&IoReply::Len(len)) = replies.last() else {
            return self.fail(IoFault::Other("unexpected reply to len".into()));
        };
        scan.len = len;
        scan.at = 0;
        scan.carry.clear();
        self.read_piece(scan, 0);
    }

    /// Reads the next piece of the current segment: at least `needed` bytes from `scan.at`.
    fn read_piece(&mut self, scan: Scan, needed: usize) {
        let from = scan.at + scan.carry.len() as u64;
        let left = scan.len.saturating_sub(from);
        let want = (self.config.read_bytes_max as u64)
            .max(needed.saturating_sub(scan.carry.len()) as u64)
            .min(left);
        if want == 0 {
            return self.end_segment(scan);
        }
        let path = self.journal_path(scan.seqs[scan.next]);
        let io = self.request(vec![IoOp::ReadAt {
            path,
            offset: from,
            len: want as usize,
        }]);
        self.phase = Phase::Reading(io, scan);
    }

    fn on_piece(&mut self, mut scan: Scan, replies: Vec<IoReply>) {
        let Some(IoReply::Data(bytes)) = replies.last() else {
            return self.fail(IoFault::Other("unexpected reply to read".into()));
        };
        if bytes.is_empty() {
            // The file is shorter than measured: what is there was scanned.
            return self.end_segment(scan);
        }
        scan.carry.extend_from_slice(bytes);
        let seq = scan.seqs[scan.next];
        let mut consumed = 0;
        loop {
            match decode_entry(&scan.carry[consumed..]) {
                Ok((view, len)) => {
                    let loc = Loc {
                        seq,
                        at: scan.at + consumed as u64,
                        len: len as u32,
                        segment: view.segment,
                        position: view.position,
                        base: view.base,
                        end: view.end,
                    };
                    match self.logs.get_mut(view.dir) {
                        Some(locs) => locs.push(loc),
                        None => {
                            self.logs.insert(Arc::from(view.dir), vec![loc]);
                        }
                    }
                    consumed += len;
                }
                Err(EntryDamage::Short { needed }) => {
                    scan.carry.drain(..consumed);
                    scan.at += consumed as u64;
                    return self.read_piece(scan, needed);
                }
                Err(EntryDamage::Bad) => {
                    scan.carry.drain(..consumed);
                    scan.at += consumed as u64;
                    return self.damage(scan);
                }
            }
        }
    }

    /// An entry that does not decode ends the segment's scan.
    fn damage(&mut self, mut scan: Scan) {
        let is_last = scan.next + 1 == scan.seqs.len();
        let zeros = scan.carry.iter().all(|&b| b == 0);
        if is_last {
            self.report.torn_bytes = scan.len - scan.at;
        } else if !zeros {
            self.report.damaged.push((scan.seqs[scan.next], scan.at));
        }
        scan.carry.clear();
        scan.next += 1;
        self.measure(scan);
    }

    fn end_segment(&mut self, mut scan: Scan) {
        if !scan.carry.is_empty() {
            // An entry cut short by the end of the file: a torn flush.
            return self.damage(scan);
        }
        scan.next += 1;
        self.measure(scan);
    }

    // ---- rewrite ----

    fn current(&self) -> Option<(&Arc<str>, &Vec<Loc>)> {
        let dir = self.pending.front()?;
        self.logs.get_key_value(dir)
    }

    fn next_log(&mut self) {
        let Some((dir, _)) = self.current() else {
            return self.empty_journal();
        };
        let dir = dir.to_string();
        self.touched.clear();
        self.report.logs += 1;
        let io = self.request(vec![
            IoOp::CreateDirAll { dir: dir.clone() },
            IoOp::List { dir },
        ]);
        self.phase = Phase::ListingLog(io);
    }

    fn on_log_listed(&mut self, replies: Vec<IoReply>) {
        let Some(IoReply::Names(names)) = replies.last() else {
            return self.fail(IoFault::Other("unexpected reply to list".into()));
        };
        let bases: Vec<Offset> = names.iter().filter_map(|n| parse_segment_name(n)).collect();
        if !self.drop_retained(&bases) {
            // Every entry was of removed segments: nothing to write back here.
            self.pending.pop_front();
            return self.next_log();
        }
        let (dir, locs) = self.current().expect("current log");
        let dir = dir.to_string();
        let first = locs[0];
        let mut expected = first.base;
        let mut gaps = Vec::new();
        for loc in locs {
            if loc.base != expected {
                gaps.push((dir.clone(), expected, loc.base));
            }
            expected = loc.end;
        }
        self.report.gaps.extend(gaps);
        let mut ops: Vec<IoOp> = bases
            .iter()
            .filter(|&&base| base > first.segment)
            .map(|&base| IoOp::Remove {
                path: join(&dir, &segment_name(base)),
            })
            .collect();
        let path = join(&dir, &segment_name(first.segment));
        if first.position == 0 || !bases.contains(&first.segment) {
            ops.push(IoOp::Create { path: path.clone() });
        }
        ops.push(IoOp::SetLen {
            path,
            len: first.position,
        });
        self.touched.insert(first.segment);
        let io = self.request(ops);
        self.phase = Phase::Cutting(io);
    }

    /// Drops the current directory's leading entries of segments retention removed; false when none
    /// is left.
    fn drop_retained(&mut self, bases: &[Offset]) -> bool {
        let oldest_present = bases.iter().min().copied();
        let dir = self.pending.front().expect("current log").clone();
        let locs = self.logs.get_mut(&dir).expect("current log");
        let mut drop = 0;
        while let Some(first) = locs.get(drop) {
            let segment = first.segment;
            let removed =
                !bases.contains(&segment) && oldest_present.is_some_and(|oldest| segment < oldest);
            if !removed {
                break;
            }
            drop += locs[drop..]
                .iter()
                .take_while(|loc| loc.segment == segment)
                .count();
        }
        locs.drain(..drop);
        self.report.retained_entries += drop as u64;
        !locs.is_empty()
    }

    /// Reads the current directory's entries from `from` on, up to `read_bytes_max` bytes at once:
    /// one read per span of a segment (see [`spans`]), not one per entry, since a slow disk pays its
    /// latency per request and a log's entries lie close together.
    fn copy_from(&mut self, from: usize) {
        let (_, locs) = self.current().expect("current log");
        if from >= locs.len() {
            return self.sync_log();
        }
        let spans = spans(&locs[from..], self.config.read_bytes_max);
        let to = from + spans.last().map_or(0, |span| span.entries);
        let ops = spans
            .iter()
            .map(|span| IoOp::ReadAt {
                path: join(&self.config.dir, &journal_segment_name(span.seq)),
                offset: span.start,
                len: (span.end - span.start) as usize,
            })
            .collect();
        let io = self.request(ops);
        self.phase = Phase::Copying(io, from, to);
    }

    fn on_copied(&mut self, from: usize, to: usize, replies: Vec<IoReply>) {
        let (dir, locs) = self.current().expect("current log");
        let dir = dir.to_string();
        let locs: Vec<Loc> = locs[from..to].to_vec();
        let spans = spans(&locs, self.config.read_bytes_max);
        if spans.len() != replies.len() {
            return self.fail(IoFault::Other("unexpected replies to reads".into()));
        }
        let mut entries: Vec<&[u8]> = Vec::with_capacity(locs.len());
        let mut first = 0;
        for (span, reply) in spans.iter().zip(&replies) {
            let IoReply::Data(bytes) = reply else {
                return self.fail(IoFault::Other("unexpected reply to read".into()));
            };
            for loc in &locs[first..span.entries] {
                let start = (loc.at - span.start) as usize;
                match bytes.get(start..start + loc.len as usize) {
                    Some(entry) => entries.push(entry),
                    None => {
                        return self.fail(IoFault::Other("journal read came back short".into()))
                    }
                }
            }
            first = span.entries;
        }
        let mut ops = Vec::with_capacity(to - from);
        let mut written = 0u64;
        for (loc, bytes) in locs.iter().zip(entries) {
            // Checked again: the bytes were verified by the scan, but this is a second read.
            let Ok((view, _)) = decode_entry(bytes) else {
                return self.fail(IoFault::Other(
                    "journal entry changed since its scan".into(),
                ));
            };
            let path = join(&dir, &segment_name(loc.segment));
            if loc.position == 0 && !self.touched.contains(&loc.segment) {
                ops.push(IoOp::Create { path: path.clone() });
            }
            self.touched.insert(loc.segment);
            written += view.frame.len() as u64;
            // A log's commits lie back to back in its segment: one write for a run of them.
            if let Some(IoOp::WriteAt {
                path: last_path,
                offset,
                data,
            }) = ops.last_mut()
            {
                if *last_path == path && *offset + data.len() as u64 == loc.position {
                    data.extend_from_slice(view.frame);
                    continue;
                }
            }
            ops.push(IoOp::WriteAt {
                path,
                offset: loc.position,
                data: view.frame.to_vec(),
            });
        }
        self.report.entries += (to - from) as u64;
        self.report.bytes += written;
        let io = self.request(ops);
        self.phase = Phase::Writing(io, to);
    }

    fn sync_log(&mut self) {
        let dir = self.pending.front().expect("current log").to_string();
        let mut ops: Vec<IoOp> = self
            .touched
            .iter()
            .map(|&base| IoOp::SyncData {
                path: join(&dir, &segment_name(base)),
            })
            .collect();
        ops.push(IoOp::SyncDir { dir });
        let io = self.request(ops);
        self.phase = Phase::Syncing(io);
    }

    fn empty_journal(&mut self) {
        let mut ops: Vec<IoOp> = self
            .seqs
            .iter()
            .map(|&seq| IoOp::Remove {
                path: self.journal_path(seq),
            })
            .collect();
        ops.push(IoOp::SyncDir {
            dir: self.config.dir.clone(),
        });
        self.logs.clear();
        let io = self.request(ops);
        self.phase = Phase::Emptying(io);
    }
}

/// A run of a log's entries read with one `ReadAt`: `[start, end)` of segment `seq`, holding the
/// entries before index `entries` (counted from the first entry given to [`spans`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    seq: u64,
    start: u64,
    end: u64,
    entries: usize,
}

/// Groups `locs` (in journal order) into spans of at most `bytes_max` bytes each, and at most
/// `bytes_max` in all (at least one entry, however long). The bytes between a log's entries (other
/// logs' entries) are read too: fewer, larger reads.
fn spans(locs: &[Loc], bytes_max: usize) -> Vec<Span> {
    let bytes_max = bytes_max as u64;
    let mut spans: Vec<Span> = Vec::new();
    let mut total = 0u64;
    for (index, loc) in locs.iter().enumerate() {
        let end = loc.at + u64::from(loc.len);
        if let Some(span) = spans.last_mut() {
            if span.seq == loc.seq && loc.at >= span.end && end - span.start <= bytes_max {
                let grown = end - span.end;
                if total + grown > bytes_max {
                    break;
                }
                total += grown;
                span.end = end;
                span.entries = index + 1;
                continue;
            }
            if total + u64::from(loc.len) > bytes_max {
                break;
            }
        }
        total += u64::from(loc.len);
        spans.push(Span {
            seq: loc.seq,
            start: loc.at,
            end,
            entries: index + 1,
        });
    }
    spans
}

impl Actor for JournalReplay {
    type Input = IoCompletion;
    type Output = ReplayOutput;

    fn handle(&mut self, _now: Instant, input: IoCompletion) {
        self.on_io(input);
    }

    fn poll_output(&mut self) -> Option<ReplayOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

#[cfg(test)]
mod span_tests {
    use super::*;

    fn loc(seq: u64, at: u64, len: u32) -> Loc {
        Loc {
            seq,
            at,
            len,
            segment: Offset(0),
            position: 0,
            base: Offset(0),
            end: Offset(0),
        }
    }

    #[test]
    fn a_logs_entries_in_one_segment_are_one_read_and_a_new_segment_starts_another() {
        let locs = [loc(1, 0, 10), loc(1, 30, 10), loc(1, 100, 20), loc(2, 0, 5)];
        let spans = spans(&locs, 1024);
        assert_eq!(
            spans,
            [
                Span {
                    seq: 1,
                    start: 0,
                    end: 120,
                    entries: 3
                },
                Span {
                    seq: 2,
                    start: 0,
                    end: 5,
                    entries: 4
                },
            ]
        );
    }

    #[test]
    fn spans_stay_within_the_byte_bound_and_an_entry_past_it_is_read_alone() {
        let locs = [loc(1, 0, 10), loc(1, 50, 10), loc(1, 100, 10)];
        assert_eq!(
            spans(&locs, 60),
            [Span {
                seq: 1,
                start: 0,
                end: 60,
                entries: 2
            }],
            "the third entry waits for the next request"
        );
        let locs = [loc(1, 0, 10), loc(1, 10, 10), loc(1, 20, 10)];
        assert_eq!(
            spans(&locs, 25),
            [Span {
                seq: 1,
                start: 0,
                end: 20,
                entries: 2
            }]
        );
        let long = [loc(1, 0, 100), loc(1, 100, 10)];
        assert_eq!(
            spans(&long, 50),
            [Span {
                seq: 1,
                start: 0,
                end: 100,
                entries: 1
            }]
        );
    }
}
