//! Waiting on a node's observable state: its Prometheus metrics and bounded polls.
//!
//! Dispatch is asynchronous (a 202 means durable in the WAL, not visible), so a test that checks what
//! became visible waits for it: [`wait_until`] polls a probe every [`POLL_INTERVAL`] until it answers or
//! [`WAIT_TIMEOUT`] passes, and [`wait_backlog_drained`] waits for `narad_ingress_dispatch_backlog_records`
//! to read 0 (every accepted record committed and the checkpoint stored past it).

use std::time::Duration;

use crate::Node;

/// Longest wait for an asynchronous outcome.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Polls `probe` until it returns `Some`, at most [`WAIT_TIMEOUT`]; panics naming `what` otherwise.
pub fn wait_until<T>(what: &str, probe: impl FnMut() -> Option<T>) -> T {
    poll_until(what, WAIT_TIMEOUT, POLL_INTERVAL, probe)
}

/// Polls `probe` every `interval` until it returns `Some`, at most `timeout` (for bounds the contract
/// under test names, such as a failure detector's delay, and for probes that ask several processes,
/// which should not poll at [`POLL_INTERVAL`]); panics naming `what` otherwise.
#[allow(clippy::disallowed_methods)] // Waiting on a real process needs the real clock and a pause.
pub fn poll_until<T>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(interval);
    }
}

/// The value of one exact series (`name` or `name{labels}`) in Prometheus text, if present.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// The sum of every series of `name` (any labels), 0 when there is none.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if rest.starts_with('{') {
                &rest[rest.find("} ")? + 2..]
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

/// The node's `/metrics` text.
pub fn metrics_text(node: &Node) -> String {
    let response = node.get("/metrics");
    assert_eq!(response.status, 200, "{}", response.text());
    response.text()
}

/// Waits until `narad_ingress_dispatch_backlog_records` reads 0; returns the metrics text then.
pub fn wait_backlog_drained(node: &Node) -> String {
    wait_until("the dispatch backlog to drain", || {
        let text = metrics_text(node);
        (metric(&text, "narad_ingress_dispatch_backlog_records") == Some(0.0)).then_some(text)
    })
}

/// Every partition's high watermark, from `GET /v1/topics/{t}`.
pub fn high_watermarks(node: &Node, topic: &str) -> Vec<u64> {
    let got = node.get(&format!("/v1/topics/{topic}"));
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["partition_stats"]
        .as_array()
        .expect("partition_stats")
        .iter()
        .map(|stat| stat["high_watermark"].as_u64().expect("high_watermark"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE narad_x counter\nnarad_x_total{a=\"1\"} 2\nnarad_x_total{a=\"2\"} 3.5\nnarad_y 7\nnarad_y_sum 1\n";

    #[test]
    fn exact_series_and_sums_are_read() {
        assert_eq!(metric(TEXT, "narad_y"), Some(7.0));
        assert_eq!(metric(TEXT, "narad_x_total{a=\"2\"}"), Some(3.5));
        assert_eq!(metric(TEXT, "narad_z"), None);
        assert_eq!(metric_sum(TEXT, "narad_x_total"), 5.5);
        assert_eq!(metric_sum(TEXT, "narad_y"), 7.0);
    }
}
