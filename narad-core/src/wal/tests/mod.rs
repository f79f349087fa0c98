//! Tests of the WAL actor: exact outputs for given inputs, crash recovery over `SimDisk`, and decoders
//! fed random bytes.

mod append;
mod cohort;
mod compaction;
mod crash;
mod fuzz;
mod prepare;
mod read;
mod recovery;

use std::time::Duration;

use super::*;
use crate::codec::wal::encode_frame;
use crate::disk::{IoCompletion, IoLane, IoReply};

pub(super) const SEG0: &str = "wal/00000000000000000000.wal";

/// Small segments so rolls, preparation and compaction happen within a few records.
pub(super) fn small_config() -> WalConfig {
    WalConfig {
        dir: "wal".to_string(),
        segment_bytes_max: 256,
        record_bytes_max: 100,
        staging_bytes_max: 1024,
        unflushed_bytes_max: 4096,
        sync_interval_ms: 10,
        commit_delay_us_max: 0,
        commit_siblings_min: 4,
        commit_delay_flush_percent: 50,
        commit_delay_flush_bytes_max: 1024,
        prealloc: false,
        prepared_write_run_bytes_max: 128,
        rotate_dispatched_active_after_bytes: 128,
        index_interval_bytes: 64,
        reads_in_flight_max: 2,
        lanes: WalLanes::default(),
        plant: crate::planted::Plant::NONE,
    }
}

pub(super) fn seg_path(first: u64) -> String {
    format!("wal/{:020}.wal", first)
}

/// Encoded frames for consecutive seqs from `first`.
pub(super) fn frames(first: u64, payloads: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (index, payload) in payloads.iter().enumerate() {
        encode_frame(&mut out, Seq(first + index as u64), payload);
    }
    out
}

/// A payload of `len` bytes of `byte`.
pub(super) fn payload(byte: u8, len: usize) -> Vec<u8> {
    vec![byte; len]
}

/// Drives a pure `IngressWal` by hand: every I/O completion is written by the test.
pub(super) struct Harness {
    pub(super) wal: IngressWal,
    pub(super) now: Instant,
}

impl Harness {
    /// Opens an empty directory and returns the harness with the repair request still in flight.
    pub(super) fn open_empty(config: WalConfig) -> (Harness, IoRequest) {
        let mut recovery = WalRecovery::new(config, Seq(0)).unwrap();
        assert!(recovery.plan(&[]).is_empty());
        let opened = recovery.finish().unwrap();
        let mut harness = Harness {
            wal: opened.wal,
            now: Instant::ZERO,
        };
        let repair = one_io(harness.drain());
        (harness, repair)
    }

    /// Opens an empty directory and completes the repair.
    pub(super) fn ready(config: WalConfig) -> Harness {
        let (mut harness, repair) = Self::open_empty(config);
        assert_eq!(harness.complete(&repair), vec![durable(0)]);
        harness
    }

    pub(super) fn drain(&mut self) -> Vec<WalOutput> {
        std::iter::from_fn(|| self.wal.poll_output()).collect()
    }

    pub(super) fn input(&mut self, input: WalInput) -> Vec<WalOutput> {
        self.wal.handle(self.now, input);
        self.drain()
    }

    pub(super) fn at(&mut self, millis: u64) -> &mut Self {
        self.now = Instant::from_millis(millis);
        self
    }

    pub(super) fn at_us(&mut self, micros: u64) -> &mut Self {
        self.now = Instant::from_nanos(micros * 1_000);
        self
    }

    pub(super) fn append(&mut self, id: u64, record: &[u8]) -> Vec<WalOutput> {
        self.input(WalInput::Append {
            id: AppendId(id),
            record: record.to_vec(),
        })
    }

    pub(super) fn append_many(&mut self, id: u64, records: &[&[u8]]) -> Vec<WalOutput> {
        let records = records.iter().map(|record| record.to_vec()).collect();
        self.input(WalInput::append_many_bytes(AppendId(id), records))
    }

    /// Completes `request` successfully (every op replies `Done`).
    pub(super) fn complete(&mut self, request: &IoRequest) -> Vec<WalOutput> {
        let replies = request.ops.iter().map(|_| IoReply::Done).collect();
        self.input(WalInput::IoDone {
            request: request.clone(),
            completion: IoCompletion {
                id: request.id,
                result: Ok(replies),
            },
        })
    }

    /// Fails op `index` of `request` with `fault`.
    pub(super) fn fail(
        &mut self,
        request: &IoRequest,
        index: usize,
        fault: IoFault,
    ) -> Vec<WalOutput> {
        self.input(WalInput::IoDone {
            request: request.clone(),
            completion: IoCompletion {
                id: request.id,
                result: Err((index, fault)),
            },
        })
    }
}

/// The one output, which must be an I/O request.
pub(super) fn one_io(outputs: Vec<WalOutput>) -> IoRequest {
    match <[WalOutput; 1]>::try_from(outputs) {
        Ok([WalOutput::Io(request)]) => request,
        Ok([other]) => panic!("expected one request, got {other:?}"),
        Err(outputs) => panic!("expected one request, got {outputs:?}"),
    }
}

/// The requests among `outputs`.
pub(super) fn ios(outputs: &[WalOutput]) -> Vec<IoRequest> {
    outputs
        .iter()
        .filter_map(|output| match output {
            WalOutput::Io(request) => Some(request.clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn request(id: u64, lane: u8, ops: Vec<IoOp>) -> IoRequest {
    IoRequest {
        id: IoId(id),
        lane: IoLane(lane),
        ops,
    }
}

pub(super) fn flush_ops(path: &str, offset: u64, data: Vec<u8>) -> Vec<IoOp> {
    vec![
        IoOp::WriteAt {
            path: path.to_string(),
            offset,
            data,
        },
        IoOp::SyncData {
            path: path.to_string(),
        },
    ]
}

pub(super) fn done(id: u64, first: u64, next: u64) -> WalOutput {
    WalOutput::AppendDone {
        id: AppendId(id),
        result: Ok(SeqRange {
            first: Seq(first),
            next: Seq(next),
        }),
    }
}

pub(super) fn failed(id: u64, error: AppendError) -> WalOutput {
    WalOutput::AppendDone {
        id: AppendId(id),
        result: Err(error),
    }
}

pub(super) fn durable(next: u64) -> WalOutput {
    WalOutput::Durable {
        next_seq: Seq(next),
    }
}

pub(super) fn ms(millis: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(millis)
}

pub(super) fn us(micros: u64) -> Instant {
    Instant::ZERO + Duration::from_micros(micros)
}
