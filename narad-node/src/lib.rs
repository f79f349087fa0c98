//! The Narad node: drivers that host `narad-core`'s actors over real files (and, under `--cfg madsim`,
//! over the simulator's disk and network).

pub mod failpoints;
pub mod fs_disk;
pub mod io;
pub mod wal_host;
