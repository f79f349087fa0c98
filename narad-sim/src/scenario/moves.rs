//! A scenario's `[moves]`: an operator task that changes the cluster's shape while the safety
//! phase runs: operator moves and their aborts, rebalances, decommissions and their cancels, each
//! through a node drawn in turn.

use serde::{Deserialize, Serialize};

use super::Span;

/// `[moves]`: nothing by default (no task).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MovesSpec {
    /// Mean time between two operations, ms, drawn per seed (0: no task).
    #[serde(default = "zero")]
    pub every_ms: Span,
    /// Percent of operations that decommission a member or cancel a decommission, drawn per seed;
    /// the rest are operator moves, their aborts and rebalances.
    #[serde(default = "zero")]
    pub decommission_percent: Span,
}

fn zero() -> Span {
    Span::Fixed(0)
}

impl Default for MovesSpec {
    fn default() -> Self {
        MovesSpec {
            every_ms: zero(),
            decommission_percent: zero(),
        }
    }
}

impl MovesSpec {
    /// Whether the scenario runs the task.
    pub fn is_default(&self) -> bool {
        *self == MovesSpec::default()
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        self.every_ms
            .check("moves.every_ms", 0, super::PHASE_MS_MAX)?;
        self.decommission_percent
            .check("moves.decommission_percent", 0, 100)?;
        Ok(())
    }
}
