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

/// Raises the process's soft limit of open files to its hard limit (a
/// connection, a block file read or written, an LMDB environment: each is
/// one), and warns when that is short of what `max_connections` client
/// connections and the node's own files need. Returns the limit now.
pub fn raise_open_files(max_connections: u32) -> u64 {
    let Some((_, now, hard)) = curvine_runtime::limits::raise_open_files() else {
        return 0;
    };
    let r = libc::rlimit {
        rlim_cur: now,
        rlim_max: hard,
    };
    let need = max_connections as u64 + 1024;
    if r.rlim_cur < need {
        tracing::warn!(
            limit = r.rlim_cur,
            max_connections,
            "the open files limit (RLIMIT_NOFILE, hard limit {}) is below node.max_connections plus 1024 for the node's own files: clients may be refused with EMFILE before the connection limit; raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower node.max_connections",
            r.rlim_max
        );
    }
    r.rlim_cur
}
