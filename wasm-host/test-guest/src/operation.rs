//! Which operations a request can ask the guest for: the `Operation` enum, and how a name
//! in `x-test-op` (or the `ops=` default) becomes one.
//!
//! Most operations act in `on_http_request_headers`, in the order the request names
//! them; the later-phase ones (from [`Operation::Body`] on) only mark the stream, and the
//! callback they name acts on them. A name that is no operation is ignored.

use std::fmt;
use std::str::FromStr;

/// One operation a request names in `x-test-op` (comma-separated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    /// `props`: every property the host knows, as `x-prop-<name>` headers.
    Props,
    /// `headers`: reads, replaces, adds and removes request headers; reports what it saw.
    Headers,
    /// `set-all`: replaces every request header but the pseudo-headers with `x-replaced-all`.
    SetAll,
    /// `shared-get`: reads the shared-data key `x-key` (`x-shared-value`, `x-shared-cas`).
    SharedGet,
    /// `shared-set`: writes `x-value` to the key `x-key`, with the cas `x-cas` (`x-shared-set`).
    SharedSet,
    /// `cas-incr`: increments the counter at `x-key` with a CAS loop (`x-cas-value`, `x-cas-retries`).
    CasIncr,
    /// `shared-script`: runs the raw get / set steps of `x-shared-script` (`x-shared-step-<i>`).
    SharedScript,
    /// `metrics`: defines, increments, records and reads the guest's metrics.
    Metrics,
    /// `callout`: dispatches a callout and pauses; its answer resumes the request.
    Callout,
    /// `callout-deny`: like `callout`, but a `429` answer becomes a local `429` reply.
    CalloutDeny,
    /// `callout-no-authority`: like `callout`, with no `:authority` header on the callout.
    CalloutNoAuthority,
    /// `local`: sends a local reply (`x-status`, `x-body`) and pauses.
    Local,
    /// `local-continue`: sends a local reply, then returns Continue.
    LocalContinue,
    /// `pause`: holds the request until the next tick.
    Pause,
    /// `hold-headers`: pauses in the request headers callback; the guest never resumes the request.
    HoldHeaders,
    /// `reset`: resets the stream.
    Reset,
    /// `panic`: panics in `on_http_request_headers` (a trap).
    Panic,
    /// `continue-then-read`: resumes the request, then logs the status of reading a header.
    ContinueThenRead,
    /// `log`: logs one line at every level.
    Log,
    /// `stdio`: writes one line to stdout and one to stderr.
    Stdio,
    /// `time`: the proxy, WASI and monotonic clocks, and an unsupported clock's errno.
    Time,
    /// `random`: 16 random bytes, and the errno of asking for too many.
    Random,
    /// `env`: the environment variable `TEST_ENV` (`x-env`).
    Env,
    /// `set-prop`: sets the property `test.prop` to `x-prop-value` and reads it back.
    SetProp,
    /// `config`: the plugin and VM configurations (`x-plugin-config`, `x-vm-config`).
    Config,
    /// `raw-misuse`: the statuses of host calls with bad arguments (`x-raw-<name>`).
    RawMisuse,
    /// `enqueue`: enqueues `x-value` on the shared queue `events` (`x-enqueue`).
    Enqueue,
    /// `header-size`: the status and result of `proxy_get_header_map_size` (`x-header-size`).
    HeaderSize,
    /// `ids`: the stream's and its root's context ids (`x-context-id`, `x-root-id`).
    Ids,
    /// `body`: appends `+seen` to the request body.
    Body,
    /// `hold-body`: holds the request body until the next tick.
    HoldBody,
    /// `trailers`: adds the request trailer `x-trailer-seen`.
    Trailers,
    /// `resp-headers`: adds, replaces and removes response headers; reports what it saw.
    RespHeaders,
    /// `resp-local`: replaces the response with a local `502` reply.
    RespLocal,
    /// `resp-pause`: holds the response headers until the next tick.
    RespPause,
    /// `resp-trailers`: sets `grpc-status` and adds `x-trailer-filtered` to the response trailers.
    RespTrailers,
    /// `resp-body`: appends ` [filtered]` to the response body.
    RespBody,
    /// `log-phase`: logs the request path and response status in `on_log`, and the stream's deletion.
    LogPhase,
    /// `done-later`: `on_done` returns false; the next tick calls `proxy_done`.
    DoneLater,
}

/// A name in `x-test-op` that is no [`Operation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnknownOperation(pub(crate) String);

impl fmt::Display for UnknownOperation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown test-guest operation `{}`", self.0)
    }
}

impl std::error::Error for UnknownOperation {}

impl FromStr for Operation {
    type Err = UnknownOperation;

    /// The operation `name` names, exactly (no trimming, case-sensitive).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Ok(match name {
            "props" => Self::Props,
            "headers" => Self::Headers,
            "set-all" => Self::SetAll,
            "shared-get" => Self::SharedGet,
            "shared-set" => Self::SharedSet,
            "cas-incr" => Self::CasIncr,
            "shared-script" => Self::SharedScript,
            "metrics" => Self::Metrics,
            "callout" => Self::Callout,
            "callout-deny" => Self::CalloutDeny,
            "callout-no-authority" => Self::CalloutNoAuthority,
            "local" => Self::Local,
            "local-continue" => Self::LocalContinue,
            "pause" => Self::Pause,
            "hold-headers" => Self::HoldHeaders,
            "reset" => Self::Reset,
            "panic" => Self::Panic,
            "continue-then-read" => Self::ContinueThenRead,
            "log" => Self::Log,
            "stdio" => Self::Stdio,
            "time" => Self::Time,
            "random" => Self::Random,
            "env" => Self::Env,
            "set-prop" => Self::SetProp,
            "config" => Self::Config,
            "raw-misuse" => Self::RawMisuse,
            "enqueue" => Self::Enqueue,
            "header-size" => Self::HeaderSize,
            "ids" => Self::Ids,
            "body" => Self::Body,
            "hold-body" => Self::HoldBody,
            "trailers" => Self::Trailers,
            "resp-headers" => Self::RespHeaders,
            "resp-local" => Self::RespLocal,
            "resp-pause" => Self::RespPause,
            "resp-trailers" => Self::RespTrailers,
            "resp-body" => Self::RespBody,
            "log-phase" => Self::LogPhase,
            "done-later" => Self::DoneLater,
            other => return Err(UnknownOperation(other.to_owned())),
        })
    }
}

/// Every name in a comma-separated list (each trimmed, empty ones skipped), parsed in
/// order; an unknown name is an `Err` in its place.
pub(crate) fn parse_list(list: &str) -> impl Iterator<Item = Result<Operation, UnknownOperation>> + '_ {
    list.split(',').map(str::trim).filter(|name| !name.is_empty()).map(str::parse)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name wasm-host's tests (and the Envoy tests) send, as they send it.
    const NAMES: [&str; 39] = [
        "props",
        "headers",
        "set-all",
        "shared-get",
        "shared-set",
        "cas-incr",
        "shared-script",
        "metrics",
        "callout",
        "callout-deny",
        "callout-no-authority",
        "local",
        "local-continue",
        "pause",
        "hold-headers",
        "reset",
        "panic",
        "continue-then-read",
        "log",
        "stdio",
        "time",
        "random",
        "env",
        "set-prop",
        "config",
        "raw-misuse",
        "enqueue",
        "header-size",
        "ids",
        "body",
        "hold-body",
        "trailers",
        "resp-headers",
        "resp-local",
        "resp-pause",
        "resp-trailers",
        "resp-body",
        "log-phase",
        "done-later",
    ];

    #[test]
    fn every_name_parses_to_its_own_operation() {
        let parsed: Vec<Operation> = NAMES.iter().map(|name| name.parse().unwrap()).collect();

        for (i, a) in parsed.iter().enumerate() {
            for b in &parsed[i + 1..] {
                assert_ne!(a, b, "two names parse to {a:?}");
            }
        }
    }

    #[test]
    fn an_unknown_name_is_reported_with_the_name() {
        let error = "Props".parse::<Operation>().unwrap_err();

        assert_eq!(error, UnknownOperation("Props".to_owned()));
        assert_eq!(error.to_string(), "unknown test-guest operation `Props`");
    }

    #[test]
    fn a_list_is_trimmed_and_skips_empty_names() {
        let parsed: Vec<_> = parse_list(" headers, ,nope,panic,").collect();

        assert_eq!(
            parsed,
            vec![Ok(Operation::Headers), Err(UnknownOperation("nope".to_owned())), Ok(Operation::Panic)]
        );
    }
}
