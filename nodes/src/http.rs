//! The HTTP port: Prometheus `/metrics`, the dashboard (`/`) and its JSON
//! API (`/api/...`), on actix-web.
//!
//! actix-web runs its own single-threaded runtime, so the server lives in a
//! thread of its own; handlers hand their work to the node's tokio runtime
//! and await it, so they never run node code on actix's runtime.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, App, HttpResponse, HttpServer};

use curvine_messages::rpc::{ListLoads, ListMounts, Report, Request, Response};
use curvine_messages::trace::{TraceEvent, TraceQuery};
use curvine_messages::{FsError, FsResult};
use curvine_runtime::stats::METRICS_CONTENT_TYPE;

use curvine_wire::cookie::same_secret;

use curvine_actors::cluster::ClusterView;

use crate::service::reports::Reports;
use crate::service::Service;

/// A running HTTP server.
pub struct HttpHandle {
    /// The address it listens on.
    pub addr: String,
    server: ServerHandle,
}

impl HttpHandle {
    /// Stops accepting and closes connections (in the background).
    pub fn stop(&self) {
        let server = self.server.clone();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(server.stop(false));
        });
    }
}

/// The cookie the dashboard keeps the bearer token in.
const TOKEN_COOKIE: &str = "curvine_token";

/// The bearer token a request presents: the `Authorization` header, the
/// dashboard's cookie, or a `token` query parameter (with whether it came
/// in the query, so the reply sets the cookie).
fn presented_token(req: &ServiceRequest) -> Option<(String, bool)> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        return v
            .strip_prefix("Bearer ")
            .map(|t| (t.trim().to_string(), false));
    }
    for cookies in req.headers().get_all(header::COOKIE) {
        let Ok(cookies) = cookies.to_str() else {
            continue;
        };
        for c in cookies.split(';') {
            if let Some(v) = c
                .trim()
                .strip_prefix(TOKEN_COOKIE)
                .and_then(|r| r.strip_prefix('='))
            {
                return Some((v.to_string(), false));
            }
        }
    }
    web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
        .ok()?
        .get("token")
        .map(|t| (t.clone(), true))
}

/// Refuses (401) a request that does not present `token`, when there is one.
async fn require_token<B: MessageBody + 'static>(
    token: Option<Arc<str>>,
    req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some(token) = token else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    match presented_token(&req) {
        Some((t, from_query)) if same_secret(t.as_bytes(), token.as_bytes()) => {
            let mut res = next.call(req).await?;
            if from_query {
                if let Ok(v) = header::HeaderValue::from_str(&format!(
                    "{TOKEN_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict"
                )) {
                    res.headers_mut().insert(header::SET_COOKIE, v);
                }
            }
            Ok(res.map_into_left_body())
        }
        presented => {
            let peer = req
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into());
            let why = if presented.is_some() {
                "a wrong bearer token"
            } else {
                "no bearer token"
            };
            tracing::warn!(%peer, path = req.path(), "http request refused: {why} (http.token)");
            let reply = HttpResponse::Unauthorized()
                .insert_header((header::WWW_AUTHENTICATE, "Bearer realm=\"curvine\""))
                .body(format!(
                    "refused: {why}; send the node's http.token as 'Authorization: Bearer TOKEN'\n"
                ));
            Ok(req.into_response(reply).map_into_right_body())
        }
    }
}

/// Serves the routes `configure` adds on `listener` from a thread of its
/// own; with a non-empty `token`, only to requests that present it.
pub fn serve<F>(
    listener: TcpListener,
    name: &str,
    token: &str,
    configure: F,
) -> std::io::Result<HttpHandle>
where
    F: Fn(&mut web::ServiceConfig) + Send + Sync + Clone + 'static,
{
    let addr = listener.local_addr()?.to_string();
    let token: Option<Arc<str>> = (!token.is_empty()).then(|| token.into());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("{name}-http"))
        .spawn(move || {
            let system = actix_web::rt::System::new();
            system.block_on(async move {
                let server = HttpServer::new(move || {
                    let token = token.clone();
                    App::new()
                        .wrap(from_fn(move |req, next| {
                            require_token(token.clone(), req, next)
                        }))
                        .configure(configure.clone())
                })
                .workers(1)
                .disable_signals()
                .shutdown_timeout(1)
                .listen(listener);
                match server {
                    Ok(server) => {
                        let server = server.run();
                        let _ = tx.send(Ok(server.handle()));
                        if let Err(e) = server.await {
                            tracing::error!(error = %e, "http server stopped");
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })?;
    let server = rx
        .recv()
        .map_err(|_| std::io::Error::other("the http thread ended at start"))??;
    Ok(HttpHandle { addr, server })
}

#[derive(Clone)]
struct NodeWeb {
    service: Arc<Service>,
    reports: Arc<Reports>,
    history: Arc<crate::service::history::History>,
    view: Arc<ClusterView>,
    rt: tokio::runtime::Handle,
}

impl NodeWeb {
    /// Runs `f` on the node's runtime, with what it needs of `on`.
    async fn run<V, T, F>(
        &self,
        on: &Arc<V>,
        f: impl FnOnce(Arc<V>) -> F + Send + 'static,
    ) -> FsResult<T>
    where
        V: Send + Sync + 'static,
        F: std::future::Future<Output = FsResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        match self.rt.spawn(f(on.clone())).await {
            Ok(r) => r,
            Err(e) => Err(FsError::Io(format!("request task failed: {e}"))),
        }
    }

    async fn request(&self, request: Request) -> FsResult<Response> {
        self.run(&self.service, move |s| async move {
            tokio::time::timeout(Duration::from_secs(15), s.handle(request))
                .await
                .unwrap_or_else(|_| Err(FsError::TimedOut("no answer in 15s".into())))
        })
        .await
    }
}

fn json<T: serde::Serialize>(result: FsResult<T>) -> HttpResponse {
    match result {
        Ok(v) => HttpResponse::Ok().json(v),
        Err(e) => {
            let status = match e {
                FsError::InvalidArgument(_) => actix_web::http::StatusCode::BAD_REQUEST,
                FsError::NotFound(_) => actix_web::http::StatusCode::NOT_FOUND,
                _ => actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            };
            HttpResponse::build(status).json(serde_json::json!({
                "error": e.to_string(),
                "kind": e.kind_name(),
            }))
        }
    }
}

/// Starts the node's HTTP port on `listener`.
pub fn serve_node(
    listener: TcpListener,
    service: Arc<Service>,
    (reports, history): (Arc<Reports>, Arc<crate::service::history::History>),
    view: Arc<ClusterView>,
    token: &str,
) -> std::io::Result<HttpHandle> {
    let web = NodeWeb {
        service: service.clone(),
        reports,
        history,
        view,
        rt: tokio::runtime::Handle::current(),
    };
    serve(
        listener,
        &format!("node-{}", service.node_id()),
        token,
        move |cfg| {
            cfg.app_data(web::Data::new(web.clone()))
                .route("/", web::get().to(dashboard))
                .route("/metrics", web::get().to(metrics))
                .route("/api/overview", web::get().to(overview))
                .route("/api/mounts", web::get().to(mounts))
                .route("/api/jobs", web::get().to(jobs))
                .route("/api/actors", web::get().to(actors))
                .route("/api/traces", web::get().to(traces))
                .route("/api/history", web::get().to(metrics_history));
        },
    )
}

const DASHBOARD: &str = include_str!("dashboard.html");

async fn dashboard() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(DASHBOARD)
}

async fn metrics(web: web::Data<NodeWeb>) -> HttpResponse {
    match web
        .run(&web.reports, |r| async move { Ok(r.metrics_text().await) })
        .await
    {
        Ok(text) => HttpResponse::Ok()
            .content_type(METRICS_CONTENT_TYPE)
            .body(text),
        Err(e) => HttpResponse::ServiceUnavailable().body(e.to_string()),
    }
}

async fn metrics_history(web: web::Data<NodeWeb>) -> HttpResponse {
    json(Ok(web.history.view()))
}

async fn overview(web: web::Data<NodeWeb>) -> HttpResponse {
    let report = match web.request(Request::Report(Report)).await {
        Ok(Response::Report(r)) => r,
        Ok(_) => return json::<()>(Err(FsError::Protocol("unexpected reply".into()))),
        Err(e) => return json::<()>(Err(e)),
    };
    let members = web.view.members();
    let http: std::collections::BTreeMap<String, String> = members
        .into_iter()
        .map(|m| (m.info.node_id, m.info.http_addr))
        .collect();
    json(Ok(serde_json::json!({
        "node": web.service.node_id(),
        "report": report,
        "http": http,
    })))
}

async fn mounts(web: web::Data<NodeWeb>) -> HttpResponse {
    json(match web.request(Request::ListMounts(ListMounts)).await {
        // The list is redacted by the service: secrets never leave the node.
        Ok(Response::MountList(m)) => Ok(m
            .into_iter()
            .map(|m| {
                serde_json::json!({
                    "id": m.id,
                    "path": m.path,
                    "ufs": m.ufs,
                    "write_type": m.write_type.to_string(),
                    "props": m.props,
                })
            })
            .collect::<Vec<_>>()),
        Ok(_) => Err(FsError::Protocol("unexpected reply".into())),
        Err(e) => Err(e),
    })
}

async fn jobs(web: web::Data<NodeWeb>) -> HttpResponse {
    json(match web.request(Request::ListLoads(ListLoads)).await {
        Ok(Response::Jobs(jobs)) => Ok(jobs),
        Ok(_) => Err(FsError::Protocol("unexpected reply".into())),
        Err(e) => Err(e),
    })
}

async fn actors(web: web::Data<NodeWeb>) -> HttpResponse {
    json(
        web.run(&web.reports, |r| async move { r.actors(None).await })
            .await,
    )
}

#[derive(serde::Deserialize)]
struct TraceParams {
    /// Only spans at least this long (`10ms`).
    slower_than: Option<String>,
    limit: Option<u32>,
}

/// The latest spans of every node, slowest-first filters applied, newest first.
async fn traces(web: web::Data<NodeWeb>, params: web::Query<TraceParams>) -> HttpResponse {
    let mut query = TraceQuery {
        limit: params.limit.unwrap_or(100).min(1000),
        ..Default::default()
    };
    if let Some(s) = &params.slower_than {
        match curvine_conf::Dur::parse(s) {
            Ok(d) => query.slower_than_ns = Some(d.0.as_nanos() as i64),
            Err(e) => {
                return json::<()>(Err(FsError::InvalidArgument(format!(
                    "slower_than={s}: {e}"
                ))))
            }
        }
    }
    let limit = query.limit as usize;
    let result = web
        .run(&web.reports, move |r| async move {
            r.trace_events(curvine_messages::rpc::TraceEvents {
                query,
                cursors: Vec::new(),
            })
            .await
        })
        .await
        .map(|nodes| {
            let mut events: Vec<TraceEvent> =
                nodes.into_iter().flat_map(|n| n.batch.events).collect();
            events.sort_by_key(|e| std::cmp::Reverse(e.start_ns));
            events.truncate(limit);
            // Ids as text: JSON numbers lose the low bits of a u64.
            events
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "trace": curvine_messages::trace::format_id(e.trace),
                        "span": curvine_messages::trace::format_id(e.span),
                        "node": e.node,
                        "actor": e.actor,
                        "kind": e.kind,
                        "start_ns": e.start_ns,
                        "queued_ns": e.queued_ns(),
                        "took_ns": e.handled_ns(),
                        "outcome": match &e.outcome {
                            curvine_messages::trace::Outcome::Ok => "ok".to_string(),
                            curvine_messages::trace::Outcome::Error(k) => format!("error: {k}"),
                        },
                    })
                })
                .collect::<Vec<_>>()
        });
    json(result)
}
