//! `wasm-host`: run a proxy-wasm plugin as Envoy would, without Envoy.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use wasm_host::serve::{ServeConfig, Upstream};
use wasm_host::{FailurePolicy, LogLevel};

#[derive(Parser)]
#[command(
    name = "wasm-host",
    version,
    about = "A proxy-wasm (ABI 0.2.1) host on wasmtime that runs a plugin as Envoy would"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an HTTP/1.1 reverse proxy on loopback with the plugin in front of an upstream.
    ///
    /// Each worker thread runs its own VM, as Envoy's workers do; shared data, metrics
    /// and callout clusters are shared. Without --upstream, a built-in echo upstream
    /// answers 200 with the request it received, so `curl -i` shows what the filter
    /// forwarded. Stops gracefully on Ctrl-C or SIGTERM.
    ///
    /// Example: wasm-host serve --wasm sluice.wasm --config config.json --listen 127.0.0.1:8080 --workers 2
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// The plugin (.wasm, proxy-wasm ABI 0.2.x, e.g. built for wasm32-wasip1).
    #[arg(long, value_name = "PATH", required_unless_present = "no_filter")]
    wasm: Option<PathBuf>,

    /// A file holding the plugin configuration (Envoy's `configuration`, Istio's
    /// `pluginConfig`), passed to proxy_on_configure as is.
    #[arg(long, value_name = "FILE", conflicts_with = "config_inline")]
    config: Option<PathBuf>,

    /// The plugin configuration given inline.
    #[arg(long, value_name = "TEXT")]
    config_inline: Option<String>,

    /// A file holding the VM configuration, passed to proxy_on_vm_start.
    #[arg(long, value_name = "FILE")]
    vm_config: Option<PathBuf>,

    /// Address to listen on; port 0 picks a free port (printed on startup).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Worker threads, each with its own VM.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    workers: u16,

    /// Where forwarded requests go (http://HOST:PORT[/prefix]); default: a built-in echo upstream.
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,

    /// Maps a cluster name used in proxy_http_call to an HTTP/1.1 server; repeatable.
    #[arg(long = "cluster", value_name = "NAME=HOST:PORT")]
    clusters: Vec<String>,

    /// An environment variable of the VMs: NAME=VALUE, or NAME alone to pass this
    /// process's own value (as Envoy's `host_env_keys`); repeatable.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,

    /// The vm_id (scopes shared data).
    #[arg(long, default_value = "")]
    vm_id: String,

    /// The root_id (plugin_root_id).
    #[arg(long, default_value = "")]
    root_id: String,

    /// The plugin name (plugin_name).
    #[arg(long, default_value = "")]
    plugin_name: String,

    /// What a trap in the plugin does, as Envoy's failure_policy.
    #[arg(long, value_enum, default_value_t = Policy::Closed)]
    failure_policy: Policy,

    /// Log lines below this level are dropped (trace, debug, info, warn, error, critical).
    #[arg(long, default_value = "info")]
    log_level: LogLevel,

    /// Most connections served at once.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,

    /// Largest request body accepted (larger ones get 413).
    #[arg(long, default_value_t = 1024 * 1024)]
    max_request_bytes: usize,

    /// Run without any plugin: the proxy alone, as a baseline for benchmarks.
    #[arg(long)]
    no_filter: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Policy {
    /// Envoy's default: 503 for the streams of a failed VM.
    #[value(name = "fail-closed")]
    Closed,
    /// Let traffic through without the plugin.
    #[value(name = "fail-open")]
    Open,
    /// Fail the streams closed, then start a fresh VM.
    #[value(name = "fail-reload")]
    Reload,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let Command::Serve(args) = cli.command;
    let config = serve_config(args)?;
    let workers = config.workers;
    let filter = config.wasm.as_ref().map_or_else(|| "no filter".to_owned(), |p| p.display().to_string());
    wasm_host::serve::run(config, shutdown_signal(), move |addr| {
        println!("wasm-host serve: listening on http://{addr} ({workers} workers, {filter})");
    })?;
    eprintln!("wasm-host serve: stopped");
    Ok(())
}

fn serve_config(args: ServeArgs) -> anyhow::Result<ServeConfig> {
    let wasm = if args.no_filter {
        None
    } else {
        let path = args.wasm.context("--wasm is required unless --no-filter is given")?;
        if !path.is_file() {
            bail!("the plugin {} does not exist or is not a file", path.display());
        }
        Some(path)
    };
    let plugin_configuration = match (&args.config, args.config_inline) {
        (Some(path), _) => {
            std::fs::read(path).with_context(|| format!("cannot read the plugin configuration {}", path.display()))?
        }
        (None, Some(text)) => text.into_bytes(),
        (None, None) => Vec::new(),
    };
    let vm_configuration = match &args.vm_config {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("cannot read the VM configuration {}", path.display()))?
        }
        None => Vec::new(),
    };
    let upstream = args.upstream.as_deref().map(parse_upstream).transpose()?;
    let clusters = args.clusters.iter().map(|c| parse_cluster(c)).collect::<anyhow::Result<Vec<_>>>()?;
    let env = args.env.iter().map(|e| parse_env(e)).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ServeConfig {
        wasm,
        plugin_configuration,
        vm_configuration,
        vm_id: args.vm_id,
        root_id: args.root_id,
        plugin_name: args.plugin_name,
        listen: args.listen,
        workers: usize::from(args.workers),
        upstream,
        clusters,
        env,
        failure_policy: match args.failure_policy {
            Policy::Closed => FailurePolicy::FailClosed,
            Policy::Open => FailurePolicy::FailOpen,
            Policy::Reload => FailurePolicy::FailReload,
        },
        log_level: args.log_level,
        max_connections: args.max_connections.max(1),
        max_request_bytes: args.max_request_bytes,
        drain_timeout: Duration::from_secs(5),
    })
}

fn resolve(host_port: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    host_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve `{host_port}`"))?
        .next()
        .with_context(|| format!("`{host_port}` resolves to no address"))
}

fn parse_upstream(url: &str) -> anyhow::Result<Upstream> {
    let uri: http::Uri = url.parse().with_context(|| format!("--upstream `{url}` is not a URL"))?;
    if uri.scheme_str() != Some("http") {
        bail!("--upstream `{url}` must be an http:// URL (no TLS)");
    }
    let authority = uri.authority().with_context(|| format!("--upstream `{url}` has no host"))?;
    let host_port = match authority.port_u16() {
        Some(_) => authority.as_str().to_owned(),
        None => format!("{}:80", authority.host()),
    };
    let base_path = uri.path().trim_end_matches('/').to_owned();
    Ok(Upstream { addr: resolve(&host_port)?, base_path })
}

fn parse_cluster(spec: &str) -> anyhow::Result<(String, SocketAddr)> {
    let (name, addr) =
        spec.split_once('=').with_context(|| format!("--cluster `{spec}` must look like NAME=HOST:PORT"))?;
    if name.is_empty() {
        bail!("--cluster `{spec}` has an empty name");
    }
    Ok((name.to_owned(), resolve(addr)?))
}

fn parse_env(spec: &str) -> anyhow::Result<(String, String)> {
    match spec.split_once('=') {
        Some(("", _)) => bail!("--env `{spec}` has an empty name"),
        Some((name, value)) => Ok((name.to_owned(), value.to_owned())),
        None => {
            let value =
                std::env::var(spec).with_context(|| format!("--env {spec}: this process has no such variable"))?;
            Ok((spec.to_owned(), value))
        }
    }
}

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
    eprintln!("wasm-host serve: shutting down (finishing requests in progress)");
}
