//! The partition actors' side of the synchronous driver: [`PartitionLog`] and [`Combiner`] plug into
//! [`crate::disk::driver`].

use super::combiner::{Combiner, CombinerInput, CombinerOutput};
use super::log::{LogInput, LogOutput, PartitionLog};
use crate::disk::{IoCompletion, IoRequest};

pub use crate::disk::driver::{
    is_read, run_request, run_to_idle, Crashed, HookVerdict, IoActor, IoHook, NoHook,
};

impl IoActor for PartitionLog {
    fn into_io(output: LogOutput) -> Result<IoRequest, LogOutput> {
        match output {
            LogOutput::Io(request) => Ok(request),
            other @ (LogOutput::Opened(_)
            | LogOutput::OpenFailed(_)
            | LogOutput::CommitDone { .. }
            | LogOutput::ReadDone { .. }
            | LogOutput::Latched(_)
            | LogOutput::Journal { .. }
            | LogOutput::Synced { .. }
            | LogOutput::SyncFailed(_)
            | LogOutput::SyncDeferred
            | LogOutput::Retained(_)
            | LogOutput::RetentionFailed(_)) => Err(other),
        }
    }

    fn io_done(_request: IoRequest, completion: IoCompletion) -> LogInput {
        LogInput::Io(completion)
    }

    fn tick() -> Option<LogInput> {
        None
    }
}

impl IoActor for Combiner {
    fn into_io(output: CombinerOutput) -> Result<IoRequest, CombinerOutput> {
        match output {
            CombinerOutput::Io(request) => Ok(request),
            other @ (CombinerOutput::Committed { .. }
            | CombinerOutput::ReadDone { .. }
            | CombinerOutput::HighWatermark { .. }
            | CombinerOutput::LogOpened { .. }
            | CombinerOutput::LogOpenFailed { .. }
            | CombinerOutput::LogLatched { .. }
            | CombinerOutput::LogRetired { .. }
            | CombinerOutput::Journal { .. }
            | CombinerOutput::Synced { .. }
            | CombinerOutput::SyncFailed { .. }
            | CombinerOutput::SyncDeferred
            | CombinerOutput::Retained(_)
            | CombinerOutput::RetentionFailed(_)) => Err(other),
        }
    }

    fn io_done(_request: IoRequest, completion: IoCompletion) -> CombinerInput {
        CombinerInput::Io(completion)
    }

    fn tick() -> Option<CombinerInput> {
        None
    }
}
