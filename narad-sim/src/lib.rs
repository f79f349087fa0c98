//! `narad-sim`: the deterministic simulator that proves "no 202 is ever lost".
//!
//! A run is a scenario file ([`scenario`]) and a seed. Under `--cfg madsim` (`runner`) the node runs
//! in a madsim node on a [`narad_core::disk::sim::SimDisk`]; simulated clients produce records with
//! unique ids ([`payload`]) and a [`ledger::Ledger`] outside the node records every attempt and its
//! outcome; a fault schedule ([`schedule`]) crashes, pauses and slows the node and fails its disk during
//! the safety phase; then faults heal, and after the liveness deadline (and a final crash) the ledger
//! reads every partition and judges lost, unseen, phantom and misplaced records. Sweeps ([`sweep`]) run
//! many seeds in parallel threads, `shrink` ([`shrink`]) delta-debugs a failing schedule.
//!
//! The node plugs in through [`seam::SimNode`]; the simulator runs the real node ([`node_narad`]).
//! The harness's own tests also run `model_node` (compiled for tests only): a deliberately minimal
//! stand-in, a self-test of the harness and not the product, on which they show that a run passes,
//! that every failure category is caught and that a seed replays.
//!
//! Everything except `runner` and the parallel part of [`sweep`] compiles without madsim, so the
//! checker, the scenario parser, the schedule generator and the shrinker are unit-tested by the
//! workspace's ordinary `cargo test`.

#![forbid(unsafe_code)]

pub mod fault;
pub mod ledger;
#[cfg(test)]
#[cfg_attr(not(madsim), allow(dead_code))]
// run by the runner's tests (madsim only); unit-tested everywhere
mod model_node;
pub mod node_narad;
pub mod outcome;
pub mod payload;
#[cfg(madsim)]
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod seam;
pub mod shrink;
pub mod sweep;
pub mod timeline;
pub mod trace;
