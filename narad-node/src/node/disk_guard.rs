//! The disk guard: produces answer 507 while the data directory's file system is short of space.
//!
//! # Contract
//! A task samples [`Disk::space`] of the node's disk every [`SAMPLE_INTERVAL`] (tokio's clock, the one
//! [`crate::clock::Clock`] reads: madsim's virtual time under the simulator). [`DiskGuard`] decides:
//! active while fewer bytes are available than the floor (`storage.min_free_bytes`, or
//! [`crate::config::min_free_bytes_default`] of the file system's size), inactive again as soon as a
//! sample finds at least the floor. No latch and no restart: space that retention or an operator frees
//! lets produces in by itself, within one interval. While active the app's flag makes produce and
//! batch produce answer 507 before touching the WAL; nothing else changes (`/readyz` stays 200, the
//! dispatcher and the owners keep committing what was accepted, which is how retention frees space).
//!
//! A sample that fails leaves the decision as it was (a guard that cannot see the disk neither starts
//! nor stops refusing) and is logged once per run of failures.
//!
//! # Metrics
//! `narad_disk_guard_active` (0/1) and `narad_data_dir_available_bytes` follow every sample;
//! `narad_data_dir_size_bytes` (the bytes of the files under the data directory) comes from a walk of
//! the tree at most every [`SIZE_INTERVAL`], on the blocking pool (inline under the simulator, whose
//! disk counts its bytes), one walk at a time.
//!
//! The task holds the app's flag weakly and ends once the app is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use narad_core::disk::{Disk, DiskSpace};

use crate::config::StorageConfig;
use crate::http::App;
use crate::metrics::Metrics;

/// How often the guard samples the file system's free space.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(250);
/// Shortest time between two walks measuring the data directory's size.
pub const SIZE_INTERVAL: Duration = Duration::from_secs(10);

/// The guard's decision, sample by sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskGuard {
    /// `storage.min_free_bytes`; `None`: the default of the file system's size.
    min_free_bytes: Option<u64>,
    active: bool,
}

/// A change of the guard's decision, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum GuardChange {
    /// Less than `min_free_bytes` is available: produces answer 507 from now on.
    Activated {
        /// Bytes available at the sample.
        available_bytes: u64,
        /// The floor.
        min_free_bytes: u64,
    },
    /// At least `min_free_bytes` is available again: produces are taken again.
    Cleared {
        /// Bytes available at the sample.
        available_bytes: u64,
        /// The floor.
        min_free_bytes: u64,
    },
}

impl DiskGuard {
    /// An inactive guard with the node's storage settings.
    pub fn new(storage: &StorageConfig) -> DiskGuard {
        DiskGuard {
            min_free_bytes: storage.min_free_bytes,
            active: false,
        }
    }

    /// Whether produces are refused.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The floor on a file system of `total_bytes`.
    pub fn min_free_bytes(&self, total_bytes: u64) -> u64 {
        StorageConfig {
            min_free_bytes: self.min_free_bytes,
            ..StorageConfig::default()
        }
        .min_free_bytes_for(total_bytes)
    }

    /// Takes one sample; the change it made, if any.
    pub fn on_sample(&mut self, space: DiskSpace) -> Option<GuardChange> {
        let min_free_bytes = self.min_free_bytes(space.total_bytes);
        let available_bytes = space.available_bytes;
        let active = available_bytes < min_free_bytes;
        if active == self.active {
            return None;
        }
        self.active = active;
        Some(if active {
            GuardChange::Activated {
                available_bytes,
                min_free_bytes,
            }
        } else {
            GuardChange::Cleared {
                available_bytes,
                min_free_bytes,
            }
        })
    }
}

/// Starts the guard's task over `disk`, setting the app's free-space flag
/// ([`App::insufficient_storage_flag`]) while it is active, and its metrics; see the module doc.
pub fn spawn(disk: Arc<dyn Disk>, app: &App, storage: &StorageConfig) {
    let guard = DiskGuard::new(storage);
    let flag = app.insufficient_storage_flag();
    let metrics = app.metrics.clone();
    tokio::spawn(run(
        disk,
        flag,
        metrics,
        guard,
        SAMPLE_INTERVAL,
        SIZE_INTERVAL,
    ));
}

async fn run(
    disk: Arc<dyn Disk>,
    flag: Weak<AtomicBool>,
    metrics: Arc<Metrics>,
    mut guard: DiskGuard,
    sample_interval: Duration,
    size_interval: Duration,
) {
    let mut interval = tokio::time::interval(sample_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let walking = Arc::new(AtomicBool::new(false));
    let mut next_walk = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        interval.tick().await;
        let Some(active) = flag.upgrade() else { return };
        match disk.space() {
            Ok(space) => {
                failing = false;
                log_change(guard.on_sample(space));
                active.store(guard.is_active(), Ordering::Release);
                metrics.disk_guard_active.set(i64::from(guard.is_active()));
                metrics
                    .data_dir_available_bytes
                    .set(i64::try_from(space.available_bytes).unwrap_or(i64::MAX));
            }
            Err(fault) => {
                if !failing {
                    tracing::warn!(%fault, "disk guard cannot read the data directory's free space");
                }
                failing = true;
            }
        }
        drop(active);
        let now = tokio::time::Instant::now();
        if now >= next_walk && !walking.swap(true, Ordering::AcqRel) {
            next_walk = now + size_interval;
            measure_size(
                Arc::clone(&disk),
                Arc::clone(&metrics),
                Arc::clone(&walking),
            );
        }
    }
}

fn log_change(change: Option<GuardChange>) {
    match change {
        Some(GuardChange::Activated {
            available_bytes,
            min_free_bytes,
        }) => tracing::warn!(
            available_bytes,
            min_free_bytes,
            "data directory short of free space: produces answer 507 until there is enough again"
        ),
        Some(GuardChange::Cleared {
            available_bytes,
            min_free_bytes,
        }) => tracing::info!(
            available_bytes,
            min_free_bytes,
            "data directory has free space again: produces are taken"
        ),
        None => {}
    }
}

/// Walks the data directory and sets `narad_data_dir_size_bytes`, then lowers `walking`.
fn measure_size(disk: Arc<dyn Disk>, metrics: Arc<Metrics>, walking: Arc<AtomicBool>) {
    let walk = move || {
        match disk.root_size_bytes() {
            Ok(bytes) => metrics
                .data_dir_size_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX)),
            Err(fault) => {
                tracing::debug!(%fault, "data directory size not measured");
                0
            }
        };
        walking.store(false, Ordering::Release);
    };
    #[cfg(madsim)]
    walk();
    #[cfg(not(madsim))]
    drop(tokio::task::spawn_blocking(walk));
}

#[cfg(test)]
mod tests {
    use narad_core::disk::sim::SimDisk;

    use super::*;

    fn space(available_bytes: u64, total_bytes: u64) -> DiskSpace {
        DiskSpace {
            available_bytes,
            total_bytes,
        }
    }

    #[test]
    fn the_guard_holds_below_the_floor_and_lets_go_at_it_with_no_latch() {
        let mut guard = DiskGuard::new(&StorageConfig {
            min_free_bytes: Some(1_000),
            ..StorageConfig::default()
        });
        assert_eq!(guard.on_sample(space(5_000, 1 << 40)), None);
        assert_eq!(
            guard.on_sample(space(999, 1 << 40)),
            Some(GuardChange::Activated {
                available_bytes: 999,
                min_free_bytes: 1_000
            })
        );
        assert!(guard.is_active());
        assert_eq!(guard.on_sample(space(10, 1 << 40)), None);
        assert_eq!(
            guard.on_sample(space(1_000, 1 << 40)),
            Some(GuardChange::Cleared {
                available_bytes: 1_000,
                min_free_bytes: 1_000
            })
        );
        assert!(!guard.is_active());
        // And again: nothing latches.
        assert!(guard.on_sample(space(0, 1 << 40)).is_some());
        assert!(guard.on_sample(space(2_000, 1 << 40)).is_some());
        // 0 turns the guard off.
        let mut off = DiskGuard::new(&StorageConfig {
            min_free_bytes: Some(0),
            ..StorageConfig::default()
        });
        assert_eq!(off.on_sample(space(0, 1 << 40)), None);
    }

    #[test]
    fn the_default_floor_is_1_gib_or_5_percent_of_the_file_system_where_less() {
        let mut guard = DiskGuard::new(&StorageConfig::default());
        let gib = 1u64 << 30;
        // A 64 MiB file system: the floor is 5%, 3,355,443 bytes.
        assert_eq!(guard.min_free_bytes(64 << 20), 3_355_443);
        assert_eq!(guard.on_sample(space(4 << 20, 64 << 20)), None);
        assert!(guard.on_sample(space(3 << 20, 64 << 20)).is_some());
        // A 1 TiB one: 1 GiB.
        assert_eq!(guard.min_free_bytes(1 << 40), gib);
        assert!(guard.on_sample(space(gib, 1 << 40)).is_some());
        assert!(!guard.is_active());
        assert!(guard.on_sample(space(gib - 1, 1 << 40)).is_some());
        assert!(guard.is_active());
    }

    /// Waits (up to 10 s of real time) until `done` holds.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        for _ in 0..1_000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never: {what}");
    }

    #[tokio::test]
    async fn the_task_sets_and_clears_the_flag_and_the_gauges_as_space_comes_and_goes() {
        let flag = Arc::new(AtomicBool::new(false));
        let active = || flag.load(Ordering::Acquire);
        let metrics = Arc::new(Metrics::new());
        let disk = SimDisk::new(7);
        disk.set_capacity(Some(10_000));
        disk.create("filler").unwrap();
        let guard = DiskGuard::new(&StorageConfig {
            min_free_bytes: Some(4_000),
            ..StorageConfig::default()
        });
        let shared: Arc<dyn Disk> = Arc::new(disk.clone());
        let every = Duration::from_millis(5);
        let task = tokio::spawn(run(
            Arc::clone(&shared),
            Arc::downgrade(&flag),
            metrics.clone(),
            guard,
            every,
            every * 4,
        ));
        let available = || metrics.data_dir_available_bytes.get();
        eventually("a first sample", || available() == 10_000).await;
        assert!(!active());
        disk.write_at("filler", 0, &[1; 6_001]).unwrap();
        eventually("the guard holds", active).await;
        assert_eq!(metrics.disk_guard_active.get(), 1);
        assert_eq!(available(), 3_999);
        // Space comes back (retention deleted a segment): produces are taken again, by themselves.
        disk.set_len("filler", 6_000).unwrap();
        eventually("the guard lets go", || !active()).await;
        assert_eq!(metrics.disk_guard_active.get(), 0);
        eventually("the size is measured", || {
            metrics.data_dir_size_bytes.get() == 6_000
        })
        .await;
        // The task ends with the flag, letting the disk go.
        drop(flag);
        task.await.unwrap();
        eventually("the last walk let the disk go", || {
            Arc::strong_count(&shared) == 1
        })
        .await;
    }

    #[tokio::test]
    async fn a_node_refuses_produces_with_507_while_its_disk_is_short_and_takes_them_again() {
        use crate::http::{ops, produce, Body};
        use crate::node::{start, NodeOptions};

        let disk = SimDisk::new(3);
        let mut config = crate::config::Config::default();
        config.storage.min_free_bytes = Some(8 << 20);
        let node = start(NodeOptions {
            disk: Arc::new(disk.clone()),
            config,
            clock: crate::clock::Clock::start(),
            seed: 3,
            member_addr: "127.0.0.1:7942".to_string(),
            hooks: crate::hooks::NodeHooks::default(),
            cluster: None,
        })
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(30), node.wait_ready())
            .await
            .expect("ready in time")
            .unwrap();
        let app = node.app();
        let created = crate::http::topics::create_topic(
            app,
            &crate::http::auth::Caller::Open,
            Body::Bytes(br#"{"name":"orders"}"#.to_vec()),
        )
        .await;
        assert_eq!(created.status, 201);
        let produce = || produce::produce(app, "orders", None, Body::Bytes(b"x".to_vec()));
        assert_eq!(produce().await.status, 202);
        let wal_next = || node.wal().unwrap().durable_next_seq();
        let before = wal_next();

        // Half the floor left: room still for what the node writes on its own meanwhile (a partition
        // log's preallocated zeros), but not for the floor.
        disk.set_capacity(Some(disk.used_bytes() + (4 << 20)));
        eventually("the guard holds", || node.status().disk_guard_active).await;
        let reply = produce().await;
        assert_eq!(
            (reply.status, reply.text()),
            (507, "{\"error\":\"insufficient storage\"}\n".to_string())
        );
        assert_eq!(wal_next(), before, "nothing reached the WAL");
        assert_eq!(ops::readyz(app).status, 200);
        assert!(app
            .metrics
            .encode()
            .contains("\nnarad_disk_guard_active 1\n"));

        disk.set_capacity(None);
        eventually("the guard lets go", || !node.status().disk_guard_active).await;
        assert_eq!(produce().await.status, 202);
        assert!(wal_next() > before);
    }
}
