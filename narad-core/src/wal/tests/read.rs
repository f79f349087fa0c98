//! Reads for the dispatcher, over `SimDisk` with the synchronous driver.

use super::*;
use crate::codec::DecodeError;
use crate::disk::sim::SimDisk;
use crate::wal::driver::{open_wal, SyncDriver};

fn read_config() -> WalConfig {
    WalConfig {
        segment_bytes_max: 64 * 1024,
        ..small_config()
    }
}

fn open(disk: &SimDisk, config: WalConfig) -> SyncDriver<'_, IngressWal> {
    let opened = open_wal(disk, config, Seq(0)).unwrap();
    let mut driver = SyncDriver::new(disk, opened.wal, Instant::ZERO);
    driver.run_until_idle();
    let next_seq = driver.actor().durable_next_seq();
    assert_eq!(driver.take_outputs(), vec![WalOutput::Durable { next_seq }]);
    driver
}

fn record(seq: u64, len: usize) -> Vec<u8> {
    payload(b'a' + (seq % 26) as u8, len)
}

/// Appends `count` records of `len` bytes, each in its own group commit.
fn append_each(driver: &mut SyncDriver<'_, IngressWal>, count: u64, len: usize) {
    for seq in 0..count {
        driver.handle(WalInput::Append {
            id: AppendId(seq),
            record: record(seq, len),
        });
        driver.run_until_idle();
    }
    driver.take_outputs();
}

fn read(from: u64, max_records: usize, max_bytes: usize) -> WalInput {
    WalInput::Read {
        id: WalReadId(7),
        from: Seq(from),
        max_records,
        max_bytes,
    }
}

fn answer(frames: Vec<WalFrame>) -> Vec<WalOutput> {
    vec![WalOutput::ReadDone {
        id: WalReadId(7),
        result: Ok(frames),
    }]
}

fn frame(seq: u64, len: usize) -> WalFrame {
    WalFrame {
        seq: Seq(seq),
        payload: record(seq, len),
    }
}

#[test]
fn a_read_of_the_last_group_commit_is_served_from_memory() {
    let disk = SimDisk::new(1);
    let mut driver = open(&disk, read_config());
    for seq in 0..3 {
        driver.handle(WalInput::Append {
            id: AppendId(seq),
            record: record(seq, 10),
        });
    }
    driver.run_until_idle(); // flush {0}, then flush {1, 2}
    driver.take_outputs();
    driver.handle(read(1, 10, 1000));
    assert_eq!(driver.pending_requests(), 0, "no I/O");
    assert_eq!(
        driver.take_outputs(),
        answer(vec![frame(1, 10), frame(2, 10)])
    );
}

#[test]
fn a_read_of_older_records_goes_to_disk_from_the_sparse_index() {
    let disk = SimDisk::new(2);
    let mut driver = open(&disk, read_config());
    append_each(&mut driver, 20, 30); // 50-byte frames: an index entry every other frame
    driver.handle(read(11, 3, 1000));
    let lane = driver.busy_lanes();
    assert_eq!(lane, vec![IoLane(2)]);
    // Entry (10, 500) precedes seq 11; the read covers the index gap plus a largest record.
    let expected = IoOp::ReadAt {
        path: SEG0.into(),
        offset: 500,
        len: 64 + 100 + 40,
    };
    assert_eq!(driver.head(IoLane(2)).unwrap().ops, vec![expected]);
    driver.run_until_idle();
    assert_eq!(
        driver.take_outputs(),
        answer(vec![frame(11, 30), frame(12, 30), frame(13, 30)])
    );
}

#[test]
fn a_frame_longer_than_the_first_read_is_read_again_whole() {
    let disk = SimDisk::new(3);
    let mut driver = open(&disk, read_config());
    append_each(&mut driver, 5, 100); // 120-byte frames, one index entry each
    driver.handle(read(3, 1, 1));
    let first = driver.head(IoLane(2)).unwrap().ops.clone();
    assert_eq!(
        first,
        vec![IoOp::ReadAt {
            path: SEG0.into(),
            offset: 360,
            len: 64 + 1 + 40
        }]
    );
    driver.run_request(IoLane(2));
    let second = driver.head(IoLane(2)).unwrap().ops.clone();
    assert_eq!(
        second,
        vec![IoOp::ReadAt {
            path: SEG0.into(),
            offset: 360,
            len: 120
        }]
    );
    driver.run_until_idle();
    assert_eq!(driver.take_outputs(), answer(vec![frame(3, 100)]));
}

#[test]
fn a_read_stops_at_max_bytes_but_always_returns_one_record() {
    let disk = SimDisk::new(4);
    let mut driver = open(&disk, read_config());
    append_each(&mut driver, 6, 30);
    driver.handle(read(0, 10, 65));
    driver.run_until_idle();
    assert_eq!(
        driver.take_outputs(),
        answer(vec![frame(0, 30), frame(1, 30)])
    );
    driver.handle(read(0, 10, 1));
    driver.run_until_idle();
    assert_eq!(driver.take_outputs(), answer(vec![frame(0, 30)]));
}

#[test]
fn a_read_at_the_durable_frontier_is_empty_and_below_the_oldest_segment_is_compacted() {
    let disk = SimDisk::new(5);
    let mut driver = open(&disk, small_config());
    append_each(&mut driver, 7, 50); // seg0 [0,3), seg3 [3,6), seg6 [6,7)
    driver.handle(read(7, 10, 1000));
    assert_eq!(driver.take_outputs(), answer(vec![]));
    driver.handle(WalInput::CheckpointSynced { seq: Seq(3) });
    driver.run_until_idle();
    driver.handle(read(2, 10, 1000));
    assert_eq!(
        driver.take_outputs(),
        vec![WalOutput::ReadDone {
            id: WalReadId(7),
            result: Err(WalReadError::Compacted { oldest: Seq(3) })
        }]
    );
    driver.handle(read(4, 10, 1000));
    driver.run_until_idle();
    assert_eq!(
        driver.take_outputs(),
        answer(vec![frame(4, 50), frame(5, 50)]),
        "a read stops at its segment's end"
    );
}

#[test]
fn disk_reads_beyond_the_in_flight_limit_are_refused_busy() {
    let disk = SimDisk::new(6);
    let mut driver = open(&disk, read_config()); // two reads in flight at most
    append_each(&mut driver, 4, 30);
    for _ in 0..3 {
        driver.handle(read(0, 1, 100));
    }
    assert_eq!(
        driver.take_outputs(),
        vec![WalOutput::ReadDone {
            id: WalReadId(7),
            result: Err(WalReadError::Busy)
        }]
    );
    driver.run_until_idle();
    assert_eq!(driver.take_outputs().len(), 2);
}

#[test]
fn rotted_durable_bytes_are_reported_corrupt_never_served() {
    let disk = SimDisk::new(7);
    let mut driver = open(&disk, read_config());
    append_each(&mut driver, 4, 30);
    assert!(disk.rot(SEG0, 75, 0)); // inside frame 1's payload (bytes 70..100)
    driver.handle(read(1, 1, 100));
    driver.run_until_idle();
    assert_eq!(
        driver.take_outputs(),
        vec![WalOutput::ReadDone {
            id: WalReadId(7),
            result: Err(WalReadError::Corrupt {
                segment: Seq(0),
                offset: 50,
                error: DecodeError::BadChecksum
            })
        }]
    );
}

#[test]
fn records_recovered_at_open_are_read_from_disk() {
    let disk = SimDisk::new(8);
    let mut driver = open(&disk, read_config());
    append_each(&mut driver, 3, 30);
    drop(driver);
    disk.crash();
    let mut driver = open(&disk, read_config());
    assert_eq!(driver.actor().durable_next_seq(), Seq(3));
    driver.handle(read(0, 10, 1000));
    driver.run_until_idle();
    assert_eq!(
        driver.take_outputs(),
        answer(vec![frame(0, 30), frame(1, 30), frame(2, 30)])
    );
}
