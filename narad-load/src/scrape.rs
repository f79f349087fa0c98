//! Reading the node's `/metrics` text (Prometheus or OpenMetrics exposition) back into numbers, so
//! `narad bench` and the black-box tests can compare two scrapes.
//!
//! Only what those callers need: samples (`name{labels} value`), sums over label sets, and cumulative
//! histograms (`<name>_bucket{le=...}`) with their difference and quantiles. Comment lines (`# HELP`,
//! `# TYPE`, `# EOF`) are skipped; a line that does not parse is skipped too (a scrape is diagnostics,
//! never a reason to fail a benchmark), and counted in [`Scrape::skipped_lines`].

/// The most samples one scrape keeps; the rest are dropped (and counted as skipped).
pub const SAMPLES_MAX: usize = 100_000;

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Metric name as exposed (with `_total`, `_bucket`, ... suffixes).
    pub name: String,
    /// Labels in order of appearance, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of a label.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// A parsed scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    /// Every sample, in order.
    pub samples: Vec<Sample>,
    /// Non-comment lines that did not parse.
    pub skipped_lines: usize,
}

impl Scrape {
    /// Parses exposition text.
    pub fn parse(text: &str) -> Scrape {
        let mut scrape = Scrape::default();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_sample(line) {
                Some(sample) if scrape.samples.len() < SAMPLES_MAX => scrape.samples.push(sample),
                Some(_) | None => scrape.skipped_lines += 1,
            }
        }
        scrape
    }

    /// The first sample named `name` whose labels include every `(key, value)` of `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|sample| sample.name == name && has_labels(sample, labels))
            .map(|sample| sample.value)
    }

    /// The value of an unlabelled (or first) sample named `name`.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.get(name, &[])
    }

    /// The sum of every sample named `name` (0 when there is none), e.g. a counter over all its
    /// label sets.
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .iter()
            .filter(|sample| sample.name == name)
            .map(|sample| sample.value)
            .sum()
    }

    /// The histogram `name` (the family name, without `_bucket`), its buckets summed over every label
    /// set; `None` when it has no buckets.
    pub fn histogram(&self, name: &str) -> Option<Histogram> {
        let bucket_name = format!("{name}_bucket");
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for sample in self.samples.iter().filter(|s| s.name == bucket_name) {
            let Some(bound) = sample.label("le").and_then(parse_value) else {
                continue;
            };
            match buckets.iter_mut().find(|(le, _)| *le == bound) {
                Some((_, count)) => *count += sample.value,
                None => buckets.push((bound, sample.value)),
            }
        }
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram { buckets })
    }
}

fn has_labels(sample: &Sample, wanted: &[(&str, &str)]) -> bool {
    wanted
        .iter()
        .all(|(key, value)| sample.label(key) == Some(*value))
}

/// A cumulative histogram: `(upper bound, observations ≤ bound)`, bounds ascending, the last normally
/// `+Inf`.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// The buckets.
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// Observations in total (the `+Inf` bucket).
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |(_, count)| *count)
    }

    /// What was observed between `earlier` and `self` (bucket by bucket; bounds missing from `earlier`
    /// count from 0).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let buckets = self
            .buckets
            .iter()
            .map(|(bound, count)| {
                let before = earlier
                    .buckets
                    .iter()
                    .find(|(le, _)| le == bound)
                    .map_or(0.0, |(_, c)| *c);
                (*bound, (count - before).max(0.0))
            })
            .collect();
        Histogram { buckets }
    }

    /// The upper bound of the first bucket holding the `q` quantile (what the histogram can promise:
    /// at least a fraction `q` of observations were ≤ it). `None` when empty.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        self.buckets
            .iter()
            .find(|(_, count)| *count >= rank)
            .map(|(bound, _)| *bound)
    }

    /// The `q` quantile interpolated linearly inside its bucket, as Prometheus's `histogram_quantile`
    /// does (the lower edge of the first bucket is 0; a quantile in the `+Inf` bucket answers the
    /// highest finite bound). `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for &(bound, count) in &self.buckets {
            if count >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let in_bucket = count - lower.1;
                if in_bucket <= 0.0 {
                    return Some(bound);
                }
                return Some(lower.0 + (bound - lower.0) * (rank - lower.1) / in_bucket);
            }
            lower = (bound, count);
        }
        Some(lower.0)
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// `name{k="v",...} value [timestamp]` or `name value [timestamp]`.
fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inside) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inside)?;
        labels = parsed;
        rest = after;
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}` and returns the labels and the text after the `}`.
fn parse_labels(mut text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_key) = text.split_once('=')?;
        let mut chars = after_key.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            let (index, c) = chars.next()?;
            match c {
                '"' => break index,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        };
        labels.push((key.trim().to_string(), value));
        text = &after_key[1 + end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP narad_ingress_wal_failed 1 once latched.
# TYPE narad_ingress_wal_failed gauge
narad_ingress_wal_failed 1
narad_ingress_accepted_records_total 12345
narad_errors_total{component=\"http\",kind=\"5xx\"} 3
narad_errors_total{component=\"ingress\",kind=\"a \\\"quoted\\\", comma\"} 4
narad_h_sum 1.5
narad_h_count 10
narad_h_bucket{le=\"0.001\"} 2
narad_h_bucket{le=\"0.002\"} 6
narad_h_bucket{le=\"0.004\"} 10
narad_h_bucket{le=\"+Inf\"} 10
broken line
# EOF
";

    #[test]
    fn samples_parse_with_labels_and_escapes() {
        let scrape = Scrape::parse(TEXT);
        assert_eq!(scrape.value("narad_ingress_wal_failed"), Some(1.0));
        assert_eq!(
            scrape.value("narad_ingress_accepted_records_total"),
            Some(12345.0)
        );
        assert_eq!(
            scrape.get(
                "narad_errors_total",
                &[("component", "http"), ("kind", "5xx")]
            ),
            Some(3.0)
        );
        assert_eq!(
            scrape.get("narad_errors_total", &[("kind", "a \"quoted\", comma")]),
            Some(4.0)
        );
        assert_eq!(scrape.sum("narad_errors_total"), 7.0);
        assert_eq!(scrape.sum("absent"), 0.0);
        assert_eq!(scrape.skipped_lines, 1);
    }

    #[test]
    fn histograms_subtract_and_give_bounded_and_interpolated_quantiles() {
        let after = Scrape::parse(TEXT).histogram("narad_h").unwrap();
        let before = Histogram {
            buckets: vec![
                (0.001, 2.0),
                (0.002, 2.0),
                (0.004, 2.0),
                (f64::INFINITY, 2.0),
            ],
        };
        let delta = after.since(&before);
        assert_eq!(
            delta.buckets,
            vec![
                (0.001, 0.0),
                (0.002, 4.0),
                (0.004, 8.0),
                (f64::INFINITY, 8.0)
            ]
        );
        assert_eq!(delta.count(), 8.0);
        assert_eq!(delta.quantile_bound(0.5), Some(0.002));
        assert_eq!(delta.quantile_bound(0.99), Some(0.004));
        // rank 4 of 8 ends the (0.001, 0.002] bucket exactly.
        assert_eq!(delta.quantile(0.5), Some(0.002));
        // rank 6 is half-way through the (0.002, 0.004] bucket.
        assert_eq!(delta.quantile(0.75), Some(0.003));
    }

    #[test]
    fn a_quantile_in_the_inf_bucket_answers_the_highest_finite_bound() {
        let histogram = Histogram {
            buckets: vec![(1.0, 1.0), (f64::INFINITY, 10.0)],
        };
        assert_eq!(histogram.quantile(0.99), Some(1.0));
        assert_eq!(histogram.quantile_bound(0.99), Some(f64::INFINITY));
        let empty = Histogram {
            buckets: vec![(1.0, 0.0), (f64::INFINITY, 0.0)],
        };
        assert_eq!(empty.quantile(0.5), None);
    }
}
