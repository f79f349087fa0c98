//! The WAL's side of the synchronous driver: [`open_wal`] runs the recovery protocol over a disk, and
//! [`IngressWal`] plugs into [`crate::disk::driver::SyncDriver`].

use super::{IngressWal, OpenError, Opened, WalConfig, WalInput, WalOutput, WalRecovery};
use crate::disk::{join, Disk, IoCompletion, IoRequest};
use crate::ids::Seq;

pub use crate::disk::driver::{IoActor, SyncDriver};

impl IoActor for IngressWal {
    fn into_io(output: WalOutput) -> Result<IoRequest, WalOutput> {
        match output {
            WalOutput::Io(request) => Ok(request),
            other @ (WalOutput::AppendDone { .. }
            | WalOutput::Durable { .. }
            | WalOutput::ReadDone { .. }
            | WalOutput::Latched { .. }
            | WalOutput::Warning(_)) => Err(other),
        }
    }

    fn io_done(request: IoRequest, completion: IoCompletion) -> WalInput {
        WalInput::IoDone {
            request,
            completion,
        }
    }

    fn tick() -> Option<WalInput> {
        Some(WalInput::Tick)
    }
}

/// Opens the WAL over `disk`: lists the directory, feeds every segment to [`WalRecovery`] and returns
/// what it returns. The actor's repair request is its first output: run it before relying on the WAL.
pub fn open_wal(disk: &dyn Disk, config: WalConfig, checkpoint: Seq) -> Result<Opened, OpenError> {
    let dir = config.dir.clone();
    let mut recovery = WalRecovery::new(config, checkpoint)?;
    let names = disk.list(&dir).map_err(|fault| OpenError::Io {
        path: dir.clone(),
        fault,
    })?;
    for name in recovery.plan(&names) {
        let path = join(&dir, &name);
        let read = disk
            .len(&path)
            .and_then(|len| disk.read_at(&path, 0, len as usize));
        let bytes = read.map_err(|fault| OpenError::Io { path, fault })?;
        recovery.feed_segment(&name, bytes)?;
    }
    recovery.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actor::Actor;
    use crate::disk::sim::SimDisk;
    use crate::disk::IoLane;
    use crate::disk::IoOp;
    use crate::time::Instant;
    use crate::wal::{AppendId, WalLanes};

    fn config() -> WalConfig {
        WalConfig {
            dir: "wal".into(),
            segment_bytes_max: 4096,
            record_bytes_max: 100,
            lanes: WalLanes::default(),
            ..WalConfig::default()
        }
    }

    #[test]
    fn run_op_runs_one_op_at_a_time_and_feeds_the_completion_after_the_last() {
        let disk = SimDisk::new(1);
        let opened = open_wal(&disk, config(), Seq(0)).unwrap();
        let mut driver = SyncDriver::new(&disk, opened.wal, Instant::ZERO);
        driver.run_until_idle();
        driver.take_outputs();
        driver.handle(WalInput::Append {
            id: AppendId(1),
            record: b"abc".to_vec(),
        });
        let lane = IoLane(0);
        assert!(matches!(
            driver.head(lane).unwrap().ops[0],
            IoOp::WriteAt { .. }
        ));
        assert!(driver.run_op(lane), "the write");
        assert_eq!(
            driver.take_outputs(),
            vec![],
            "no answer between the write and the sync"
        );
        assert_eq!(
            disk.durable_image("wal/00000000000000000000.wal"),
            Some(Vec::new())
        );
        assert!(driver.run_op(lane), "the sync");
        assert_eq!(
            driver.take_outputs().len(),
            2,
            "the ack and the durable frontier"
        );
        assert!(!driver.run_op(lane), "the lane is idle");
        assert_eq!(
            disk.durable_image("wal/00000000000000000000.wal")
                .unwrap()
                .len(),
            23
        );
    }

    #[test]
    fn advance_to_feeds_a_tick_only_once_the_timeout_has_passed() {
        let disk = SimDisk::new(2);
        let opened = open_wal(&disk, config(), Seq(0)).unwrap();
        let mut driver = SyncDriver::new(&disk, opened.wal, Instant::ZERO);
        driver.handle(WalInput::Append {
            id: AppendId(1),
            record: b"abc".to_vec(),
        });
        // The repair is still queued: the record waits, and the backstop is armed 10 ms out.
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(10))
        );
        driver.advance_to(Instant::from_millis(9));
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(10))
        );
        driver.advance_to(Instant::from_millis(10));
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(20)),
            "re-armed"
        );
        assert_eq!(
            driver.pending_requests(),
            1,
            "the tick cannot pass the repair"
        );
    }
}
