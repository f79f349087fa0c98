//! What a run is asked to do and what it found: shared by the runner (madsim only) and the sweep
//! reporting (compiled everywhere, so its tables are unit-tested in normal builds).

use std::sync::Arc;

use crate::fault::FaultEvent;
use crate::ledger::Report;
use crate::scenario::Scenario;
use crate::seam::PlantedBug;
use crate::timeline::{dispatch_events, from_trace, render};

/// What to run.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// The scenario.
    pub scenario: Arc<Scenario>,
    /// Its path as the user gave it (for replay commands).
    pub scenario_path: String,
    /// The seed.
    pub seed: u64,
    /// The bug to plant.
    pub plant_bug: Option<PlantedBug>,
    /// Keep the readable trace.
    pub trace: bool,
    /// Replaces the scenario's (explicit or generated) fault schedule; `shrink` sets it.
    pub schedule: Option<Vec<FaultEvent>>,
}

/// What a run found.
#[derive(Clone, Debug, Default)]
pub struct RunOutcome {
    /// The seed.
    pub seed: u64,
    /// The ledger's verdict.
    pub report: Report,
    /// In-node invariant violations.
    pub violations: Vec<String>,
    /// Harness-level failures: a panic, the node never booting, a read that never succeeded, ...
    pub errors: Vec<String>,
    /// Hash over the event trace.
    pub trace_hash: u64,
    /// Events traced.
    pub trace_events: u64,
    /// The readable trace, when asked for.
    pub trace_lines: Option<Vec<String>>,
    /// The fault schedule the run applied.
    pub schedule: Vec<FaultEvent>,
    /// Simulated time the run took, in nanoseconds.
    pub sim_ns: u64,
    /// Produce calls made.
    pub produce_calls: u64,
    /// Crashes applied (the final crash included).
    pub crashes: u64,
    /// Records whose produce got a 202.
    pub accepted: u64,
    /// What the ledger knows about the first lost and unseen records.
    pub details: Vec<String>,
    /// The verdict by node and by fault kind (a cluster's; empty for a single node).
    pub breakdown: crate::ledger::Breakdown,
    /// What a timeline shows (gathered with the readable trace).
    pub timeline: Option<crate::timeline::TimelineData>,
}

impl RunOutcome {
    /// Whether the run failed.
    pub fn failed(&self) -> bool {
        self.report.failed() || !self.violations.is_empty() || !self.errors.is_empty()
    }

    /// A one-line reason for a failure.
    pub fn reason(&self) -> String {
        let mut parts = Vec::new();
        let r = &self.report;
        for (name, count) in [
            ("lost", r.lost.len()),
            ("unseen", r.unseen.len()),
            ("phantoms", r.phantoms.len()),
            ("misplaced", r.misplaced.len()),
            ("offset_conflicts", r.offset_conflicts.len()),
            ("violations", self.violations.len()),
        ] {
            if count > 0 {
                parts.push(format!("{name}={count}"));
            }
        }
        if let Some(consumed) = &r.consumed {
            for (name, count) in [
                ("unacked", consumed.unacked.len()),
                ("foreign", consumed.foreign.len()),
                ("acked_redelivered", consumed.acked_redelivered.len()),
            ] {
                if count > 0 {
                    parts.push(format!("{name}={count}"));
                }
            }
        }
        if let Some(error) = self.errors.first() {
            parts.push(format!("error: {error}"));
        }
        parts.join(" ")
    }
}

/// The message of a caught panic.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-text payload".to_string()
    }
}

/// The timeline page of a run: what the runner gathered (or, for a run that ended before its
/// verdict, what its trace shows), the node's commits from `trace_lines`, and the failure if it
/// failed. It lives with the outcome it reads, so the timeline's drawing knows nothing of runs.
pub fn timeline_page(spec: &RunSpec, outcome: &RunOutcome, trace_lines: &[String]) -> String {
    let mut data = outcome.timeline.clone().unwrap_or_else(|| {
        let mut data = from_trace(trace_lines, spec.scenario.topology.nodes as usize);
        data.scenario = spec.scenario_path.clone();
        data.seed = spec.seed;
        data.safety_end_ns = spec.scenario.phases.safety_ms * 1_000_000;
        data.plant_bug = spec.plant_bug.map(|bug| bug.name().to_string());
        data.verdict = "the run ended before its verdict".to_string();
        data
    });
    data.failure = outcome.failed().then(|| outcome.reason());
    let dispatch = dispatch_events(trace_lines, &data.owners);
    render(&data, &dispatch)
}
