//! A real Prometheus for tests: started on a loopback port the OS picked, scraping the
//! targets given every [`SCRAPE`], evaluating the rule files given, and queried through
//! its HTTP API.
//!
//! The binary is `prometheus` on `PATH` (`.ci/run` installs Debian's package) or
//! `SLUICE_PROMETHEUS`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{self, Request};

/// How often it scrapes and evaluates its rules.
pub const SCRAPE: Duration = Duration::from_secs(1);
/// How long it may take to start answering.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One scrape job: its name, the path it scrapes and its targets.
#[derive(Debug, Clone)]
pub struct Job {
    /// `job` label.
    pub name: String,
    /// `metrics_path`.
    pub path: String,
    /// `host:port` of each target.
    pub targets: Vec<SocketAddr>,
}

/// A running Prometheus; stopped when dropped.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

/// The binary to run.
fn binary() -> PathBuf {
    std::env::var_os("SLUICE_PROMETHEUS").map_or_else(|| PathBuf::from("prometheus"), PathBuf::from)
}

/// A loopback port the OS picked (free when this returns).
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("its address")
}

/// `text` with every byte but the unreserved ones percent-encoded (a form value).
fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs` and evaluating `rule_files`.
    ///
    /// # Panics
    /// When the binary cannot run or does not answer within a minute (with its log).
    pub fn start(jobs: &[Job], rule_files: &[&Path]) -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-prometheus-{}-{}", std::process::id(), free_port().port()));
        std::fs::create_dir_all(&dir).expect("a directory for Prometheus");
        let config = serde_json::json!({
            "global": {
                "scrape_interval": format!("{}s", SCRAPE.as_secs()),
                "evaluation_interval": format!("{}s", SCRAPE.as_secs()),
                // Names this instance, so the test knows it talks to its own.
                "external_labels": {"sluice_test": dir.display().to_string()},
            },
            "rule_files": rule_files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "scrape_configs": jobs.iter().map(|job| serde_json::json!({
                "job_name": job.name,
                "metrics_path": job.path,
                "static_configs": [{"targets": job.targets.iter().map(ToString::to_string).collect::<Vec<_>>()}],
            })).collect::<Vec<_>>(),
        });
        // YAML is a superset of JSON: Prometheus reads this as its configuration.
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config.to_string()).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("a log file");
        let addr = free_port();
        let child = Command::new(binary())
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} (install Debian's prometheus): {e}", binary().display()));
        let prometheus = Self { child, addr, dir };
        prometheus.wait_ready();
        prometheus
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(mut c) = http::Connection::connect(self.addr)
                && let Ok(r) = c.send(&Request::get("/api/v1/status/config"))
                && r.status == 200
            {
                let own = r.text().contains(&self.dir.display().to_string());
                assert!(own, "another server answers on {}: {}", self.addr, r.text());
                return;
            }
            assert!(Instant::now() < deadline, "Prometheus did not start:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` of its API: the `data` of a `success` answer.
    ///
    /// # Panics
    /// When it does not answer `success`.
    pub fn api(&self, path: &str) -> Value {
        let response = http::send(self.addr, &Request::get(path));
        let body: Value = serde_json::from_slice(&response.body)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", response.text()));
        assert_eq!(body["status"], "success", "{path}: {body}");
        body["data"].clone()
    }

    /// An instant query now: its result vector (`[{"metric": {...}, "value": [t, "v"]}]`).
    ///
    /// # Panics
    /// When Prometheus refuses the query (with its error).
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let request = Request::post("/api/v1/query", format!("query={}", form_encode(promql)))
            .header("content-type", "application/x-www-form-urlencoded");
        let response = http::send(self.addr, &request);
        let body: Value = serde_json::from_slice(&response.body)
            .unwrap_or_else(|e| panic!("{promql}: not JSON ({e}): {}", response.text()));
        assert_eq!(body["status"], "success", "{promql}: {body}");
        match &body["data"]["result"] {
            Value::Array(series) => series.clone(),
            scalar => vec![serde_json::json!({"metric": {}, "value": scalar})],
        }
    }

    /// The one value of `promql` (a query whose result is a single series or scalar).
    ///
    /// # Panics
    /// When it has no series or more than one.
    pub fn value(&self, promql: &str) -> f64 {
        let result = self.query(promql);
        assert_eq!(result.len(), 1, "{promql}: expected one series, got {result:?}");
        result[0]["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{promql}: {result:?}"))
    }

    /// Whether every target has been scraped since `since` (its last scrape began after
    /// it) and is up.
    pub fn scraped_after(&self, since: std::time::SystemTime) -> bool {
        self.job_scraped_after(None, since)
    }

    /// [`Self::scraped_after`] for the targets of `job` only (every job's: `None`).
    pub fn job_scraped_after(&self, job: Option<&str>, since: std::time::SystemTime) -> bool {
        let targets = self.api("/api/v1/targets?state=active");
        let active: Vec<Value> = targets["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| job.is_none_or(|job| t["labels"]["job"] == job))
            .cloned()
            .collect();
        let fresh = |t: &Value| {
            t["health"] == "up" && t["lastScrape"].as_str().and_then(parse_rfc3339).is_some_and(|at| at > since)
        };
        !active.is_empty() && active.iter().all(fresh)
    }

    /// Waits until [`Self::scraped_after`] `since`, or `timeout` passes.
    ///
    /// # Panics
    /// When a target is not scraped in time (with the targets' state).
    pub fn wait_scraped_after(&self, since: std::time::SystemTime, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.scraped_after(since) {
            assert!(
                Instant::now() < deadline,
                "targets not scraped since {since:?}: {}",
                self.api("/api/v1/targets?state=active")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A timestamp of Prometheus' API (`2026-12-05T22:13:00.123456789Z`, or with an offset
/// of zero), as a system time; `None` for another form.
fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let text = text.strip_suffix('Z').or_else(|| text.strip_suffix("+00:00"))?;
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<u64>().ok());
    let (h, min, s) = (t.next()??, t.next()??, t.next()??);
    let nanos: u64 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let secs = days * 86_400 + h * 3_600 + min * 60 + s;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_nanos(nanos))
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prometheus_timestamp_reads_as_the_instant_it_names() {
        let at = parse_rfc3339("2026-12-05T22:13:00.5Z").unwrap();
        assert_eq!(at.duration_since(std::time::UNIX_EPOCH).unwrap(), Duration::from_millis(1_796_508_780_500));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(std::time::UNIX_EPOCH));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn a_form_value_keeps_only_unreserved_bytes_as_they_are() {
        assert_eq!(form_encode(r#"sum(x{a="b"}) > 0"#), "sum%28x%7Ba%3D%22b%22%7D%29%20%3E%200");
    }
}
