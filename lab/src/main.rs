//! `sluice-lab`: run a scenario against a filter configuration, compare two
//! configurations, or replay an Envoy access log; each writes a report directory.

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_lab::access_log::{self, Replay};
use sluice_lab::report;
use sluice_lab::run::{FilterConfig, Lab};
use sluice_lab::scenario::Scenario;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The proxies' threads allocate and free constantly (requests, headers, the guest's
/// host-call buffers). With glibc's allocator every proxy's work took about 1.5× as long
/// on two threads as on one (frees across arenas, consolidation); mimalloc keeps each
/// thread's free lists apart (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SCENARIO_HELP: &str = r#"THE SCENARIO (YAML; every field below, defaults in brackets):

  name: a title                      description: a sentence or two  [empty]
  seed: 7          everything random comes from it: same seed, same report byte for byte  [1]
  duration: 60s    virtual time the traffic runs (up to 24h)
  interval: 1s     one report row per interval (at most 2000 rows)  [1s]
  fleet:
    regions:       - {name: eu, proxies: 2}   (proxies in all: at most 64)
    workers: 2     Envoy worker threads per proxy, each its own VM  [2]
    service_latency: 2ms    round trip to the counter service  [2ms]
    upstream_latency: 20ms  how long the upstream takes to answer  [20ms]
  callers:         one entry per class of callers
    - name: app
      legitimate: true      abuse is false: the verdict tells the two apart  [true]
      method: GET           [GET]
      path: /api/items      [/]
      headers: {x-user: "{key}"}   {key} is the caller's identity, {region} its region
      regions: [eu]         whose proxies it reaches  [all]
      keys: {count: 1000, hot_share: 0.5, rotating: false}
                            identities: uniform over count, hot_share of requests from
                            one hot key, rotating = a new identity per request  [{count: 1}]
      rate:                 requests per second over time, held until the next point
        - {at: 0s, rps: 50}
        - {at: 10s, rps: 500, ramp: 2s}   reached linearly over ramp
      arrivals: poisson     poisson (independent callers) or even (a scheduler)  [poisson]
      usage: 120            the upstream reports this usage (header x-usage)  [none]
      retry: {attempts: 3, backoff: 1s, jitter: true, honor_retry_after: true}
                            a refused call is sent again after backoff, doubled each time;
                            jitter spreads it over [0, wait]  [no retries]
  faults:          the timeline
    - {kind: slow, at: 10s, for: 5s, latency: 300ms, region: eu}   region optional
    - {kind: down, at: 20s, for: 5s}          connections refused
    - {kind: errors, at: 20s, for: 5s}        the service answers 500
    - {kind: partition, at: 30s, for: 10s, region: eu}   calls never answered
    - {kind: restart, at: 40s}                the service loses every counter
    - {kind: clock_step, at: 45s, by: -2s}    the service's clock steps
    - {kind: config, at: 50s, file: other.json}   every proxy reloads (path relative
                                                   to the scenario)

Examples: lab/scenarios/*.yaml. The report directory gets index.html (open it in a
browser: no network needed), summary.json, policies.csv, callers.csv and fleet.csv."#;

/// Try a rate-limit configuration on traffic and faults before production: the real
/// sluice.wasm in a simulated fleet on a virtual clock.
#[derive(Debug, Parser)]
#[command(name = "sluice-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Args)]
struct Common {
    /// The compiled filter (`cargo build --release --target wasm32-wasip1 -p sluice-filter`).
    #[arg(long, env = "SLUICE_WASM", default_value = "target/wasm32-wasip1/release/sluice.wasm")]
    wasm: PathBuf,
    /// Where the report goes (created; its files are replaced).
    #[arg(long)]
    out: PathBuf,
    /// Threads to run the proxies on (at most one per proxy; the machine's cores by
    /// default). The report is the same whatever the number; on a busy machine, fewer
    /// threads than idle cores run faster.
    #[arg(long, env = "SLUICE_LAB_THREADS")]
    threads: Option<usize>,
}

impl Common {
    /// `lab` with the threads asked for.
    fn threads(&self, lab: Lab) -> Lab {
        let cores = || std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        lab.with_threads(self.threads.unwrap_or_else(cores))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a scenario against a filter configuration.
    #[command(after_long_help = SCENARIO_HELP)]
    Run {
        /// The scenario (YAML; see --help for every field).
        scenario: PathBuf,
        /// The filter configuration (the JSON Envoy or Istio would be given).
        #[arg(long)]
        config: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Run one scenario under two configurations and show them side by side.
    #[command(after_long_help = SCENARIO_HELP)]
    Compare {
        /// The first configuration.
        a: PathBuf,
        /// The second configuration.
        b: PathBuf,
        /// The scenario.
        scenario: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Replay an Envoy access log (default text format or JSON lines) through a fleet.
    #[command(after_help = access_log::JSON_FIELDS)]
    Replay {
        /// The access log.
        log: PathBuf,
        /// The filter configuration.
        #[arg(long)]
        config: PathBuf,
        /// Play the log this many times faster than it was recorded (1: its own pace).
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Proxies the log's requests are spread over.
        #[arg(long, default_value_t = 2)]
        proxies: usize,
        /// Workers per proxy.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// One report row per interval.
        #[arg(long, default_value = "1s")]
        interval: humantime::Duration,
        #[command(flatten)]
        common: Common,
    },
}

fn load_scenario(path: &Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Scenario::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

fn check_wasm(path: &Path) -> anyhow::Result<()> {
    if !path.is_file() {
        bail!(
            "{} is not there: build it with `cargo build --release --target wasm32-wasip1 -p sluice-filter`, or give --wasm",
            path.display()
        );
    }
    Ok(())
}

fn progress(label: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total / 1_000_000);
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} ms virtual ({elapsed} wall, {eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    bar
}

fn run_one(lab: &Lab, label: &str) -> anyhow::Result<sluice_lab::Outcome> {
    let bar = progress(label, 1);
    let outcome = lab.run(|done, total| {
        bar.set_length(total / 1_000_000);
        bar.set_position(done / 1_000_000);
    })?;
    bar.finish_and_clear();
    Ok(outcome)
}

/// What a command wrote: the report's files, where they go, and the requests it ran.
struct Written {
    files: Vec<(String, Vec<u8>)>,
    out: PathBuf,
    requests: u64,
}

fn run(scenario: &Path, config: &Path, common: Common) -> anyhow::Result<Written> {
    let parsed = load_scenario(scenario)?;
    let config = FilterConfig::load(config)?;
    check_wasm(&common.wasm)?;
    let base = scenario.parent().unwrap_or(Path::new("."));
    let lab = common.threads(Lab::new(parsed, config, base, &common.wasm)?);
    let outcome = run_one(&lab, "run")?;
    Ok(Written { files: report::render(&outcome), out: common.out, requests: outcome.requests })
}

fn compare(a: &Path, b: &Path, scenario: &Path, common: Common) -> anyhow::Result<Written> {
    let parsed = load_scenario(scenario)?;
    let (a, b) = (FilterConfig::load(a)?, FilterConfig::load(b)?);
    check_wasm(&common.wasm)?;
    let base = scenario.parent().unwrap_or(Path::new("."));
    let first = run_one(&common.threads(Lab::new(parsed.clone(), a, base, &common.wasm)?), "a")?;
    let second = run_one(&common.threads(Lab::new(parsed, b, base, &common.wasm)?), "b")?;
    let mut files = vec![("index.html".to_owned(), report::html::compare(&first, &second).into_bytes())];
    for (dir, outcome) in [("a", &first), ("b", &second)] {
        for (name, bytes) in report::render(outcome) {
            files.push((format!("{dir}/{name}"), bytes));
        }
    }
    Ok(Written { files, out: common.out, requests: first.requests + second.requests })
}

fn replay(log: &Path, config: &Path, replay: Replay, common: Common) -> anyhow::Result<Written> {
    if !(replay.speed.is_finite() && replay.speed > 0.0) {
        bail!("--speed must be above 0");
    }
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    let config = FilterConfig::load(config)?;
    let wanted = sluice_lab::run::headers_read(&config.parsed);
    let parsed = access_log::parse_for(&text, &wanted);
    for bad in &parsed.bad {
        eprintln!("{}: line {}: {}", log.display(), bad.line, bad.message);
    }
    if !parsed.bad.is_empty() {
        eprintln!("{}: {} lines could not be read (not replayed)", log.display(), parsed.bad.len());
    }
    if parsed.entries.is_empty() {
        bail!("{}: no request could be read", log.display());
    }
    for name in parsed.missing_headers(wanted.iter().map(String::as_str)) {
        eprintln!(
            "{}: no line carries header {name}, which the configuration reads (looked for JSON fields `{name}` and \
             `{}`, and `headers.{name}`): those requests will miss it",
            log.display(),
            name.replace('-', "_")
        );
    }
    check_wasm(&common.wasm)?;
    let scenario = parsed.scenario(&log.display().to_string(), replay);
    let lab = Lab::new(scenario, config, Path::new("."), &common.wasm)?.with_log(parsed.entries, replay.speed);
    let outcome = run_one(&common.threads(lab), "replay")?;
    Ok(Written { files: report::render(&outcome), out: common.out, requests: outcome.requests })
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let started = Instant::now();
    let Written { files, out, requests } = match cli.command {
        Command::Run { scenario, config, common } => run(&scenario, &config, common)?,
        Command::Compare { a, b, scenario, common } => compare(&a, &b, &scenario, common)?,
        Command::Replay { log, config, speed, proxies, workers, interval, common } => {
            replay(&log, &config, Replay { speed, proxies, workers, interval: *interval }, common)?
        }
    };
    report::write_files(&out, &files).with_context(|| format!("writing {}", out.display()))?;
    eprintln!(
        "{}: {requests} requests in {:.1} s of wall time; open {}",
        out.display(),
        started.elapsed().as_secs_f64(),
        out.join("index.html").display()
    );
    Ok(())
}
