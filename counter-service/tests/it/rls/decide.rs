//! RLS decisions on every store (memory, Redis, a Redis Cluster), with exact times: what
//! envoyproxy/ratelimit answers for each case, and what Sluice adds on purpose.

use std::time::Duration;

use shared_store::Nanos;
use sluice_counter::App;
use sluice_counter::auth::Auth;
use sluice_counter::config::Config;
use sluice_counter::rls::config::{RlsConfig, Unit};
use sluice_counter::rls::decide::{Code, RlsAnswer, RlsDescriptor, RlsRequest, Status, decide};
use sluice_counter::store::CounterStore;

use crate::support::t_us;

const S: u64 = 1_000_000; // microseconds

/// Every rule the scenarios use. `t_us(0)` is Unix second 1 750 000 000: 20 s before a
/// minute ends, 3 200 s before an hour does, 200 s before a five-minute window does.
const RULES: &str = r#"
domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /admin
    rate_limit: {unit: hour, requests_per_unit: 1, name: admin}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: open
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4}
  - key: five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1}
  - key: shared
    value: "ip-*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: broad
    rate_limit: {unit: hour, requests_per_unit: 100, name: broad}
  - key: specific
    rate_limit: {unit: hour, requests_per_unit: 1, name: specific, replaces: [{name: broad}]}
  - key: quota
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// A domain decided all or nothing, its slot picked by the tenant.
const TOGETHER: &str = r#"
domain: DOMAIN-together
all_or_nothing: true
all_or_nothing_key: tenant
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

struct Rls<'a> {
    app: App,
    config: RlsConfig,
    domain: &'a str,
}

fn service(store: CounterStore, domain: &str) -> Rls<'_> {
    let yaml = RULES.replace("DOMAIN", domain);
    let together = TOGETHER.replace("DOMAIN", domain);
    let config = RlsConfig::from_files([("rules.yaml", yaml.as_str()), ("together.yaml", together.as_str())], false)
        .expect("the rules load");
    Rls { app: App::new(store, &Config::defaults(), Auth::Open), config, domain }
}

fn d(entries: &[(&str, &str)]) -> RlsDescriptor {
    RlsDescriptor {
        entries: entries.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        ..RlsDescriptor::default()
    }
}

fn hits(entries: &[(&str, &str)], hits: u64) -> RlsDescriptor {
    RlsDescriptor { hits_addend: Some(hits), ..d(entries) }
}

impl Rls<'_> {
    async fn ask_in(&self, domain: &str, descriptors: Vec<RlsDescriptor>, at_us: u64) -> RlsAnswer {
        let request = RlsRequest { domain: domain.to_owned(), descriptors, hits_addend: 0 };
        decide(&self.app, &self.config, &request, Some(t_us(at_us))).await.expect("decided")
    }

    async fn ask(&self, descriptors: Vec<RlsDescriptor>, at_us: u64) -> RlsAnswer {
        self.ask_in(self.domain, descriptors, at_us).await
    }

    async fn one(&self, descriptor: RlsDescriptor, at_us: u64) -> Status {
        let answer = self.ask(vec![descriptor], at_us).await;
        assert_eq!(answer.overall, answer.statuses[0].code, "one descriptor decides the whole");
        answer.statuses[0].clone()
    }
}

fn seen(statuses: &[Status]) -> Vec<(Code, u32)> {
    statuses.iter().map(|s| (s.code, s.limit_remaining)).collect()
}

async fn a_key_alone_counts_each_value_apart_and_answers_over_limit_past_it(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let mut alice = Vec::new();
    for _ in 0..4 {
        alice.push(rls.one(d(&[("user", "alice")]), 0).await);
    }
    let bob = rls.one(d(&[("user", "bob")]), 0).await;

    assert_eq!(seen(&alice), [(Code::Ok, 2), (Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)]);
    assert_eq!(alice[3].duration_until_reset, Some(Duration::from_secs(3200)), "until the hour ends");
    let limit = alice[0].current_limit.as_ref().expect("a limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (3, Unit::Hour));
    assert_eq!(seen(&[bob]), [(Code::Ok, 2)]);
}

async fn an_exact_value_wins_over_a_wildcard_and_a_wildcard_over_the_key_alone(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let admin = rls.one(d(&[("path", "/admin")]), 0).await;
    let api = rls.one(d(&[("path", "/api/users")]), 0).await;
    let other = rls.one(d(&[("path", "/other")]), 0).await;

    let rpu = |s: &Status| s.current_limit.as_ref().map(|l| (l.requests_per_unit, l.name.clone()));
    assert_eq!(rpu(&admin), Some((1, "admin".to_owned())));
    assert_eq!(rpu(&api), Some((2, String::new())));
    assert_eq!(rpu(&other), Some((5, String::new())));
}

async fn a_nested_rule_counts_only_at_the_descriptors_last_entry(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let free = [
        rls.one(d(&[("tenant", "a"), ("plan", "free")]), 0).await,
        rls.one(d(&[("tenant", "a"), ("plan", "free")]), 0).await,
    ];
    let third = rls.one(d(&[("tenant", "a"), ("plan", "free")]), 0).await;
    let shallower = rls.one(d(&[("tenant", "a")]), 0).await;
    let deeper = rls.one(d(&[("tenant", "a"), ("plan", "free"), ("extra", "1")]), 0).await;
    let next_minute = rls.one(d(&[("tenant", "a"), ("plan", "free")]), 20 * S).await;

    assert_eq!(seen(&free), [(Code::Ok, 1), (Code::Ok, 0)]);
    assert_eq!((third.code, third.duration_until_reset), (Code::OverLimit, Some(Duration::from_secs(20))));
    assert_eq!((shallower.code, shallower.current_limit), (Code::Ok, None), "the request stops above the rule");
    assert_eq!((deeper.code, deeper.current_limit), (Code::Ok, None), "the request goes deeper than the rule");
    assert_eq!(seen(&[next_minute]), [(Code::Ok, 1)], "a window aligned to Unix minutes");
}

async fn unlimited_allows_with_every_hit_left_and_zero_per_unit_never_allows(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let open = rls.one(d(&[("open", "x")]), 0).await;
    let blocked = rls.one(d(&[("blocked", "x")]), 0).await;

    assert_eq!((open.code, open.limit_remaining, open.current_limit), (Code::Ok, u32::MAX, None));
    assert_eq!((blocked.code, blocked.limit_remaining), (Code::OverLimit, 0));
}

async fn an_unknown_domain_or_descriptor_is_allowed_and_counted_nowhere(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let unknown = rls.ask_in("nobody-configures-this", vec![d(&[("user", "alice")])], 0).await;
    let unmatched = rls.ask(vec![d(&[("colour", "blue")])], 0).await;
    let after = rls.one(d(&[("user", "alice")]), 0).await;

    assert!(unknown.domain_not_found);
    assert_eq!((unknown.overall, unknown.statuses[0].current_limit.clone()), (Code::Ok, None));
    assert_eq!((unmatched.overall, unmatched.domain_not_found), (Code::Ok, false));
    assert_eq!(seen(&[after]), [(Code::Ok, 2)], "neither counted alice's hit");
}

async fn shadow_mode_counts_and_decides_but_answers_ok(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let first = rls.one(d(&[("shadow", "x")]), 0).await;
    let second = rls.one(d(&[("shadow", "x")]), 0).await;

    assert_eq!((first.code, first.decided), (Code::Ok, Code::Ok));
    assert_eq!((second.code, second.decided), (Code::Ok, Code::OverLimit));
}

async fn a_rejected_hit_is_counted_so_a_budget_charged_on_stream_done_runs_out(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let budget = [("budget", "tenant-1")];

    let asked = rls.one(hits(&budget, 0), 0).await;
    let spent = rls.one(hits(&budget, 7), S).await;
    let charged_over = rls.one(hits(&budget, 7), 2 * S).await;
    let asked_again = rls.one(hits(&budget, 0), 3 * S).await;
    let next_hour = rls.one(hits(&budget, 0), 3200 * S).await;

    assert_eq!(seen(&[asked, spent]), [(Code::Ok, 10), (Code::Ok, 3)]);
    assert_eq!(charged_over.code, Code::OverLimit, "7 more do not fit in 3");
    assert_eq!(asked_again.code, Code::OverLimit, "the 7 were counted all the same: the budget is spent");
    assert_eq!(seen(&[next_hour]), [(Code::Ok, 10)], "the debt ends with the window");
}

async fn a_charge_larger_than_the_limit_is_over_and_counted_up_to_one_limit_of_debt(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let budget = [("budget", "tenant-2")];

    let huge = rls.one(hits(&budget, 1_000), 0).await;
    let small = rls.one(hits(&budget, 1), S).await;
    let asked = rls.one(hits(&budget, 0), 2 * S).await;

    assert_eq!(huge.code, Code::OverLimit);
    assert_eq!((small.code, asked.code), (Code::OverLimit, Code::OverLimit));
    assert_eq!(huge.duration_until_reset, Some(Duration::from_secs(3200)));
}

async fn a_token_bucket_rule_answers_the_exact_wait_of_its_rejection(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let mut burst = Vec::new();
    for _ in 0..4 {
        burst.push(rls.one(d(&[("bucket", "x")]), 0).await);
    }
    let fifth = rls.one(d(&[("bucket", "x")]), 0).await;
    let on_time = rls.one(d(&[("bucket", "x")]), 500_000).await;

    assert_eq!(seen(&burst), [(Code::Ok, 3), (Code::Ok, 2), (Code::Ok, 1), (Code::Ok, 0)]);
    assert_eq!(fifth.code, Code::OverLimit);
    assert_eq!(fifth.retry_after, Some(Nanos::from_millis(1000)), "the fifth was counted: two refills away");
    assert_eq!(fifth.duration_until_reset, Some(Duration::from_secs(1)));
    assert_eq!(on_time.code, Code::OverLimit, "still in debt by the fifth hit");
}

async fn a_window_of_five_minutes_ends_on_a_five_minute_boundary(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let first = rls.one(d(&[("five_minutes", "x")]), 0).await;
    let second = rls.one(d(&[("five_minutes", "x")]), 100 * S).await;
    let next = rls.one(d(&[("five_minutes", "x")]), 200 * S).await;

    assert_eq!(seen(&[first]), [(Code::Ok, 0)]);
    assert_eq!((second.code, second.duration_until_reset), (Code::OverLimit, Some(Duration::from_secs(100))));
    assert_eq!(seen(&[next]), [(Code::Ok, 0)]);
}

async fn values_a_shared_wildcard_matches_share_one_counter(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let one = rls.one(d(&[("shared", "ip-1")]), 0).await;
    let two = rls.one(d(&[("shared", "ip-2")]), 0).await;
    let three = rls.one(d(&[("shared", "ip-3")]), 0).await;

    assert_eq!(seen(&[one, two, three]), [(Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)]);
}

async fn a_replaced_rule_is_neither_applied_nor_counted(store: CounterStore, domain: &str) {
    let rls = service(store, domain);

    let both = rls.ask(vec![d(&[("broad", "x")]), d(&[("specific", "y")])], 0).await;
    let broad_alone = rls.one(d(&[("broad", "x")]), 0).await;

    assert_eq!(both.statuses[0].current_limit, None, "replaced by `specific`");
    assert_eq!(seen(&both.statuses), [(Code::Ok, 0), (Code::Ok, 0)]);
    assert_eq!(seen(&[broad_alone]), [(Code::Ok, 99)], "the replaced hit was not counted");
}

async fn descriptors_are_counted_independently_and_one_over_makes_the_whole_over(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    rls.one(d(&[("path", "/admin")]), 0).await;

    let both = rls.ask(vec![d(&[("user", "dora")]), d(&[("path", "/admin")])], 0).await;
    let dora = rls.one(d(&[("user", "dora")]), 0).await;

    assert_eq!(both.overall, Code::OverLimit);
    assert_eq!(seen(&both.statuses), [(Code::Ok, 2), (Code::OverLimit, 0)]);
    assert_eq!(seen(&[dora]), [(Code::Ok, 1)], "dora's hit counted though the request was over");
}

async fn in_quota_mode_a_request_is_over_only_when_every_quota_descriptor_is(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    rls.one(d(&[("quota", "a")]), 0).await;

    let one_of_two = rls.ask(vec![d(&[("quota", "a")]), d(&[("quota", "b")])], 0).await;
    let all = rls.ask(vec![d(&[("quota", "a")]), d(&[("quota", "b")])], 0).await;

    assert_eq!((one_of_two.overall, seen(&one_of_two.statuses)), (Code::Ok, vec![(Code::OverLimit, 0), (Code::Ok, 0)]));
    assert_eq!(all.overall, Code::OverLimit);
}

async fn a_requests_own_limit_applies_and_new_numbers_keep_the_counter(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let limited = |rpu: u32| RlsDescriptor { limit: Some((rpu, 3)), ..d(&[("colour", "red")]) };

    let first = rls.one(limited(1), 0).await;
    let second = rls.one(limited(1), 0).await;
    let raised = rls.one(limited(3), 0).await;
    let past_raised = rls.one(limited(3), 0).await;

    assert_eq!(seen(&[first, second]), [(Code::Ok, 0), (Code::OverLimit, 0)]);
    assert_eq!(seen(&[raised]), [(Code::Ok, 0)], "two hits counted (one rejected), carried to 3: a third fits");
    assert_eq!(past_raised.code, Code::OverLimit);
}

async fn negative_hits_give_back_what_was_spent_in_this_window(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    for _ in 0..3 {
        rls.one(d(&[("user", "carol")]), 0).await;
    }

    let refund = rls.one(RlsDescriptor { negative: true, ..hits(&[("user", "carol")], 2) }, S).await;
    let after = [rls.one(d(&[("user", "carol")]), 2 * S).await, rls.one(d(&[("user", "carol")]), 2 * S).await];
    let past = rls.one(d(&[("user", "carol")]), 2 * S).await;

    assert_eq!(seen(&[refund]), [(Code::Ok, 2)]);
    assert_eq!(seen(&after), [(Code::Ok, 1), (Code::Ok, 0)]);
    assert_eq!(past.code, Code::OverLimit);
}

async fn all_or_nothing_spends_every_counter_of_a_request_or_none(store: CounterStore, domain: &str) {
    let rls = service(store, domain);
    let together = format!("{domain}-together");
    let both = || vec![d(&[("user", "ann")]), d(&[("tenant", "acme")])];

    let first = rls.ask_in(&together, both(), 0).await;
    let second = rls.ask_in(&together, both(), 0).await;
    let third = rls.ask_in(&together, both(), 0).await;
    let tenant_alone = rls.ask_in(&together, vec![d(&[("tenant", "acme")])], 0).await;

    assert_eq!(seen(&first.statuses), [(Code::Ok, 1), (Code::Ok, 4)]);
    assert_eq!(seen(&second.statuses), [(Code::Ok, 0), (Code::Ok, 3)]);
    assert_eq!(third.overall, Code::OverLimit);
    assert_eq!(seen(&third.statuses), [(Code::OverLimit, 0), (Code::Ok, 3)], "the tenant's 3 left, unspent");
    assert_eq!(seen(&tenant_alone.statuses), [(Code::Ok, 2)], "the refused request spent nothing of the tenant's");
}

async fn under_all_or_nothing_a_descriptor_that_never_fits_spends_nothing_of_the_others(
    store: CounterStore,
    domain: &str,
) {
    let rls = service(store, domain);
    let together = format!("{domain}-together");

    let blocked = rls.ask_in(&together, vec![d(&[("user", "bo")]), d(&[("zero", "x")])], 0).await;
    let too_many = rls.ask_in(&together, vec![hits(&[("user", "bo")], 1), hits(&[("tenant", "t")], 6)], 0).await;
    let shadowed =
        rls.ask_in(&together, vec![d(&[("user", "bo")]), d(&[("shadow", "s")]), d(&[("shadow", "s")])], 0).await;

    assert_eq!(
        (blocked.overall, seen(&blocked.statuses)),
        (Code::OverLimit, vec![(Code::Ok, 2), (Code::OverLimit, 0)])
    );
    assert_eq!(
        (too_many.overall, seen(&too_many.statuses)),
        (Code::OverLimit, vec![(Code::Ok, 2), (Code::OverLimit, 0)])
    );
    assert_eq!(shadowed.overall, Code::Ok, "a shadow rule over its limit is decided on its own and answered OK");
    assert_eq!(seen(&shadowed.statuses[..1]), [(Code::Ok, 1)], "bo's first hit: nothing before was spent");
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn on_the_memory_store() {
                let _shared = crate::support::HEAVY.read().await;
                super::$scenario(crate::support::memory_store(), stringify!($scenario)).await;
            }

            #[tokio::test]
            async fn on_redis() {
                let _shared = crate::support::HEAVY.read().await;
                let redis = crate::support::RedisServer::start();
                super::$scenario(crate::support::redis_store(&redis), stringify!($scenario)).await;
                redis.assert_every_key_has_a_ttl();
            }

            #[tokio::test]
            async fn on_a_redis_cluster() {
                let _shared = crate::support::HEAVY.read().await;
                let cluster = crate::support::shared_cluster();
                super::$scenario(crate::support::cluster_store(cluster), stringify!($scenario)).await;
                cluster.assert_every_key_has_a_ttl();
            }
        }
    )*};
}

on_every_store!(
    a_key_alone_counts_each_value_apart_and_answers_over_limit_past_it,
    an_exact_value_wins_over_a_wildcard_and_a_wildcard_over_the_key_alone,
    a_nested_rule_counts_only_at_the_descriptors_last_entry,
    unlimited_allows_with_every_hit_left_and_zero_per_unit_never_allows,
    an_unknown_domain_or_descriptor_is_allowed_and_counted_nowhere,
    shadow_mode_counts_and_decides_but_answers_ok,
    a_rejected_hit_is_counted_so_a_budget_charged_on_stream_done_runs_out,
    a_charge_larger_than_the_limit_is_over_and_counted_up_to_one_limit_of_debt,
    a_token_bucket_rule_answers_the_exact_wait_of_its_rejection,
    a_window_of_five_minutes_ends_on_a_five_minute_boundary,
    values_a_shared_wildcard_matches_share_one_counter,
    a_replaced_rule_is_neither_applied_nor_counted,
    descriptors_are_counted_independently_and_one_over_makes_the_whole_over,
    in_quota_mode_a_request_is_over_only_when_every_quota_descriptor_is,
    a_requests_own_limit_applies_and_new_numbers_keep_the_counter,
    negative_hits_give_back_what_was_spent_in_this_window,
    all_or_nothing_spends_every_counter_of_a_request_or_none,
    under_all_or_nothing_a_descriptor_that_never_fits_spends_nothing_of_the_others,
);
