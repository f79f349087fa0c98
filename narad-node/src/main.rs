//! The `narad` binary: `narad serve` runs a node (see `narad_node::server`), `narad bench` loads one
//! (see `narad_node::bench`), and the client subcommands (`pub`, `sub`, `replay`, `topic`, `cluster`)
//! talk to one (see `narad_node::client`).
//!
//! Exit codes: 0 after a graceful shutdown, 1 when the node fails, 2 for a configuration error.

/// mimalloc: a produce allocates and frees per request (body, record, metric labels, futures), and
/// glibc's malloc cost a tenth of the async threads' time under load.
#[cfg(not(madsim))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (`c_src/mimalloc/v3/include/mimalloc.h`
/// of libmimalloc-sys; v2 has it at the same index), for which libmimalloc-sys names no constant.
#[cfg(not(madsim))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long mimalloc keeps freed memory before giving it back to the OS, in milliseconds
/// (mimalloc's default: 1000). A purge that is due is carried out by a later call into the
/// allocator, so with 1 s (or 100 ms) the threads of a finished burst (a recovery over 1 GiB of
/// data, a batch load) were idle before it came due and kept what they had freed: 165 to 699 MiB of
/// RSS idle 5 s after a restart over 1 GiB of data (over 530 MiB in most runs), against 28 to 166
/// MiB (median 40 over 11 runs) with 10 ms. 0 (purge at once) gives it back more reliably (28 to 33
/// MiB), but cost 1 KiB batch loads a fifth of their MB/s against 10 ms, and restarts more time; 10
/// ms costs them about a fifth against 1 s (ci/bench-scale's memory case, on a noisy machine).
#[cfg(not(madsim))]
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`], unless the environment sets one
/// (`MIMALLOC_PURGE_DELAY`, which mimalloc reads when the process loads). Called first thing in
/// `main`, while it is the only thread.
#[cfg(not(madsim))]
#[allow(unsafe_code)]
fn give_freed_memory_back() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: `mi_option_set` accepts any option below `_mi_option_last` and any value (for this
        // option: < 0 never purges, 0 purges at once, > 0 after that many ms); it writes mimalloc's
        // option table, which no other thread reads yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// Threads of tokio's blocking pool: start-up I/O (the ingress WAL's recovery, the checkpoint's), the
/// metastore's persistence, and any I/O lane whose own thread the OS refused. The partitions' and the
/// owner journal's I/O run on their executor's own pool (`narad_node::io::POOL_WORKERS_MAX`), which
/// this pool ran until hundreds of partitions made tokio's default (512) start hundreds of threads,
/// each keeping its own allocator heap of buffers it read into: GiBs of RSS. The cap stays.
#[cfg(not(madsim))]
const BLOCKING_THREADS_MAX: usize = 32;

/// How long a blocking-pool thread waits idle for work before it ends (tokio's default: 10 s), as the
/// partition I/O pool's workers do: a thread keeps the allocator pages of the buffers it read into
/// until it allocates again or ends, so after a burst idle threads held tens of MiB for the whole
/// keep-alive; a thread is cheap to start again when work comes back.
#[cfg(not(madsim))]
const BLOCKING_THREAD_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    use clap::Parser as _;
    use narad_node::cli::{Cli, Command};
    use narad_node::config::Config;
    use std::process::ExitCode;

    give_freed_memory_back();
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => args,
        Command::Bench(args) => return narad_load::main(args),
        Command::Client(command) => return narad_node::client::main(command),
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
        .max_blocking_threads(BLOCKING_THREADS_MAX)
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
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

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    #[test]
    #[allow(unsafe_code)]
    fn the_purge_delay_is_the_option_it_is_taken_for() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        // SAFETY: reading any option below `_mi_option_last` is always allowed.
        let read = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        // mimalloc's default purge delay; the options around it default to 0, 1 or -1.
        assert_eq!(read(), 1000);
        give_freed_memory_back();
        assert_eq!(read(), PURGE_DELAY_MS);
    }
}
