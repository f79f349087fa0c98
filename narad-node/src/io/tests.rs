#[cfg(not(madsim))]
use std::sync::Barrier;
#[cfg(not(madsim))]
use std::time::Duration;

use narad_core::disk::sim::SimDisk;
use narad_core::disk::{DiskLayer, IoId, IoOp, IoReply};
use narad_core::IoFault;

use super::*;

fn write(id: u64, lane: u8, path: &str, offset: u64, data: &[u8]) -> IoRequest {
    IoRequest {
        id: IoId(id),
        lane: IoLane(lane),
        ops: vec![IoOp::WriteAt {
            path: path.into(),
            offset,
            data: data.to_vec(),
        }],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lane_runs_in_order_and_completes_in_order() {
    let disk = SimDisk::new(1);
    disk.create("f").unwrap();
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(Arc::new(disk.clone()), sender, |_, completion| completion);
    for index in 0..40u64 {
        // Each write overwrites the same byte: only in-order execution leaves the last value.
        executor.submit(write(index, 0, "f", 0, &[index as u8]));
    }
    for index in 0..40u64 {
        let completion = receiver.recv().await.unwrap();
        assert_eq!(completion.id, IoId(index));
        assert_eq!(completion.result, Ok(vec![IoReply::Done]));
    }
    assert_eq!(disk.read_at("f", 0, 1).unwrap(), [39]);
}

/// A disk whose writes to two files must meet at a barrier: it deadlocks unless they run at once.
#[cfg(not(madsim))]
struct MeetingDisk {
    inner: SimDisk,
    barrier: Barrier,
}

#[cfg(not(madsim))]
impl DiskLayer for MeetingDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        self.barrier.wait();
        self.inner.write_at(path, offset, data)
    }
}

// Under madsim `spawn_blocking` runs inline on the one simulated thread: lanes interleave between
// requests but never run at the same instant, so this meeting would deadlock there.
#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_lanes_run_concurrently() {
    let inner = SimDisk::new(2);
    inner.create("a").unwrap();
    inner.create("b").unwrap();
    let disk = MeetingDisk {
        inner,
        barrier: Barrier::new(2),
    };
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(Arc::new(disk), sender, |_, completion| completion);
    executor.submit(write(1, 0, "a", 0, b"x"));
    executor.submit(write(2, 1, "b", 0, b"y"));
    let both = async {
        let mut ids = vec![
            receiver.recv().await.unwrap().id,
            receiver.recv().await.unwrap().id,
        ];
        ids.sort();
        ids
    };
    let ids = tokio::time::timeout(Duration::from_secs(10), both)
        .await
        .expect("lanes 0 and 1 must run at the same time");
    assert_eq!(ids, [IoId(1), IoId(2)]);
}

/// A disk whose writes note the name of the thread running them, wait for a gate, and panic on the
/// path "boom".
#[cfg(not(madsim))]
struct ThreadNotingDisk {
    inner: SimDisk,
    threads: Mutex<Vec<String>>,
    gate: Mutex<()>,
}

#[cfg(not(madsim))]
impl DiskLayer for ThreadNotingDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push(name);
        drop(
            self.gate
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        assert_ne!(path, "boom", "a disk bug");
        self.inner.write_at(path, offset, data)
    }
}

#[cfg(not(madsim))]
fn thread_noting_disk() -> Arc<ThreadNotingDisk> {
    let inner = SimDisk::new(6);
    inner.create("f").unwrap();
    Arc::new(ThreadNotingDisk {
        inner,
        threads: Mutex::new(Vec::new()),
        gate: Mutex::new(()),
    })
}

/// Writes to the path "slow" wait until the test lets them go; every other op runs at once.
#[cfg(not(madsim))]
struct SlowPathDisk {
    inner: SimDisk,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
}

#[cfg(not(madsim))]
impl DiskLayer for SlowPathDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        if path == "slow" {
            let release = self.release.lock().unwrap();
            release.recv().unwrap();
        }
        self.inner.write_at(path, offset, data)
    }
}

#[cfg(not(madsim))]
fn slow_path_disk() -> (Arc<SlowPathDisk>, std::sync::mpsc::Sender<()>) {
    let inner = SimDisk::new(7);
    inner.create("slow").unwrap();
    inner.create("f").unwrap();
    let (release, releases) = std::sync::mpsc::channel();
    let disk = SlowPathDisk {
        inner,
        release: Mutex::new(releases),
    };
    (Arc::new(disk), release)
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_other_lanes_while_one_waits_on_its_disk() {
    let (disk, release) = slow_path_disk();
    let (sender, mut receiver) = mpsc::channel(64);
    let executor = IoExecutor::new_keyed(disk, sender, |actor, _, done: IoCompletion| {
        (actor, done.id)
    });
    executor.submit_for(ActorKey(1), write(1, 0, "slow", 0, b"s"));
    // Same lane: it waits behind the slow write.
    executor.submit_for(ActorKey(1), write(2, 0, "f", 0, b"a"));
    for index in 0..20 {
        executor.submit_for(ActorKey(2 + index), write(10 + index, 0, "f", 1, b"b"));
    }
    for _ in 0..20 {
        let (actor, _) = receiver.recv().await.unwrap();
        assert_ne!(
            actor,
            ActorKey(1),
            "a lane ran ahead of its earlier request"
        );
    }
    release.send(()).unwrap();
    assert_eq!(receiver.recv().await.unwrap(), (ActorKey(1), IoId(1)));
    assert_eq!(receiver.recv().await.unwrap(), (ActorKey(1), IoId(2)));
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "holds 64 requests")]
async fn a_pool_lane_refuses_the_request_past_its_bound() {
    let (disk, release) = slow_path_disk();
    let (sender, _receiver) = mpsc::channel(256);
    let executor = IoExecutor::new_keyed(disk, sender, |_, _, done: IoCompletion| done);
    // The first request runs and waits: 64 are held, queued or running.
    for index in 0..LANE_QUEUE_MAX as u64 {
        executor.submit_for(ActorKey(1), write(index, 0, "slow", 0, b"x"));
    }
    // Another instance's lane is not full.
    executor.submit_for(ActorKey(2), write(98, 0, "f", 0, b"x"));
    executor.submit_for(ActorKey(1), write(99, 0, "slow", 0, b"x"));
    drop(release);
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_actor_executor_runs_each_lane_on_a_thread_of_its_own_and_a_keyed_one_on_the_pool() {
    let disk = thread_noting_disk();
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(disk.clone(), sender, |_, completion| completion);
    executor.submit(write(1, 0, "f", 0, b"a"));
    executor.submit(write(2, 3, "f", 1, b"b"));
    executor.submit(write(3, 0, "f", 2, b"c"));
    for _ in 0..3 {
        assert!(receiver.recv().await.unwrap().result.is_ok());
    }
    let mut threads = disk.threads.lock().unwrap().clone();
    threads.sort();
    assert_eq!(
        threads,
        ["narad-io-lane0", "narad-io-lane0", "narad-io-lane3"]
    );
    let keyed_disk = thread_noting_disk();
    let (sender, mut receiver) = mpsc::channel(8);
    let keyed = IoExecutor::new_keyed(keyed_disk.clone(), sender, |_, _, done| done);
    keyed.submit_for(ActorKey(1), write(4, 0, "f", 0, b"d"));
    assert!(receiver.recv().await.unwrap().result.is_ok());
    let threads = keyed_disk.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 1);
    assert!(
        !threads[0].starts_with("narad-io-lane"),
        "a partition holds no thread of its own: {threads:?}"
    );
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "holds 64 requests")]
async fn a_lane_thread_refuses_the_request_past_its_bound() {
    let disk = thread_noting_disk();
    let closed = disk.gate.lock().unwrap();
    let (sender, _receiver) = mpsc::channel(256);
    let executor = IoExecutor::new(disk.clone(), sender, |_, completion| completion);
    // The first request runs and waits at the gate: 64 are held, queued or running.
    for index in 0..LANE_QUEUE_MAX as u64 {
        executor.submit(write(index, 0, "f", 0, b"x"));
    }
    executor.submit(write(99, 0, "f", 0, b"x"));
    drop(closed);
}

#[cfg(not(madsim))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_disk_is_answered_with_a_failure_and_the_lane_goes_on() {
    let disk = thread_noting_disk();
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(disk, sender, |_, completion| completion);
    executor.submit(write(1, 0, "boom", 0, b"x"));
    executor.submit(write(2, 0, "f", 0, b"y"));
    assert_eq!(
        receiver.recv().await.unwrap(),
        IoCompletion {
            id: IoId(1),
            result: Err((0, IoFault::Other("I/O worker failed: panicked".to_string())))
        }
    );
    assert_eq!(
        receiver.recv().await.unwrap().result,
        Ok(vec![IoReply::Done])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_op_stops_its_request_and_is_reported_with_its_index() {
    let disk = SimDisk::new(3);
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(Arc::new(disk.clone()), sender, |_, completion| completion);
    executor.submit(IoRequest {
        id: IoId(7),
        lane: IoLane(0),
        ops: vec![
            IoOp::Create { path: "f".into() },
            IoOp::WriteAt {
                path: "missing".into(),
                offset: 0,
                data: b"x".to_vec(),
            },
            IoOp::Remove { path: "f".into() },
        ],
    });
    let completion = receiver.recv().await.unwrap();
    assert_eq!(completion.id, IoId(7));
    assert_eq!(completion.result, Err((1, IoFault::NotFound)));
    assert_eq!(disk.paths(), ["f"], "the op after the failure did not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_lanes_serialize_per_instance_and_name_the_instance() {
    let disk = SimDisk::new(5);
    disk.create("a").unwrap();
    disk.create("b").unwrap();
    let (sender, mut receiver) = mpsc::channel(64);
    let executor = IoExecutor::new_keyed(Arc::new(disk.clone()), sender, |actor, _, done| {
        (actor, done.id)
    });
    // The same lane number of two instances: two ordering domains, each in submission order.
    for index in 0..10u64 {
        executor.submit_for(ActorKey(1), write(index, 0, "a", 0, &[index as u8]));
        executor.submit_for(ActorKey(2), write(100 + index, 0, "b", 0, &[index as u8]));
    }
    let mut seen: BTreeMap<ActorKey, Vec<u64>> = BTreeMap::new();
    for _ in 0..20 {
        let (actor, id) = receiver.recv().await.unwrap();
        seen.entry(actor).or_default().push(id.0);
    }
    assert_eq!(seen[&ActorKey(1)], (0..10).collect::<Vec<_>>());
    assert_eq!(seen[&ActorKey(2)], (100..110).collect::<Vec<_>>());
    #[cfg(madsim)]
    {
        assert_eq!(executor.lanes(), 2);
        executor.forget(ActorKey(1));
        assert_eq!(executor.lanes(), 1);
    }
    // The worker pool lets go of a lane once its last request was delivered.
    #[cfg(not(madsim))]
    {
        let mut waits = 0;
        while executor.lanes() > 0 && waits < 1000 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            waits += 1;
        }
        assert_eq!(executor.lanes(), 0);
    }
    assert_eq!(disk.read_at("a", 0, 1).unwrap(), [9]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_wrapped_into_the_mailbox_type() {
    #[derive(Debug, PartialEq)]
    enum Event {
        Io(IoCompletion),
    }
    let disk = SimDisk::new(4);
    let (sender, mut receiver) = mpsc::channel(8);
    let executor = IoExecutor::new(Arc::new(disk), sender, |_, completion| {
        Event::Io(completion)
    });
    executor.submit(IoRequest {
        id: IoId(1),
        lane: IoLane(3),
        ops: vec![IoOp::List { dir: String::new() }],
    });
    assert_eq!(
        receiver.recv().await.unwrap(),
        Event::Io(IoCompletion {
            id: IoId(1),
            result: Ok(vec![IoReply::Names(Vec::new())])
        })
    );
}
