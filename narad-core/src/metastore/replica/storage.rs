//! raft's view of the log: raft-rs's `MemStorage` with the last snapshot's data beside it.
//!
//! `MemStorage::snapshot` returns a snapshot without data, labelled with the commit index (raft-rs notes
//! this is wrong under async persist), so a leader would ship an empty state to a follower behind its
//! first index. [`ReplicaStorage`] answers `snapshot` with the last snapshot the replica took or
//! received, data included, and delegates everything else to `MemStorage`.

use raft::eraftpb::{Entry, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// The replica's raft storage; see the module documentation.
#[derive(Clone, Default)]
pub(super) struct ReplicaStorage {
    /// The entries, hard state and conf state raft reads.
    pub(super) memory: MemStorage,
    /// The last snapshot taken or received, with its data (index 0: none yet).
    pub(super) snapshot: Snapshot,
}

impl ReplicaStorage {
    /// The entries above `index` through the last one.
    pub(super) fn entries_above(&self, index: u64) -> Vec<Entry> {
        let last = self
            .memory
            .last_index()
            .expect("memory storage always has a last index");
        if last <= index {
            return Vec::new();
        }
        self.memory
            .entries(index + 1, last + 1, None, GetEntriesContext::empty(false))
            .expect("the entries above the last snapshot are in memory")
    }
}

impl Storage for ReplicaStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.memory.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.memory.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.memory.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.memory.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.memory.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let index = self.snapshot.get_metadata().index;
        if index == 0 || index < request_index {
            // raft asks again later; by then a compaction may have made one.
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}
