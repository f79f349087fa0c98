//! A run's timeline: one self-contained HTML page with an SVG of what happened, for a developer
//! replaying a seed (`ci/sim run ... --timeline out.html`).
//!
//! Nodes are lanes, time runs left to right. Faults are bands on the lanes they strike (a partition
//! on both sides, a network episode across every lane); produce calls are bars by the node that
//! took them (202, failed, timed out or refused), commits that became visible are marks on the
//! owner's lane, the harness's reads are diamonds; reroutes and 412s are arrows from the node that
//! sent the records to the owner of the partition they went to. A failed run is outlined in red,
//! with its reason, and the calls whose records it lost or did not see are red marks.
//!
//! The runner gathers [`TimelineData`] (madsim only); the node's own events come from the trace
//! ([`dispatch_events`]); rendering is a plain function, unit-tested in normal builds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A fault as the run applied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultBand {
    /// Its kind ([`crate::fault::FaultEvent::kind_name`], or `kept-down`, `final-crash`).
    pub kind: &'static str,
    /// What it was, as the trace describes it.
    pub label: String,
    /// The node it struck; `None`: the whole network.
    pub node: Option<usize>,
    /// A partition's other side: `Some(Some(p))` one peer, `Some(None)` every other node.
    pub peer: Option<Option<usize>>,
    /// When it began, in simulated nanoseconds.
    pub start_ns: u64,
    /// When it ended.
    pub end_ns: u64,
}

/// One produce call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallMark {
    /// The node that took it.
    pub node: usize,
    /// When it was sent.
    pub at_ns: u64,
    /// How it ended (`202`, `5xx`, `timeout`, `refused`, ...).
    pub outcome: &'static str,
    /// Records it carried.
    pub records: u64,
    /// One of its records was lost or unseen.
    pub failed_record: bool,
}

/// A read of every partition by the harness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadMark {
    /// When it finished.
    pub at_ns: u64,
    /// Which read (`liveness`, `final`).
    pub what: String,
    /// Records served.
    pub served: u64,
    /// 202'd records it did not find.
    pub missing: u64,
}

/// Records that went from one node to another's partition: a reroute or a 412.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrow {
    /// The node that sent them.
    pub from: usize,
    /// The owner they went to.
    pub to: usize,
    /// When.
    pub at_ns: u64,
    /// How many records (reroutes) or commits (412s).
    pub count: u64,
}

/// Commits the node's dispatchers reported, read from the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchEvents {
    /// Commits that landed, as (owner, at_ns, records): their records are visible from then on.
    pub visible: Vec<(usize, u64, u64)>,
    /// Commits answered 412 (another incarnation at the owner), as arrows sender → owner.
    pub stale: Vec<Arrow>,
}

/// Everything the page shows.
#[derive(Clone, Debug, Default)]
pub struct TimelineData {
    /// The scenario's path.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The planted bug, if any.
    pub plant_bug: Option<String>,
    /// Nodes in the run.
    pub nodes: usize,
    /// When the safety phase ended (the heal).
    pub safety_end_ns: u64,
    /// When the run ended.
    pub end_ns: u64,
    /// Faults applied.
    pub faults: Vec<FaultBand>,
    /// Produce calls.
    pub calls: Vec<CallMark>,
    /// The harness's reads.
    pub reads: Vec<ReadMark>,
    /// Rerouted records, by sender, owner and time.
    pub reroutes: Vec<Arrow>,
    /// The owner of each partition (`topic/partition`), for the trace's commits.
    pub owners: BTreeMap<String, usize>,
    /// The verdict line.
    pub verdict: String,
    /// Why the run failed; `None`: it passed.
    pub failure: Option<String>,
}

/// Reads the dispatchers' commits from trace lines (`[ t s] dispatch@N commit #k topic/p
/// records=R`, `... commit #k done`, `... commit #k failed: IncarnationMismatch ...`; node 0's
/// source has no `@0`), placing each on the owner `owners` names.
pub fn dispatch_events(lines: &[String], owners: &BTreeMap<String, usize>) -> DispatchEvents {
    let mut events = DispatchEvents::default();
    // (node, commit id) → (partition, records)
    let mut open: BTreeMap<(usize, u64), (String, u64)> = BTreeMap::new();
    for line in lines {
        let Some((at_ns, source, text)) = split_line(line) else {
            continue;
        };
        let node = match source {
            "dispatch" => 0,
            other => match other.strip_prefix("dispatch@").and_then(|n| n.parse().ok()) {
                Some(node) => node,
                None => continue,
            },
        };
        let Some(rest) = text.strip_prefix("commit #") else {
            continue;
        };
        let (id, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let Ok(id) = id.parse::<u64>() else {
            continue;
        };
        if rest == "done" {
            if let Some((partition, records)) = open.remove(&(node, id)) {
                if let Some(&owner) = owners.get(&partition) {
                    events.visible.push((owner, at_ns, records));
                }
            }
        } else if let Some(failure) = rest.strip_prefix("failed: ") {
            let Some((partition, _)) = open.remove(&(node, id)) else {
                continue;
            };
            if failure.starts_with("IncarnationMismatch") {
                if let Some(&owner) = owners.get(&partition) {
                    events.stale.push(Arrow {
                        from: node,
                        to: owner,
                        at_ns,
                        count: 1,
                    });
                }
            }
        } else if let Some((partition, records)) = rest.split_once(" records=") {
            let records = records
                .split(' ')
                .next()
                .and_then(|count| count.parse().ok())
                .unwrap_or(0);
            open.insert((node, id), (partition.to_string(), records));
        }
    }
    events
}

/// What the trace alone shows, for a run that ended before its verdict (a node's assertion, the
/// time limit): the faults applied and the produce calls, from their trace lines.
pub fn from_trace(lines: &[String], nodes: usize) -> TimelineData {
    let mut data = TimelineData {
        nodes,
        ..TimelineData::default()
    };
    for line in lines {
        let Some((at_ns, source, text)) = split_line(line) else {
            continue;
        };
        data.end_ns = data.end_ns.max(at_ns);
        match source {
            "fault" => {
                let Some(fault) = text.strip_prefix("apply ") else {
                    continue;
                };
                let (label, node) = match fault.rsplit_once(" to node ") {
                    Some((label, node)) => (label, node.parse::<usize>().ok()),
                    None => (fault, None),
                };
                let word = |key: &str| {
                    label
                        .split_whitespace()
                        .find_map(|field| field.strip_prefix(key))
                };
                let kind = match label.split_whitespace().next().unwrap_or("") {
                    "disk" => match label.split_whitespace().nth(1) {
                        Some("WriteEio") => "write-eio",
                        Some("Enospc") => "enospc",
                        _ => "fsync-eio",
                    },
                    other => match crate::fault::KIND_NAMES.iter().find(|kind| **kind == other) {
                        Some(kind) => kind,
                        None => continue,
                    },
                };
                let duration_ms: u64 = word("duration_ms=")
                    .or_else(|| word("down_ms="))
                    .and_then(|ms| ms.parse().ok())
                    .unwrap_or(0);
                let peer = (kind == "partition")
                    .then(|| word("peer=").and_then(|peer| peer.parse::<usize>().ok()));
                data.faults.push(FaultBand {
                    kind,
                    label: label.to_string(),
                    node,
                    peer,
                    start_ns: at_ns,
                    end_ns: at_ns + duration_ms * 1_000_000,
                });
            }
            "client" => {
                let Some(rest) = text.strip_prefix("produce #") else {
                    continue;
                };
                let node = rest
                    .split_once("via node ")
                    .and_then(|(_, tail)| tail.split_whitespace().next())
                    .and_then(|node| node.parse().ok())
                    .unwrap_or(0);
                let records = rest
                    .split_once("records=")
                    .and_then(|(_, tail)| tail.split_whitespace().next())
                    .and_then(|records| records.parse().ok())
                    .unwrap_or(0);
                let outcome = match rest.rsplit_once("-> ").map(|(_, outcome)| outcome.trim()) {
                    Some("202") => "202",
                    Some("refused") => "refused",
                    Some("timeout") => "timeout",
                    _ => "5xx",
                };
                data.calls.push(CallMark {
                    node,
                    at_ns,
                    outcome,
                    records,
                    failed_record: false,
                });
            }
            _ => {}
        }
    }
    data
}

/// `[   1.234567s] source  text` → (ns, source, text).
fn split_line(line: &str) -> Option<(u64, &str, &str)> {
    let rest = line.strip_prefix('[')?;
    let (time, rest) = rest.split_once("s]")?;
    let seconds: f64 = time.trim().parse().ok()?;
    let rest = rest.trim_start();
    let (source, text) = rest.split_once(' ')?;
    Some(((seconds * 1e9) as u64, source, text.trim_start()))
}

/// Sums arrows of the same sender and owner within `bin_ns` of each other into one.
pub fn bin_arrows(arrows: &[Arrow], bin_ns: u64) -> Vec<Arrow> {
    let bin_ns = bin_ns.max(1);
    let mut bins: BTreeMap<(u64, usize, usize), u64> = BTreeMap::new();
    for arrow in arrows {
        *bins
            .entry((arrow.at_ns / bin_ns, arrow.from, arrow.to))
            .or_default() += arrow.count;
    }
    bins.into_iter()
        .map(|((bin, from, to), count)| Arrow {
            from,
            to,
            at_ns: bin * bin_ns + bin_ns / 2,
            count,
        })
        .collect()
}

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 80.0;
const LANE: f64 = 90.0;
/// Columns the calls are summed into.
const CALL_BINS: u64 = 300;

fn fault_color(kind: &str) -> &'static str {
    match kind {
        "crash" | "final-crash" => "#d62728",
        "kept-down" => "#8c1c13",
        "pause" => "#9467bd",
        "partition" => "#ff7f0e",
        "net" => "#bcbd22",
        "slow-disk" => "#17becf",
        "bit-rot" => "#8c564b",
        "lag" => "#7f7f7f",
        _ => "#e377c2", // disk errors
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page.
pub fn render(data: &TimelineData, dispatch: &DispatchEvents) -> String {
    let mut plot = Plot::new(data.nodes, data.end_ns);
    plot.draw_verdict(data);
    plot.draw_lanes_and_axis(data.safety_end_ns);
    plot.draw_faults(&data.faults);
    plot.draw_calls(&data.calls);
    plot.draw_failed_records(&data.calls);
    plot.draw_visible(&dispatch.visible);
    plot.draw_arrows(&data.reroutes, &dispatch.stale);
    plot.draw_reads(&data.reads);
    plot.draw_legend();
    html_page(data, &plot.finish())
}

/// The SVG being drawn and its geometry: nodes are lanes, `[0, end_ns]` spans the plot's width.
struct Plot {
    svg: String,
    nodes: usize,
    end_ns: u64,
    /// The plot's width between the margins.
    width: f64,
}

impl Plot {
    /// An SVG with its arrowhead defined, for `nodes` lanes over `end_ns` of simulated time.
    fn new(nodes: usize, end_ns: u64) -> Plot {
        let mut plot = Plot {
            svg: String::new(),
            nodes: nodes.max(1),
            end_ns: end_ns.max(1),
            width: WIDTH - LEFT - RIGHT,
        };
        let height = plot.height();
        let _ = write!(
            plot.svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(
            plot.svg,
            r##"<defs><marker id="head" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="context-stroke"/></marker></defs>"##
        );
        plot
    }

    fn x(&self, ns: u64) -> f64 {
        LEFT + self.width * (ns.min(self.end_ns) as f64 / self.end_ns as f64)
    }

    fn lane_top(&self, node: usize) -> f64 {
        TOP + LANE * node as f64
    }

    fn lane_mid(&self, node: usize) -> f64 {
        self.lane_top(node) + LANE / 2.0
    }

    fn axis_y(&self) -> f64 {
        TOP + LANE * self.nodes as f64
    }

    fn height(&self) -> f64 {
        self.axis_y() + 70.0
    }

    /// The time one column of calls (and of visible commits) sums.
    fn bin_ns(&self) -> u64 {
        (self.end_ns / CALL_BINS).max(1)
    }

    /// One column's width.
    fn column(&self) -> f64 {
        (self.width / CALL_BINS as f64).max(1.0)
    }

    /// Passed, or the page outlined in red with the failure; then the verdict.
    fn draw_verdict(&mut self, data: &TimelineData) {
        if let Some(reason) = &data.failure {
            let _ = write!(
                self.svg,
                r##"<rect x="1" y="1" width="{}" height="{}" fill="none" stroke="#d62728" stroke-width="4"/><text x="{LEFT}" y="24" fill="#d62728" font-size="16" font-weight="bold">FAILED: {}</text>"##,
                WIDTH - 2.0,
                self.height() - 2.0,
                escape(reason)
            );
        } else {
            let _ = write!(
                self.svg,
                r##"<text x="{LEFT}" y="24" fill="#2ca02c" font-size="16" font-weight="bold">passed</text>"##
            );
        }
        let _ = write!(
            self.svg,
            r##"<text x="{LEFT}" y="44">{}</text>"##,
            escape(&data.verdict)
        );
    }

    /// The lanes, the time axis and the line where faults heal.
    fn draw_lanes_and_axis(&mut self, safety_end_ns: u64) {
        let plot = self.width;
        for node in 0..self.nodes {
            let fill = if node % 2 == 0 { "#f7f7f7" } else { "#efefef" };
            let _ = write!(
                self.svg,
                r##"<rect x="{LEFT}" y="{}" width="{plot}" height="{LANE}" fill="{fill}"/><text x="8" y="{}" font-weight="bold">node {node}</text>"##,
                self.lane_top(node),
                self.lane_mid(node) + 4.0
            );
        }
        let axis_y = self.axis_y();
        let step_s = ((self.end_ns as f64 / 1e9) / 15.0).ceil().max(1.0) as u64;
        let mut second = 0;
        while second * 1_000_000_000 <= self.end_ns {
            let at = self.x(second * 1_000_000_000);
            let _ = write!(
                self.svg,
                r##"<line x1="{at}" y1="{TOP}" x2="{at}" y2="{}" stroke="#ccc"/><text x="{at}" y="{}" text-anchor="middle">{second} s</text>"##,
                axis_y + 4.0,
                axis_y + 18.0
            );
            second += step_s;
        }
        let heal = self.x(safety_end_ns);
        let _ = write!(
            self.svg,
            r##"<line x1="{heal}" y1="{}" x2="{heal}" y2="{}" stroke="#2ca02c" stroke-width="2" stroke-dasharray="6 3"/><text x="{heal}" y="{}" fill="#2ca02c" text-anchor="middle">heal: liveness phase</text>"##,
            TOP - 10.0,
            axis_y,
            TOP - 14.0
        );
    }

    /// A band per fault on each lane it struck.
    fn draw_faults(&mut self, faults: &[FaultBand]) {
        for band in faults {
            let x0 = self.x(band.start_ns);
            let w = (self.x(band.end_ns) - x0).max(2.0);
            let color = fault_color(band.kind);
            let title = escape(&format!(
                "{} ({:.3}-{:.3} s)",
                band.label,
                band.start_ns as f64 / 1e9,
                band.end_ns as f64 / 1e9
            ));
            let lanes: Vec<usize> = match (band.node, band.peer) {
                (None, _) => (0..self.nodes).collect(),
                (Some(node), None) => vec![node],
                (Some(node), Some(Some(peer))) => vec![node, peer],
                (Some(node), Some(None)) => vec![node],
            };
            for lane in lanes {
                if lane >= self.nodes {
                    continue;
                }
                let _ = write!(
                    self.svg,
                    r##"<rect x="{x0}" y="{}" width="{w}" height="{}" fill="{color}" fill-opacity="0.35" stroke="{color}"><title>{title}</title></rect><text x="{}" y="{}" fill="{color}" font-size="11">{}</text>"##,
                    self.lane_top(lane) + 2.0,
                    LANE - 4.0,
                    x0 + 2.0,
                    self.lane_top(lane) + 13.0,
                    escape(band.kind)
                );
            }
        }
    }

    /// Produce calls, summed per column: 202s up from the lane's middle, the rest down.
    fn draw_calls(&mut self, calls: &[CallMark]) {
        let bin_ns = self.bin_ns();
        let mut bins: BTreeMap<(usize, u64), [u64; 3]> = BTreeMap::new();
        for call in calls {
            let slot = match call.outcome {
                "202" => 0,
                "pending" | "refused" => 2,
                _ => 1,
            };
            bins.entry((call.node, call.at_ns / bin_ns)).or_default()[slot] += call.records;
        }
        let peak = bins
            .values()
            .map(|counts| counts.iter().copied().max().unwrap_or(0))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let column = self.column();
        for ((node, bin), counts) in &bins {
            if *node >= self.nodes {
                continue;
            }
            let x0 = self.x(bin * bin_ns);
            let scale = (LANE / 2.0 - 16.0) / peak;
            let mid = self.lane_mid(*node);
            if counts[0] > 0 {
                let h = (counts[0] as f64 * scale).max(1.0);
                let _ = write!(
                    self.svg,
                    r##"<rect x="{x0}" y="{}" width="{column}" height="{h}" fill="#2ca02c"><title>{} records 202</title></rect>"##,
                    mid - h,
                    counts[0]
                );
            }
            let mut below = mid;
            for (slot, color, what) in [
                (1, "#ff7f0e", "failed or timed out"),
                (2, "#7f7f7f", "refused or pending"),
            ] {
                if counts[slot] > 0 {
                    let h = (counts[slot] as f64 * scale).max(1.0);
                    let _ = write!(
                        self.svg,
                        r##"<rect x="{x0}" y="{below}" width="{column}" height="{h}" fill="{color}"><title>{} records {what}</title></rect>"##,
                        counts[slot]
                    );
                    below += h;
                }
            }
        }
    }

    /// A red mark under each call one of whose records was lost or unseen.
    fn draw_failed_records(&mut self, calls: &[CallMark]) {
        for call in calls.iter().filter(|call| call.failed_record) {
            if call.node >= self.nodes {
                continue;
            }
            let _ = write!(
                self.svg,
                r##"<circle cx="{}" cy="{}" r="4" fill="#d62728"><title>a record of this call ({}, {} records at {:.3} s) was lost or unseen</title></circle>"##,
                self.x(call.at_ns),
                self.lane_top(call.node) + LANE - 8.0,
                call.outcome,
                call.records,
                call.at_ns as f64 / 1e9
            );
        }
    }

    /// Visible commits: a tick on the owner's lane, just above its bottom.
    fn draw_visible(&mut self, commits: &[(usize, u64, u64)]) {
        let bin_ns = self.bin_ns();
        let column = self.column();
        let mut visible: BTreeMap<(usize, u64), u64> = BTreeMap::new();
        for &(owner, at_ns, records) in commits {
            *visible.entry((owner, at_ns / bin_ns)).or_default() += records;
        }
        for ((owner, bin), records) in &visible {
            if *owner >= self.nodes {
                continue;
            }
            let _ = write!(
                self.svg,
                r##"<rect x="{}" y="{}" width="{column}" height="4" fill="#1f77b4"><title>{records} records visible</title></rect>"##,
                self.x(bin * bin_ns),
                self.lane_top(*owner) + LANE - 18.0
            );
        }
    }

    /// Reroutes and 412s, binned, as arrows from the sender's lane to the owner's.
    fn draw_arrows(&mut self, reroutes: &[Arrow], stale: &[Arrow]) {
        let arrow_bin = (self.end_ns / 60).max(1);
        for (arrows, color, what) in [
            (bin_arrows(reroutes, arrow_bin), "#6a3d9a", "rerouted"),
            (bin_arrows(stale, arrow_bin), "#e31a1c", "412"),
        ] {
            for arrow in arrows {
                if arrow.from >= self.nodes || arrow.to >= self.nodes || arrow.from == arrow.to {
                    continue;
                }
                let at = self.x(arrow.at_ns);
                let width = 1.0 + (arrow.count as f64).log10().max(0.0);
                let _ = write!(
                    self.svg,
                    r##"<line x1="{at}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="{width:.1}" marker-end="url(#head)"><title>{} {what}: node {} to node {}</title></line>"##,
                    self.lane_mid(arrow.from),
                    at + 6.0,
                    self.lane_mid(arrow.to),
                    arrow.count,
                    arrow.from,
                    arrow.to
                );
            }
        }
    }

    /// The harness's reads: diamonds above the lanes, red when they missed records.
    fn draw_reads(&mut self, reads: &[ReadMark]) {
        for (index, read) in reads.iter().enumerate() {
            let at = self.x(read.at_ns);
            // Reads sit close together at the end: stagger their labels, and keep them on the page.
            let label_y = TOP - 30.0 - 14.0 * (index % 2) as f64;
            let anchor = if at > WIDTH - 120.0 { "end" } else { "middle" };
            let color = if read.missing > 0 {
                "#d62728"
            } else {
                "#1f77b4"
            };
            let _ = write!(
                self.svg,
                r##"<path d="M{at},{y0} l6,6 l-6,6 l-6,-6 z" fill="{color}"><title>{} read at {:.3} s: {} served, {} missing</title></path><text x="{at}" y="{label_y}" text-anchor="{anchor}" fill="{color}">{} read</text>"##,
                escape(&read.what),
                read.at_ns as f64 / 1e9,
                read.served,
                read.missing,
                escape(&read.what),
                y0 = TOP - 26.0,
            );
        }
    }

    fn draw_legend(&mut self) {
        let legend_y = self.axis_y() + 40.0;
        let mut lx = LEFT;
        for (color, what) in [
            ("#2ca02c", "202'd records"),
            ("#ff7f0e", "failed / timed out"),
            ("#1f77b4", "visible at owner"),
            ("#6a3d9a", "reroute arrow"),
            ("#e31a1c", "412 arrow"),
            ("#d62728", "crash / lost or unseen"),
            ("#9467bd", "pause"),
            ("#ff7f0e", "partition"),
            ("#bcbd22", "net loss/latency"),
            ("#17becf", "slow disk"),
            ("#e377c2", "disk errors"),
            ("#7f7f7f", "view held (lag)"),
        ] {
            let _ = write!(
                self.svg,
                r##"<rect x="{lx}" y="{}" width="12" height="12" fill="{color}"/><text x="{}" y="{legend_y}">{what}</text>"##,
                legend_y - 10.0,
                lx + 16.0
            );
            lx += 16.0 + 6.5 * what.len() as f64 + 14.0;
        }
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>");
        self.svg
    }
}

/// The HTML page around the SVG, with a table of the faults.
fn html_page(data: &TimelineData, svg: &str) -> String {
    let title = format!(
        "narad-sim {} seed {}{}",
        data.scenario,
        data.seed,
        data.plant_bug
            .as_ref()
            .map(|bug| format!(" plant-bug {bug}"))
            .unwrap_or_default()
    );
    let mut faults = String::new();
    for band in &data.faults {
        let node = match band.node {
            Some(node) => format!("node {node}"),
            None => "every node".to_string(),
        };
        let _ = write!(
            faults,
            "<tr><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{node}</td><td>{}</td></tr>",
            band.start_ns as f64 / 1e9,
            band.end_ns as f64 / 1e9,
            escape(band.kind),
            escape(&band.label)
        );
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title>\
         <style>body{{font-family:sans-serif;margin:16px}}table{{border-collapse:collapse}}\
         td,th{{border:1px solid #ccc;padding:2px 8px;font-size:12px}}</style></head><body>\
         <h2>{title}</h2>{svg}<h3>Faults</h3><table><tr><th>from s</th><th>to s</th><th>kind</th>\
         <th>node</th><th>fault</th></tr>{faults}</table></body></html>\n",
        title = escape(&title)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[&str]) -> Vec<String> {
        text.iter().map(|line| line.to_string()).collect()
    }

    #[test]
    fn commits_become_visible_marks_and_412s_become_arrows_to_the_owner() {
        let owners = BTreeMap::from([("orders/1".to_string(), 2), ("events/0".to_string(), 0)]);
        let trace = lines(&[
            "[   1.000000s] dispatch@1 commit #4 orders/1 records=3",
            "[   1.100000s] dispatch commit #9 events/0 records=2",
            "[   1.200000s] dispatch@1 commit #4 done",
            "[   1.300000s] dispatch commit #9 failed: IncarnationMismatch { record_topic_id: TopicId(1), live_topic_id: Some(TopicId(2)) }",
            "[   1.400000s] dispatch@1 commit #5 failed: Timeout",
            "[   1.500000s] client  produce #1 via node 0 orders#1 records=1 partition=None -> 202",
        ]);
        let events = dispatch_events(&trace, &owners);
        assert_eq!(events.visible, vec![(2, 1_200_000_000, 3)]);
        assert_eq!(
            events.stale,
            vec![Arrow {
                from: 0,
                to: 0,
                at_ns: 1_300_000_000,
                count: 1
            }]
        );
    }

    #[test]
    fn a_run_without_a_verdict_still_shows_its_faults_and_calls() {
        let trace = lines(&[
            "[   1.000000s] fault   apply crash down_ms=1500 node=2 to node 2",
            "[   2.000000s] fault   apply partition peer=1 two-way duration_ms=500 to node 0",
            "[   2.500000s] fault   apply net loss_ppm=10 latency_us=1..2 duration_ms=100",
            "[   3.000000s] client  produce #7 via node 1 orders#1 records=4 partition=None -> 202",
        ]);
        let data = from_trace(&trace, 3);
        assert_eq!(data.end_ns, 3_000_000_000);
        let kinds: Vec<_> = data
            .faults
            .iter()
            .map(|band| (band.kind, band.node))
            .collect();
        assert_eq!(
            kinds,
            vec![("crash", Some(2)), ("partition", Some(0)), ("net", None)]
        );
        assert_eq!(data.faults[0].end_ns, 2_500_000_000);
        assert_eq!(data.faults[1].peer, Some(Some(1)));
        assert_eq!(data.calls.len(), 1);
        assert_eq!((data.calls[0].node, data.calls[0].records), (1, 4));
    }

    #[test]
    fn arrows_of_one_pair_within_a_bin_are_summed() {
        let arrow = |from, to, at_ns, count| Arrow {
            from,
            to,
            at_ns,
            count,
        };
        let binned = bin_arrows(
            &[arrow(0, 1, 10, 2), arrow(0, 1, 90, 3), arrow(1, 0, 50, 1)],
            100,
        );
        assert_eq!(binned, vec![arrow(0, 1, 50, 5), arrow(1, 0, 50, 1)]);
    }

    #[test]
    fn the_page_names_every_node_and_fault_and_outlines_a_failure() {
        let data = TimelineData {
            scenario: "scenarios/x.toml".into(),
            seed: 7,
            nodes: 3,
            safety_end_ns: 5_000_000_000,
            end_ns: 9_000_000_000,
            faults: vec![
                FaultBand {
                    kind: "partition",
                    label: "partition node=0 peer=2".into(),
                    node: Some(0),
                    peer: Some(Some(2)),
                    start_ns: 1_000_000_000,
                    end_ns: 2_000_000_000,
                },
                FaultBand {
                    kind: "net",
                    label: "net loss_ppm=5000".into(),
                    node: None,
                    peer: None,
                    start_ns: 3_000_000_000,
                    end_ns: 4_000_000_000,
                },
            ],
            calls: vec![CallMark {
                node: 1,
                at_ns: 1_500_000_000,
                outcome: "202",
                records: 4,
                failed_record: true,
            }],
            reroutes: vec![Arrow {
                from: 1,
                to: 2,
                at_ns: 1_600_000_000,
                count: 4,
            }],
            failure: Some("lost=1 <x>".into()),
            ..TimelineData::default()
        };
        let page = render(&data, &DispatchEvents::default());
        for node in 0..3 {
            assert!(page.contains(&format!(">node {node}</text>")));
        }
        assert!(page.contains("partition node=0 peer=2"));
        assert!(page.contains("net loss_ppm=5000"));
        assert!(page.contains("FAILED: lost=1 &lt;x&gt;"));
        assert!(page.contains("4 rerouted: node 1 to node 2"));
        assert!(page.contains("was lost or unseen"));
        assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    }
}
