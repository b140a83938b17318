//! The fleet simulation (`sluice_tests::fleet`) on many seeds: several proxies running
//! `sluice.wasm` in wasm-host, the counter service's real decision code, faults, reloads
//! and interleaved workers, with every oracle checked after every step.
//!
//! * CI runs a fixed set of seeds: [`fixed_seeds_run_clean`].
//! * A longer run: `SLUICE_FLEET_SEEDS=2000 SLUICE_FLEET_FIRST=1000 cargo test --release -p
//!   sluice-tests --test fleet fixed_seeds_run_clean -- --nocapture` (seeds 1000..3000).
//! * One seed, with its trace: `SLUICE_FLEET_SEED=<seed> cargo test -p sluice-tests
//!   --test fleet replay -- --exact --nocapture`.
//! * Another build of the filter: `SLUICE_WASM_UNDER_TEST=<path to a .wasm>`.
//! * A contended scenario (one record, three racing workers): add `SLUICE_FLEET_CONTENDED=1`.

use sluice_tests::fleet::{self, Scenario};

/// Seeds and steps of the CI run.
const CI_SEEDS: u64 = 24;
const CI_FIRST_SEED: u64 = 1;
/// Instants one run may take (a run usually ends earlier, with its scenario).
const MAX_STEPS: u64 = 20_000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn wasm() -> String {
    std::env::var("SLUICE_WASM_UNDER_TEST").unwrap_or_else(|_| sluice_artifacts::SLUICE_WASM.to_owned())
}

#[test]
fn fixed_seeds_run_clean() {
    let first = env("SLUICE_FLEET_FIRST", CI_FIRST_SEED);
    let seeds = env("SLUICE_FLEET_SEEDS", CI_SEEDS);
    let steps = env("SLUICE_FLEET_STEPS", MAX_STEPS);
    let wasm = wasm();
    let mut failures = Vec::new();
    let mut total = fleet::Report::default();
    for seed in first..first + seeds {
        let scenario = Scenario::generate(seed);
        match fleet::run(&scenario, &wasm, steps) {
            Ok(report) => {
                total.steps += report.steps;
                total.requests += report.requests;
                total.admitted += report.admitted;
                total.callouts += report.callouts;
                total.switches += report.switches;
            }
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure.seed);
            }
        }
    }
    eprintln!(
        "fleet: {seeds} seeds from {first}: {} steps, {} requests ({} admitted), {} callouts, {} interleaving \
         switches; failed seeds: {failures:?}",
        total.steps, total.requests, total.admitted, total.callouts, total.switches
    );
    assert!(failures.is_empty(), "seeds {failures:?} broke an invariant (see above for each one's replay command)");
}

#[test]
fn replay() {
    let Ok(seed) = std::env::var("SLUICE_FLEET_SEED") else { return };
    let seed: u64 = seed.parse().expect("SLUICE_FLEET_SEED is a number");
    let scenario = if std::env::var_os("SLUICE_FLEET_CONTENDED").is_some() {
        Scenario::contended(seed)
    } else {
        Scenario::generate(seed)
    };
    eprintln!("{scenario:#?}");
    eprintln!("filter configuration: {}", scenario.filter_config(&scenario.policies));
    match fleet::run(&scenario, &wasm(), env("SLUICE_FLEET_STEPS", MAX_STEPS)) {
        Ok(report) => eprintln!("seed {seed} ran clean: {report:?}"),
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn a_seed_replays_exactly() {
    let scenario = Scenario::generate(7);

    let first = fleet::run(&scenario, &wasm(), 3_000);
    let second = fleet::run(&scenario, &wasm(), 3_000);

    assert_eq!(first, second);
}

#[test]
fn the_simulation_catches_a_lease_record_written_without_cas() {
    // The mutant loses lease updates only when two workers interleave inside their
    // callbacks on one record: scenarios made for that race.
    let mutant = sluice_artifacts::SLUICE_MUTANT_LEASE_NO_CAS_WASM;
    let caught = (1..=10).find_map(|seed| fleet::run(&Scenario::contended(seed), mutant, MAX_STEPS).err());

    let failure = caught.expect("no seed caught a lease record that loses its updates");
    eprintln!("{failure}");
    assert!(
        matches!(failure.violation.oracle, "spent within grants" | "conservation" | "budget"),
        "caught, but by an oracle that does not speak of spending: {failure}"
    );
}

#[test]
fn the_contended_scenarios_run_clean_with_the_real_filter() {
    for seed in 1..=3 {
        if let Err(failure) = fleet::run(&Scenario::contended(seed), &wasm(), MAX_STEPS) {
            panic!("{failure}");
        }
    }
}
