//! The client subcommands of `narad` (`pub`, `sub`, `replay`, `topic`, `cluster`, `user`): blocking calls to
//! one node's `/v1` HTTP API, wire-compatible with Narad's CLI.
//!
//! - [`http`]: the HTTP client (ureq), Basic auth, and the server's `{"error":…}` answers as errors.
//! - [`pubsub`]: `pub`, `sub` (queue mode and `--peek`) and `replay`.
//! - [`topic`]: `topic add|ls|info|edit|rm`; [`cluster`]:
//!   `cluster members|moves|move|rebalance|decommission`; [`user`]: `user add|grant|ls|rm|passwd`.
//! - [`output`]: how results are printed (human tables and lines, `--json`, `--raw` payloads).
//!
//! Exit codes: 0 when every request succeeded, 1 when one failed (the server's message, or why the
//! node could not be reached, on stderr), 2 for bad flags (clap's).

pub mod cluster;
pub mod http;
pub mod output;
pub mod pubsub;
pub mod topic;
pub mod user;

use std::process::ExitCode;

use crate::cli::ClientCommand;

/// Runs one client subcommand and turns its outcome into the process's exit code.
pub fn main(command: ClientCommand) -> ExitCode {
    let result = match command {
        ClientCommand::Pub(args) => pubsub::publish(&args),
        ClientCommand::Sub(args) => pubsub::subscribe(&args),
        ClientCommand::Replay(args) => pubsub::replay(&args),
        ClientCommand::Topic(args) => topic::run(&args),
        ClientCommand::Cluster(args) => cluster::run(&args),
        ClientCommand::User(args) => user::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`narad sub … | head`) ended the output it wanted: not a failure.
        Err(error) if output::is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("narad: {error:#}");
            ExitCode::FAILURE
        }
    }
}
