//! An HTTP/2 upstream whose answers end with trailers, as gRPC services and some HTTP/2
//! gateways end theirs: cleartext HTTP/2 with prior knowledge (what Envoy speaks to a
//! cluster with `http2_protocol_options`), each request answered `200` with a JSON
//! document reporting the token usage its query asks for (`tokens=N`, as
//! [`crate::llm::document`] writes it) in DATA frames that do not end the stream, then a
//! HEADERS frame of trailers (`x-usage-final: N`) that does. It listens on a port the OS
//! picks, counts the answers it wrote in full, and stops when dropped.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// A running upstream (see the module docs).
#[derive(Debug)]
pub struct TrailersUpstream {
    addr: SocketAddr,
    served: Arc<AtomicU64>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl TrailersUpstream {
    /// Starts the upstream on a loopback port the OS picks.
    ///
    /// # Panics
    /// When no runtime can be built or no loopback port can be bound.
    pub fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the HTTP/2 upstream");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("the HTTP/2 upstream binds a loopback port");
        let addr = listener.local_addr().expect("the HTTP/2 upstream's address");
        let served = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&served);
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| answer(request, Arc::clone(&counted)));
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, served, runtime: Some(runtime) }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers whose trailers were written (the stream ended).
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }
}

impl Drop for TrailersUpstream {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The answer to one request: the document, then the trailers once it has been sent.
async fn answer(
    request: Request<Incoming>,
    served: Arc<AtomicU64>,
) -> Result<Response<impl hyper::body::Body<Data = Bytes, Error = Infallible>>, Infallible> {
    let tokens: u64 = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|p| p.strip_prefix("tokens="))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let body = Full::new(Bytes::from(crate::llm::document(tokens))).with_trailers(async move {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-usage-final", http::HeaderValue::from(tokens));
        served.fetch_add(1, Ordering::Relaxed);
        Some(Ok(trailers))
    });
    let mut response = Response::new(body);
    response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    Ok(response)
}
