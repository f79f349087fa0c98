//! How the client prints: human tables and lines, `--json` (one JSON value per result line, the
//! server's own JSON where there is one), and `--raw` payload bytes.
//!
//! Results go to stdout, written and flushed one line at a time so that a pipe sees each message as
//! it comes; errors and reports go to stderr.

use std::io::{self, Write};

use anyhow::Context as _;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// How messages are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageFormat {
    /// `partition/offset key payload`.
    Human,
    /// The server's message JSON, verbatim.
    Json,
    /// The payload's bytes alone.
    Raw,
}

impl MessageFormat {
    /// The format the flags ask for: `--raw` over `--json` over human.
    pub fn from_flags(raw: bool, json: bool) -> MessageFormat {
        if raw {
            MessageFormat::Raw
        } else if json {
            MessageFormat::Json
        } else {
            MessageFormat::Human
        }
    }
}

/// A consumed message, as the server's JSON carries it (`topic` and `timestamp` are not needed).
#[derive(Debug, Deserialize)]
pub struct Message<'a> {
    /// Partition index.
    pub partition: u64,
    /// Offset in the partition.
    pub offset: u64,
    /// The key, when the message has one.
    #[serde(default)]
    pub key: Option<String>,
    /// The payload as sent: embedded JSON verbatim, a JSON string, or base64 text.
    #[serde(borrow)]
    pub payload: &'a RawValue,
    /// `base64` when the payload is neither JSON nor UTF-8.
    #[serde(default)]
    pub payload_encoding: Option<String>,
    /// Queue mode's lease: `partition:offset:nonce`.
    #[serde(default)]
    pub receipt_handle: Option<String>,
}

impl<'a> Message<'a> {
    /// Parses a message body.
    pub fn parse(body: &'a [u8]) -> anyhow::Result<Message<'a>> {
        serde_json::from_slice(body).with_context(|| {
            format!(
                "the node answered a message this client does not understand: {}",
                String::from_utf8_lossy(body).trim()
            )
        })
    }

    /// The payload's bytes as they were produced: a JSON string's text, base64 decoded, or an
    /// embedded JSON value's text as it was sent.
    pub fn payload_bytes(&self) -> anyhow::Result<Vec<u8>> {
        let raw = self.payload.get();
        if !raw.starts_with('"') {
            return Ok(raw.as_bytes().to_vec());
        }
        let text: String = serde_json::from_str(raw).context("a malformed payload string")?;
        match self.payload_encoding.as_deref() {
            None => Ok(text.into_bytes()),
            Some("base64") => base64::engine::general_purpose::STANDARD
                .decode(text)
                .context("a malformed base64 payload"),
            Some(other) => anyhow::bail!("unknown payload_encoding {other:?}"),
        }
    }

    /// The human line: `partition/offset key payload` (`-` for no key; a base64 payload as
    /// `base64:…`, since its bytes may not be printable).
    pub fn human_line(&self) -> anyhow::Result<String> {
        let key = self.key.as_deref().unwrap_or("-");
        let raw = self.payload.get();
        let payload = if raw.starts_with('"') {
            let text: String = serde_json::from_str(raw).context("a malformed payload string")?;
            match self.payload_encoding.as_deref() {
                Some(encoding) => format!("{encoding}:{text}"),
                None => text,
            }
        } else {
            raw.to_string()
        };
        Ok(format!(
            "{}/{} {key} {payload}",
            self.partition, self.offset
        ))
    }
}

/// Prints one message body (the server's JSON) in `format`.
pub fn print_message(format: MessageFormat, body: &[u8]) -> anyhow::Result<()> {
    let line = match format {
        MessageFormat::Json => body.strip_suffix(b"\n").unwrap_or(body).to_vec(),
        MessageFormat::Raw => Message::parse(body)?.payload_bytes()?,
        MessageFormat::Human => Message::parse(body)?.human_line()?.into_bytes(),
    };
    print_line(&line)
}

/// Writes `line` and a newline to stdout, at once.
pub fn print_line(line: &[u8]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .context("cannot write to stdout")
}

/// Whether `error` is stdout's reader having gone away.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|error| error.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// `rows` under `headers`, each column as wide as its widest cell, two spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header_cells: Vec<String> = headers.iter().map(|header| header.to_string()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (column, cell) in row.iter().enumerate() {
            if column > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let width = widths.get(column).copied().unwrap_or(0);
            line.extend(std::iter::repeat_n(
                ' ',
                width.saturating_sub(cell.chars().count()),
            ));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// A JSON field as a table cell: strings bare, other values as JSON, `-` when absent or null.
pub fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "-".to_string(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Bytes in the largest binary unit that divides them (`10GiB`, `1536KiB`, `1000B`), as
/// `--retention-bytes` takes them.
pub fn size_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    if bytes == 0 {
        return "0B".to_string();
    }
    UNITS
        .iter()
        .find(|(scale, _)| bytes % scale == 0)
        .map(|(scale, unit)| format!("{}{unit}", bytes / scale))
        .unwrap_or_else(|| format!("{bytes}B"))
}

/// Milliseconds in the largest unit that divides them (`7d`, `2h`, `1500ms`), as `--retention`
/// takes them.
pub fn duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    if ms == 0 {
        return "0ms".to_string();
    }
    UNITS
        .iter()
        .find(|(scale, _)| ms % scale == 0)
        .map(|(scale, unit)| format!("{}{unit}", ms / scale))
        .unwrap_or_else(|| format!("{ms}ms"))
}

/// Unix seconds as a UTC time, `2026-07-29T12:00:00Z`.
pub fn utc_time(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let second_of_day = unix_seconds % 86_400;
    // Howard Hinnant's `civil_from_days`, for days since 1970-01-01 (never negative here).
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        second_of_day / 3_600,
        second_of_day % 3_600 / 60,
        second_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(json: &str) -> Message<'_> {
        Message::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn payloads_come_back_as_the_bytes_produced() {
        let embedded = message(
            r#"{"topic":"t","partition":2,"offset":0,"payload":{"b": [1, 2]},"timestamp":1}"#,
        );
        assert_eq!(embedded.payload_bytes().unwrap(), br#"{"b": [1, 2]}"#);
        assert_eq!(embedded.human_line().unwrap(), r#"2/0 - {"b": [1, 2]}"#);
        let text = message(
            r#"{"topic":"t","partition":0,"offset":7,"key":"k","payload":"\u003chi\u003e\n","timestamp":1}"#,
        );
        assert_eq!(text.payload_bytes().unwrap(), b"<hi>\n");
        assert_eq!(text.human_line().unwrap(), "0/7 k <hi>\n");
        let bytes = message(
            r#"{"topic":"t","partition":1,"offset":3,"payload":"/wD+","payload_encoding":"base64","timestamp":1,"receipt_handle":"1:3:9"}"#,
        );
        assert_eq!(bytes.payload_bytes().unwrap(), [0xff, 0x00, 0xfe]);
        assert_eq!(bytes.human_line().unwrap(), "1/3 - base64:/wD+");
        assert_eq!(bytes.receipt_handle.as_deref(), Some("1:3:9"));
        assert!(Message::parse(b"{\"partition\":1}").is_err());
    }

    #[test]
    fn the_format_follows_the_flags() {
        assert_eq!(MessageFormat::from_flags(true, true), MessageFormat::Raw);
        assert_eq!(MessageFormat::from_flags(false, true), MessageFormat::Json);
        assert_eq!(
            MessageFormat::from_flags(false, false),
            MessageFormat::Human
        );
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = vec![
            vec!["orders".to_string(), "3".to_string()],
            vec!["x".to_string(), "108".to_string()],
        ];
        assert_eq!(
            table(&["NAME", "PARTITIONS"], &rows),
            "NAME    PARTITIONS\norders  3\nx       108\n"
        );
        assert_eq!(table(&["ID"], &[]), "ID\n");
    }

    #[test]
    fn cells_durations_and_times_read_as_a_person_would() {
        assert_eq!(cell(Some(&Value::from("a"))), "a");
        assert_eq!(cell(Some(&Value::from(3))), "3");
        assert_eq!(cell(Some(&Value::Bool(true))), "true");
        assert_eq!(cell(None), "-");
        assert_eq!(duration_ms(604_800_000), "7d");
        assert_eq!(duration_ms(7_200_000), "2h");
        assert_eq!(duration_ms(30_000), "30s");
        assert_eq!(duration_ms(1_500), "1500ms");
        assert_eq!(duration_ms(0), "0ms");
        assert_eq!(size_bytes(10 << 30), "10GiB");
        assert_eq!(size_bytes(1_572_864), "1536KiB");
        assert_eq!(size_bytes(1_000), "1000B");
        assert_eq!(size_bytes(0), "0B");
        assert_eq!(utc_time(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_time(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_time(1_785_326_400), "2026-07-29T12:00:00Z");
    }
}
