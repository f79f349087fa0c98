//! Narad's core: the pure state machines of the produce path and the formats they read and write.
//!
//! Nothing in this crate performs I/O, reads a clock or draws ambient randomness. Every actor follows
//! the sans-IO pattern of [`actor::Actor`]: the driver feeds events with the current [`time::Instant`],
//! drains commands with `poll_output`, executes them (disk, network) and feeds the results back as events.
//! The same actors run under the real node (tokio, real files) and under the simulator (madsim, a
//! simulated disk that tears writes and fails fsyncs).

pub mod actor;
pub mod checkpoint;
pub mod codec;
pub mod disk;
pub mod dispatcher;
pub mod error;
pub mod ids;
pub mod metastore;
pub mod partition;
pub mod planted;
pub mod routing;
pub mod time;
pub mod wal;

pub use actor::Actor;
pub use error::IoFault;
pub use ids::{NodeId, Offset, PartitionId, Seq, TopicId};
pub use time::Instant;
