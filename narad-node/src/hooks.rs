//! What a test or the simulator plugs into a node ([`NodeHooks`]): read by every host the node
//! starts, so it lives below all of them rather than in the node that assembles them.

use std::sync::Arc;

use narad_core::planted::Plant;

use crate::observer::Observer;

/// What a test or the simulator plugs into a node: an observer, smaller files, a planted bug.
#[derive(Clone, Debug, Default)]
pub struct NodeHooks {
    /// Where hosts report events and broken invariants ([`Observer::none`] in production).
    pub observer: Observer,
    /// File sizes overriding production's, so rolls, rotations and compaction happen within seconds.
    pub sizes: StorageSizes,
    /// The bug planted in every actor's configuration (only the simulator can plant one).
    pub plant: Plant,
    /// The metastore's hold failpoint ([`crate::metastore::MetastoreOptions::hold_file`]).
    pub metastore_hold_file: Option<std::path::PathBuf>,
    /// The same hold as a flag ([`crate::metastore::MetastoreOptions::hold_flag`]; the simulator's lag fault).
    pub metastore_hold_flag: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Act, as a partition owner, as a release from before the incarnation section: a commit that
    /// carries one is refused as trailing data (the simulator's legacy-owner scenario).
    pub legacy_owner: bool,
}

/// File sizes overriding production's; `None` keeps the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageSizes {
    /// The ingress WAL's segment size (its largest record and its rotation size follow: half of it).
    pub wal_segment_bytes_max: Option<u64>,
    /// A partition log's segment size.
    pub partition_segment_bytes_max: Option<u64>,
    /// The owner journal's segment size (trims, partition syncs and replays then happen often).
    pub journal_segment_bytes_max: Option<u64>,
}
