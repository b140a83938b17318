//! Builds the wasm guests for `wasm32-wasip1` so that `cargo test` always exercises
//! freshly built modules, with no manual build step.
//!
//! The nested `cargo` uses its own target directory (`target/guests`): sharing the outer
//! build's directory would deadlock on its lock. Flags meant for the host build
//! (`RUSTFLAGS`, coverage wrappers, the jobserver) are removed so they do not leak into
//! the wasm build.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Packages built for `wasm32-wasip1`, and the constant that names each artifact.
const GUESTS: &[(&str, &str, &str)] = &[
    ("sluice-filter", "sluice.wasm", "SLUICE_WASM"),
    ("sluice-test-guest", "sluice_test_guest.wasm", "TEST_GUEST_WASM"),
];

/// Sources whose change must rebuild the guests.
const WATCHED: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "filter",
    "shared-store/src",
    "shared-store/Cargo.toml",
    "protocol",
    "wasm-host/test-guest",
];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("tests/artifacts sits two levels below the workspace root")
        .to_path_buf();
    // Checkouts that share one CARGO_TARGET_DIR (git worktrees) each get their own
    // guests directory: a build in one must never swap the `sluice.wasm` another is
    // testing (the mutants pass through `release/sluice.wasm` on their way aside).
    let shared = env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).filter(|dir| *dir != root.join("target"));
    let target_dir = match shared {
        None => root.join("target").join("guests"),
        Some(dir) => {
            let checkout = root.file_name().map_or_else(|| "root".into(), |n| n.to_string_lossy().into_owned());
            dir.join(format!("guests-{checkout}"))
        }
    };

    for path in WATCHED {
        println!("cargo:rerun-if-changed={}", root.join(path).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let build = |packages: &[&str], features: Option<&str>| {
        let mut command = Command::new(&cargo);
        command
            .current_dir(&root)
            .args(["build", "--release", "--target", "wasm32-wasip1", "--target-dir"])
            .arg(&target_dir);
        for package in packages {
            command.args(["-p", package]);
        }
        if let Some(features) = features {
            command.args(["--features", features]);
        }
        for var in [
            "CARGO_ENCODED_RUSTFLAGS",
            "RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "CARGO_MAKEFLAGS",
            "MAKEFLAGS",
            "MFLAGS",
            "RUSTC_WORKSPACE_WRAPPER",
            "CARGO_LLVM_COV",
            "LLVM_PROFILE_FILE",
        ] {
            command.env_remove(var);
        }
        let status = command.status().expect("could not start cargo to build the wasm guests");
        assert!(status.success(), "building the wasm guests for wasm32-wasip1 failed: {status}");
    };
    let release = target_dir.join("wasm32-wasip1/release");

    // The test-only mutant first (its artifact has the same name), copied aside; then the
    // real guests, so that `release/sluice.wasm` is always the real filter.
    build(&["sluice-filter"], Some("mutant-blind-writes"));
    let mutant = target_dir.join("sluice-mutant-blind-writes.wasm");
    std::fs::copy(release.join("sluice.wasm"), &mutant).expect("could not copy the mutant aside");
    build(&["sluice-filter"], Some("mutant-lease-no-cas"));
    let lease_mutant = target_dir.join("sluice-mutant-lease-no-cas.wasm");
    std::fs::copy(release.join("sluice.wasm"), &lease_mutant).expect("could not copy the lease mutant aside");
    build(&["sluice-filter"], Some("mutant-return-keeps-tokens"));
    let return_mutant = target_dir.join("sluice-mutant-return-keeps-tokens.wasm");
    std::fs::copy(release.join("sluice.wasm"), &return_mutant).expect("could not copy the return mutant aside");
    build(&["sluice-filter"], Some("mutant-batch-misplaced"));
    let batch_mutant = target_dir.join("sluice-mutant-batch-misplaced.wasm");
    std::fs::copy(release.join("sluice.wasm"), &batch_mutant).expect("could not copy the batch mutant aside");
    build(&["sluice-filter"], Some("test-crash-header"));
    let crashable = target_dir.join("sluice-crashable.wasm");
    std::fs::copy(release.join("sluice.wasm"), &crashable).expect("could not copy the crashable build aside");
    let packages: Vec<&str> = GUESTS.iter().map(|(package, _, _)| *package).collect();
    build(&packages, None);
    // A feature cargo did not apply (a `pkg/feature` name that names a dependency) would
    // leave a "mutant" that is the real filter, and the tests that must catch it would
    // prove nothing: each mutant must differ from the real filter and from the other.
    let bytes = |path: &Path| std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let real = bytes(&release.join("sluice.wasm"));
    let (blind, lease, crash) = (bytes(&mutant), bytes(&lease_mutant), bytes(&crashable));
    let returns = bytes(&return_mutant);
    let batch = bytes(&batch_mutant);
    assert!(
        blind != real
            && lease != real
            && blind != lease
            && crash != real
            && returns != real
            && returns != lease
            && batch != real
            && batch != returns,
        "a mutant of sluice.wasm was built without its feature"
    );

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut generated = String::new();
    for (package, file, constant) in GUESTS {
        let path = release.join(file);
        assert!(path.exists(), "{package} built, but {} is missing", path.display());
        generated.push_str(&format!(
            "/// Path of `{file}`, built from the `{package}` package for `wasm32-wasip1` (release).\npub const {constant}: &str = {:?};\n",
            path.display().to_string()
        ));
    }
    generated.push_str(&format!(
        "/// Path of a TEST-ONLY mutant of `sluice.wasm` whose shared-data writes ignore CAS (feature \
         `mutant-blind-writes`): tests show their oracles catch it.\npub const SLUICE_MUTANT_BLIND_WRITES_WASM: &str = {:?};\n",
        mutant.display().to_string()
    ));
    generated.push_str(&format!(
        "/// Path of a TEST-ONLY mutant of `sluice.wasm` whose lease-record writes ignore CAS (feature \
         `mutant-lease-no-cas`; every other write keeps it): the fleet simulation shows it catches \
         it.\npub const SLUICE_MUTANT_LEASE_NO_CAS_WASM: &str = {:?};\n",
        lease_mutant.display().to_string()
    ));
    generated.push_str(&format!(
        "/// Path of a TEST-ONLY mutant of `sluice.wasm` that credits the service with the \
         leased tokens it returns and goes on spending them (feature `mutant-return-keeps-tokens`): \
         the fleet simulation shows it catches it.\npub const SLUICE_MUTANT_RETURN_KEEPS_TOKENS_WASM: &str = {:?};\n",
        return_mutant.display().to_string()
    ));
    generated.push_str(&format!(
        "/// Path of a TEST-ONLY mutant of `sluice.wasm` that decides each request of a batch of \
         checks with the next request's result (feature `mutant-batch-misplaced`): the fleet \
         simulation shows it catches it.\npub const SLUICE_MUTANT_BATCH_MISPLACED_WASM: &str = {:?};\n",
        batch_mutant.display().to_string()
    ));
    generated.push_str(&format!(
        "/// Path of a TEST-ONLY build of `sluice.wasm` whose VM panics on a request carrying \
         `x-sluice-test-crash` (feature `test-crash-header`; otherwise the real filter): Envoy \
         tests kill a VM with it.\npub const SLUICE_CRASHABLE_WASM: &str = {:?};\n",
        crashable.display().to_string()
    ));
    std::fs::write(out_dir.join("artifacts.rs"), generated).expect("could not write artifacts.rs");
}
