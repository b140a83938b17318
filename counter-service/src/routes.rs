//! Which answer each HTTP request gets: the routes, the middleware that authenticates,
//! reads the body within its bounds and sheds load, and the error responses.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::api::ApiError;
use crate::app::App;
use crate::handle::Route;
use crate::overrides::OverrideList;
use sluice_protocol::ErrorCode;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

/// The router with every route and bound.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/checks", post(checks))
        .route("/v1/lease", post(lease))
        .route("/v1/charge", post(charge))
        .route("/v1/credit", post(credit))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin/v1/overrides", post(set_override).get(list_overrides))
        .route("/admin/v1/overrides/{id}", delete(remove_override))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), bound))
        // `bound` has read the body within --max-body-bytes already.
        .layer(DefaultBodyLimit::disable())
        .with_state(app)
}

/// Refuses callers without the configured token (except on the probes, which
/// orchestrators and scrapers call without one; the admin API takes the admin token
/// instead, and only it), reads the whole body within
/// `max_body` bytes and `request_timeout`, then sheds requests beyond `max_in_flight`
/// (except liveness and metrics, which must answer under overload), keeps the in-flight
/// gauge and counts statuses.
///
/// The permit is taken only once the request is whole: a caller that sends headers and
/// then a body slowly, or never, holds no permit while it does (it holds a connection,
/// or an HTTP/2 stream, bounded by `--max-connections` and the streams per connection,
/// until the request timeout answers it `408`).
async fn bound(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    if matches!(path, "/healthz" | "/metrics") {
        return next.run(request).await;
    }
    // Before anything else: a refused caller costs a header comparison, no read.
    let refused = {
        let presented = request.headers().get_all(header::AUTHORIZATION);
        let presented = presented.iter().map(|v| v.as_bytes());
        if path.starts_with("/admin/") {
            app.authenticate_admin(presented).err()
        } else if path != "/readyz" {
            app.authenticate(presented).err()
        } else {
            None
        }
    };
    if let Some(refused) = refused {
        app.metrics().response(refused.status);
        return unauthorized(refused);
    }
    let (parts, body) = request.into_parts();
    let read = {
        let _reading = app.metrics().reading();
        read_body(body, app.max_body(), app.request_timeout()).await
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(error) => {
            let timed_out = error.status == 408;
            let mut response = error.into_response();
            if timed_out && parts.version <= axum::http::Version::HTTP_11 {
                // The rest of the body may still come: this connection cannot carry
                // another request (RFC 9110 §15.5.9).
                response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            app.metrics().response(response.status().as_u16());
            return response;
        }
    };
    let request = Request::from_parts(parts, Body::from(bytes));
    let response = match app.in_flight_permit() {
        Ok(permit) => {
            let _gauge = app.metrics().start();
            let response = next.run(request).await;
            drop(permit);
            response
        }
        Err(overloaded) => overloaded.into_response(),
    };
    app.metrics().response(response.status().as_u16());
    response
}

/// `401 unauthorized` with `WWW-Authenticate: Bearer` (RFC 6750 §3). The message says
/// which rule failed, never what was sent. (The admin API's `404 admin_disabled` has no
/// such header.)
fn unauthorized(refused: ApiError) -> Response {
    let challenge = refused.status == 401;
    let mut response = refused.into_response();
    if !challenge {
        return response;
    }
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"sluice-counter\""));
    response
}

/// How much of an oversized body is read and discarded before answering 413, so that a
/// client still sending it reads the answer instead of a reset connection. Beyond this
/// (or [`DRAIN_TIME`]) the connection is closed.
const DRAIN_BYTES: usize = 4 << 20;
/// The longest time spent discarding an oversized body.
const DRAIN_TIME: Duration = Duration::from_secs(1);

/// Reads a whole body of at most `limit` bytes that arrives within `timeout`: `413
/// body_too_large` past the size (after discarding some of the rest, see
/// [`DRAIN_BYTES`]), `408 request_timeout` past the time.
async fn read_body(mut body: Body, limit: usize, timeout: Duration) -> Result<bytes::Bytes, ApiError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let too_large = || ApiError::body_too_large(limit);
    let timed_out = || ApiError {
        status: 408,
        code: ErrorCode::RequestTimeout,
        message: format!(
            "the request body did not arrive within {} ms of its headers (--request-timeout-ms)",
            timeout.as_millis()
        ),
    };
    let unreadable = |e: axum::Error| {
        ApiError::bad_request(ErrorCode::BodyUnreadable, format!("the request body could not be read: {e}"))
    };
    let mut buffer = bytes::BytesMut::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(_) => return Err(timed_out()),
        };
        let Ok(data) = frame.map_err(unreadable)?.into_data() else { continue };
        if buffer.len() + data.len() > limit {
            let mut discarded = buffer.len() + data.len();
            let drain = async {
                while discarded <= DRAIN_BYTES {
                    match body.frame().await {
                        Some(Ok(frame)) => discarded += frame.data_ref().map_or(0, |d| d.len()),
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(too_large());
        }
        buffer.extend_from_slice(&data);
    }
    Ok(buffer.freeze())
}

fn json<T: serde::Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(bytes) => json_bytes(bytes),
        Err(e) => {
            ApiError { status: 500, code: ErrorCode::Internal, message: format!("cannot encode the response: {e}") }
                .into_response()
        }
    }
}

fn json_bytes(bytes: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(bytes));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A decision route over HTTP: what [`App::handle_now`] does, with the store awaited.
async fn decide(app: &App, route: Route, body: &[u8]) -> Result<Response, ApiError> {
    let call = app.prepare(route, body)?;
    let (outcome, enforced) = app.decide(&call).await?;
    Ok(json_bytes(app.answer(&call, &outcome, &enforced)?))
}

async fn check(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Check, &body).await
}

/// `POST /v1/checks`: the batch's checks decided concurrently (see `batch.rs`), their
/// results in the request's order.
async fn checks(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    let bodies = app.split_checks(&body)?;
    let mut decided = tokio::task::JoinSet::new();
    for (index, check) in bodies.iter().cloned().enumerate() {
        let app = app.clone();
        decided.spawn(async move { (index, app.decide_in_batch(index, &check).await) });
    }
    let mut results: Vec<Option<Vec<u8>>> = vec![None; bodies.len()];
    while let Some(joined) = decided.join_next().await {
        if let Ok((index, result)) = joined
            && let Some(slot) = results.get_mut(index)
        {
            *slot = Some(result);
        }
    }
    // A check whose task did not finish (it panicked) is answered as an internal error.
    let results: Vec<Vec<u8>> = results
        .into_iter()
        .enumerate()
        .map(|(index, result)| {
            result.unwrap_or_else(|| {
                let error = ApiError { status: 500, code: ErrorCode::Internal, message: "not decided".to_owned() };
                crate::batch::failure(index, &error)
            })
        })
        .collect();
    Ok(json_bytes(crate::batch::results(&results)))
}

async fn lease(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Lease, &body).await
}

async fn charge(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Charge, &body).await
}

async fn credit(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    decide(&app, Route::Credit, &body).await
}

async fn set_override(State(app): State<Arc<App>>, body: Bytes) -> Result<Response, ApiError> {
    let stored = app.set_override(&body).await?;
    let mut response = json(&stored);
    *response.status_mut() = StatusCode::CREATED;
    Ok(response)
}

async fn list_overrides(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    Ok(json(&OverrideList { overrides: app.list_overrides().await? }))
}

async fn remove_override(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    app.remove_override(&id, &body).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn healthz() -> Response {
    json(&serde_json::json!({ "status": "ok" }))
}

async fn readyz(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    app.timed(app.store().ping()).await?;
    Ok(json(&serde_json::json!({ "status": "ready", "store": app.store().name() })))
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let mut response = Response::new(Body::from(app.metrics().render(app.store())));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    response
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(request.uri().path())
}

async fn method_not_allowed(request: Request) -> ApiError {
    ApiError::method_not_allowed(request.method().as_str(), request.uri().path())
}
