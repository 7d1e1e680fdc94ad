//! The node's trace events: a bounded ring every actor records into
//! ([`Tracer`]), and the [`TraceRecorder`] actor that answers queries
//! over it and keeps events sent from elsewhere.
//!
//! Recording takes one short lock and never waits on an actor, so tracing
//! adds no mailbox hop to the messages it records. The ring lives outside
//! the actor: a restarted recorder keeps what was recorded before.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use curvine_messages::trace::{
    fresh_id, Outcome, TraceBatch, TraceCtx, TraceEvent, TraceMsg, TraceQuery, Traced,
    MAX_QUERY_EVENTS,
};
use curvine_messages::{now_ns, FsError, FsResult};

use crate::stats::{ActorStats, Metrics};
use crate::supervisor::Slot;

pub use curvine_runtime::trace::{current, scope};

/// Wraps a message with the running task's context and the send time.
pub fn traced<M>(msg: M) -> Traced<M> {
    Traced::new(msg, current())
}

/// How a result ends a span.
pub fn outcome_of<T>(result: &FsResult<T>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Error(error_kind(e)),
    }
}

/// An error's kind as trace events show it.
pub fn error_kind(e: &FsError) -> String {
    e.kind_name().to_string()
}

/// The last `capacity` events, each with its position since the ring started.
#[derive(Debug)]
pub struct TraceRing {
    events: VecDeque<(u64, TraceEvent)>,
    capacity: usize,
    next_seq: u64,
    dropped: u64,
}

impl TraceRing {
    pub fn new(capacity: usize) -> TraceRing {
        TraceRing {
            events: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity: capacity.max(1),
            next_seq: 0,
            dropped: 0,
        }
    }

    /// Adds an event, dropping the oldest one when full.
    pub fn push(&mut self, event: TraceEvent) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.dropped += 1;
        }
        self.events.push_back((self.next_seq, event));
        self.next_seq += 1;
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The latest `query.limit` matching events, oldest first.
    pub fn query(&self, query: &TraceQuery) -> TraceBatch {
        let limit = match query.limit {
            0 => MAX_QUERY_EVENTS,
            n => n.min(MAX_QUERY_EVENTS),
        } as usize;
        // Events are in position order: skip what the caller has seen.
        let first = match query.from_seq {
            Some(from) => self.events.partition_point(|(seq, _)| *seq < from),
            None => 0,
        };
        let mut events: Vec<TraceEvent> = self
            .events
            .range(first..)
            .rev()
            .filter(|(_, e)| query.matches(e))
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect();
        events.reverse();
        TraceBatch {
            events,
            next_seq: self.next_seq,
            dropped: self.dropped,
        }
    }
}

/// Handle every actor of a node records through.
#[derive(Clone)]
pub struct Tracer {
    inner: Arc<TracerInner>,
}

struct TracerInner {
    node: String,
    sample_rate: f64,
    ring: Mutex<TraceRing>,
}

impl Tracer {
    pub fn new(node: impl Into<String>, capacity: usize, sample_rate: f64) -> Tracer {
        Tracer {
            inner: Arc::new(TracerInner {
                node: node.into(),
                sample_rate,
                ring: Mutex::new(TraceRing::new(capacity)),
            }),
        }
    }

    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The share of requests traced when no trace is forced.
    pub fn sample_rate(&self) -> f64 {
        self.inner.sample_rate
    }

    /// A new trace for background work, at the node's sample rate.
    pub fn sampled_root(&self) -> Option<TraceCtx> {
        curvine_messages::trace::sample(self.sample_rate()).then(TraceCtx::root)
    }

    /// Runs `work` as a span `kind` of `actor` in `trace` (when there is
    /// one): what it asks of shards, nodes and the UFS joins the span.
    pub async fn in_span<T>(
        &self,
        trace: Option<TraceCtx>,
        actor: &'static str,
        kind: &'static str,
        work: impl std::future::Future<Output = FsResult<T>>,
    ) -> FsResult<T> {
        let Some(span) = self.start(trace, 0, actor, "", kind) else {
            return work.await;
        };
        let result = scope(Some(span.ctx()), work).await;
        span.end(outcome_of(&result));
        result
    }

    /// Events dropped from the ring to make room since the node started.
    pub fn dropped(&self) -> u64 {
        self.inner.ring.lock().dropped
    }

    pub fn record(&self, event: TraceEvent) {
        self.inner.ring.lock().push(event);
    }

    /// Records a span of `actor` in the trace of `ctx` that started at
    /// `start_ns` and ends now, timed by its caller.
    pub fn record_span(
        &self,
        ctx: TraceCtx,
        actor: &str,
        kind: &str,
        start_ns: i64,
        outcome: Outcome,
    ) {
        self.record(TraceEvent {
            trace: ctx.trace,
            span: fresh_id(),
            parent: ctx.span,
            node: self.node().to_string(),
            actor: actor.to_string(),
            actor_id: String::new(),
            kind: kind.to_string(),
            enqueue_ns: start_ns,
            start_ns,
            end_ns: now_ns().max(start_ns),
            outcome,
        });
    }

    pub fn record_all(&self, events: impl IntoIterator<Item = TraceEvent>) {
        let mut ring = self.inner.ring.lock();
        for e in events {
            ring.push(e);
        }
    }

    pub fn query(&self, query: &TraceQuery) -> FsResult<TraceBatch> {
        query.validate()?;
        Ok(self.inner.ring.lock().query(query))
    }

    /// Starts the span of a message `actor` handles, when the message
    /// belongs to a trace.
    pub fn start(
        &self,
        ctx: Option<TraceCtx>,
        sent_ns: i64,
        actor: &str,
        actor_id: impl std::fmt::Display,
        kind: &'static str,
    ) -> Option<Span> {
        let ctx = ctx?;
        let start_ns = now_ns();
        Some(Span {
            tracer: self.clone(),
            parent: ctx,
            span: fresh_id(),
            actor: actor.to_string(),
            actor_id: actor_id.to_string(),
            kind,
            enqueue_ns: if sent_ns > 0 { sent_ns } else { start_ns },
            start_ns,
        })
    }
}

/// One message being handled in a trace; recorded when it ends.
pub struct Span {
    tracer: Tracer,
    parent: TraceCtx,
    span: u64,
    actor: String,
    actor_id: String,
    kind: &'static str,
    enqueue_ns: i64,
    start_ns: i64,
}

impl Span {
    /// The context messages sent while handling carry.
    pub fn ctx(&self) -> TraceCtx {
        self.parent.child(self.span)
    }

    /// Records a span this one caused outside any actor (a commit on the
    /// writer thread): who ran it, what it was, and when it was queued,
    /// started and ended.
    pub fn child(
        &self,
        actor: &str,
        kind: &str,
        (queued, start, end): (i64, i64, i64),
        outcome: Outcome,
    ) {
        self.tracer.record(TraceEvent {
            trace: self.parent.trace,
            span: fresh_id(),
            parent: self.span,
            node: self.tracer.node().to_string(),
            actor: actor.to_string(),
            actor_id: String::new(),
            kind: kind.to_string(),
            enqueue_ns: queued,
            start_ns: start,
            end_ns: end.max(start),
            outcome,
        });
    }

    /// Records the span as ended now.
    pub fn end(self, outcome: Outcome) {
        let end_ns = now_ns();
        self.end_at(end_ns, outcome);
    }

    /// Records the span as ended at `end_ns` (a reply sent later).
    pub fn end_at(self, end_ns: i64, outcome: Outcome) {
        let event = TraceEvent {
            trace: self.parent.trace,
            span: self.span,
            parent: self.parent.span,
            node: self.tracer.node().to_string(),
            actor: self.actor,
            actor_id: self.actor_id,
            kind: self.kind.to_string(),
            enqueue_ns: self.enqueue_ns,
            start_ns: self.start_ns,
            end_ns: end_ns.max(self.start_ns),
            outcome,
        };
        self.tracer.record(event);
    }
}

/// Where the node's trace recorder is (absent while it restarts): its slot
/// in the supervision tree.
#[derive(Clone)]
pub struct RecorderRef(Slot<TraceMsg>);

impl Default for RecorderRef {
    fn default() -> Self {
        RecorderRef(Slot::new("trace recorder"))
    }
}

impl RecorderRef {
    /// The slot its supervisor keeps pointed at the recorder.
    pub fn slot(&self) -> Slot<TraceMsg> {
        self.0.clone()
    }

    /// Asks the recorder for the events matching `query`.
    pub async fn query(&self, query: TraceQuery) -> FsResult<TraceBatch> {
        query.validate()?;
        let actor = self.0.get()?;
        match actor
            .call(
                |reply| TraceMsg::Query { query, reply },
                Some(std::time::Duration::from_secs(10)),
            )
            .await
        {
            Ok(ractor::rpc::CallResult::Success(r)) => r,
            Ok(ractor::rpc::CallResult::Timeout) => Err(FsError::TimedOut(
                "the trace recorder did not answer in 10s".into(),
            )),
            _ => Err(FsError::Unavailable(
                "the trace recorder stopped while answering".into(),
            )),
        }
    }
}

/// The node's trace recorder: answers queries over the node's ring.
pub struct TraceRecorder;

impl Actor for TraceRecorder {
    type Msg = TraceMsg;
    type State = (Tracer, Arc<ActorStats>);
    type Arguments = (Tracer, Metrics);

    async fn pre_start(
        &self,
        myself: ActorRef<TraceMsg>,
        (tracer, metrics): (Tracer, Metrics),
    ) -> Result<(Tracer, Arc<ActorStats>), ActorProcessingErr> {
        let stats = metrics.actor("trace-recorder", false);
        metrics.started(myself.get_id(), &stats);
        Ok((tracer, stats))
    }

    async fn handle(
        &self,
        _myself: ActorRef<TraceMsg>,
        message: TraceMsg,
        (tracer, stats): &mut (Tracer, Arc<ActorStats>),
    ) -> Result<(), ActorProcessingErr> {
        let _handling = stats.handling(match &message {
            TraceMsg::Record(_) => "record",
            TraceMsg::Query { .. } => "query",
        });
        match message {
            TraceMsg::Record(events) => tracer.record_all(events),
            TraceMsg::Query { query, reply } => {
                let _ = reply.send(tracer.query(&query));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use curvine_messages::trace::Outcome;

    fn event(n: u64) -> TraceEvent {
        TraceEvent {
            trace: n % 3 + 1,
            span: n + 1,
            parent: 0,
            node: "n1".into(),
            actor: format!("shard-{}", n % 4),
            actor_id: "0.1".into(),
            kind: "ShardMsg::Create".into(),
            enqueue_ns: n as i64 * 10,
            start_ns: n as i64 * 10 + 1,
            end_ns: n as i64 * 10 + 2 + (n as i64 % 5) * 1000,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn the_ring_keeps_the_latest_events_within_its_bound() {
        let mut ring = TraceRing::new(1000);
        for n in 0..25_000 {
            ring.push(event(n));
            assert!(ring.len() <= 1000);
        }
        let all = ring.query(&TraceQuery::default());
        assert_eq!(all.events.len(), 1000);
        assert_eq!(all.dropped, 24_000);
        assert_eq!(all.events.first().unwrap().span, 24_001);
        assert_eq!(all.events.last().unwrap().span, 25_000);
        assert_eq!(all.next_seq, 25_000);
    }

    #[test]
    fn queries_filter_limit_and_follow() {
        let mut ring = TraceRing::new(100);
        for n in 0..50 {
            ring.push(event(n));
        }
        let q = TraceQuery {
            trace: Some(2),
            limit: 5,
            ..Default::default()
        };
        let b = ring.query(&q);
        assert_eq!(b.events.len(), 5);
        assert!(b.events.iter().all(|e| e.trace == 2));
        // The latest five, oldest first.
        let spans: Vec<u64> = b.events.iter().map(|e| e.span).collect();
        assert_eq!(spans, vec![38, 41, 44, 47, 50]);

        // Following: only what came after the cursor.
        let cursor = ring.query(&TraceQuery::default()).next_seq;
        ring.push(event(50));
        ring.push(event(51));
        let next = ring.query(&TraceQuery {
            from_seq: Some(cursor),
            ..Default::default()
        });
        let spans: Vec<u64> = next.events.iter().map(|e| e.span).collect();
        assert_eq!(spans, vec![51, 52]);
        assert_eq!(next.next_seq, 52);

        let slow = ring.query(&TraceQuery {
            slower_than_ns: Some(4000),
            ..Default::default()
        });
        assert!(!slow.events.is_empty());
        assert!(slow.events.iter().all(|e| e.end_ns - e.enqueue_ns >= 4000));
    }

    #[test]
    fn the_ring_holds_under_concurrent_recording() {
        let tracer = Tracer::new("n1", 5_000, 0.01);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let tracer = tracer.clone();
                std::thread::spawn(move || {
                    for n in 0..20_000 {
                        tracer.record(event(t * 100_000 + n));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let b = tracer.query(&TraceQuery::default()).unwrap();
        assert_eq!(b.events.len(), 5_000);
        assert_eq!(b.dropped, 75_000);
        assert!(tracer
            .query(&TraceQuery {
                limit: MAX_QUERY_EVENTS + 1,
                ..Default::default()
            })
            .is_err());
    }
}
