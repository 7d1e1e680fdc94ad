//! The mount's Prometheus `/metrics` (`fuse.metrics_listen`): a small
//! HTTP/1.1 responder on the mount's runtime. It answers `GET /metrics`
//! (one request per connection, then it closes), behind `http.token` when
//! one is set, as the node's HTTP port does.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use curvine_runtime::stats::METRICS_CONTENT_TYPE;
use curvine_wire::cookie::same_secret;

/// The cookie a browser keeps the bearer token in (the node's dashboard
/// sets it; the same name is accepted here).
const TOKEN_COOKIE: &str = "curvine_token";

/// The longest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// What renders the metrics text at each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running metrics endpoint; it stops when dropped.
pub struct MetricsServer {
    /// The address it listens on.
    pub addr: String,
    task: JoinHandle<()>,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `render()` at `/metrics` on `listen`; with a non-empty `token`,
/// only to requests that present it. Must be called on a tokio runtime.
pub fn serve_metrics(listen: &str, token: &str, render: Render) -> std::io::Result<MetricsServer> {
    let listener = std::net::TcpListener::bind(listen)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?.to_string();
    let listener = TcpListener::from_std(listener)?;
    let token: Option<Arc<str>> = (!token.is_empty()).then(|| token.into());
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics port: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let (token, render) = (token.clone(), render.clone());
            tokio::spawn(async move {
                let answer = respond(stream, token.as_deref(), &render);
                if let Err(e) = tokio::time::timeout(Duration::from_secs(15), answer).await {
                    tracing::debug!(%peer, error = %e, "metrics request timed out");
                }
            });
        }
    });
    Ok(MetricsServer { addr, task })
}

/// One request: its head, then the answer.
async fn respond(mut stream: TcpStream, token: Option<&str>, render: &Render) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let Some(head) = read_head(&mut stream).await else {
        return;
    };
    let request = Request::parse(&head);
    let reply = match &request {
        None => Reply::status(400, "Bad Request", "bad request\n"),
        Some(r) if r.method != "GET" && r.method != "HEAD" => {
            Reply::status(405, "Method Not Allowed", "only GET is served\n")
        }
        Some(r) if r.path != "/metrics" => {
            Reply::status(404, "Not Found", "only /metrics is served here\n")
        }
        Some(r) => match (token, r.token()) {
            (Some(want), Some(got)) if same_secret(want.as_bytes(), got.as_bytes()) => {
                Reply::metrics(render())
            }
            (Some(_), presented) => {
                let why = if presented.is_some() {
                    "a wrong bearer token"
                } else {
                    "no bearer token"
                };
                tracing::warn!(%peer, path = r.path, "http request refused: {why} (http.token)");
                Reply::unauthorized(why)
            }
            (None, _) => Reply::metrics(render()),
        },
    };
    let head_only = request.as_ref().is_some_and(|r| r.method == "HEAD");
    let _ = stream.write_all(&reply.encode(head_only)).await;
    let _ = stream.shutdown().await;
}

/// Reads up to the end of the request head (`\r\n\r\n`).
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(head).ok()
}

/// What the responder needs of a request.
struct Request<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: Vec<(&'a str, &'a str)>,
}

impl<'a> Request<'a> {
    fn parse(head: &'a str) -> Option<Request<'a>> {
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let (method, target) = (first.next()?, first.next()?);
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let headers = lines
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        Some(Request {
            method,
            path,
            query,
            headers,
        })
    }

    /// The bearer token presented: the `Authorization` header, the token
    /// cookie, or a `token` query parameter.
    fn token(&self) -> Option<&'a str> {
        let header = |name: &'static str| {
            self.headers
                .iter()
                .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| *v)
        };
        if let Some(v) = header("authorization").next() {
            return v.strip_prefix("Bearer ").map(str::trim);
        }
        let from_cookie = header("cookie")
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix(TOKEN_COOKIE)?.strip_prefix('='));
        from_cookie.or_else(|| {
            self.query
                .split('&')
                .find_map(|kv| kv.strip_prefix("token="))
        })
    }
}

/// An answer: status line, extra headers, body.
struct Reply {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    extra: &'static str,
    body: String,
}

impl Reply {
    fn status(status: u16, reason: &'static str, body: &str) -> Reply {
        Reply {
            status,
            reason,
            content_type: "text/plain; charset=utf-8",
            extra: "",
            body: body.to_string(),
        }
    }

    fn metrics(text: String) -> Reply {
        Reply {
            status: 200,
            reason: "OK",
            content_type: METRICS_CONTENT_TYPE,
            extra: "",
            body: text,
        }
    }

    fn unauthorized(why: &str) -> Reply {
        Reply {
            status: 401,
            reason: "Unauthorized",
            content_type: "text/plain; charset=utf-8",
            extra: "WWW-Authenticate: Bearer realm=\"curvine\"\r\n",
            body: format!(
                "refused: {why}; send the node's http.token as 'Authorization: Bearer TOKEN'\n"
            ),
        }
    }

    fn encode(&self, head_only: bool) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n{}\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len(),
            self.extra
        )
        .into_bytes();
        if !head_only {
            out.extend_from_slice(self.body.as_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(addr: &str, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_only_to_the_token() {
        let render: Render = Arc::new(|| "curvine_fuse_up 1\n".to_string());
        let server = serve_metrics("127.0.0.1:0", "s3cret", render).unwrap();
        let addr = server.addr.clone();

        let refused = get(&addr, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(refused.starts_with("HTTP/1.1 401 "), "{refused}");
        assert!(refused.contains("no bearer token"), "{refused}");
        let wrong = get(
            &addr,
            "GET /metrics HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n",
        )
        .await;
        assert!(wrong.contains("a wrong bearer token"), "{wrong}");

        for request in [
            "GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n",
            "GET /metrics?token=s3cret HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nCookie: a=b; curvine_token=s3cret\r\n\r\n",
        ] {
            let ok = get(&addr, request).await;
            assert!(ok.starts_with("HTTP/1.1 200 OK"), "{request}: {ok}");
            assert!(ok.contains(METRICS_CONTENT_TYPE), "{ok}");
            assert!(ok.ends_with("curvine_fuse_up 1\n"), "{ok}");
        }
        let other = get(
            &addr,
            "GET / HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n",
        )
        .await;
        assert!(other.starts_with("HTTP/1.1 404 "), "{other}");
    }

    #[tokio::test]
    async fn without_a_token_anyone_may_scrape() {
        let render: Render = Arc::new(|| "m 2\n".to_string());
        let server = serve_metrics("127.0.0.1:0", "", render).unwrap();
        let ok = get(&server.addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("m 2\n"),
            "{ok}"
        );
        let bad = get(&server.addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(bad.starts_with("HTTP/1.1 405 "), "{bad}");
    }
}
