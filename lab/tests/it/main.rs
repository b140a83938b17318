//! sluice-lab's tests: the real sluice.wasm in the simulated fleet, through the library
//! and through the binary.

mod closed_form;
mod errors;
mod layers;
mod replay;
mod reports;

use sluice_lab::run::{FilterConfig, Lab};
use sluice_lab::{Outcome, Scenario};
use std::path::{Path, PathBuf};

/// The filter under test (`SLUICE_WASM_UNDER_TEST` runs another build).
pub fn wasm() -> PathBuf {
    PathBuf::from(std::env::var("SLUICE_WASM_UNDER_TEST").unwrap_or_else(|_| sluice_artifacts::SLUICE_WASM.to_owned()))
}

/// The lab's directory (scenarios, configurations).
pub fn lab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Runs scenario text against configuration text.
pub fn run_text(scenario: &str, config: &str) -> Outcome {
    let scenario = Scenario::parse(scenario).unwrap_or_else(|e| panic!("the scenario is refused: {e}"));
    let config = FilterConfig::from_bytes("test.json", config.as_bytes().to_vec()).expect("the configuration is valid");
    Lab::new(scenario, config, &lab_dir(), &wasm()).expect("the lab starts").run(|_, _| {}).expect("the run completes")
}

/// Runs the binary from the lab's directory: `command` (`run`, `replay`) on `input` with
/// `config`, the report into `out`, then `extra` arguments. Whether it succeeded, and
/// what it said on stderr.
pub fn sluice_lab(command: &str, input: &Path, config: &Path, out: &Path, extra: &[&str]) -> (bool, String) {
    let result = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-lab"))
        .arg(command)
        .arg(input)
        .arg("--config")
        .arg(config)
        .arg("--out")
        .arg(out)
        .arg("--wasm")
        .arg(wasm())
        .args(extra)
        // One thread per run: the tests run side by side.
        .env("SLUICE_LAB_THREADS", "1")
        .current_dir(lab_dir())
        .output()
        .expect("the binary runs");
    (result.status.success(), String::from_utf8_lossy(&result.stderr).into_owned())
}

/// Runs a shipped scenario against a shipped configuration (on one thread: the tests
/// run side by side).
pub fn run_shipped(scenario: &str, config: &str) -> Outcome {
    run_shipped_on(scenario, config, 1)
}

/// The same, the proxies on `threads` threads.
pub fn run_shipped_on(scenario: &str, config: &str, threads: usize) -> Outcome {
    let dir = lab_dir();
    let path = dir.join("scenarios").join(scenario);
    let text = std::fs::read_to_string(&path).expect("the scenario is shipped");
    let parsed = Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = FilterConfig::load(&dir.join("configs").join(config)).expect("the configuration is valid");
    let lab = Lab::new(parsed, config, &dir.join("scenarios"), &wasm()).expect("the lab starts").with_threads(threads);
    lab.run(|_, _| {}).expect("the run completes")
}
