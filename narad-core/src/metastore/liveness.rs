//! Member liveness: which members the leader marks dead or alive again, from the heartbeats it hears.
//!
//! Every node sends a heartbeat to every peer each [`HEARTBEAT_INTERVAL`]; each replica notes the
//! ones it hears ([`Liveness::heard`]). Only the raft leader decides, through the log
//! ([`Command::SetMemberAlive`]), so every replica agrees on who is dead: a member not heard for
//! [`MEMBER_DEAD_AFTER`] is marked dead, and a dead member heard again is marked alive. The leader
//! itself is alive by definition.
//!
//! A new leader counts every member as heard when it took over: it has no record of what the old
//! leader heard, and marking the whole cluster dead on its first tick would reroute everything.
//! A proposed change is not proposed again for [`STATUS_RETRY`], so a slow commit does not flood the
//! log; a lost one is proposed again after it.

use core::time::Duration;
use std::collections::BTreeMap;

use crate::ids::NodeId;
use crate::metastore::{Command, MetaState};
use crate::planted::{Plant, PlantedBug};
use crate::time::Instant;

/// How often every node sends a heartbeat to every peer.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// A member the leader has not heard for this long is marked dead.
pub const MEMBER_DEAD_AFTER: Duration = Duration::from_secs(5);
/// How long a proposed status change waits before it is proposed again.
pub const STATUS_RETRY: Duration = Duration::from_secs(1);

/// The leader's liveness bookkeeping; see the module documentation.
#[derive(Clone, Debug)]
pub struct Liveness {
    me: NodeId,
    heard: BTreeMap<NodeId, Instant>,
    leading_since: Option<Instant>,
    proposed: BTreeMap<NodeId, (bool, Instant)>,
    plant: Plant,
}

impl Liveness {
    /// Bookkeeping for replica `me`.
    pub fn new(me: NodeId) -> Liveness {
        Liveness {
            me,
            heard: BTreeMap::new(),
            leading_since: None,
            proposed: BTreeMap::new(),
            plant: Plant::NONE,
        }
    }

    /// The same, with `plant` planted (simulator only).
    pub fn with_plant(me: NodeId, plant: Plant) -> Liveness {
        Liveness {
            plant,
            ..Liveness::new(me)
        }
    }

    /// A heartbeat from `node` arrived at `now`.
    pub fn heard(&mut self, node: NodeId, now: Instant) {
        self.heard.insert(node, now);
    }

    /// The status changes to propose now; none unless `leader`.
    pub fn decide(&mut self, now: Instant, leader: bool, state: &MetaState) -> Vec<Command> {
        if !leader {
            self.leading_since = None;
            self.proposed.clear();
            return Vec::new();
        }
        let since = *self.leading_since.get_or_insert(now);
        let mut changes = Vec::new();
        if self.plant.is(PlantedBug::NeverMarkDead) {
            return changes; // Planted: every member stays as it is, silent or not.
        }
        for &node in state.members().keys() {
            let alive = node == self.me || {
                let last = self
                    .heard
                    .get(&node)
                    .map_or(since, |heard| (*heard).max(since));
                now.saturating_duration_since(last) < MEMBER_DEAD_AFTER
            };
            if alive == state.is_alive(node) {
                self.proposed.remove(&node);
                continue;
            }
            let waiting = self.proposed.get(&node).is_some_and(|(wanted, at)| {
                *wanted == alive && now.saturating_duration_since(*at) < STATUS_RETRY
            });
            if !waiting {
                self.proposed.insert(node, (alive, now));
                changes.push(Command::SetMemberAlive { node, alive });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(members: &[u32]) -> MetaState {
        let mut state = MetaState::new();
        for node in members {
            state
                .apply(&Command::AddMember {
                    node: NodeId(*node),
                    addr: format!("n{node}"),
                })
                .unwrap();
        }
        state
    }

    fn at(seconds: u64) -> Instant {
        Instant::from_nanos(seconds * 1_000_000_000)
    }

    fn dead(node: u32) -> Command {
        Command::SetMemberAlive {
            node: NodeId(node),
            alive: false,
        }
    }

    #[test]
    fn the_leader_marks_a_silent_member_dead_after_the_timeout_and_alive_when_heard() {
        let mut state = state(&[1, 2, 3]);
        let mut liveness = Liveness::new(NodeId(1));
        assert!(liveness.decide(at(0), true, &state).is_empty());
        liveness.heard(NodeId(2), at(4));
        liveness.heard(NodeId(3), at(1));
        assert!(liveness.decide(at(5), true, &state).is_empty());
        // Node 3 was last heard at 1 s: dead at 6 s; node 2 (4 s) is not.
        assert_eq!(liveness.decide(at(6), true, &state), vec![dead(3)]);
        // Not proposed again while the first proposal may still commit...
        assert!(liveness
            .decide(at(6) + STATUS_RETRY / 2, true, &state)
            .is_empty());
        // ...but again once it had its time.
        assert_eq!(
            liveness.decide(at(6) + STATUS_RETRY, true, &state),
            vec![dead(3)]
        );
        state.apply(&dead(3)).unwrap();
        assert!(liveness.decide(at(8), true, &state).is_empty());
        liveness.heard(NodeId(2), at(8));
        liveness.heard(NodeId(3), at(9));
        assert_eq!(
            liveness.decide(at(9), true, &state),
            vec![Command::SetMemberAlive {
                node: NodeId(3),
                alive: true
            }]
        );
    }

    #[test]
    fn only_the_leader_decides_and_a_new_leader_gives_everyone_the_full_timeout() {
        let state = state(&[1, 2]);
        let mut liveness = Liveness::new(NodeId(1));
        assert!(liveness.decide(at(100), false, &state).is_empty());
        // Leads from 100 s: node 2, never heard, is dead only at 105 s.
        assert!(liveness.decide(at(100), true, &state).is_empty());
        assert!(liveness.decide(at(104), true, &state).is_empty());
        assert_eq!(liveness.decide(at(105), true, &state), vec![dead(2)]);
        // Losing the lead forgets it; leading again restarts the grace.
        assert!(liveness.decide(at(106), false, &state).is_empty());
        assert!(liveness.decide(at(107), true, &state).is_empty());
        assert!(liveness.decide(at(111), true, &state).is_empty());
    }

    #[test]
    fn the_leader_marks_itself_alive() {
        let mut state = state(&[1, 2]);
        state.apply(&dead(1)).unwrap();
        let mut liveness = Liveness::new(NodeId(1));
        liveness.heard(NodeId(2), at(0));
        assert_eq!(
            liveness.decide(at(0), true, &state),
            vec![Command::SetMemberAlive {
                node: NodeId(1),
                alive: true
            }]
        );
    }
}
