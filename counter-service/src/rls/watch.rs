//! The configuration in force, and how changes to its directory reach it without a
//! restart: [`Loaded`].
//!
//! The directory is read again every `--rls-reload-ms`; when any file's name or content
//! changed, it is loaded whole. A directory that loads replaces the configuration at
//! once (requests already deciding finish under the one they began with); one that does
//! not leaves the last good configuration in force, logged and counted
//! (`sluice_counter_rls_config_loads_total{outcome="error"}`), and is tried again when it
//! changes next.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::config::{LoadError, RlsConfig, yaml_files};
use super::identity;
use crate::metrics::Metrics;

/// The configuration in force, and where it comes from.
#[derive(Debug)]
pub struct Loaded {
    dir: PathBuf,
    merge: bool,
    current: RwLock<Arc<RlsConfig>>,
    /// The fingerprint of the directory last read (loaded or refused).
    seen: Mutex<String>,
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reload {
    /// Nothing changed in the directory.
    Unchanged,
    /// The directory changed and its configuration is now in force.
    Loaded,
    /// The directory changed and did not load: the last good configuration stays.
    Refused(LoadError),
}

/// A fingerprint of the name and content of every file [`RlsConfig::load_dir`] reads
/// in `dir` ([`yaml_files`]: a staged hidden file is not a change), or of the error
/// reading it.
fn fingerprint(dir: &Path) -> String {
    let Ok(paths) = yaml_files(dir) else { return "unreadable".to_owned() };
    let files: Vec<(String, Vec<u8>)> =
        paths.iter().map(|p| (p.display().to_string(), std::fs::read(p).unwrap_or_default())).collect();
    let parts: Vec<&[u8]> = files.iter().flat_map(|(n, c)| [n.as_bytes(), c.as_slice()]).collect();
    identity::hash(&parts)
}

impl Loaded {
    /// Loads `dir` (see [`RlsConfig::load_dir`]).
    ///
    /// # Errors
    /// The first file that does not load: the service refuses to start with it.
    pub fn load(dir: &Path, merge: bool) -> Result<Self, LoadError> {
        let seen = fingerprint(dir);
        let config = RlsConfig::load_dir(dir, merge)?;
        Ok(Self { dir: dir.to_owned(), merge, current: RwLock::new(Arc::new(config)), seen: Mutex::new(seen) })
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<RlsConfig> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the directory again and, when it changed, loads it (counted in `metrics`).
    pub fn reload(&self, metrics: &Metrics) -> Reload {
        let now = fingerprint(&self.dir);
        {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            if *seen == now {
                return Reload::Unchanged;
            }
            *seen = now;
        }
        match RlsConfig::load_dir(&self.dir, self.merge) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
                metrics.rls().config_load(true);
                tracing::info!(dir = %self.dir.display(), "rls configuration reloaded");
                Reload::Loaded
            }
            Err(error) => {
                metrics.rls().config_load(false);
                tracing::warn!(%error, "rls configuration not reloaded: the last good one stays in force");
                Reload::Refused(error)
            }
        }
    }
}
