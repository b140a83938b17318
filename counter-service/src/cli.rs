//! `sluice-counter override set|list|rm`: a client of a running service's admin API.
//!
//! It sends one request to `--url` with the admin token read from the environment
//! variable `--admin-token-env` names, prints the JSON answer on stdout, and fails (exit
//! status 1) with the service's error code and message when the answer is not a success.
//! Plain HTTP only: reach a remote service through a tunnel or a sidecar.

use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, Uri, header};

/// How long one admin call may take, connection included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The binary's subcommands (without one, it serves).
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Set, list or remove operator overrides on a running service (its admin API).
    #[command(subcommand)]
    Override(OverrideCommand),
    /// Envoy's rate limit service protocol (RLS v3): check a configuration directory.
    #[command(subcommand)]
    Rls(RlsCommand),
}

/// `sluice-counter rls ...`.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum RlsCommand {
    /// Load a directory of envoyproxy/ratelimit YAML files as `--rls-config` would, and
    /// print its domains and rules, or the first error (naming the file and the
    /// descriptor) with exit status 1. For CI.
    Validate {
        /// The directory.
        dir: std::path::PathBuf,
        /// As `--rls-merge-domains`.
        #[arg(long)]
        merge_domains: bool,
    },
}

impl RlsCommand {
    /// Runs it: what to print, or the error.
    ///
    /// # Errors
    /// The first file that does not load.
    pub fn run(&self) -> Result<String, crate::rls::config::LoadError> {
        let Self::Validate { dir, merge_domains } = self;
        let config = crate::rls::config::RlsConfig::load_dir(dir, *merge_domains)?;
        let mut out = format!("{} file(s), {} domain(s): valid\n", config.files.len(), config.domains.len());
        for rule in config.rules() {
            let numbers = match rule.unit {
                Some(unit) if rule.unit_multiplier > 1 => {
                    format!("{}/{}×{unit}", rule.requests_per_unit, rule.unit_multiplier)
                }
                Some(unit) => format!("{}/{unit}", rule.requests_per_unit),
                None => "unlimited".to_owned(),
            };
            out.push_str(&format!("{}: {numbers} (policy {})\n", rule.path, rule.policy));
        }
        Ok(out)
    }
}

/// `sluice-counter override ...`.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum OverrideCommand {
    /// Set an override; prints it as stored (with its id).
    Set(SetArgs),
    /// List the live overrides.
    List(Target),
    /// Remove an override before it expires.
    Rm(RmArgs),
}

/// Which service, and the admin token.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct Target {
    /// The service's base URL (plain HTTP).
    #[arg(long, env = "SLUICE_COUNTER_URL", default_value = "http://127.0.0.1:8710")]
    pub url: String,

    /// The environment variable holding the admin token.
    #[arg(long, env = "SLUICE_COUNTER_ADMIN_TOKEN_ENV", value_name = "NAME")]
    pub admin_token_env: String,
}

/// `override set`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct SetArgs {
    #[command(flatten)]
    target: Target,

    /// `bypass` (admit without spending) or `clamp` (lower the numbers to `--limit`).
    #[arg(long)]
    kind: String,

    /// The policy's name in the filter configuration.
    #[arg(long)]
    policy: String,

    /// A clamp's numbers, as a limit's JSON
    /// (`{"algorithm":"token_bucket","amount":1,"per_ms":1000,"burst":5}`).
    #[arg(long, value_name = "JSON")]
    limit: Option<String>,

    /// A value of the policy's key parts, in order (repeat for each part): the override
    /// then applies to those callers only. The service hashes them as the filters do and
    /// stores only the hash (a flag's value shows in `ps`).
    #[arg(long = "key", value_name = "VALUE")]
    key: Vec<String>,

    /// The policy version the key is hashed under (default 0).
    #[arg(long)]
    policy_version: Option<u64>,

    /// How long it lasts, in milliseconds (1 000 to 86 400 000).
    #[arg(long)]
    ttl_ms: u64,

    /// Why (required).
    #[arg(long)]
    reason: String,

    /// Who sets it (required).
    #[arg(long)]
    operator: String,
}

/// `override rm`.
#[derive(Clone, Debug, PartialEq, Eq, Args)]
pub struct RmArgs {
    #[command(flatten)]
    target: Target,

    /// The override's id (`ovr-...`).
    id: String,

    /// Who removes it (required: the audit line names them).
    #[arg(long)]
    operator: String,

    /// Why.
    #[arg(long)]
    reason: Option<String>,
}

impl OverrideCommand {
    /// Sends the request and returns what to print: the answer's JSON.
    ///
    /// # Errors
    /// A message with the service's error code and message when it refused, or why it
    /// could not be reached.
    pub async fn run(&self, env: impl Fn(&str) -> Option<String>) -> anyhow::Result<String> {
        match self {
            Self::Set(args) => {
                let limit = match &args.limit {
                    Some(text) => Some(
                        serde_json::from_str::<serde_json::Value>(text)
                            .map_err(|e| anyhow::anyhow!("--limit: not JSON: {e}"))?,
                    ),
                    None => None,
                };
                let mut body = serde_json::json!({
                    "kind": args.kind,
                    "policy": args.policy,
                    "ttl_ms": args.ttl_ms,
                    "reason": args.reason,
                    "operator": args.operator,
                });
                if let Some(limit) = limit {
                    body["limit"] = limit;
                }
                if !args.key.is_empty() {
                    body["key"] = serde_json::json!(args.key);
                }
                if let Some(version) = args.policy_version {
                    body["policy_version"] = serde_json::json!(version);
                }
                call(&args.target, &env, Method::POST, "", Some(body.to_string())).await
            }
            Self::List(target) => call(target, &env, Method::GET, "", None).await,
            Self::Rm(args) => {
                let mut body = serde_json::json!({ "operator": args.operator });
                if let Some(reason) = &args.reason {
                    body["reason"] = serde_json::json!(reason);
                }
                let path = format!("/{}", args.id);
                call(&args.target, &env, Method::DELETE, &path, Some(body.to_string())).await?;
                Ok(serde_json::json!({ "removed": args.id }).to_string())
            }
        }
    }
}

/// One call to `{url}/admin/v1/overrides{suffix}`; the answer's body on a success.
async fn call(
    target: &Target,
    env: &impl Fn(&str) -> Option<String>,
    method: Method,
    suffix: &str,
    body: Option<String>,
) -> anyhow::Result<String> {
    let name = &target.admin_token_env;
    let token = env(name)
        .map(|t| t.trim_end_matches(['\n', '\r']).to_owned())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow::anyhow!("--admin-token-env {name}: the environment variable is not set or empty"))?;
    let base: Uri = target.url.parse().map_err(|e| anyhow::anyhow!("--url {}: {e}", target.url))?;
    if base.scheme_str() != Some("http") {
        anyhow::bail!("--url {}: only http:// is supported", target.url);
    }
    let authority = base.authority().ok_or_else(|| anyhow::anyhow!("--url {}: no host", target.url))?.clone();
    let path = format!("{}/admin/v1/overrides{suffix}", base.path().trim_end_matches('/'));
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, authority.as_str())
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((authority.host(), authority.port_u16().unwrap_or(80))).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, bytes))
    };
    let (status, bytes) = tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{}: no answer within {} s", target.url, CALL_TIMEOUT.as_secs()))?
        .map_err(|e| anyhow::anyhow!("{}: {e}", target.url))?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if status.is_success() {
        return Ok(text);
    }
    match serde_json::from_slice::<sluice_protocol::ErrorBody>(&bytes) {
        Ok(error) => anyhow::bail!("{} {}: {}", status.as_u16(), error.error.code, error.error.message),
        Err(_) if status == StatusCode::NOT_FOUND => anyhow::bail!("404: no admin API at {}", target.url),
        Err(_) => anyhow::bail!("{}: {text}", status.as_u16()),
    }
}
