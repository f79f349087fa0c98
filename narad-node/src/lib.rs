//! The Narad node: drivers that host `narad-core`'s actors over real files (and, under `--cfg madsim`,
//! over the simulator's disk and network).
//!
//! - [`config`], [`cli`], [`logging`]: `narad serve`'s configuration and start-up.
//! - [`metastore`]: topic metadata on raft-rs, persisted through the `Disk` seam.
//! - [`http`]: the `/v1` surface as plain functions (called by the axum router, or by the simulator).
//! - [`metrics`]: every Prometheus metric of the node.
//! - [`clock`]: the node's only clock reads.
//! - [`fs_disk`], [`failpoints`], [`io`]: real files behind the `Disk` seam and the per-lane I/O executor.
//! - [`ingress`]: the ingress host (the WAL, the checkpointer and the dispatcher in one task) and
//!   the [`ingress::transport::CommitTransport`] seam its dispatcher commits through;
//!   [`accept_times`]: when each record earned its 202 (for the accept→visible histogram).
//! - [`hooks`]: what a test or the simulator plugs into a node; [`future`]: the seams' boxed future.
//! - [`host`]: the one generic host loop every actor runs on; [`mailbox`]: sending into a host's
//!   bounded mailbox.
//! - [`node`]: every host wired into one node over one disk ([`node::start`]), without HTTP; the
//!   partition (owner) host and the local commit transport live there.
//! - [`cluster`]: the QUIC transport between nodes (on madsim's network under the simulator), with
//!   the peers' authentication; [`node::peers`] serves it and carries the node's calls over it.
//! - `server` (not under madsim): wires it all to a real listener.
//! - `client` (not under madsim): `narad pub|sub|replay|topic|cluster`, the client subcommands.

#![forbid(unsafe_code)]
// Every actor output, input and phase is matched by name, so a new variant cannot slip past a host.
#![deny(clippy::wildcard_enum_match_arm)]
// Tests pick one kind of output out of many; the production build above is what the rule guards.
#![cfg_attr(test, allow(clippy::wildcard_enum_match_arm))]

pub mod accept_times;
pub mod cli;
#[cfg(not(madsim))]
pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod failpoints;
pub mod fs_disk;
pub mod future;
pub mod hooks;
pub mod host;
pub mod http;
pub mod ingress;
pub mod io;
pub mod logging;
pub mod mailbox;
pub mod metastore;
pub mod metrics;
pub mod node;
pub mod observer;
#[cfg(not(madsim))]
pub mod server;
