//! The I/O executor: runs an actor's [`IoRequest`]s on a [`Disk`] and delivers each request back with
//! its [`IoCompletion`] to the actor's mailbox (the WAL reuses the request's buffers).
//!
//! Requests of one [`IoLane`] run one at a time in submission order, and their completions are delivered
//! in that order; different lanes run concurrently. Each request runs on `tokio::task::spawn_blocking`
//! (under `--cfg madsim` op by op in the simulated task, after each op's simulated latency: see
//! [`run_request`]), serialized per lane by one async task that the first request on the lane starts.
//!
//! It decides nothing: no retries, no reordering, no dropping. Lanes are an actor *instance's* own
//! ordering domains: an executor serves one actor through [`IoExecutor::submit`], or many instances of
//! one kind (every partition's combiner) through [`IoExecutor::submit_for`], which keys the
//! serialization by `(instance, lane)` and hands the instance back with each completion; an instance
//! that is gone gives its lanes back with [`IoExecutor::forget`]. Queues are bounded by
//! [`LANE_QUEUE_MAX`]; an actor keeps far fewer requests outstanding, so a full lane is a programmer
//! error and panics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[cfg(not(madsim))]
use narad_core::disk::execute;
use narad_core::disk::{Disk, IoCompletion, IoLane, IoRequest};
#[cfg(not(madsim))]
use narad_core::IoFault;
use tokio::sync::mpsc;

/// The most requests one lane may hold queued or running.
pub const LANE_QUEUE_MAX: usize = 64;

/// Names one actor instance among those an executor serves ([`IoExecutor::submit_for`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActorKey(pub u64);

/// Wraps a finished request (and, for a keyed executor, the instance that issued it) into the
/// mailbox's message type.
enum Wrap<M> {
    Single(fn(IoRequest, IoCompletion) -> M),
    Keyed(fn(ActorKey, IoRequest, IoCompletion) -> M),
}

impl<M> Clone for Wrap<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Wrap<M> {}

/// Runs one actor's (or one kind of actor's) I/O; see the module documentation.
pub struct IoExecutor<M> {
    disk: Arc<dyn Disk>,
    mailbox: mpsc::Sender<M>,
    wrap: Wrap<M>,
    lanes: Mutex<BTreeMap<(ActorKey, IoLane), mpsc::Sender<IoRequest>>>,
}

impl<M> std::fmt::Debug for IoExecutor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoExecutor").finish_non_exhaustive()
    }
}

impl<M: Send + 'static> IoExecutor<M> {
    /// An executor over `disk` that delivers each request and its completion, wrapped by `wrap`, into `mailbox`.
    pub fn new(
        disk: Arc<dyn Disk>,
        mailbox: mpsc::Sender<M>,
        wrap: fn(IoRequest, IoCompletion) -> M,
    ) -> Self {
        IoExecutor {
            disk,
            mailbox,
            wrap: Wrap::Single(wrap),
            lanes: Mutex::new(BTreeMap::new()),
        }
    }

    /// An executor for many instances of one actor kind: each completion is delivered wrapped by
    /// `wrap` together with the [`ActorKey`] its request was submitted for.
    pub fn new_keyed(
        disk: Arc<dyn Disk>,
        mailbox: mpsc::Sender<M>,
        wrap: fn(ActorKey, IoRequest, IoCompletion) -> M,
    ) -> Self {
        IoExecutor {
            disk,
            mailbox,
            wrap: Wrap::Keyed(wrap),
            lanes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Queues `request` on its lane; never blocks. Must be called inside the runtime.
    ///
    /// Panics when the lane already holds [`LANE_QUEUE_MAX`] requests: actors bound what they keep
    /// outstanding far below that.
    pub fn submit(&self, request: IoRequest) {
        self.submit_for(ActorKey(0), request);
    }

    /// Queues `request` on the lane `(actor, request.lane)`: serialized with that instance's earlier
    /// requests on the same lane only. Panics like [`IoExecutor::submit`].
    pub fn submit_for(&self, actor: ActorKey, request: IoRequest) {
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let lane = request.lane;
        let sender = lanes.entry((actor, lane)).or_insert_with(|| {
            let (sender, receiver) = mpsc::channel(LANE_QUEUE_MAX);
            let deliver = Deliver {
                mailbox: self.mailbox.clone(),
                actor,
                wrap: self.wrap,
            };
            tokio::spawn(run_lane(Arc::clone(&self.disk), receiver, deliver));
            sender
        });
        match sender.try_send(request) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                panic!("I/O lane {lane:?} holds {LANE_QUEUE_MAX} requests: the actor exceeded its bound")
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The lane task ended because the mailbox is gone: nobody would read the completion.
            }
        }
    }

    /// Lets go of every lane of `actor`: each lane's task ends once the requests already queued on it
    /// ran and were delivered. A later [`IoExecutor::submit_for`] for the key starts fresh lanes.
    pub fn forget(&self, actor: ActorKey) {
        let mut lanes = self
            .lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lanes.retain(|(key, _), _| *key != actor);
    }

    /// Lanes currently kept (for tests and leak checks).
    pub fn lanes(&self) -> usize {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

/// Where a lane delivers its completions.
struct Deliver<M> {
    mailbox: mpsc::Sender<M>,
    actor: ActorKey,
    wrap: Wrap<M>,
}

impl<M> Deliver<M> {
    fn wrap(&self, request: IoRequest, completion: IoCompletion) -> M {
        match self.wrap {
            Wrap::Single(wrap) => wrap(request, completion),
            Wrap::Keyed(wrap) => wrap(self.actor, request, completion),
        }
    }
}

async fn run_lane<M: Send + 'static>(
    disk: Arc<dyn Disk>,
    mut requests: mpsc::Receiver<IoRequest>,
    deliver: Deliver<M>,
) {
    while let Some(request) = requests.recv().await {
        let (request, completion) = run_request(Arc::clone(&disk), request).await;
        let message = deliver.wrap(request, completion);
        if deliver.mailbox.send(message).await.is_err() {
            return;
        }
    }
}

/// Runs one request on `disk` and hands it back with its completion: on the blocking pool in a real
/// node; under `--cfg madsim` op by op in the simulated task, each after sleeping its simulated
/// [`Disk::latency`], so a crash can fall between two ops of one request and slow disks slow the node.
#[cfg(not(madsim))]
pub async fn run_request(disk: Arc<dyn Disk>, request: IoRequest) -> (IoRequest, IoCompletion) {
    let id = request.id;
    let lane = request.lane;
    let job = tokio::task::spawn_blocking(move || {
        let completion = execute(&*disk, &request);
        (request, completion)
    });
    match job.await {
        Ok(done) => done,
        // A panicking disk is a bug; still answer, so the actor sees a failure instead of waiting.
        // The request went down with the worker: an empty one with its id and lane stands in.
        Err(error) => (
            IoRequest {
                id,
                lane,
                ops: Vec::new(),
            },
            IoCompletion {
                id,
                result: Err((0, IoFault::Other(format!("I/O worker failed: {error}")))),
            },
        ),
    }
}

/// Runs one request on `disk` and hands it back with its completion: on the blocking pool in a real
/// node; under `--cfg madsim` op by op in the simulated task, each after sleeping its simulated
/// [`Disk::latency`], so a crash can fall between two ops of one request and slow disks slow the node.
#[cfg(madsim)]
pub async fn run_request(disk: Arc<dyn Disk>, request: IoRequest) -> (IoRequest, IoCompletion) {
    let mut replies = Vec::with_capacity(request.ops.len());
    for (index, op) in request.ops.iter().enumerate() {
        let latency = disk.latency(op);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match narad_core::disk::execute_op(&*disk, op) {
            Ok(reply) => replies.push(reply),
            Err(fault) => {
                let id = request.id;
                return (
                    request,
                    IoCompletion {
                        id,
                        result: Err((index, fault)),
                    },
                );
            }
        }
    }
    let id = request.id;
    (
        request,
        IoCompletion {
            id,
            result: Ok(replies),
        },
    )
}

#[cfg(test)]
mod tests {
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
        assert_eq!(executor.lanes(), 2);
        executor.forget(ActorKey(1));
        assert_eq!(executor.lanes(), 1);
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
}
