//! The Narad node: drivers that host `narad-core`'s actors over real files (and, under `--cfg madsim`,
//! over the simulator's disk and network).

pub mod cli;
pub mod clock;
pub mod config;
pub mod metastore;
