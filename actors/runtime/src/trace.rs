//! The trace context a task works for. Requests and messages the task sends
//! (client port, data port, shard mailboxes) carry it, so the spans they
//! cause join its trace.

use curvine_messages::trace::TraceCtx;

tokio::task_local! {
    /// The span the running task works for: messages it sends carry it.
    static CURRENT: Option<TraceCtx>;
}

/// The trace context of the running task, if it works for a traced request.
pub fn current() -> Option<TraceCtx> {
    CURRENT.try_with(|c| *c).ok().flatten()
}

/// `fut` with `ctx` as the context its messages carry. (Not an `async fn`:
/// that would hold `fut` twice in its state and double what a spawn copies.)
pub fn scope<F: std::future::Future>(
    ctx: Option<TraceCtx>,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<Option<TraceCtx>, F> {
    CURRENT.scope(ctx, fut)
}
