//! Structured logs through `tracing`: JSON lines (default) or text, to stderr, filtered by `log.level`.

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber; fails on a filter that does not parse.
pub fn init(config: &LogConfig) -> Result<(), String> {
    let filter = EnvFilter::try_new(&config.level)
        .map_err(|error| format!("log.level {:?}: {error}", config.level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match config.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
    installed.map_err(|error| format!("cannot install the logger: {error}"))
}
