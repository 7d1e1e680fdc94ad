//! What the node's ports share: accepting the next connection, and the
//! supervised task that runs a port's accept loop.

use std::future::Future;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use curvine_runtime::supervisor::TaskChild;

/// The next connection of `listener` (the node's `port`); a failed
/// accept (out of descriptors, say) is logged and retried after a pause.
pub async fn next_connection(
    listener: &TcpListener,
    port: &str,
) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(port, error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// A task child (role `role`) that serves `listener` with `serve`; each
/// start (after a failure too) serves the same socket anew, so the port
/// never closes while the node runs.
pub fn accept_loop<F, Fut>(role: &str, listener: Arc<std::net::TcpListener>, serve: F) -> TaskChild
where
    F: Fn(TcpListener) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let port = role.to_string();
    TaskChild::new(role, move || {
        let (listener, serve, port) = (listener.clone(), serve.clone(), port.clone());
        async move {
            let tokio_listener = listener.try_clone().and_then(|l| {
                l.set_nonblocking(true)?;
                TcpListener::from_std(l)
            });
            match tokio_listener {
                Ok(l) => serve(l).await,
                // Ending the task is a failure: its supervisor tries again.
                Err(e) => tracing::error!(port, error = %e, "cannot serve the port"),
            }
        }
    })
}
