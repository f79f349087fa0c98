//! Unit tests of the owner: views from the replica, parked reads, retired logs removed, idle
//! combiners dropped.

use std::collections::VecDeque;

use super::*;
use crate::disk::execute;
use crate::disk::sim::SimDisk;
use crate::metastore::Command;
use crate::partition::BatchRecord;

pub(super) const HERE: NodeId = NodeId(1);

pub(super) fn create(name: &str, partitions: u32) -> Command {
    crate::metastore::create_command(name, partitions)
}

/// A replica state after `commands`, with this node (and node 2) as members.
pub(super) fn state(commands: &[Command]) -> MetaState {
    let mut state = MetaState::new();
    for node in [HERE, NodeId(2)] {
        let member = Command::AddMember {
            node,
            addr: format!("n{}", node.0),
        };
        state.apply(&member).expect("member added");
    }
    for command in commands {
        state.apply(command).expect("applied");
    }
    state
}

/// Drives an owner over a SimDisk, holding I/O until told to run it.
pub(super) struct Harness {
    pub(super) owner: Owner,
    pub(super) disk: SimDisk,
    pending: VecDeque<(LogKey, IoRequest)>,
    outputs: Vec<OwnerOutput>,
}

impl Harness {
    pub(super) fn new() -> Harness {
        let config = OwnerConfig {
            journal: None,
            node: HERE,
            combiner: CombinerConfig::new(1_700_000_000_000),
            retention_check_interval: crate::partition::owner::RETENTION_CHECK_INTERVAL_DEFAULT,
        };
        Harness {
            owner: Owner::new(config),
            disk: SimDisk::new(3),
            pending: VecDeque::new(),
            outputs: Vec::new(),
        }
    }

    pub(super) fn input(&mut self, input: OwnerInput) {
        self.owner.handle(Instant::ZERO, input);
        while let Some(output) = self.owner.poll_output() {
            match output {
                OwnerOutput::Io { key, request } => self.pending.push_back((key, request)),
                other => self.outputs.push(other),
            }
        }
    }

    pub(super) fn replica(&mut self, commands: &[Command]) {
        self.input(OwnerInput::Replica(Arc::new(state(commands))));
    }

    /// Runs the I/O requested so far, and what it leads to, until none is left.
    pub(super) fn run_all(&mut self) {
        while let Some((key, request)) = self.pending.pop_front() {
            let completion = execute(&self.disk, &request);
            self.input(OwnerInput::IoDone { key, completion });
        }
    }

    pub(super) fn take(&mut self) -> Vec<OwnerOutput> {
        std::mem::take(&mut self.outputs)
    }

    /// A read of topic "t" (created by the first command the test fed) at a partition owned here.
    fn read(&mut self, id: u64, topic_id: TopicId) {
        let partition = owned_here(&self.owner.state, "t");
        self.input(OwnerInput::Read(OwnerRead {
            id: LogReadId(id),
            topic: Arc::from("t"),
            topic_id,
            partition,
            offset: Offset(0),
            records_max: 10,
            bytes_max: 1 << 20,
        }));
    }

    pub(super) fn commit(
        &mut self,
        id: u64,
        topic_id: TopicId,
        partition: PartitionId,
        payload: &str,
    ) {
        self.input(OwnerInput::Commit {
            topic: Arc::from("t"),
            partition,
            batch: CommitBatch {
                id: BatchId(id),
                records: vec![BatchRecord {
                    topic_id: Some(topic_id),
                    key: None,
                    payload: payload.as_bytes().to_vec(),
                }],
                deadline: None,
            },
        });
    }
}

fn live_id(state: &MetaState, name: &str) -> TopicId {
    state.topic(name).expect("created").id
}

/// How many partitions of the topics `names` are assigned to this node.
fn owned_count(state: &MetaState, names: &[&str]) -> usize {
    names
        .iter()
        .map(|name| {
            let record = state.topic(name).expect("created");
            (0..record.partitions())
                .filter(|partition| record.owner_of(PartitionId(*partition)) == Some(HERE))
                .count()
        })
        .sum()
}

/// A partition of `name` assigned to this node.
pub(super) fn owned_here(state: &MetaState, name: &str) -> PartitionId {
    let record = state.topic(name).expect("created");
    (0..record.partitions())
        .map(PartitionId)
        .find(|partition| record.owner_of(*partition) == Some(HERE))
        .expect("some partition is assigned here")
}

#[test]
fn owner_view_owns_an_absent_name_and_only_the_partitions_assigned_here() {
    let state = state(&[create("t", 4)]);
    let record = state.topic("t").expect("created");
    let mut owned = Vec::new();
    for index in 0..4 {
        let view = owner_view(&state, HERE, "t", PartitionId(index));
        let here = record.owner_of(PartitionId(index)) == Some(HERE);
        // Only a partition owned here has a live log here (a peer's opens none, and one that
        // moved away lets its log go).
        assert_eq!(
            view.live,
            here.then(|| LiveTopic {
                topic_id: Some(record.id),
                log_dir: partition_dir("t", record.id, PartitionId(index)),
            })
        );
        assert_eq!(view.owned, here);
        assert!(!view.frozen);
        owned.push(view.owned);
    }
    // Two members share the partitions: some are another node's, which this one must not commit.
    assert!(owned.contains(&true) && owned.contains(&false), "{owned:?}");
    let beyond = owner_view(&state, HERE, "t", PartitionId(4));
    assert!(!beyond.owned && beyond.live.is_none());
    // An absent name: owned, so a batch for it is refused as absent, never as "not owner".
    let absent = owner_view(&state, HERE, "gone", PartitionId(0));
    assert!(absent.owned && absent.live.is_none());
    assert_eq!(
        partition_dir("t", TopicId(7), PartitionId(3)),
        "topics/t/7/p00003"
    );
}

#[test]
fn every_partition_owned_here_gets_a_log_that_opens_and_a_peer_s_none() {
    let mut h = Harness::new();
    let commands = [create("t", 3), create("u", 3)];
    h.replica(&commands);
    let here = owned_count(&state(&commands), &["t", "u"]);
    assert!((1..6).contains(&here), "both members own some: {here}");
    assert_eq!(h.owner.status().opening, here);
    h.run_all();
    let opened = h
        .take()
        .into_iter()
        .filter(|output| {
            matches!(
                output,
                OwnerOutput::Log {
                    event: LogEvent::Opened { .. },
                    ..
                }
            )
        })
        .count();
    assert_eq!(opened, here);
    assert_eq!(h.owner.status(), OwnerStatus::default());
}

#[test]
fn a_read_waits_while_its_log_opens_and_a_stale_incarnation_is_not_live() {
    let mut h = Harness::new();
    let commands = [create("t", 3)];
    h.replica(&commands);
    let live = live_id(&state(&commands), "t");
    h.read(1, live);
    h.read(2, TopicId(live.0 + 1));
    assert_eq!(
        h.take(),
        [OwnerOutput::ReadDone {
            id: LogReadId(2),
            result: Err(OwnerReadError::NotLive(TopicId(live.0 + 1))),
        }],
        "the live incarnation's read is parked, not answered"
    );
    h.run_all();
    let answered: Vec<_> = h
        .take()
        .into_iter()
        .filter_map(|output| match output {
            OwnerOutput::ReadDone { id, result } => Some((id, result)),
            _ => None,
        })
        .collect();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].0, LogReadId(1));
    assert!(
        matches!(
            answered[0].1,
            Err(OwnerReadError::Log(
                LogReadError::AtOrPastHighWatermark { .. }
            ))
        ),
        "{answered:?}"
    );
}

#[test]
fn reads_past_the_parking_bound_are_refused_as_busy() {
    let mut h = Harness::new();
    let commands = [create("t", 3)];
    h.replica(&commands);
    let live = live_id(&state(&commands), "t");
    for id in 0..=PARKED_READS_MAX as u64 {
        h.read(id, live);
    }
    assert_eq!(
        h.take(),
        [OwnerOutput::ReadDone {
            id: LogReadId(PARKED_READS_MAX as u64),
            result: Err(OwnerReadError::Log(LogReadError::Busy)),
        }]
    );
}

#[test]
fn a_deleted_topic_s_log_files_are_removed_and_its_idle_combiner_dropped() {
    let mut h = Harness::new();
    let commands = vec![create("t", 3)];
    h.replica(&commands);
    h.run_all();
    let live = live_id(&state(&commands), "t");
    let here = owned_here(&state(&commands), "t");
    h.commit(1, live, here, "kept until deleted");
    h.run_all();
    let dir = partition_dir("t", live, here);
    assert!(h.take().iter().any(|output| matches!(
        output,
        OwnerOutput::Committed {
            id: BatchId(1),
            result: Ok(_)
        }
    )));
    assert!(!crate::disk::Disk::list(&h.disk, &dir)
        .expect("listed")
        .is_empty());

    let mut deleted = commands.clone();
    deleted.push(Command::DeleteTopic {
        name: "t".to_string(),
    });
    h.replica(&deleted);
    h.run_all();
    let outputs = h.take();
    let removed = outputs
        .iter()
        .filter(|output| {
            matches!(
                output,
                OwnerOutput::Log {
                    event: LogEvent::Removed { .. },
                    ..
                }
            )
        })
        .count();
    let owned = owned_count(&state(&commands), &["t"]);
    assert_eq!(removed, owned, "{outputs:?}");
    let forgotten = outputs
        .iter()
        .filter(|output| matches!(output, OwnerOutput::Forget { .. }))
        .count();
    assert_eq!(
        forgotten, owned,
        "every combiner is dropped once its removal ran"
    );
    assert!(crate::disk::Disk::list(&h.disk, &dir)
        .expect("listed")
        .is_empty());
    assert_eq!(h.owner.partition_of(LogKey(1)), None);
    // A commit for the deleted name now meets an absent name here: refused, never "not owner".
    h.commit(2, live, here, "late");
    h.run_all();
    assert!(h.take().iter().any(|output| matches!(
        output,
        OwnerOutput::Committed {
            id: BatchId(2),
            result: Err(CommitError::TopicIncarnationMismatch { .. })
        }
    )));
}
