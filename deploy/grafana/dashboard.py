"""Sluice's Grafana dashboard, as code (grafanalib, pinned in deploy/requirements.txt).

`python3 deploy/generate.py` writes it to deploy/grafana/sluice-dashboard.json; never edit
that file by hand. Every query uses only the variables `$policy`, `$proxy` (regexes:
multi-valued, "All" is `.*`) and `$__rate_interval`, so the generator can list each one
with the variables set (`--queries`) for a test to run against a real Prometheus.

What it shows follows the seed's list of measures, in bounded dimensions only: per policy
(and outcome, reason, kind), per proxy (`instance`), per counter-service instance; never a
label that comes from a request.
"""

import attr
from grafanalib.core import (
    Dashboard,
    GridPos,
    Heatmap,
    Repeat,
    RowPanel,
    Stat,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
    GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
    REFRESH_ON_TIME_RANGE_CHANGE,
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The matchers every filter series of a panel carries.
SEL = 'policy=~"$policy", instance=~"$proxy"'
# The matcher of the proxies' plugin-wide series (no policy label).
PROXY = 'instance=~"$proxy"'
RATE = "[$__rate_interval]"
# The counter service's cluster: `sluice-counter` in envoy-config/envoy.yaml, and
# `outbound|8710||sluice-counter.<namespace>.svc.cluster.local` under Istio.
SERVICE_CLUSTER = 'envoy_cluster_name=~".*sluice-counter.*"'
WIDTH = 24


def target(expr: str, legend: str, ref: str, **extra) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, datasource=DATASOURCE, intervalFactor=1, **extra)


def targets(*pairs) -> list:
    """Targets from (expr, legend) pairs, with refIds A, B, ..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def series(title: str, description: str, *pairs, unit: str = "short", **extra) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*pairs),
        unit=unit,
        fillOpacity=extra.pop("fillOpacity", 10),
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        **extra,
    )


def stat(title: str, description: str, expr: str, legend: str, unit: str, no_value: str) -> Stat:
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets((expr, legend)),
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="none",
        noValue=no_value,
        thresholds=[{"color": "green", "value": None}],
    )


def heatmap(title: str, description: str, reason: str) -> Heatmap:
    # A wait is the proxy's, not a policy's (one sample per request that waited).
    expr = f'sum by (le) (rate(sluice_wait_milliseconds_bucket{{reason="{reason}", {PROXY}}}{RATE}))'
    return Heatmap(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, "{{le}}", "A", format="heatmap")],
        dataFormat="tsbuckets",
        yBucketBound="upper",
        hideZeroBuckets=True,
        # The heatmap panel of Grafana 9 and later (the legacy fields above are for older
        # ones): Prometheus' buckets as they are, upper bounds in milliseconds.
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5,
                      "steps": 64, "fill": "dark-orange", "reverse": False},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "le"},
            "tooltip": {"show": True, "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "unit": "ms"},
        },
    )


def ratio(numerator: str, matchers: str = "") -> str:
    """Per policy: rate(numerator{matchers}) / rate(sluice_offered_total) over the selected proxies."""
    inner = f"{matchers}, {SEL}" if matchers else SEL
    return (
        f"sum by (policy) (rate({numerator}{{{inner}}}{RATE}))\n"
        f"/ sum by (policy) (rate(sluice_offered_total{{{SEL}}}{RATE}))"
    )


def by_policy_rate(metric: str, extra_labels: str = "", matchers: str = "") -> str:
    labels = "policy" + (f", {extra_labels}" if extra_labels else "")
    inner = f"{matchers}, {SEL}" if matchers else SEL
    return f"sum by ({labels}) (rate({metric}{{{inner}}}{RATE}))"


# Stacking the three terms of the accounting line, with offered drawn over them as a line:
# the stack's top meets it while the line holds.
OFFERED_OVER_STACK = [
    {
        "matcher": {"id": "byName", "options": "offered"},
        "properties": [
            {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.lineWidth", "value": 2},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": "text"}},
        ],
    }
]

ROWS = [
    (
        "Outcomes: offered = allowed + rejected + queued",
        [
            (
                series(
                    "Accounting line: $policy",
                    "Per policy (one panel each): the requests it applied to since each proxy started, "
                    "stacked as allowed + rejected + queued (held by shaping now), with offered drawn "
                    "over them. The stack's top meets offered while the accounting line holds.",
                    (f'sum(sluice_requests_total{{outcome="allowed", {SEL}}})', "allowed"),
                    (f'sum(sluice_requests_total{{outcome="rejected", {SEL}}})', "rejected"),
                    (f"sum(sluice_queued{{{SEL}}})", "queued"),
                    (f"sum(sluice_offered_total{{{SEL}}})", "offered"),
                    stacking={"mode": "normal", "group": "A"},
                    fillOpacity=40,
                    overrides=OFFERED_OVER_STACK,
                    repeat=Repeat(variable="policy", direction="h", maxPerRow=2),
                ),
                24,
            ),
            (
                series(
                    "Offered, allowed and rejected",
                    "Requests per second by policy and outcome. A low rejection rate is not healthy by "
                    "itself (the limiter may be bypassed: see the fallback and override rows); a high "
                    "one can be right during an attack.",
                    (by_policy_rate("sluice_offered_total"), "{{policy}} offered"),
                    (by_policy_rate("sluice_requests_total", "outcome"), "{{policy}} {{outcome}}"),
                    unit="reqps",
                ),
                12,
            ),
            (
                series(
                    "Rejection ratio",
                    "Rejected / offered, per policy.",
                    (ratio("sluice_requests_total", 'outcome="rejected"'), "{{policy}}"),
                    unit="percentunit",
                ),
                12,
            ),
            (
                series(
                    "Queued by shaping now",
                    "Requests held by shaping (leaky_bucket) right now, per policy.",
                    (f"sum by (policy) (sluice_queued{{{SEL}}})", "{{policy}}"),
                ),
                12,
            ),
            (
                series(
                    "Rejections by the binding policy",
                    "Requests a policy's own decision rejected (over_limit), per second: the policy that "
                    "bound, where 'rejected' counts every policy the request matched.",
                    (by_policy_rate("sluice_over_limit_total"), "{{policy}}"),
                    unit="reqps",
                ),
                12,
            ),
        ],
    ),
    (
        "Fallback: decisions the counter service did not make",
        [
            (
                series(
                    "Workers deciding by a fallback now",
                    "Per policy, the proxies' workers deciding it by its failure rule or emergency cap "
                    "right now (0 while the counter service decides). Fallback-mode duration: how long "
                    "this stays above 0.",
                    (f"sum by (policy) (sluice_fallback_active{{{SEL}}})", "{{policy}}"),
                    drawStyle="line",
                    lineInterpolation="stepAfter",
                ),
                8,
            ),
            (
                series(
                    "Workers in fallback (average)",
                    "Worker-seconds of fallback per second, per policy: 1 is one worker deciding by a "
                    "fallback all the time. Its integral is the fallback-mode duration.",
                    (f"sum by (policy) (rate(sluice_fallback_milliseconds_total{{{SEL}}}{RATE})) / 1000",
                     "{{policy}}"),
                ),
                8,
            ),
            (
                series(
                    "Degraded decisions by reason",
                    "Per second, per policy and reason: requests a fallback decided because the counter "
                    "service's answer was not had (timeout, refused, circuit_open, unauthorized, ...).",
                    (by_policy_rate("sluice_degraded_total", "reason"), "{{policy}} {{reason}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Degraded share",
                    "Degraded decisions / offered, per policy: the share of requests the counter service "
                    "did not decide.",
                    (ratio("sluice_degraded_total"), "{{policy}}"),
                    unit="percentunit",
                ),
                8,
            ),
            (
                series(
                    "Failure-rule and emergency-cap decisions",
                    "Per second: what the failure rule (on_failure action) and the emergency cap decided "
                    "while the service could not, by outcome.",
                    (by_policy_rate("sluice_failure_decisions_total", "outcome"), "{{policy}} failure rule {{outcome}}"),
                    (by_policy_rate("sluice_emergency_decisions_total", "outcome"),
                     "{{policy}} emergency cap {{outcome}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Circuit breaker openings",
                    "Times each proxy's circuit breaker to the counter service opened (its global "
                    "policies fall back, reason circuit_open, for the cooldown).",
                    (f"sum by (instance) (increase(sluice_counter_service_circuit_opened_total{{{PROXY}}}{RATE}))",
                     "{{instance}}"),
                    drawStyle="bars",
                ),
                8,
            ),
        ],
    ),
    (
        "Waiting before the decision",
        [
            (
                heatmap(
                    "Wait in the shaping queue",
                    "How long requests waited in a leaky_bucket's queue before release (ms). A stable "
                    "release rate with rising waits means admitted work is already stale.",
                    "queue",
                ),
                8,
            ),
            (
                heatmap(
                    "Wait for the counter service",
                    "How long requests waited for the counter service's answer before their decision (ms).",
                    "service",
                ),
                8,
            ),
            (
                heatmap(
                    "Wait for a lease refill",
                    "How long lease-mode requests waited for a refill before their decision (ms).",
                    "refill",
                ),
                8,
            ),
            (
                series(
                    "Wait p99 by reason",
                    "99th percentile of the wait before the decision, by what was waited for (queue, "
                    "service, refill), over the selected proxies.",
                    (f"histogram_quantile(0.99, sum by (reason, le) "
                     f"(rate(sluice_wait_milliseconds_bucket{{{PROXY}}}{RATE})))", "{{reason}}"),
                    unit="ms",
                ),
                24,
            ),
        ],
    ),
    (
        "Counter service callouts (as the proxies see them)",
        [
            (
                series(
                    "Callouts per second",
                    "Calls each proxy sends the counter service (checks, refills, charges), the batched "
                    "ones among them, and checks whose deadline passed before their batch was sent.",
                    (f"sum by (instance) (rate(sluice_counter_service_callouts_total{{{PROXY}}}{RATE}))",
                     "{{instance}} callouts"),
                    (f"sum by (instance) (rate(sluice_counter_service_check_batches_total{{{PROXY}}}{RATE}))",
                     "{{instance}} batches"),
                    (f"sum by (instance) (rate(sluice_counter_service_checks_unsent_total{{{PROXY}}}{RATE}))",
                     "{{instance}} unsent checks"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Callout round trip",
                    "The round trip of a callout as the proxies see it (ms), over the selected proxies: "
                    "Envoy's own histogram of the counter service's cluster (the filter does not measure it again).",
                    (f"histogram_quantile(0.5, sum by (le) "
                     f"(rate(envoy_cluster_upstream_rq_time_bucket{{{SERVICE_CLUSTER},{PROXY}}}{RATE})))", "p50"),
                    (f"histogram_quantile(0.99, sum by (le) "
                     f"(rate(envoy_cluster_upstream_rq_time_bucket{{{SERVICE_CLUSTER},{PROXY}}}{RATE})))", "p99"),
                    unit="ms",
                ),
                8,
            ),
            (
                series(
                    "Requests waiting for the service now",
                    "Requests each proxy holds waiting for the counter service (a check's answer or a "
                    "refill).",
                    (f"sum by (instance) (sluice_counter_service_waiting{{{PROXY}}})", "{{instance}}"),
                ),
                8,
            ),
        ],
    ),
    (
        "Counter service (sluice-counter)",
        [
            (
                series(
                    "Store latency",
                    "Latency of the counter service's store calls (Redis scripts, or memory), per store, "
                    "and its p99 by what the call was for (check, lease, charge, credit, admin).",
                    ("histogram_quantile(0.5, sum by (store, le) "
                     f"(rate(sluice_counter_store_latency_seconds_bucket{RATE})))", "{{store}} p50"),
                    ("histogram_quantile(0.99, sum by (store, op, le) "
                     f"(rate(sluice_counter_store_latency_seconds_bucket{RATE})))", "{{store}} {{op}} p99"),
                    unit="s",
                ),
                8,
            ),
            (
                series(
                    "Store errors by kind",
                    "Store calls that failed, per second, by kind (timeout, connection, full, server, "
                    "protocol): each is a 503 the proxies count as degraded (bad_status).",
                    (f"sum by (kind) (rate(sluice_counter_store_errors_total{RATE}))", "{{kind}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Service decisions",
                    "Checks the counter service decided, by outcome, and their entries by the policy the "
                    "proxies named (a check is all or nothing: each entry has its check's outcome).",
                    (f"sum by (outcome) (rate(sluice_counter_decisions_total{RATE}))", "checks {{outcome}}"),
                    (f'sum by (policy, outcome) (rate(sluice_counter_policy_decisions_total{{policy=~"$policy"}}{RATE}))',
                     "{{policy}} {{outcome}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Responses by status, and shed requests",
                    "The service's responses per second by HTTP status (0: any other), and requests it "
                    "refused because too many were in flight.",
                    (f"sum by (status) (rate(sluice_counter_responses_total{RATE}))", "{{status}}"),
                    (f"sum(rate(sluice_counter_shed_requests_total{RATE}))", "shed"),
                    unit="reqps",
                ),
                12,
            ),
            (
                series(
                    "Instances up, requests in flight",
                    'sluice-counter instances Prometheus reaches (job="sluice-counter", the convention '
                    "the alert rules assume) and the requests they serve now.",
                    ('sum(up{job="sluice-counter"})', "instances up"),
                    ("sum(sluice_counter_in_flight_requests)", "in flight"),
                ),
                12,
            ),
        ],
    ),
    (
        "Leases",
        [
            (
                series(
                    "Lease tokens",
                    "Per second, per lease-mode policy: tokens granted to the proxies, expired unspent, "
                    "and returned to the service before expiry.",
                    (by_policy_rate("sluice_lease_granted_tokens_total"), "{{policy}} granted"),
                    (by_policy_rate("sluice_lease_expired_tokens_total"), "{{policy}} expired"),
                    (by_policy_rate("sluice_lease_returned_tokens_total"), "{{policy}} returned"),
                ),
                8,
            ),
            (
                series(
                    "Lease refills",
                    "Refills the proxies sent, per second, per policy.",
                    (by_policy_rate("sluice_lease_refills_total"), "{{policy}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Lease reconciliation",
                    "Units admitted without the service (or beyond an estimate) and charged afterwards, "
                    "debt repaid from a later grant, and units forgiven: per second, per policy.",
                    (by_policy_rate("sluice_lease_reconciled_units_total"), "{{policy}} reconciled"),
                    (by_policy_rate("sluice_lease_repaid_units_total"), "{{policy}} repaid"),
                    (by_policy_rate("sluice_lease_forgiven_units_total"), "{{policy}} forgiven"),
                ),
                8,
            ),
            (
                series(
                    "Requests a lease could not serve",
                    "Lease-mode requests decided by a check at the service instead, by reason (slot_taken, "
                    "contended, cold).",
                    (by_policy_rate("sluice_lease_checked_total", "reason"), "{{policy}} {{reason}}"),
                    unit="reqps",
                ),
                24,
            ),
        ],
    ),
    (
        "Operator overrides",
        [
            (
                stat(
                    "Overrides in force",
                    "Live operator overrides (clamps and bypasses), as the counter service instances "
                    "last saw them.",
                    "max(sluice_counter_overrides_active)",
                    "overrides",
                    "none",
                    "0",
                ),
                4,
            ),
            (
                stat(
                    "Soonest override expiry",
                    "When the soonest live override expires (nothing shown: none is live). The policy "
                    "goes back to its configured numbers then.",
                    "min(sluice_counter_overrides_soonest_expiry_timestamp_seconds > 0) * 1000",
                    "expires",
                    "dateTimeFromNow",
                    "none live",
                ),
                4,
            ),
            (
                series(
                    "Requests decided under an override",
                    "Per second, per policy and kind (clamp, bypass), as the proxies count them.",
                    (by_policy_rate("sluice_overridden_total", "kind"), "{{policy}} {{kind}}"),
                    unit="reqps",
                ),
                8,
            ),
            (
                series(
                    "Entries decided under an override (service)",
                    "Entries of checks, leases, charges and credits the counter service decided under an "
                    "override, per second, by kind.",
                    (f"sum by (kind) (rate(sluice_counter_overridden_entries_total{RATE}))", "{{kind}}"),
                ),
                8,
            ),
        ],
    ),
    (
        "Slot tables, shadow policies, enforcement health",
        [
            (
                series(
                    "Overflow share (slot table full)",
                    "Requests decided on a policy's overflow bucket / offered: callers beyond the slot "
                    "table (or colliding in it) share one budget. Above 1 % the table is (near) full.",
                    (ratio("sluice_overflowed_total"), "{{policy}}"),
                    unit="percentunit",
                ),
                8,
            ),
            (
                series(
                    "Shadow policies: would-reject share",
                    "Requests a shadow policy would have rejected / the requests it applied to: the "
                    "predicted impact of enforcing it (0 for enforcing policies).",
                    (ratio("sluice_shadow_rejected_total"), "{{policy}}"),
                    unit="percentunit",
                ),
                8,
            ),
            (
                series(
                    "Shared-data keys created",
                    "Keys each proxy created for buckets, per second (bounded by the slot tables).",
                    (f"sum by (instance) (rate(sluice_keys_created_total{{{PROXY}}}{RATE}))", "{{instance}}"),
                ),
                8,
            ),
            (
                series(
                    "Shared-data failures",
                    "Per second, per policy: decisions given up after CAS conflicts, shared-data calls "
                    "the host failed, undecodable states repaired, host reads that failed.",
                    (by_policy_rate("sluice_cas_exhausted_total"), "{{policy}} cas exhausted"),
                    (by_policy_rate("sluice_store_errors_total"), "{{policy}} store errors"),
                    (by_policy_rate("sluice_repaired_total"), "{{policy}} repaired"),
                    (by_policy_rate("sluice_read_failures_total"), "{{policy}} read failures"),
                ),
                8,
            ),
            (
                series(
                    "Missing keys, abandoned, unrefunded",
                    "Per second, per policy: requests lacking a key part, requests whose client left "
                    "while queued or waiting, refunds that could not be written.",
                    (by_policy_rate("sluice_missing_key_total"), "{{policy}} missing key"),
                    (by_policy_rate("sluice_abandoned_total"), "{{policy}} abandoned"),
                    (by_policy_rate("sluice_unrefunded_total"), "{{policy}} unrefunded"),
                ),
                8,
            ),
            (
                series(
                    "Replies and resumes the host refused",
                    "Per proxy: local replies the host refused, paused requests it would not resume.",
                    (f"sum by (instance) (rate(sluice_reply_failures_total{{{PROXY}}}{RATE}))",
                     "{{instance}} reply failures"),
                    (f"sum by (instance) (rate(sluice_resume_failures_total{{{PROXY}}}{RATE}))",
                     "{{instance}} resume failures"),
                ),
                8,
            ),
        ],
    ),
]

HEIGHT = 8


def laid_out() -> list:
    """The rows and their panels, placed left to right, top to bottom."""
    panels = []
    y = 0
    for title, row in ROWS:
        panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=WIDTH, x=0, y=y)))
        y += 1
        x = 0
        for panel, width in row:
            if x + width > WIDTH:
                x, y = 0, y + HEIGHT
            panels.append(attr.evolve(panel, gridPos=GridPos(h=HEIGHT, w=width, x=x, y=y)))
            x += width
        y += HEIGHT
    return panels


def variable(name: str, label: str, query: str) -> Template:
    """A multi-valued query variable whose "All" (selected at first) is the regex `.*`, so
    new policies and proxies are included without a reload."""
    template = Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        multi=True,
        includeAll=True,
        allValue=".*",
        refresh=REFRESH_ON_TIME_RANGE_CHANGE,
    )
    template._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return template


def dashboard() -> Dashboard:
    return Dashboard(
        title="Sluice",
        uid="sluice",
        description=(
            "Sluice rate limiting: outcomes, fallback, waits, the counter service, leases, overrides, "
            "slot tables and shadow policies. Generated by deploy/grafana/dashboard.py "
            "(python3 deploy/generate.py): do not edit the JSON."
        ),
        tags=["sluice", "envoy", "rate-limiting"],
        timezone="browser",
        time=Time("now-1h", "now"),
        refresh="30s",
        schemaVersion=39,
        graphTooltip=GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        templating=Templating(
            list=[
                Template(
                    name="datasource",
                    label="Data source",
                    query="prometheus",
                    type="datasource",
                    default="default",
                ),
                variable("policy", "Policy", "label_values(sluice_offered_total, policy)"),
                variable("proxy", "Proxy", "label_values(sluice_offered_total, instance)"),
            ]
        ),
        panels=laid_out(),
    ).auto_panel_ids()
