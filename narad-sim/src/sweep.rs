//! Sweeps: many seeds of many scenarios, in parallel OS threads, each seed in its own madsim runtime.
//!
//! The tallies, the per-scenario table and the closing `key=value` line are plain functions (tested in
//! normal builds); `run_parallel` exists only under `--cfg madsim`.

use std::fmt::Write as _;

use crate::outcome::RunOutcome;
use crate::seam::PlantedBug;

/// Sums over runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Seeds run.
    pub seeds: u64,
    /// Seeds that failed.
    pub failed: u64,
    /// Records 202'd.
    pub accepted: u64,
    /// Lost records.
    pub lost: u64,
    /// Unseen records.
    pub unseen: u64,
    /// Phantoms.
    pub phantoms: u64,
    /// Misplaced copies.
    pub misplaced: u64,
    /// Extra copies.
    pub duplicates: u64,
    /// Rerouted copies.
    pub reroutes: u64,
    /// Records excused by bit rot.
    pub excused_rot: u64,
    /// Records excused by topic deletion.
    pub excused_deleted: u64,
    /// Records excused by retention.
    pub excused_retention: u64,
    /// Crashes applied.
    pub crashes: u64,
    /// In-node invariant violations.
    pub violations: u64,
    /// Harness errors.
    pub errors: u64,
    /// Simulated nanoseconds.
    pub sim_ns: u64,
    /// Wall nanoseconds spent inside runs (summed over threads).
    pub run_wall_ns: u64,
    /// The verdicts by node and by fault kind.
    pub breakdown: crate::ledger::Breakdown,
}

impl Tally {
    /// Adds one run.
    pub fn add(&mut self, outcome: &RunOutcome, wall_ns: u64) {
        let report = &outcome.report;
        self.seeds += 1;
        self.failed += u64::from(outcome.failed());
        self.accepted += report.accepted;
        self.lost += report.lost.len() as u64;
        self.unseen += report.unseen.len() as u64;
        self.phantoms += report.phantoms.len() as u64;
        self.misplaced += report.misplaced.len() as u64;
        self.duplicates += report.duplicate_copies();
        self.reroutes += report.reroutes;
        self.excused_rot += report.excused_rot;
        self.excused_deleted += report.excused_deleted;
        self.excused_retention += report.excused_retention;
        self.crashes += outcome.crashes;
        self.violations += outcome.violations.len() as u64;
        self.errors += outcome.errors.len() as u64;
        self.sim_ns += outcome.sim_ns;
        self.run_wall_ns += wall_ns;
        self.breakdown.add(&outcome.breakdown);
    }

    /// Adds another tally.
    pub fn merge(&mut self, other: &Tally) {
        self.seeds += other.seeds;
        self.failed += other.failed;
        self.accepted += other.accepted;
        self.lost += other.lost;
        self.unseen += other.unseen;
        self.phantoms += other.phantoms;
        self.misplaced += other.misplaced;
        self.duplicates += other.duplicates;
        self.reroutes += other.reroutes;
        self.excused_rot += other.excused_rot;
        self.excused_deleted += other.excused_deleted;
        self.excused_retention += other.excused_retention;
        self.crashes += other.crashes;
        self.violations += other.violations;
        self.errors += other.errors;
        self.sim_ns += other.sim_ns;
        self.run_wall_ns += other.run_wall_ns;
        self.breakdown.add(&other.breakdown);
    }
}

/// The numeric fields of a [`Tally`] by name, in the order [`Tally::encode`] writes them.
macro_rules! tally_fields {
    ($apply:ident) => {
        $apply!(
            seeds,
            failed,
            accepted,
            lost,
            unseen,
            phantoms,
            misplaced,
            duplicates,
            reroutes,
            excused_rot,
            excused_deleted,
            excused_retention,
            crashes,
            violations,
            errors,
            sim_ns,
            run_wall_ns
        )
    };
}

impl Tally {
    /// One line of text that [`Tally::decode`] reads back: how a sweep's worker process hands its
    /// tally to the sweep that started it.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        macro_rules! put {
            ($($field:ident),*) => {
                $(let _ = write!(out, "{}={} ", stringify!($field), self.$field);)*
            };
        }
        tally_fields!(put);
        for (node, t) in &self.breakdown.by_node {
            let _ = write!(out, "node:{node}={} ", tally_counts(t));
        }
        for (kind, t) in &self.breakdown.by_fault {
            let _ = write!(out, "fault:{kind}={} ", tally_counts(t));
        }
        out.trim_end().to_string()
    }

    /// Reads what [`Tally::encode`] wrote.
    pub fn decode(text: &str) -> Result<Tally, String> {
        let mut tally = Tally::default();
        for pair in text.split_whitespace() {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("tally field {pair:?} has no value"))?;
            let number = |value: &str| {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("tally field {pair:?} is not a number"))
            };
            if let Some(node) = key.strip_prefix("node:") {
                let node = node
                    .parse::<u32>()
                    .map_err(|_| format!("tally field {pair:?} names no node"))?;
                tally.breakdown.by_node.insert(node, parse_counts(value)?);
                continue;
            }
            if let Some(kind) = key.strip_prefix("fault:") {
                let kind = crate::fault::KIND_NAMES
                    .iter()
                    .copied()
                    .find(|known| *known == kind)
                    .ok_or_else(|| format!("tally field {pair:?} names no fault kind"))?;
                tally.breakdown.by_fault.insert(kind, parse_counts(value)?);
                continue;
            }
            macro_rules! get {
                ($($field:ident),*) => {
                    match key {
                        $(stringify!($field) => tally.$field = number(value)?,)*
                        _ => return Err(format!("unknown tally field {key:?}")),
                    }
                };
            }
            tally_fields!(get);
        }
        Ok(tally)
    }
}

fn tally_counts(t: &crate::ledger::Tally) -> String {
    format!(
        "{},{},{},{},{}",
        t.accepted, t.lost, t.unseen, t.duplicated, t.rerouted
    )
}

fn parse_counts(text: &str) -> Result<crate::ledger::Tally, String> {
    let counts: Vec<u64> = text
        .split(',')
        .map(|count| count.parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("bad breakdown counts {text:?}"))?;
    match counts[..] {
        [accepted, lost, unseen, duplicated, rerouted] => Ok(crate::ledger::Tally {
            accepted,
            lost,
            unseen,
            duplicated,
            rerouted,
        }),
        _ => Err(format!("breakdown counts {text:?} are not five")),
    }
}

/// The breakdown lines of a cluster's verdict: one per node, one per fault kind (none when no run
/// broke its records down).
pub fn breakdown_lines(breakdown: &crate::ledger::Breakdown) -> Vec<String> {
    let mut lines = Vec::new();
    for (node, tally) in &breakdown.by_node {
        lines.push(format!("  via node {node}: {tally}"));
    }
    for (kind, tally) in &breakdown.by_fault {
        lines.push(format!("  around {kind}: {tally}"));
    }
    lines
}

/// The per-scenario table.
pub fn table(rows: &[(String, Tally)]) -> String {
    let width = rows
        .iter()
        .map(|(name, _)| name.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<width$} {:>6} {:>6} {:>9} {:>5} {:>6} {:>8} {:>9} {:>5} {:>8} {:>5} {:>7} {:>8} {:>7} {:>4} {:>9}",
        "scenario", "seeds", "failed", "accepted", "lost", "unseen", "phantoms", "misplaced",
        "dups", "reroutes", "rot", "deleted", "retained", "crashes", "inv", "sim_s"
    );
    for (name, t) in rows {
        let _ = writeln!(
            out,
            "{:<width$} {:>6} {:>6} {:>9} {:>5} {:>6} {:>8} {:>9} {:>5} {:>8} {:>5} {:>7} {:>8} {:>7} {:>4} {:>9.1}",
            name,
            t.seeds,
            t.failed,
            t.accepted,
            t.lost,
            t.unseen,
            t.phantoms,
            t.misplaced,
            t.duplicates,
            t.reroutes,
            t.excused_rot,
            t.excused_deleted,
            t.excused_retention,
            t.crashes,
            t.violations,
            t.sim_ns as f64 / 1e9
        );
    }
    out
}

/// The speed line: seeds per second and the simulated-to-wall-time ratio (overall, and per run, which
/// is what one core achieves).
pub fn speed_line(total: &Tally, wall_s: f64) -> String {
    let sim_s = total.sim_ns as f64 / 1e9;
    let run_wall_s = total.run_wall_ns as f64 / 1e9;
    format!(
        "speed: {:.2} seeds/s, sim/wall {:.0}x overall, {:.0}x per run ({} seeds, {:.1} sim s, {:.2} wall s)",
        total.seeds as f64 / wall_s.max(1e-9),
        sim_s / wall_s.max(1e-9),
        sim_s / run_wall_s.max(1e-9),
        total.seeds,
        sim_s,
        wall_s
    )
}

/// The closing line: exactly one line of `key=value` pairs.
pub fn summary_line(total: &Tally, wall_s: f64) -> String {
    format!(
        "seeds={} failed={} lost={} unseen={} phantoms={} misplaced={} duplicates={} reroutes={} sim_s={:.1} wall_s={:.2}",
        total.seeds,
        total.failed,
        total.lost,
        total.unseen,
        total.phantoms,
        total.misplaced,
        total.duplicates,
        total.reroutes,
        total.sim_ns as f64 / 1e9,
        wall_s
    )
}

/// The one command that replays a run.
pub fn replay_command(scenario_path: &str, seed: u64, plant_bug: Option<PlantedBug>) -> String {
    let mut command = format!("ci/sim run --scenario {scenario_path} --seed {seed}");
    if let Some(bug) = plant_bug {
        command.push_str(&format!(" --plant-bug {bug}"));
    }
    command.push_str(" --trace");
    command
}

/// Parses `A..B` (B excluded), `A..=B` (B included) or a single seed `N`.
pub fn parse_seeds(text: &str) -> Result<std::ops::Range<u64>, String> {
    let parse = |s: &str| {
        s.trim()
            .parse::<u64>()
            .map_err(|_| format!("bad seed {s:?} in {text:?}"))
    };
    let range = if let Some((a, b)) = text.split_once("..=") {
        parse(a)?..parse(b)?.checked_add(1).ok_or("seed range overflows")?
    } else if let Some((a, b)) = text.split_once("..") {
        parse(a)?..parse(b)?
    } else {
        let seed = parse(text)?;
        seed..seed.checked_add(1).ok_or("seed range overflows")?
    };
    if range.is_empty() {
        return Err(format!("seed range {text:?} is empty"));
    }
    Ok(range)
}

#[cfg(madsim)]
pub use parallel::{run_parallel, Job};

#[cfg(madsim)]
mod parallel {
    use std::io::{IsTerminal, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use crate::outcome::{RunOutcome, RunSpec};
    use crate::runner;
    use crate::seam::SimNode;

    /// One seed of one scenario.
    #[derive(Clone, Debug)]
    pub struct Job {
        /// Index of the scenario in the sweep's list.
        pub scenario: usize,
        /// What to run.
        pub spec: RunSpec,
    }

    /// Runs every job on `threads` OS threads (each run its own madsim runtime); returns the outcomes
    /// with their wall time, in job order (`None` for jobs skipped after a failure when
    /// `stop_at_first_failure`). Draws a progress bar on stderr when it is a terminal.
    pub fn run_parallel<N: SimNode>(
        jobs: &[Job],
        threads: usize,
        stop_at_first_failure: bool,
    ) -> Vec<Option<(RunOutcome, u64)>> {
        let next = AtomicUsize::new(0);
        let failed = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<(RunOutcome, u64)>>> = Mutex::new(vec![None; jobs.len()]);
        let progress = std::io::stderr().is_terminal();
        std::thread::scope(|scope| {
            for _ in 0..threads.max(1) {
                scope.spawn(|| loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(index) else {
                        return;
                    };
                    if stop_at_first_failure && failed.load(Ordering::Relaxed) > 0 {
                        return;
                    }
                    #[allow(clippy::disallowed_methods)]
                    // wall time of the run, outside the simulation
                    let started = std::time::Instant::now();
                    let outcome = runner::run::<N>(&job.spec);
                    let wall_ns = started.elapsed().as_nanos() as u64;
                    if outcome.failed() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if progress {
                        let width = 40;
                        let filled = finished * width / jobs.len();
                        eprint!(
                            "\r[{}{}] {finished}/{} seeds, {} failed ",
                            "#".repeat(filled),
                            " ".repeat(width - filled),
                            jobs.len(),
                            failed.load(Ordering::Relaxed)
                        );
                        let _ = std::io::stderr().flush();
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner())[index] =
                        Some((outcome, wall_ns));
                });
            }
        });
        if progress {
            eprintln!();
        }
        results.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Report;
    use std::collections::BTreeMap;

    fn outcome(lost: usize, duplicates: u64) -> RunOutcome {
        RunOutcome {
            seed: 1,
            report: Report {
                accepted: 10,
                lost: (0..lost as u64).collect(),
                duplicates: BTreeMap::from([(2, duplicates)]),
                reroutes: 1,
                ..Report::default()
            },
            sim_ns: 2_000_000_000,
            crashes: 2,
            ..RunOutcome::default()
        }
    }

    #[test]
    fn the_summary_line_has_exactly_the_agreed_keys() {
        let mut total = Tally::default();
        total.add(&outcome(0, 3), 1_000_000);
        total.add(&outcome(2, 0), 1_000_000);
        assert_eq!(
            summary_line(&total, 0.5),
            "seeds=2 failed=1 lost=2 unseen=0 phantoms=0 misplaced=0 duplicates=3 reroutes=2 \
             sim_s=4.0 wall_s=0.50"
        );
    }

    #[test]
    fn tallies_merge_like_adding_runs() {
        let mut a = Tally::default();
        a.add(&outcome(1, 1), 5);
        let mut b = Tally::default();
        b.add(&outcome(0, 2), 7);
        let mut both = Tally::default();
        both.add(&outcome(1, 1), 5);
        both.add(&outcome(0, 2), 7);
        a.merge(&b);
        assert_eq!(a, both);
    }

    #[test]
    fn a_tally_survives_its_encoding() {
        let mut tally = Tally::default();
        tally.add(&outcome(2, 3), 17);
        tally.add(&outcome(0, 1), 5);
        tally.errors = 4;
        tally.breakdown.by_node.insert(
            3,
            crate::ledger::Tally {
                accepted: 9,
                lost: 1,
                unseen: 2,
                duplicated: 3,
                rerouted: 4,
            },
        );
        tally.breakdown.by_fault.insert(
            "partition",
            crate::ledger::Tally {
                accepted: 5,
                ..Default::default()
            },
        );
        assert_eq!(Tally::decode(&tally.encode()), Ok(tally));
        assert!(Tally::decode("seeds=x").is_err());
        assert!(Tally::decode("fault:meteor=1,0,0,0,0").is_err());
        assert!(Tally::decode("node:1=1,2").is_err());
        assert!(Tally::decode("bogus=1").is_err());
    }

    #[test]
    fn the_table_has_a_row_per_scenario() {
        let mut t = Tally::default();
        t.add(&outcome(0, 0), 1);
        let text = table(&[("basic".into(), t.clone()), ("churn".into(), t)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("scenario"));
        assert!(lines[1].starts_with("basic "));
        assert!(lines[2].starts_with("churn "));
    }

    #[test]
    fn seed_ranges_parse_like_rust_ranges() {
        assert_eq!(parse_seeds("1..300"), Ok(1..300));
        assert_eq!(parse_seeds("1..=300"), Ok(1..301));
        assert_eq!(parse_seeds("7"), Ok(7..8));
        assert!(parse_seeds("5..5").is_err());
        assert!(parse_seeds("a..5").is_err());
    }

    #[test]
    fn the_replay_command_names_everything_that_matters() {
        assert_eq!(
            replay_command("scenarios/basic.toml", 7, Some(PlantedBug::AckBeforeFsync)),
            "ci/sim run --scenario scenarios/basic.toml --seed 7 --plant-bug ack-before-fsync --trace"
        );
    }
}
