//! Log lines written by guests (`proxy_log`, stdout and stderr) and by the host itself.
//!
//! Envoy prints a guest's `proxy_log` at the guest's level, WASI stdout at `info` and
//! stderr at `error` (one line per `fd_write`, trailing newline removed). This host keeps
//! the same mapping. Tests read the captured lines with [`crate::Host::logs`] and
//! [`crate::Host::logs_at`]; `serve` prints them as they arrive.

use std::fmt;
use std::sync::{Mutex, PoisonError};

/// proxy-wasm log levels (`proxy_log_level_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    /// 0
    Trace,
    /// 1
    Debug,
    /// 2
    Info,
    /// 3
    Warn,
    /// 4
    Error,
    /// 5
    Critical,
}

impl LogLevel {
    /// The level for an ABI value, `None` for values above 5.
    pub fn from_abi(raw: u32) -> Option<Self> {
        Some(match raw {
            0 => Self::Trace,
            1 => Self::Debug,
            2 => Self::Info,
            3 => Self::Warn,
            4 => Self::Error,
            5 => Self::Critical,
            _ => return None,
        })
    }

    /// The ABI value.
    pub fn to_abi(self) -> u32 {
        self as u32
    }

    /// Lower-case name, as Envoy prints it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
            Self::Critical => "critical",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "trace" => Self::Trace,
            "debug" => Self::Debug,
            "info" => Self::Info,
            "warn" | "warning" => Self::Warn,
            "error" => Self::Error,
            "critical" => Self::Critical,
            other => {
                return Err(format!(
                    "unknown log level `{other}` (expected trace, debug, info, warn, error or critical)"
                ));
            }
        })
    }
}

/// Who wrote a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LogSource {
    /// The guest, through `proxy_log`.
    Guest,
    /// The guest's standard output (WASI `fd_write` on fd 1), logged at `info`.
    Stdout,
    /// The guest's standard error (WASI `fd_write` on fd 2), logged at `error`.
    Stderr,
    /// The host: traps, failure policies, rejected configurations.
    Host,
}

/// One captured log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRecord {
    /// The worker whose VM wrote it.
    pub worker: usize,
    /// The level it was written at.
    pub level: LogLevel,
    /// Who wrote it.
    pub source: LogSource,
    /// The text; bytes that are not UTF-8 are replaced with U+FFFD.
    pub message: String,
}

impl fmt::Display for LogRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match self.source {
            LogSource::Guest => "wasm log",
            LogSource::Stdout => "wasm stdout",
            LogSource::Stderr => "wasm stderr",
            LogSource::Host => "wasm-host",
        };
        write!(f, "[{}][worker {}] {source}: {}", self.level, self.worker, self.message)
    }
}

/// A function that receives every log line as it is written.
pub(crate) type Printer = Box<dyn Fn(&LogRecord) + Send + Sync>;

/// Where log lines go: kept in memory for tests, printed by `serve`, or both.
pub(crate) struct LogSink {
    /// Lines below this level are dropped (`proxy_get_log_level` reports it).
    pub(crate) level: LogLevel,
    captured: Option<Mutex<Vec<LogRecord>>>,
    printer: Option<Printer>,
}

impl fmt::Debug for LogSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogSink").field("level", &self.level).finish_non_exhaustive()
    }
}

impl LogSink {
    pub(crate) fn new(level: LogLevel, capture: bool, printer: Option<Printer>) -> Self {
        Self { level, captured: capture.then(|| Mutex::new(Vec::new())), printer }
    }

    pub(crate) fn write(&self, record: LogRecord) {
        if record.level < self.level {
            return;
        }
        if let Some(printer) = &self.printer {
            printer(&record);
        }
        if let Some(captured) = &self.captured {
            captured.lock().unwrap_or_else(PoisonError::into_inner).push(record);
        }
    }

    pub(crate) fn records(&self) -> Vec<LogRecord> {
        self.captured.as_ref().map(|c| c.lock().unwrap_or_else(PoisonError::into_inner).clone()).unwrap_or_default()
    }

    pub(crate) fn clear(&self) {
        if let Some(captured) = &self.captured {
            captured.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }
}
