//! Traces of the mount's own work: a sampled kernel request starts a trace
//! (`trace.sample_rate`); the cluster requests it makes join it, and its
//! span (actor `fuse`) is shipped to the node the mount talks to, in
//! batches, so `curvine-cli trace` shows it beside the nodes' spans.

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use curvine_client::Client;
use curvine_messages::trace::{fresh_id, sample, Outcome, TraceCtx, TraceEvent};
use curvine_messages::{now_ns, FsError};

/// Events kept at most while the node cannot take them.
const MAX_PENDING: usize = 10_000;

tokio::task_local! {
    /// The error kind the running request was answered with, if any.
    static ANSWERED_ERROR: Cell<Option<&'static str>>;
}

/// Notes the error a request is answered with (for its span's outcome).
pub fn answered_error(e: &FsError) {
    let _ = ANSWERED_ERROR.try_with(|c| c.set(Some(e.kind_name())));
}

pub struct FuseTraces {
    rate: f64,
    /// How the mount names itself in trace events.
    node: String,
    pending: Mutex<Vec<TraceEvent>>,
}

impl FuseTraces {
    pub fn new(rate: f64) -> Arc<FuseTraces> {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        Arc::new(FuseTraces {
            rate,
            node: format!("{host}:{}", std::process::id()),
            pending: Mutex::new(Vec::new()),
        })
    }

    /// Whether the next kernel request is traced (`trace.sample_rate`).
    pub fn sampled(&self) -> bool {
        sample(self.rate)
    }

    /// Runs the answer to a sampled kernel request as a trace whose cluster
    /// requests join it, recording the request's span.
    pub async fn run<F: std::future::Future<Output = ()>>(&self, op: &'static str, f: F) {
        let ctx = TraceCtx::root().child(fresh_id());
        let start = now_ns();
        let error = ANSWERED_ERROR
            .scope(Cell::new(None), async {
                curvine_client::trace_scope(Some(ctx), f).await;
                ANSWERED_ERROR.with(|c| c.get())
            })
            .await;
        let event = TraceEvent {
            trace: ctx.trace,
            span: ctx.span,
            parent: 0,
            node: self.node.clone(),
            actor: "fuse".into(),
            actor_id: String::new(),
            kind: op.into(),
            enqueue_ns: start,
            start_ns: start,
            end_ns: now_ns().max(start),
            outcome: match error {
                None => Outcome::Ok,
                Some(kind) => Outcome::Error(kind.into()),
            },
        };
        let mut pending = self.pending.lock();
        if pending.len() < MAX_PENDING {
            pending.push(event);
        }
    }

    /// Ships recorded events to the node every `every`, until `client` is
    /// dropped by the caller's runtime.
    pub async fn ship(self: Arc<Self>, client: Client, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            let events = std::mem::take(&mut *self.pending.lock());
            if events.is_empty() {
                continue;
            }
            if let Err(e) = client.record_trace(events).await {
                tracing::debug!(error = %e, "trace events of the mount were not kept");
            }
        }
    }
}
