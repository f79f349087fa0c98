//! Segment preparation (`storage.ingress_wal_prealloc`): the spare `next-segment.prep`, made off the
//! append path on its own lane.

use super::{IngressWal, Pending, Prep, WalOutput, WalWarning};
use crate::codec::wal::encode_prep_trailer;
use crate::disk::{IoOp, IoReply};
use crate::error::IoFault;
use crate::ids::Seq;

impl IngressWal {
    /// Starts preparing the spare once the tail segment is half full, unless one exists or is being
    /// made, or the attempt for this tail already failed.
    pub(super) fn maybe_prepare(&mut self) {
        if !self.config.prealloc
            || self.latched.is_some()
            || self.prep != Prep::Idle
            || self.prep_failed_for == Some(self.tail.first)
            || self.tail.end.saturating_mul(2) < self.tail.limit
        {
            return;
        }
        let path = self.config.prep_path();
        let write_limit = self.config.prepared_write_limit();
        let ops = vec![
            IoOp::Create { path: path.clone() },
            IoOp::WriteZeros {
                path: path.clone(),
                offset: 0,
                len: write_limit,
            },
            IoOp::WriteAt {
                path: path.clone(),
                offset: write_limit,
                data: encode_prep_trailer(write_limit).to_vec(),
            },
            IoOp::SyncData { path },
        ];
        self.prep = Prep::Preparing;
        let lane = self.config.lanes.prepare;
        let tail = self.tail.first;
        self.emit_io(lane, ops, Pending::Prepare { tail });
    }

    pub(super) fn on_prepare_done(
        &mut self,
        tail: Seq,
        result: Result<Vec<IoReply>, (usize, IoFault)>,
    ) {
        assert_eq!(self.prep, Prep::Preparing);
        match result {
            Ok(_) => self.prep = Prep::Ready,
            Err((_, fault)) => {
                // Not a WAL failure: the append path never depended on the spare. Remove the remains
                // and let the next roll create an empty segment.
                self.outputs
                    .push_back(WalOutput::Warning(WalWarning::PrepareFailed { fault }));
                self.prep_failed_for = Some(tail);
                self.prep = Prep::Cleaning;
                let ops = vec![IoOp::Remove {
                    path: self.config.prep_path(),
                }];
                let lane = self.config.lanes.prepare;
                self.emit_io(lane, ops, Pending::PrepareCleanup);
            }
        }
    }

    pub(super) fn on_prepare_cleanup_done(&mut self) {
        assert_eq!(self.prep, Prep::Cleaning);
        // Whatever the outcome (the file may never have been created), the name is free again: the
        // next preparation truncates it.
        self.prep = Prep::Idle;
        self.maybe_prepare();
    }
}
