//! The metastore host: the replicated topic metadata of `narad_core::metastore`, kept by raft-rs and
//! persisted under `<data>/metastore/` through the `Disk` seam.
//!
//! - [`storage`]: the durable raft log, hard state and snapshot over `narad_core::disk::Disk`.
//! - [`Metastore`]: the host task and its handle (propose and await the applied answer; read the local
//!   replica).

mod host;
mod slog_bridge;
pub mod storage;

pub use host::{
    DeliveryReports, MetaPeers, MetaView, Metastore, MetastoreOptions, ProposeError,
    ELECTION_TICKS, HEARTBEAT_TICKS, PROPOSALS_QUEUED_MAX, PROPOSE_TIMEOUT, SNAPSHOT_EVERY_ENTRIES,
    TICK,
};
