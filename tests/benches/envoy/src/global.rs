//! The global group: one policy local, in `check` mode (h2c and HTTP/1.1) and in `lease`
//! mode against a real `sluice-counter`, beside no filter; callouts per 1000 requests and
//! latency at one connection beside a round trip to the service itself.

use super::{Sample, TOKEN, base, baseline_wasm, measure, median, wrk};
use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::{Counter as Metric, Envoy, PluginCounter, Reason, cluster, plugin_stat, policy_stat, sluice};
use std::collections::BTreeMap;

/// The check-mode variant whose cost the response reports (42 against an estimate of
/// 10): each response is settled at the service with a charge, one more callout.
const CHECK_SETTLED: &str = "check, cost from the response";

/// The check-mode variant that sends every check alone (`max_checks_in_flight: 0`), as
/// the filter did before group commit.
const CHECK_UNBATCHED: &str = "check, each alone";

/// The global group's policy on `x-tenant`, by mode: `local`, `check` (either
/// protocol) or `lease`, on a budget that never runs out; and `lease, over the limit`: a
/// budget of 200 per second, leased 20 at a time, under a demand far above it (the
/// budget is exhausted, most requests get the service's 429).
fn global_policy(mode: &str) -> String {
    let mode = mode.strip_prefix("before: ").unwrap_or(mode);
    let (strategy, numbers) = match mode {
        m if matches!(m, "check" | "check over HTTP/1.1" | CHECK_UNBATCHED)
            || (m.starts_with("check, ") && m.ends_with(" in flight")) =>
        {
            (r#","global":{"strategy":"check"}"#, r#""1000000000/second","burst":1000000000"#)
        }
        CHECK_SETTLED => (
            r#","global":{"strategy":"check"},"cost":{"response_header":"x-usage","estimate":10,"max":1000}"#,
            r#""1000000000/second","burst":1000000000"#,
        ),
        "lease" => (
            r#","global":{"strategy":"lease","lease":{"size":10000,"duration":"10s","low_water":2000}}"#,
            r#""1000000000/second","burst":1000000000"#,
        ),
        "lease, over the limit" => (
            r#","global":{"strategy":"lease","lease":{"size":20,"duration":"1s","low_water":5}}"#,
            r#""200/second","burst":200"#,
        ),
        _ => ("", r#""1000000000/second","burst":1000000000"#),
    };
    // Checks go together by default (group commit); one variant sends each alone, and
    // `check, <n> in flight` (run by name with `GLOBAL_MODES`) sets the bound to n.
    let in_flight = mode.strip_prefix("check, ").and_then(|m| m.strip_suffix(" in flight"));
    let batching = match in_flight {
        _ if mode == CHECK_UNBATCHED => r#","max_checks_in_flight":0"#.to_owned(),
        Some(n) => format!(r#","max_checks_in_flight":{n}"#),
        None => String::new(),
    };
    format!(
        r#"{{"counter_service":{{"cluster":"sluice-counter","hash_key_env":"H","token_env":"T","timeout":"200ms"{batching}}},
           "policies":[{{"name":"tenant","key":[{{"header":"x-tenant"}}],"rate":{numbers}{strategy}}}],
           "response":{{"fallback_header":"x-sluice-fallback"}}}}"#
    )
}

/// One Envoy of the global group, with no filter (`none`) or Sluice in `mode`, and the
/// counter-service cluster: h2c, as the examples configure it, or HTTP/1.1 for the one
/// variant that shows what the protocol adds to a check's latency.
pub(crate) fn global_envoy(mode: &str, service: &Counter) -> Envoy {
    let builder = base(1).cluster(cluster("sluice-counter", service.addr(), !mode.ends_with("HTTP/1.1")));
    let builder = if mode.ends_with(CHECK_SETTLED) { builder.answer("{}", &[("x-usage", "42")]) } else { builder };
    let builder = if mode == "none" {
        builder
    } else {
        let filter = sluice(&global_policy(mode)).env("H", "bench-hash-key-0123456789abcdef").env("T", TOKEN);
        match (mode.starts_with("before: "), baseline_wasm()) {
            (true, Some(before)) => builder.sluice(filter.wasm(before)),
            _ => builder.sluice(filter),
        }
    };
    builder.start().unwrap_or_else(|e| panic!("{e}"))
}

pub(crate) fn global_group(rounds: u64, seconds: u64) {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy_with = |mode: &str| global_envoy(mode, &service);
    // A wrk script that posts one check, as the filter does, straight to the service.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("check.lua");
    let body = r#"{"tag":"t","entries":[{"key":"0123456789abcdef0123456789abcdef","policy_version":0,"limit":{"algorithm":"token_bucket","amount":1000000000,"per_ms":1000,"burst":1000000000},"cost":1}]}"#;
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"content-type\"] = \"application/json\"\nwrk.headers[\"authorization\"] = \"Bearer {TOKEN}\"\n"
        ),
    )
    .unwrap();
    let mut rows: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut modes = vec![
        "none",
        "local",
        "check",
        CHECK_UNBATCHED,
        "check over HTTP/1.1",
        CHECK_SETTLED,
        "lease",
        "lease, over the limit",
    ];
    if baseline_wasm().is_some() {
        modes.extend([
            "before: local",
            "before: check",
            "before: check, cost from the response",
            "before: lease",
            "before: lease, over the limit",
        ]);
    }
    // `GLOBAL_MODES` (separated by `;`: some names have commas) runs only those modes.
    let chosen = std::env::var("GLOBAL_MODES").ok();
    if let Some(only) = &chosen {
        let only: Vec<&str> = only.split(';').map(str::trim).collect();
        modes.retain(|m| only.contains(m));
        // The bound on check calls in flight, by name: `check, <n> in flight`.
        modes.extend(only.into_iter().filter(|m| m.starts_with("check, ") && m.ends_with(" in flight")));
    }
    for round in 1..=rounds {
        for &mode in &modes {
            let envoy = envoy_with(mode);
            let url = format!("http://{}/", envoy.addr());
            // A tenant named `reject` tells `wrk` that its 429s are expected.
            let tenant = if mode.ends_with("lease, over the limit") { "x-tenant: reject" } else { "x-tenant: acme" };
            let _ = measure(&envoy, &[tenant], 32, 1);
            let before = envoy.stats();
            let saturated = measure(&envoy, &[tenant], 32, seconds);
            let after = envoy.stats();
            let count = |stats: &sluice_tests::envoy::Stats, name: &str| stats.get(name).copied().unwrap_or(0);
            let tenant_delta = |counter: Metric| {
                policy_stat(&after, "tenant", counter).saturating_sub(policy_stat(&before, "tenant", counter))
            };
            let calls = plugin_stat(&after, PluginCounter::Callouts) - plugin_stat(&before, PluginCounter::Callouts);
            let requests = tenant_delta(Metric::Offered);
            let degraded: u64 = Reason::ALL.iter().map(|r| tenant_delta(r.counter())).sum();
            // Streams the client closed while they waited (wrk ending its run) are
            // counted as rejected too; they are not the limiter's rejections.
            let abandoned = tenant_delta(Metric::Abandoned);
            let rejected = tenant_delta(Metric::Rejected) - abandoned;
            if rejected > 0 && !mode.ends_with("lease, over the limit") {
                // A budget that never runs out rejected: say what the filter counted.
                let changed: Vec<String> = after
                    .iter()
                    .filter(|(name, _)| name.starts_with("wasmcustom.") && name.contains("sluice_"))
                    .map(|(name, value)| (name, value.saturating_sub(count(&before, name))))
                    .filter(|(_, delta)| *delta > 0)
                    .map(|(name, delta)| format!("{name} +{delta}"))
                    .collect();
                eprintln!("note: {mode} rejected {rejected} on a budget that never runs out; counted: {changed:?}");
            }
            // A cost the response reports: what the service charged, and what it could
            // not (forgiven: counted, but admitted beyond the budget).
            let charged = tenant_delta(Metric::CostCharged);
            let forgiven = tenant_delta(Metric::CostForgiven);
            let one = wrk(&url, &[tenant], 1, seconds, None);
            let per_thousand = if requests > 0 { calls as f64 * 1000.0 / requests as f64 } else { 0.0 };
            eprintln!(
                "round {round}: {mode:21} {:>8.0} req/s saturated (p50 {:.0} µs, p99 {:.0} µs), {per_thousand:.2} callouts \
                 per 1000, {rejected} rejected, {degraded} degraded, {abandoned} abandoned, cost charged {charged} \
                 forgiven {forgiven} over {requests} requests; 1 connection p50 {:.0} µs",
                saturated.rps, saturated.p50_us, saturated.p99_us, one.p50_us
            );
            if mode.ends_with(CHECK_SETTLED) {
                let forgiven_share =
                    if charged + forgiven > 0 { forgiven as f64 / (charged + forgiven) as f64 } else { 0.0 };
                rows.entry(format!("{mode}, share of the excess forgiven"))
                    .or_default()
                    .push(Sample { rps: forgiven_share, ..Sample::default() });
            }
            rows.entry(format!("{mode}, saturated")).or_default().push(saturated);
            rows.entry(format!("{mode}, 1 connection")).or_default().push(one);
            rows.entry(format!("{mode}, callouts per 1000 requests"))
                .or_default()
                .push(Sample { rps: per_thousand, ..Sample::default() });
        }
        let rtt = wrk(&format!("http://{}/v1/check", service.addr()), &[], 1, seconds, Some(script.to_str().unwrap()));
        let service_max =
            wrk(&format!("http://{}/v1/check", service.addr()), &[], 32, seconds, Some(script.to_str().unwrap()));
        eprintln!(
            "round {round}: service alone: 1 connection p50 {:.0} µs; 32 connections {:.0} req/s",
            rtt.p50_us, service_max.rps
        );
        rows.entry("service alone, 1 connection".to_owned()).or_default().push(rtt);
        rows.entry("service alone, 32 connections".to_owned()).or_default().push(service_max);
    }
    let med = |name: &str, f: fn(&Sample) -> f64| median(&mut rows[name].iter().map(f).collect::<Vec<_>>());
    println!(
        "\n## global policies\n\n| row | median req/s | median p50 µs | median p99 µs | Envoy CPU ns/request |\n|---|---:|---:|---:|---:|"
    );
    for name in rows.keys() {
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} |",
            med(name, |s| s.rps),
            med(name, |s| s.p50_us),
            med(name, |s| s.p99_us),
            med(name, |s| s.cpu_ns_per_request)
        );
    }
    // Envoy's CPU time per request (all its threads), the steadier figure.
    let cpu = |mode: &str| med(&format!("{mode}, saturated"), |s| s.cpu_ns_per_request);
    let over_none = |mode: &str| cpu(mode) - cpu("none");
    let has = |mode: &str| rows.contains_key(&format!("{mode}, saturated"));
    if has("check") && has(CHECK_UNBATCHED) && has("none") {
        let per_thousand = |mode: &str| med(&format!("{mode}, callouts per 1000 requests"), |s| s.rps);
        println!(
            "group commit: check mode adds {:.0} ns of Envoy CPU per request over no filter against {:.0} ns with each \
             check alone ({:.2}×); {:.0} callouts per 1000 requests against {:.0}; p99 at 32 connections {:.0} µs \
             against {:.0} µs; p50 at 1 connection {:.0} µs against {:.0} µs",
            over_none("check"),
            over_none(CHECK_UNBATCHED),
            over_none("check") / over_none(CHECK_UNBATCHED),
            per_thousand("check"),
            per_thousand(CHECK_UNBATCHED),
            med("check, saturated", |s| s.p99_us),
            med(&format!("{CHECK_UNBATCHED}, saturated"), |s| s.p99_us),
            med("check, 1 connection", |s| s.p50_us),
            med(&format!("{CHECK_UNBATCHED}, 1 connection"), |s| s.p50_us),
        );
    }
    if !(has("none")
        && has("local")
        && has("check")
        && has("check over HTTP/1.1")
        && has(CHECK_SETTLED)
        && has("lease"))
    {
        return;
    }
    let added_cpu = |mode: &str| cpu(mode) - cpu("local");
    let added_p50 = med("check, 1 connection", |s| s.p50_us) - med("local, 1 connection", |s| s.p50_us);
    let rtt = med("service alone, 1 connection", |s| s.p50_us);
    println!(
        "\ncheck mode over local: {:.0} ns of Envoy CPU per request; p50 +{added_p50:.0} µs = {:.2} × one round trip to the service ({rtt:.0} µs)",
        added_cpu("check"),
        added_p50 / rtt
    );
    let added_p50_http1 =
        med("check over HTTP/1.1, 1 connection", |s| s.p50_us) - med("local, 1 connection", |s| s.p50_us);
    println!(
        "check mode over HTTP/1.1 to the service: p50 +{added_p50_http1:.0} µs = {:.2} × one round trip",
        added_p50_http1 / rtt
    );
    println!(
        "check mode with a cost the response reports, over the same check with a known cost: {:.0} ns of Envoy CPU per \
         request, {:.0} callouts per 1000 requests (the checks and the settlements' charges), {:.4} of the excess \
         forgiven",
        cpu(CHECK_SETTLED) - cpu("check"),
        med(&format!("{CHECK_SETTLED}, callouts per 1000 requests"), |s| s.rps),
        med(&format!("{CHECK_SETTLED}, share of the excess forgiven"), |s| s.rps)
    );
    println!(
        "Envoy CPU added over no filter: local {:.0} ns, check {:.0} ns, lease {:.0} ns per request; lease / local = {:.2}; \
         {:.2} callouts per 1000 requests in lease mode",
        over_none("local"),
        over_none("check"),
        over_none("lease"),
        over_none("lease") / over_none("local"),
        med("lease, callouts per 1000 requests", |s| s.rps)
    );
    if baseline_wasm().is_some() {
        println!(
            "before (BASELINE_WASM), Envoy CPU added over no filter: local {:.0} ns, check {:.0} ns, lease {:.0} ns per request",
            over_none("before: local"),
            over_none("before: check"),
            over_none("before: lease"),
        );
    }
}
