//! Why a configuration was refused: the first malformed value, or every semantic
//! problem, each located by the path of the field it is about.

use std::fmt;

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The JSON is malformed or a value has the wrong shape.
    Syntax {
        /// Where (`policies[1].rate`), or `.` for the document.
        path: String,
        /// What was expected.
        message: String,
    },
    /// The JSON is well formed but its values do not make a valid configuration.
    Invalid(Vec<Issue>),
}

/// One semantic problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Where.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax { path, message } if path == "." => write!(f, "configuration: {message}"),
            Self::Syntax { path, message } => write!(f, "{path}: {message}"),
            Self::Invalid(issues) => {
                for (i, issue) in issues.iter().enumerate() {
                    if i > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{issue}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ConfigError {}
