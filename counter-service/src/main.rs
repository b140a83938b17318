//! The `sluice-counter` binary: flags and environment in, [`sluice_counter::run`] out;
//! or, with the `override` subcommand, a call to a running service's admin API
//! ([`sluice_counter::cli`]).

use clap::Parser;
use sluice_counter::cli::Command;
use sluice_counter::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

/// mimalloc: the gRPC and JSON stacks allocate and free small buffers on every call, and
/// glibc's allocator spent 8 % of a decision's CPU on them (docs/benchmarks.md, "RLS v3").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// sluice-counter: the central counter service for Sluice's global rate-limit policies.
///
/// Every flag can also be set from the environment variable named beside it.
#[derive(Parser)]
#[command(name = "sluice-counter", version, about, long_about = None, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(flatten)]
    config: Config,

    #[command(subcommand)]
    command: Option<Command>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let workers = cli.config.worker_threads.map_or_else(sluice_counter::config::cpus_available, usize::from);
    // One worker: a current-thread runtime, which skips the work-stealing scheduler's
    // cross-thread wake-ups (measured in docs/benchmarks.md, "RLS v3").
    let mut runtime = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    let runtime = runtime.enable_all().build().map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(cli))
}

async fn serve(Cli { config, command }: Cli) -> anyhow::Result<()> {
    if let Some(Command::Rls(command)) = &command {
        match command.run() {
            Ok(report) => print!("{report}"),
            Err(error) => {
                eprintln!("error: {error}");
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    if let Some(Command::Override(command)) = command {
        match command.run(|name| std::env::var(name).ok()).await {
            Ok(answer) => println!("{answer}"),
            Err(error) => {
                eprintln!("error: {error}");
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    let filter = EnvFilter::try_new(&config.log).map_err(|e| anyhow::anyhow!("--log {:?}: {e}", config.log))?;
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    sluice_counter::run(listener, config, shutdown_signal()).await
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
