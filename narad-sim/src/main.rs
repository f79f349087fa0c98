//! `narad-sim`: runs scenarios under the deterministic simulator. Build and run it with `ci/sim`.
//!
//! Subcommands: `run` (one seed, `--trace`, `--check-determinism`), `sweep` (many seeds of many
//! scenarios in parallel; the last line is a `key=value` summary), `shrink` (delta-debug a failing
//! seed's fault schedule into a regression scenario) and `replay` (check regression scenarios).
//! Exit status: 0 pass, 1 a run failed (or determinism broke), 2 bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use narad_sim::seam::PlantedBug;
use narad_sim::shrink::TESTS_MAX_DEFAULT;

/// mimalloc: a run allocates and frees per simulated event, and glibc's malloc cost a seventh of
/// a run's instructions (allocation addresses reach no output: determinism is unaffected).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The deterministic simulator of Narad.
#[derive(Debug, Parser)]
#[command(name = "narad-sim", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one seed of one scenario.
    Run(RunArgs),
    /// Run a range of seeds over scenarios (all of scenarios/*.toml by default).
    Sweep(SweepArgs),
    /// Delta-debug a failing seed's fault schedule and write a regression scenario.
    Shrink(ShrinkArgs),
    /// Check regression scenarios: each fails with its planted bug and passes without it.
    Replay(ReplayArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Scenario file, or a name under scenarios/.
    #[arg(long)]
    scenario: String,
    /// Seed (a regression scenario supplies its own when omitted).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the readable event trace.
    #[arg(long)]
    trace: bool,
    /// Run the seed twice and compare trace hashes; exit 1 on mismatch.
    #[arg(long)]
    check_determinism: bool,
    /// Write the run's timeline (one self-contained HTML page) to this file.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Plant a bug (simulation only).
    #[arg(long, value_parser = parse_bug)]
    plant_bug: Option<PlantedBug>,
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Scenario files or names (repeatable); default: every scenarios/*.toml.
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Seeds: `A..B` (B excluded), `A..=B`, or `N`.
    #[arg(long, value_parser = narad_sim::sweep::parse_seeds)]
    seeds: std::ops::Range<u64>,
    /// Parallel runs (OS threads, each its own madsim runtime); default: available cores.
    #[arg(long)]
    jobs: Option<usize>,
    /// Plant a bug (simulation only).
    #[arg(long, value_parser = parse_bug)]
    plant_bug: Option<PlantedBug>,
    /// Stop taking new seeds after the first failure (planted-bug checks).
    #[arg(long)]
    stop_at_first_failure: bool,
    /// Runs (seeds times scenarios) per worker process: a longer sweep runs its seeds in chunks,
    /// one child process after another, so what a run leaves behind ends with its process.
    #[arg(long, default_value_t = 1000)]
    runs_per_process: u64,
    /// Run as a sweep's worker: print each scenario's tally and the failures, for the parent.
    #[arg(long, hide = true)]
    worker: bool,
}

#[derive(Debug, Args)]
struct ShrinkArgs {
    /// Scenario file, or a name under scenarios/.
    #[arg(long)]
    scenario: String,
    /// The failing seed.
    #[arg(long)]
    seed: u64,
    /// The planted bug the failure needs, if any.
    #[arg(long, value_parser = parse_bug)]
    plant_bug: Option<PlantedBug>,
    /// Where to write the regression scenario (default: scenarios/regress/<name>-seed<N>[-<bug>].toml).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Most simulations the shrink may run.
    #[arg(long, default_value_t = TESTS_MAX_DEFAULT)]
    tests_max: usize,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// Regression scenario files; default: every scenarios/regress/*.toml.
    files: Vec<String>,
}

fn parse_bug(name: &str) -> Result<PlantedBug, String> {
    name.parse()
}

#[cfg_attr(not(madsim), allow(dead_code))] // used by the simulator build only
/// The repository root as `ci/sim` exports it, else the working directory.
fn root() -> PathBuf {
    std::env::var_os("NARAD_SIM_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

#[cfg_attr(not(madsim), allow(dead_code))] // used by the simulator build only
/// Resolves a scenario argument: a path, or a name under `<root>/scenarios/` (with or without `.toml`).
fn resolve_scenario(arg: &str) -> Result<PathBuf, String> {
    let direct = PathBuf::from(arg);
    if direct.is_file() {
        return Ok(direct);
    }
    let dir = root().join("scenarios");
    for candidate in [
        root().join(arg),
        dir.join(arg),
        dir.join(format!("{arg}.toml")),
    ] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "no scenario file {arg:?} (looked in . and {})",
        dir.display()
    ))
}

/// A path as replay commands show it: relative to the repository root when it is inside it.
#[cfg_attr(not(madsim), allow(dead_code))] // used by the simulator build only
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every `*.toml` directly in `dir`, sorted.
#[cfg_attr(not(madsim), allow(dead_code))] // used by the simulator build only
fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|error| format!("cannot list {}: {error}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file() && path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The nodes' own logs (tracing), for a replay: `NARAD_SIM_LOG=warn ci/sim run ...`. Off by
    // default: a sweep would print every seed's logs.
    if let Ok(filter) = std::env::var("NARAD_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    match execute(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("narad-sim: {error}");
            ExitCode::from(2)
        }
    }
}

#[cfg(not(madsim))]
fn execute(_cli: Cli) -> Result<ExitCode, String> {
    Err(
        "this binary was built without the simulator: build and run it with `ci/sim ARGS...` \
         (RUSTFLAGS=\"--cfg madsim --cfg narad_invariants\", target dir target/sim, profile sim)"
            .into(),
    )
}

#[cfg(madsim)]
fn execute(cli: Cli) -> Result<ExitCode, String> {
    if !narad_core::DEEP_CHECKS {
        // A sweep without the actors' invariant checks would pass runs that break them.
        return Err(
            "this simulator was built without the actors' invariant checks: build it with `ci/sim` \
             (debug assertions, or RUSTFLAGS with `--cfg narad_invariants`)"
                .into(),
        );
    }
    match cli.command {
        Command::Run(args) => sim::run(args),
        Command::Sweep(args) => sim::sweep(args),
        Command::Shrink(args) => sim::shrink(args),
        Command::Replay(args) => sim::replay(args),
    }
}

#[cfg(madsim)]
mod sim {
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;
    use std::sync::Arc;

    use narad_sim::node_narad::NaradSimNode;
    use narad_sim::outcome::{RunOutcome, RunSpec};
    use narad_sim::runner;
    use narad_sim::scenario::{Regression, Scenario};
    use narad_sim::seam::{PlantedBug, SimNode};
    use narad_sim::shrink::ddmin;
    use narad_sim::sweep::{
        replay_command, run_parallel, speed_line, summary_line, table, Job, Tally,
    };

    use super::{
        resolve_scenario, root, shown, toml_files, ReplayArgs, RunArgs, ShrinkArgs, SweepArgs,
    };

    /// The node the simulator runs: the real one.
    type Node = NaradSimNode;

    /// How many ids of each failure category a run report lists.
    const DETAILS_MAX: usize = 10;

    #[allow(clippy::disallowed_methods)] // wall time of the harness, outside any simulation
    fn wall_now() -> std::time::Instant {
        std::time::Instant::now()
    }

    fn check_supported(bug: Option<PlantedBug>) -> Result<(), String> {
        match bug {
            Some(bug) if !Node::supports(bug) => Err(format!(
                "planted bug {bug} is not implemented by node {} (it belongs to the real node)",
                Node::name()
            )),
            Some(_) | None => Ok(()),
        }
    }

    fn load(arg: &str) -> Result<(PathBuf, Arc<Scenario>), String> {
        let path = resolve_scenario(arg)?;
        let scenario = Scenario::load(&path)?;
        Ok((path, Arc::new(scenario)))
    }

    fn display_name(path: &Path) -> String {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match path.parent().and_then(Path::file_name) {
            Some(parent) if parent == "regress" => format!("regress/{stem}"),
            Some(_) | None => stem,
        }
    }

    /// Renders the run's timeline into `file`.
    fn write_timeline(
        spec: &RunSpec,
        file: &Path,
        outcome: &RunOutcome,
        trace_lines: &[String],
    ) -> Result<(), String> {
        let page = narad_sim::outcome::timeline_page(spec, outcome, trace_lines);
        std::fs::write(file, page)
            .map_err(|error| format!("cannot write {}: {error}", file.display()))?;
        println!("timeline: {}", file.display());
        Ok(())
    }

    fn print_outcome(spec: &RunSpec, outcome: &RunOutcome, wall_s: f64) {
        if let Some(lines) = &outcome.trace_lines {
            for line in lines {
                println!("{line}");
            }
        }
        let r = &outcome.report;
        println!(
            "scenario={} seed={} node={} plant_bug={}",
            spec.scenario_path,
            spec.seed,
            Node::name(),
            spec.plant_bug.map_or("none", PlantedBug::name)
        );
        println!(
            "faults={} crashes={} produce_calls={} accepted={} ambiguous={} refused={}",
            outcome.schedule.len(),
            outcome.crashes,
            outcome.produce_calls,
            r.accepted,
            r.ambiguous,
            r.refused
        );
        println!(
            "lost={} unseen={} phantoms={} misplaced={} duplicates={} [{}] reroutes={} \
             excused_rot={} excused_deleted={} excused_retention={} violations={}",
            r.lost.len(),
            r.unseen.len(),
            r.phantoms.len(),
            r.misplaced.len(),
            r.duplicate_copies(),
            r.duplicates_histogram(),
            r.reroutes,
            r.excused_rot,
            r.excused_deleted,
            r.excused_retention,
            outcome.violations.len()
        );
        if let Some(c) = &r.consumed {
            println!(
                "consumed: delivered={} redelivered={} acked={} unacked={} foreign={}",
                c.delivered,
                c.redelivered,
                c.acked,
                c.unacked.len(),
                c.foreign.len()
            );
        }
        for line in narad_sim::sweep::breakdown_lines(&outcome.breakdown) {
            println!("{line}");
        }
        println!(
            "trace_hash={:016x} events={} sim_s={:.3} wall_s={:.3} sim/wall={:.0}x",
            outcome.trace_hash,
            outcome.trace_events,
            outcome.sim_ns as f64 / 1e9,
            wall_s,
            outcome.sim_ns as f64 / 1e9 / wall_s.max(1e-9)
        );
        if !outcome.failed() {
            println!("PASS");
            return;
        }
        println!("FAIL {}", outcome.reason());
        let ids = |ids: &[u64]| {
            let shown: Vec<String> = ids.iter().take(DETAILS_MAX).map(u64::to_string).collect();
            shown.join(",")
        };
        if !r.lost.is_empty() {
            println!(
                "  lost ids: {} (vanished after the final crash: {})",
                ids(&r.lost),
                r.vanished.len()
            );
        }
        if !r.unseen.is_empty() {
            println!("  unseen ids: {}", ids(&r.unseen));
        }
        if let Some(c) = &r.consumed {
            if !c.unacked.is_empty() {
                println!("  unacked ids: {}", ids(&c.unacked));
            }
            for foreign in c.foreign.iter().take(DETAILS_MAX) {
                println!("  foreign delivery {foreign}");
            }
            for again in c.acked_redelivered.iter().take(DETAILS_MAX) {
                println!("  acked redelivered {again}");
            }
        }
        for detail in &outcome.details {
            println!("  {detail}");
        }
        for anomaly in r.phantoms.iter().take(DETAILS_MAX) {
            println!("  phantom {anomaly}");
        }
        for anomaly in r.misplaced.iter().take(DETAILS_MAX) {
            println!("  misplaced {anomaly}");
        }
        for conflict in r.offset_conflicts.iter().take(DETAILS_MAX) {
            println!("  offset conflict {conflict}");
        }
        for violation in outcome.violations.iter().take(DETAILS_MAX) {
            println!("  violation {violation}");
        }
        for error in &outcome.errors {
            println!("  error {error}");
        }
        println!(
            "replay: {}",
            replay_command(&spec.scenario_path, spec.seed, spec.plant_bug)
        );
    }

    fn timed(spec: &RunSpec) -> (RunOutcome, f64) {
        let started = wall_now();
        let outcome = runner::run::<Node>(spec);
        (outcome, started.elapsed().as_secs_f64())
    }

    pub fn run(args: RunArgs) -> Result<ExitCode, String> {
        check_supported(args.plant_bug)?;
        let (path, scenario) = load(&args.scenario)?;
        let regression = scenario.regression.clone();
        let seed = args
            .seed
            .or(regression.as_ref().map(|r| r.seed))
            .ok_or("--seed is required (the scenario is not a regression file)")?;
        let spec = RunSpec {
            scenario,
            scenario_path: shown(&path),
            seed,
            plant_bug: args.plant_bug,
            // The timeline reads the node's commits from the trace.
            trace: args.trace || args.timeline.is_some(),
            schedule: None,
        };
        let (mut outcome, wall_s) = timed(&spec);
        let trace_lines = if args.trace {
            outcome.trace_lines.clone()
        } else {
            outcome.trace_lines.take()
        };
        print_outcome(&spec, &outcome, wall_s);
        let mut failed = outcome.failed();
        if let Some(file) = &args.timeline {
            write_timeline(
                &spec,
                file,
                &outcome,
                trace_lines.as_deref().unwrap_or_default(),
            )?;
        }
        if args.check_determinism {
            let (again, _) = timed(&RunSpec {
                trace: false,
                ..spec.clone()
            });
            if again.trace_hash == outcome.trace_hash && again.trace_events == outcome.trace_events
            {
                println!(
                    "determinism: ok (trace_hash={:016x}, twice)",
                    outcome.trace_hash
                );
            } else {
                println!(
                    "determinism: MISMATCH trace_hash {:016x} ({} events) then {:016x} ({} events)",
                    outcome.trace_hash, outcome.trace_events, again.trace_hash, again.trace_events
                );
                failed = true;
            }
        }
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }

    pub fn sweep(args: SweepArgs) -> Result<ExitCode, String> {
        check_supported(args.plant_bug)?;
        let paths = if args.scenarios.is_empty() {
            toml_files(&root().join("scenarios"))?
        } else {
            args.scenarios
                .iter()
                .map(|arg| resolve_scenario(arg))
                .collect::<Result<_, _>>()?
        };
        if paths.is_empty() {
            return Err("no scenarios to sweep".into());
        }
        let mut scenarios = Vec::new();
        for path in &paths {
            scenarios.push((path.clone(), Arc::new(Scenario::load(path)?)));
        }
        let runs = (args.seeds.end - args.seeds.start).saturating_mul(scenarios.len() as u64);
        if !args.worker && runs > args.runs_per_process.max(1) {
            return sweep_in_processes(&args, &paths);
        }
        let mut jobs = Vec::new();
        for seed in args.seeds.clone() {
            for (index, (path, scenario)) in scenarios.iter().enumerate() {
                jobs.push(Job {
                    scenario: index,
                    spec: RunSpec {
                        scenario: scenario.clone(),
                        scenario_path: shown(path),
                        seed,
                        plant_bug: args.plant_bug,
                        trace: false,
                        schedule: None,
                    },
                });
            }
        }
        let threads = args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        let started = wall_now();
        let results = run_parallel::<Node>(&jobs, threads, args.stop_at_first_failure);
        let wall_s = started.elapsed().as_secs_f64();

        let mut rows: Vec<(String, narad_sim::sweep::Tally)> = scenarios
            .iter()
            .map(|(path, _)| (display_name(path), Tally::default()))
            .collect();
        let mut failures = Vec::new();
        for (job, result) in jobs.iter().zip(&results) {
            let Some((outcome, wall_ns)) = result else {
                continue;
            };
            rows[job.scenario].1.add(outcome, *wall_ns);
            if outcome.failed() {
                failures.push((job, outcome));
            }
        }
        let failure_lines: Vec<String> = failures
            .iter()
            .map(|(job, outcome)| {
                format!(
                    "FAIL {} seed={}: {}\n  replay: {}",
                    rows[job.scenario].0,
                    job.spec.seed,
                    outcome.reason(),
                    replay_command(&job.spec.scenario_path, job.spec.seed, job.spec.plant_bug)
                )
            })
            .collect();
        if args.worker {
            for (index, (_, tally)) in rows.iter().enumerate() {
                println!("{WORKER_TALLY} {index} {}", tally.encode());
            }
            for line in &failure_lines {
                println!("{line}");
            }
        } else {
            print_sweep(&rows, &failure_lines, wall_s);
        }
        Ok(if failures.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    /// The line prefix of a worker's tally of one scenario.
    const WORKER_TALLY: &str = "worker-tally";

    /// The sweep's report: the table, each failure, the breakdown, the speed and the summary.
    fn print_sweep(rows: &[(String, Tally)], failure_lines: &[String], wall_s: f64) {
        let mut total = Tally::default();
        for (_, tally) in rows {
            total.merge(tally);
        }
        print!("{}", table(rows));
        for line in failure_lines {
            println!("{line}");
        }
        let breakdown = narad_sim::sweep::breakdown_lines(&total.breakdown);
        if !breakdown.is_empty() {
            println!("breakdown (records by the node that took them, and by the faults in force around their call):");
            for line in breakdown {
                println!("{line}");
            }
        }
        println!("{}", speed_line(&total, wall_s));
        println!("{}", summary_line(&total, wall_s));
    }

    /// A long sweep: its seeds in chunks of `runs_per_process` runs, each chunk a worker process of
    /// this binary (one after another, each with every job thread), their tallies summed.
    fn sweep_in_processes(args: &SweepArgs, paths: &[PathBuf]) -> Result<ExitCode, String> {
        let exe = std::env::current_exe().map_err(|error| format!("no own executable: {error}"))?;
        let per_chunk = (args.runs_per_process / paths.len() as u64).max(1);
        let started = wall_now();
        let mut rows: Vec<(String, Tally)> = paths
            .iter()
            .map(|path| (display_name(path), Tally::default()))
            .collect();
        let mut failure_lines = Vec::new();
        let mut from = args.seeds.start;
        while from < args.seeds.end {
            let to = from.saturating_add(per_chunk).min(args.seeds.end);
            let mut command = std::process::Command::new(&exe);
            command.arg("sweep").arg("--worker");
            for path in paths {
                command.arg("--scenario").arg(path);
            }
            command.arg("--seeds").arg(format!("{from}..{to}"));
            if let Some(jobs) = args.jobs {
                command.arg("--jobs").arg(jobs.to_string());
            }
            if let Some(bug) = args.plant_bug {
                command.arg("--plant-bug").arg(bug.name());
            }
            if args.stop_at_first_failure {
                command.arg("--stop-at-first-failure");
            }
            command.stderr(std::process::Stdio::inherit());
            let output = command
                .output()
                .map_err(|error| format!("cannot start a sweep worker: {error}"))?;
            let text = String::from_utf8_lossy(&output.stdout);
            if !matches!(output.status.code(), Some(0 | 1)) {
                return Err(format!(
                    "the sweep worker for seeds {from}..{to} ended with {}:\n{text}",
                    output.status
                ));
            }
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix(WORKER_TALLY) {
                    let (index, encoded) = rest
                        .trim_start()
                        .split_once(' ')
                        .ok_or_else(|| format!("bad worker line {line:?}"))?;
                    let index: usize = index
                        .parse()
                        .map_err(|_| format!("bad worker line {line:?}"))?;
                    let row = rows
                        .get_mut(index)
                        .ok_or_else(|| format!("worker line {line:?} names no scenario"))?;
                    row.1.merge(&Tally::decode(encoded)?);
                } else if !line.is_empty() {
                    failure_lines.push(line.to_string());
                }
            }
            if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                let (start, end) = (args.seeds.start, args.seeds.end);
                eprintln!("seeds {start}..{to} of {start}..{end} done");
            }
            if args.stop_at_first_failure && output.status.code() == Some(1) {
                break;
            }
            from = to;
        }
        let wall_s = started.elapsed().as_secs_f64();
        print_sweep(&rows, &failure_lines, wall_s);
        let failed = rows.iter().any(|(_, tally)| tally.failed > 0);
        Ok(if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }

    pub fn shrink(args: ShrinkArgs) -> Result<ExitCode, String> {
        check_supported(args.plant_bug)?;
        let (path, scenario) = load(&args.scenario)?;
        let base = RunSpec {
            scenario: scenario.clone(),
            scenario_path: shown(&path),
            seed: args.seed,
            plant_bug: args.plant_bug,
            trace: false,
            schedule: None,
        };
        let original = runner::run::<Node>(&base);
        if !original.failed() {
            return Err(format!(
                "seed {} of {} passes: nothing to shrink",
                args.seed,
                path.display()
            ));
        }
        println!(
            "seed {} fails ({}) with {} fault events; shrinking",
            args.seed,
            original.reason(),
            original.schedule.len()
        );
        let shrunk = ddmin(original.schedule.clone(), args.tests_max, |candidate| {
            runner::run::<Node>(&RunSpec {
                schedule: Some(candidate.to_vec()),
                ..base.clone()
            })
            .failed()
        });
        println!(
            "{} -> {} fault events in {} runs{}",
            original.schedule.len(),
            shrunk.minimal.len(),
            shrunk.tests,
            if shrunk.budget_exhausted {
                " (budget exhausted: not 1-minimal)"
            } else {
                " (1-minimal)"
            }
        );
        let mut regression = (*scenario).clone();
        regression.description = format!(
            "Regression: seed {} of {}{}, fault schedule shrunk from {} to {} events. {}",
            args.seed,
            display_name(&path),
            args.plant_bug
                .map_or(String::new(), |bug| format!(" with planted bug {bug}")),
            original.schedule.len(),
            shrunk.minimal.len(),
            scenario.description
        );
        regression.schedule = Some(shrunk.minimal.clone());
        regression.regression = Some(Regression {
            seed: args.seed,
            plant_bug: args.plant_bug.map(|bug| bug.name().to_string()),
            shrunk_from: display_name(&path),
        });
        let out = args.out.clone().unwrap_or_else(|| {
            let mut name = format!(
                "{}-seed{}",
                display_name(&path).replace('/', "-"),
                args.seed
            );
            if let Some(bug) = args.plant_bug {
                name.push_str(&format!("-{bug}"));
            }
            root()
                .join("scenarios/regress")
                .join(format!("{name}.toml"))
        });
        let text = format!(
            "# Written by `narad-sim shrink`; replay with `ci/sim replay {}`.\n{}",
            shown(&out),
            regression.to_toml()
        );
        Scenario::parse(&text).map_err(|e| format!("the regression file does not parse: {e}"))?;
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(&out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        let check = runner::run::<Node>(&RunSpec {
            scenario: Arc::new(regression),
            scenario_path: out.display().to_string(),
            ..base
        });
        println!(
            "wrote {} (re-run: {})",
            shown(&out),
            if check.failed() {
                "fails as expected"
            } else {
                "PASSES: not a reproduction"
            }
        );
        Ok(if check.failed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }

    pub fn replay(args: ReplayArgs) -> Result<ExitCode, String> {
        let files = if args.files.is_empty() {
            toml_files(&root().join("scenarios/regress"))?
        } else {
            args.files.iter().map(PathBuf::from).collect()
        };
        let mut mismatches = 0;
        for path in &files {
            let scenario = Arc::new(Scenario::load(path)?);
            let Some(regression) = scenario.regression.clone() else {
                return Err(format!("{} has no [regression] table", path.display()));
            };
            let bug = regression.planted()?;
            if let Some(bug) = bug {
                if !Node::supports(bug) {
                    println!("SKIP {}: node {} lacks {bug}", path.display(), Node::name());
                    continue;
                }
            }
            let spec = RunSpec {
                scenario,
                scenario_path: shown(path),
                seed: regression.seed,
                plant_bug: bug,
                trace: false,
                schedule: None,
            };
            let mut checks = vec![(bug, bug.is_some())];
            if bug.is_some() {
                checks.push((None, false));
            }
            for (plant_bug, expect_failure) in checks {
                let outcome = runner::run::<Node>(&RunSpec {
                    plant_bug,
                    ..spec.clone()
                });
                let ok = outcome.failed() == expect_failure;
                mismatches += usize::from(!ok);
                println!(
                    "{} {} seed={} plant_bug={}: {} (expected {})",
                    if ok { "ok  " } else { "MISMATCH" },
                    shown(path),
                    spec.seed,
                    plant_bug.map_or("none", PlantedBug::name),
                    if outcome.failed() {
                        format!("fails: {}", outcome.reason())
                    } else {
                        "passes".to_string()
                    },
                    if expect_failure { "failure" } else { "pass" }
                );
            }
        }
        println!("replayed={} mismatches={mismatches}", files.len());
        Ok(if mismatches == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_planted_bugs_are_rejected_by_the_cli() {
        let error = Cli::try_parse_from([
            "narad-sim",
            "run",
            "--scenario",
            "basic",
            "--seed",
            "1",
            "--plant-bug",
            "lose-everything",
        ])
        .unwrap_err();
        assert!(error.to_string().contains("unknown planted bug"), "{error}");
    }

    #[test]
    fn every_subcommand_parses() {
        for argv in [
            &[
                "narad-sim",
                "run",
                "--scenario",
                "basic",
                "--seed",
                "7",
                "--trace",
                "--check-determinism",
            ][..],
            &[
                "narad-sim",
                "run",
                "--scenario",
                "basic",
                "--seed",
                "7",
                "--plant-bug",
                "ack-before-fsync",
            ],
            &["narad-sim", "sweep", "--seeds", "1..300", "--jobs", "2"],
            &[
                "narad-sim",
                "sweep",
                "--scenario",
                "a",
                "--scenario",
                "b",
                "--seeds",
                "1..=3",
            ],
            &["narad-sim", "shrink", "--scenario", "basic", "--seed", "9"],
            &["narad-sim", "replay"],
        ] {
            Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        }
    }

    #[test]
    fn a_bad_seed_range_is_rejected() {
        assert!(Cli::try_parse_from(["narad-sim", "sweep", "--seeds", "9..3"]).is_err());
    }
}
