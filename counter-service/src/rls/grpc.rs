//! The gRPC service Envoy's `envoy.filters.http.ratelimit` calls:
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, with the protobuf types
//! `envoy-types` ships already generated (no `protoc` at build time).
//!
//! Errors are gRPC statuses (`INVALID_ARGUMENT`, `UNAVAILABLE`, `UNAUTHENTICATED`),
//! never `overall_code: UNKNOWN`, which Envoy lets through whatever its
//! `failure_mode_deny` says.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as ProtoCode, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

use super::config::Unit;
use super::decide::{Code, RlsAnswer, RlsDescriptor, RlsError, RlsRequest, Status, decide};
use super::headers::{ResponseHeaders, headers};
use super::metadata::dynamic_metadata;
use super::watch::Loaded;
use crate::app::App;

/// The tonic service that serves [`Rls`].
pub type RlsServer = RateLimitServiceServer<Rls>;

/// The service: the app it decides with, the configuration it decides under.
#[derive(Clone, Debug)]
pub struct Rls {
    app: Arc<App>,
    config: Arc<Loaded>,
    headers: ResponseHeaders,
    dynamic_metadata: bool,
}

impl Rls {
    /// Serves `config` with `app`, adding `headers` to each answer.
    pub const fn new(app: Arc<App>, config: Arc<Loaded>, headers: ResponseHeaders) -> Self {
        Self { app, config, headers, dynamic_metadata: false }
    }

    /// Whether each answer carries `dynamic_metadata` ([`dynamic_metadata`]).
    #[must_use]
    pub fn with_dynamic_metadata(mut self, dynamic_metadata: bool) -> Self {
        self.dynamic_metadata = dynamic_metadata;
        self
    }

    /// The tonic service to mount.
    pub fn into_service(self) -> RlsServer {
        RateLimitServiceServer::new(self)
    }
}

/// `request` in the decision's own types.
pub fn from_proto(request: RateLimitRequest) -> RlsRequest {
    RlsRequest {
        domain: request.domain,
        hits_addend: request.hits_addend,
        descriptors: request
            .descriptors
            .into_iter()
            .map(|d| RlsDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit: d.limit.map(|l| (l.requests_per_unit, l.unit)),
                hits_addend: d.hits_addend.map(|h| h.value),
                negative: d.is_negative_hits,
            })
            .collect(),
    }
}

const fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

const fn proto_code(code: Code) -> ProtoCode {
    match code {
        Code::Ok => ProtoCode::Ok,
        Code::OverLimit => ProtoCode::OverLimit,
    }
}

fn status_to_proto(status: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: proto_code(status.code) as i32,
        current_limit: status.current_limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: proto_unit(l.unit) as i32,
        }),
        limit_remaining: status.limit_remaining,
        duration_until_reset: status
            .duration_until_reset
            .map(|d| ProtoDuration { seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nanos: 0 }),
        quota: None,
    }
}

/// `answer` as Envoy reads it, with the configured headers.
pub fn to_proto(answer: &RlsAnswer, wanted: ResponseHeaders) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: proto_code(answer.overall) as i32,
        statuses: answer.statuses.iter().map(status_to_proto).collect(),
        response_headers_to_add: headers(answer, wanted)
            .into_iter()
            .map(|(key, value)| HeaderValue { key: key.to_owned(), value, raw_value: Vec::new() })
            .collect(),
        ..RateLimitResponse::default()
    }
}

fn status_of(error: &RlsError) -> tonic::Status {
    match error {
        RlsError::Invalid(m) => tonic::Status::invalid_argument(m.clone()),
        RlsError::Unavailable(m) => tonic::Status::unavailable(m.clone()),
        RlsError::Unauthenticated(m) => tonic::Status::unauthenticated(m.clone()),
    }
}

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let start = Instant::now();
        let metrics = self.app.metrics().rls();
        let result = self.answer(request).await;
        metrics.request(result.as_ref().err().map(RlsError::kind), start.elapsed());
        match result {
            Ok((request, answer)) => {
                for status in &answer.statuses {
                    if let (Some(stat), Some(limit)) = (&status.stat, &status.current_limit) {
                        metrics.hits(stat, status.hits, status.decided == Code::OverLimit, status.shadow_mode, {
                            let near = u64::from(limit.requests_per_unit) * 8 / 10;
                            u64::from(limit.requests_per_unit).saturating_sub(u64::from(status.limit_remaining)) >= near
                        });
                    }
                }
                if answer.domain_not_found {
                    metrics.domain_not_found();
                }
                let mut response = to_proto(&answer, self.headers);
                if self.dynamic_metadata {
                    response.dynamic_metadata = Some(dynamic_metadata(&request, &answer));
                }
                Ok(tonic::Response::new(response))
            }
            Err(error) => Err(status_of(&error)),
        }
    }
}

impl Rls {
    async fn answer(&self, request: tonic::Request<RateLimitRequest>) -> Result<(RlsRequest, RlsAnswer), RlsError> {
        let values = request.metadata().get_all("authorization");
        self.app.authenticate(values.iter().map(|v| v.as_bytes()))?;
        let _permit = self.app.in_flight_permit()?;
        let _gauge = self.app.metrics().start();
        let config = self.config.current();
        let request = from_proto(request.into_inner());
        let answer = decide(&self.app, &config, &request, None).await?;
        Ok((request, answer))
    }
}
