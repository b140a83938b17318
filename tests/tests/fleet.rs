//! The fleet simulation (`sluice_tests::fleet`) on many seeds: several proxies running
//! `sluice.wasm` in wasm-host, the counter service's real decision code, faults, reloads
//! and interleaved workers, with every oracle checked after every step.
//!
//! * CI runs a fixed set of seeds: [`fixed_seeds_run_clean`].
//! * A longer run: `SLUICE_FLEET_SEEDS=2000 SLUICE_FLEET_FIRST=1000 cargo test --release -p
//!   sluice-tests --test fleet fixed_seeds_run_clean -- --nocapture` (seeds 1000..3000).
//! * One seed, with its trace: `SLUICE_FLEET_SEED=<seed> cargo test -p sluice-tests
//!   --test fleet replay -- --ignored --exact --nocapture` ([`replay`] is ignored otherwise).
//! * Another build of the filter: `SLUICE_WASM_UNDER_TEST=<path to a .wasm>`.
//! * A contended scenario (three racing workers): add `SLUICE_FLEET_CONTENDED=lease` (one
//!   lease record; `1` says the same) or `SLUICE_FLEET_CONTENDED=local` (one local bucket).
//!
//! Each oracle is shown to catch a deliberately wrong run ([`fleet::Variant`], the
//! mutants of `sluice.wasm`: no CAS, a return that keeps its tokens), deterministically: these tests drive the same seeds
//! every time.

use sluice_tests::fleet::scenario::{Algorithm, Kind, Kinds, Shape, allowed};
use sluice_tests::fleet::{self, Scenario, Variant};

/// Seeds and steps of the CI run: 96 seeds, and the seeds below, each for at most
/// [`MAX_STEPS`] instants (a run usually ends after 2 000 to 6 000): about 70 s of one
/// core in the test profile, the whole binary 2.5 minutes on two busy cores.
const CI_SEEDS: u64 = 96;
const CI_FIRST_SEED: u64 = 1;
/// Seeds beyond the first 96 that, when the generator took its present form, found on
/// the counter service before issue 37's fixes a rollout over a counter in debt
/// forgiving the debt (175 and 235 in check mode, 783 in lease mode), a clamp over a
/// counter in debt letting its caller through early (136), a clamp with a shorter window
/// letting a full window through again (155, 213) and a clamp that ended while its
/// counter, idle under the clamp's numbers, had been swept (254). They run in CI too:
/// seeds like any others, which must run clean.
const CI_MORE_SEEDS: [u64; 7] = [136, 155, 175, 213, 235, 254, 783];
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
    let more = if std::env::var_os("SLUICE_FLEET_SEEDS").is_some() { &[][..] } else { &CI_MORE_SEEDS[..] };
    for seed in (first..first + seeds).chain(more.iter().copied()) {
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
        "fleet: {seeds} seeds from {first} and {more:?}: {} steps, {} requests ({} admitted), {} callouts, {} \
         interleaving switches; failed seeds: {failures:?}",
        total.steps, total.requests, total.admitted, total.callouts, total.switches
    );
    assert!(failures.is_empty(), "seeds {failures:?} broke an invariant (see above for each one's replay command)");
}

#[test]
#[ignore = "replays one seed: SLUICE_FLEET_SEED=<seed> cargo test -p sluice-tests --test fleet replay -- --ignored \
            --exact --nocapture"]
fn replay() {
    let seed = std::env::var("SLUICE_FLEET_SEED").expect(
        "SLUICE_FLEET_SEED=<seed> names the seed to replay (SLUICE_FLEET_CONTENDED=lease or local for a contended \
         scenario, SLUICE_FLEET_TRACE=1 for the whole trace)",
    );
    let seed: u64 = seed.parse().expect("SLUICE_FLEET_SEED is a number");
    let shape = Shape::from_env(std::env::var("SLUICE_FLEET_CONTENDED").ok().as_deref());
    let scenario = shape.scenario(seed);
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

/// The first failure of `variant` over `seeds` in `shape`, with the filter at `wasm`.
fn first_caught(
    shape: Shape,
    seeds: std::ops::RangeInclusive<u64>,
    wasm: &str,
    variant: Variant,
    keep: impl Fn(&Scenario) -> bool,
) -> Option<Box<fleet::Failure>> {
    seeds
        .map(|seed| shape.scenario(seed))
        .filter(|scenario| keep(scenario))
        .find_map(|scenario| fleet::run_variant(&scenario, wasm, MAX_STEPS, variant).err())
}

#[test]
fn the_simulation_catches_a_lease_record_written_without_cas() {
    // The mutant loses lease updates only when two workers interleave inside their
    // callbacks on one record: scenarios made for that race.
    let mutant = sluice_artifacts::SLUICE_MUTANT_LEASE_NO_CAS_WASM;
    let caught = first_caught(Shape::ContendedLease, 1..=10, mutant, Variant::Real, |_| true);

    let failure = caught.expect("no seed caught a lease record that loses its updates");
    eprintln!("{failure}");
    assert!(
        matches!(failure.violation.oracle, "spent within grants" | "conservation" | "counter bound"),
        "caught, but by an oracle that does not speak of spending: {failure}"
    );
}

#[test]
fn the_simulation_catches_leases_spent_by_a_filter_whose_shared_data_writes_ignore_cas() {
    // What the Envoy test could only hope to see (two workers of one Envoy writing one
    // record at the same instant), the baton forces.
    let mutant = sluice_artifacts::SLUICE_MUTANT_BLIND_WRITES_WASM;
    let caught = first_caught(Shape::ContendedLease, 1..=10, mutant, Variant::Real, |_| true);

    let failure = caught.expect("no seed caught a filter whose lease records lose their updates");
    eprintln!("{failure}");
    assert!(
        matches!(failure.violation.oracle, "spent within grants" | "conservation" | "counter bound"),
        "caught, but by an oracle that does not speak of spending: {failure}"
    );
}

#[test]
fn the_simulation_catches_a_filter_that_spends_the_leased_tokens_it_returned() {
    // The mutant credits the service with a lease's surplus and leaves it in the lease:
    // a token returned, then spent or counted as expired, is used twice.
    let mutant = sluice_artifacts::SLUICE_MUTANT_RETURN_KEEPS_TOKENS_WASM;
    let caught = first_caught(Shape::Generated, 1..=CI_SEEDS, mutant, Variant::Real, |s| {
        s.policies.iter().any(|p| matches!(p.kind, Kind::Lease { .. }))
    });

    let failure = caught.expect("no seed caught a filter that spends the tokens it returned");
    eprintln!("{failure}");
    assert!(
        matches!(failure.violation.oracle, "lease ledger" | "conservation"),
        "caught, but by an oracle that does not speak of spending: {failure}"
    );
}

#[test]
fn the_simulation_catches_a_filter_that_gives_a_batchs_answers_to_the_wrong_requests() {
    // The mutant decides each request of a batch of checks with the next one's result:
    // a request the service rejected is admitted, one it admitted (and spent for) is not.
    // Where the next result answers a different number of policies, the request reads
    // it as a bad body: the healthy oracle sees a degraded decision first. The
    // admission oracles must still catch it on some seed.
    let mutant = sluice_artifacts::SLUICE_MUTANT_BATCH_MISPLACED_WASM;
    let by_admissions = (1..=CI_SEEDS)
        .map(|seed| Shape::Generated.scenario(seed))
        .filter(|s| s.checks_in_flight.0 > 0 && s.policies.iter().any(|p| matches!(p.kind, Kind::Check)))
        .filter_map(|scenario| fleet::run_variant(&scenario, mutant, MAX_STEPS, Variant::Real).err())
        .find(|failure| {
            let admissions = matches!(failure.violation.oracle, "counter bound" | "checked within admissions");
            if !admissions {
                assert!(
                    failure.violation.oracle == "healthy" && failure.violation.detail.contains("reason=bad_body"),
                    "caught, but neither by an oracle of admissions nor as a misplaced answer's bad body: {failure}"
                );
            }
            admissions
        });

    let failure = by_admissions.expect("no seed's admissions caught a filter that misplaces a batch's answers");
    eprintln!("{failure}");
}

#[test]
fn the_local_bound_catches_a_filter_whose_shared_data_writes_ignore_cas() {
    // Lost updates of one local bucket: three workers admitting one hot caller at the
    // same instants, interleaved inside their callbacks.
    let mutant = sluice_artifacts::SLUICE_MUTANT_BLIND_WRITES_WASM;
    let caught = first_caught(Shape::ContendedLocal, 1..=10, mutant, Variant::Real, |_| true);

    let failure = caught.expect("no seed caught a local bucket that loses its updates");
    eprintln!("{failure}");
    assert!(matches!(failure.violation.oracle, "local bound" | "in flight"), "{failure}");
}

#[test]
fn the_contended_scenarios_run_clean_with_the_real_filter() {
    for shape in [Shape::ContendedLease, Shape::ContendedLocal] {
        for seed in 1..=3 {
            if let Err(failure) = fleet::run(&shape.scenario(seed), &wasm(), MAX_STEPS) {
                panic!("{failure}");
            }
        }
    }
}

#[test]
fn the_ci_seeds_draw_check_mode_batched_and_unbatched_with_batches_failing_whole_and_in_part() {
    let mut in_flight = std::collections::BTreeSet::new();
    let mut per_call = std::collections::BTreeSet::new();
    let mut one_check_refused = 0;
    for seed in 1..=CI_SEEDS {
        let scenario = Scenario::generate(seed);
        if !scenario.policies.iter().any(|p| matches!(p.kind, Kind::Check)) {
            continue;
        }
        in_flight.insert(scenario.checks_in_flight.0);
        per_call.insert(scenario.checks_in_flight.1);
        one_check_refused += scenario.faults.iter().filter(|f| f.mode == fleet::service::Mode::OneCheckRefused).count();
    }

    assert_eq!(in_flight.into_iter().collect::<Vec<_>>(), [0, 1, 2, 4, 8], "unbatched, and 1 to 8 calls out");
    assert_eq!(per_call.into_iter().collect::<Vec<_>>(), [2, 3, 64]);
    assert!(one_check_refused > 0, "no seed refuses one check of a batch");
}

#[test]
fn the_generator_draws_every_algorithm_each_mode_allows_from_the_one_list() {
    let mut seen = std::collections::BTreeSet::new();
    for seed in 1..=400 {
        for policy in Scenario::generate(seed).policies {
            let mode = match policy.kind {
                Kind::Local => 0,
                Kind::Check => 1,
                Kind::Lease { .. } => 2,
            };
            assert!(allowed(&policy.kind).contains(&policy.algorithm.kind()), "seed {seed}: {policy:?}");
            seen.insert((mode, policy.algorithm.kind()));
        }
    }

    let kinds =
        [Kind::Local, Kind::Check, Kind::Lease { size: 1, low_water: 0, duration_ms: 1, max_waiting: 1, max_debt: 0 }];
    for (mode, kind) in kinds.iter().enumerate() {
        for algorithm in Kinds::ALL.into_iter().filter(|a| allowed(kind).contains(a)) {
            assert!(seen.contains(&(mode, algorithm)), "no seed draws {algorithm} for a {kind:?} policy");
        }
    }
    assert_eq!(allowed(&kinds[0]).len(), Kinds::ALL.len(), "a local policy may have every algorithm");
    assert!(allowed(&kinds[1]).iter().all(|a| a.global()) && allowed(&kinds[2]).iter().all(|a| a.leasable()));
}

#[test]
fn the_counter_bounds_catch_a_filter_that_admits_more_than_its_numbers() {
    // The proxies run four times the scenario's numbers; the oracles hold them to the
    // scenario's. A global counter and a local one each go past their bound.
    let global =
        |s: &Scenario| s.policies.iter().any(|p| p.is_global() && matches!(p.algorithm, Algorithm::TokenBucket { .. }));
    let caught = first_caught(Shape::Generated, 1..=40, &wasm(), Variant::LooserFilter, global)
        .expect("no seed caught a filter that admits more than its numbers on a global counter");
    eprintln!("{caught}");
    assert!(matches!(caught.violation.oracle, "counter bound" | "local bound"), "{caught}");

    let counts = |s: &Scenario| !s.policies.iter().any(|p| matches!(p.algorithm, Algorithm::Concurrency { .. }));
    let caught = first_caught(Shape::ContendedLocal, 1..=10, &wasm(), Variant::LooserFilter, counts)
        .expect("no seed caught a filter that admits more than its numbers on a local counter");
    eprintln!("{caught}");
    assert_eq!(caught.violation.oracle, "local bound", "{caught}");
}

#[test]
fn the_in_flight_oracle_catches_a_filter_that_lets_more_requests_in_flight_than_its_limit() {
    let concurrency = |s: &Scenario| s.policies.iter().any(|p| matches!(p.algorithm, Algorithm::Concurrency { .. }));
    let caught = first_caught(Shape::ContendedLocal, 1..=20, &wasm(), Variant::LooserFilter, concurrency)
        .expect("no seed caught a concurrency policy with too many requests in flight");
    eprintln!("{caught}");
    assert_eq!(caught.violation.oracle, "in flight", "{caught}");
}

#[test]
fn the_clamp_bound_catches_a_service_that_never_applied_the_clamp() {
    let clamped = |s: &Scenario| {
        s.events.iter().any(|(_, e)| {
            matches!(e, fleet::scenario::Event::Override(o) if matches!(o.kind, fleet::scenario::OverrideKind::Clamp(_)))
        })
    };
    let caught = first_caught(Shape::Generated, 1..=200, &wasm(), Variant::ClampsNotSet, clamped)
        .expect("no seed caught a clamp that the service never applied");
    eprintln!("{caught}");
    assert_eq!(caught.violation.oracle, "clamp bound", "{caught}");
}

#[test]
fn the_forgiven_oracle_catches_a_service_that_forgives_debt_it_was_asked_to_keep() {
    let charged = |s: &Scenario| {
        s.policies
            .iter()
            .any(|p| p.is_global() && p.max_debt() > 1 && matches!(p.algorithm, Algorithm::TokenBucket { .. }))
    };
    let caught = first_caught(Shape::Generated, 1..=200, &wasm(), Variant::ForgiveDebt, charged)
        .expect("no seed caught a service that forgives what it was asked to owe");
    eprintln!("{caught}");
    assert_eq!(caught.violation.oracle, "forgiven", "{caught}");
}
