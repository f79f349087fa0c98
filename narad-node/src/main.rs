//! The `narad` binary: `narad serve` runs a node (see `narad_node::server`), `narad bench` loads one
//! (see `narad_node::bench`).
//!
//! Exit codes: 0 after a graceful shutdown, 1 when the node fails, 2 for a configuration error.

/// mimalloc: a produce allocates and frees per request (body, record, metric labels, futures), and
/// glibc's malloc cost a tenth of the async threads' time under load.
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    use clap::Parser as _;
    use narad_node::cli::{Cli, Command};
    use narad_node::config::Config;
    use std::process::ExitCode;

    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Bench(args) => return narad_node::bench::main(args),
    };
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    if let Err(error) = narad_node::config::check_env_names(names.iter().map(String::as_str)) {
        eprintln!("narad: {error}");
        return ExitCode::from(2);
    }
    let config = match Config::load(&args.overrides(), &|key| std::env::var(key).ok()) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("narad: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = narad_node::logging::init(&config.log) {
        eprintln!("narad: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("narad: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(narad_node::server::serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = format!("{error:#}"), "node failed");
            ExitCode::FAILURE
        }
    }
}

/// Under the simulator the node is started by the harness, not by this binary.
#[cfg(madsim)]
fn main() {}
