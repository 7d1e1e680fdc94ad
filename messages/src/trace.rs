//! Actor traces: what one handled message looks like when recorded, the
//! context that ties the messages of one request together across nodes, and
//! the query a node's trace recorder answers.
//!
//! A trace is one request (a client call, a FUSE operation, a load job
//! step); a span is one message handled by one actor. The span that sent a
//! message is the parent of the span that handled it, on any node: the
//! context travels as a field of our own cross-node messages.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::FsError;

/// The trace a message belongs to and the span that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceCtx {
    pub trace: u64,
    /// The sender's span (0: the request's root).
    pub span: u64,
}

impl TraceCtx {
    /// A new trace with fresh ids.
    pub fn root() -> TraceCtx {
        TraceCtx {
            trace: fresh_id(),
            span: 0,
        }
    }

    /// The context a span passes on to the messages it sends.
    pub fn child(self, span: u64) -> TraceCtx {
        TraceCtx {
            trace: self.trace,
            span,
        }
    }
}

/// A non-zero id, unique within a process and unlikely to repeat across
/// processes (a SplitMix64 sequence seeded from the clock and process id).
pub fn fresh_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let seed =
        *SEED.get_or_init(|| (crate::types::now_ns() as u64) ^ ((std::process::id() as u64) << 32));
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        if z != 0 {
            return z;
        }
    }
}

/// Whether a request is sampled at `rate` (0 to 1).
pub fn sample(rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate <= 0.0 {
        return false;
    }
    ((fresh_id() >> 11) as f64 / (1u64 << 53) as f64) < rate
}

/// An id as printed and accepted by the command line: 16 hex digits.
pub fn format_id(id: u64) -> String {
    format!("{id:016x}")
}

/// Parses an id printed by [`format_id`] (1 to 16 hex digits).
pub fn parse_id(text: &str) -> Result<u64, FsError> {
    let t = text.trim();
    if t.is_empty() || t.len() > 16 || !t.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(FsError::InvalidArgument(format!(
            "trace id {text:?}: expected 1 to 16 hex digits, as printed by `trace`"
        )));
    }
    u64::from_str_radix(t, 16)
        .map_err(|e| FsError::InvalidArgument(format!("trace id {text:?}: {e}")))
}

/// How the handling of a message ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok,
    /// The error's kind (`NotFound`, `Io`, ...).
    Error(String),
}

/// One message handled by one actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceEvent {
    pub trace: u64,
    pub span: u64,
    /// The span that sent the message (0: the request's root).
    pub parent: u64,
    pub node: String,
    /// The actor's name (`shard-3`, `gateway`, `block-manager`, ...).
    pub actor: String,
    /// The actor's id within its node (ractor's id, `0.12`).
    pub actor_id: String,
    /// The message kind (`ShardMsg::Create`, ...).
    pub kind: String,
    /// When the message was sent, handling started and ended (Unix ns).
    pub enqueue_ns: i64,
    pub start_ns: i64,
    pub end_ns: i64,
    pub outcome: Outcome,
}

impl TraceEvent {
    /// Time spent waiting in the mailbox.
    pub fn queued_ns(&self) -> i64 {
        (self.start_ns - self.enqueue_ns).max(0)
    }

    /// Time spent handling.
    pub fn handled_ns(&self) -> i64 {
        (self.end_ns - self.start_ns).max(0)
    }
}

/// Which events a trace recorder returns. Every filter given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceQuery {
    /// Only events at or after this position of the ring (to follow: the
    /// `next_seq` of the previous answer).
    pub from_seq: Option<u64>,
    /// Actor name contains this text.
    pub actor: Option<String>,
    /// Node id is this one.
    pub node: Option<String>,
    pub trace: Option<u64>,
    /// Message kind contains this text.
    pub kind: Option<String>,
    /// Queueing plus handling took at least this long.
    pub slower_than_ns: Option<i64>,
    /// Handling ended at or after this time (Unix ns).
    pub since_ns: Option<i64>,
    /// At most this many events, the latest ones (0: the recorder's limit).
    pub limit: u32,
}

/// Largest number of events one query returns.
pub const MAX_QUERY_EVENTS: u32 = 100_000;

impl TraceQuery {
    /// Refuses a query no recorder could answer sensibly, naming the field.
    pub fn validate(&self) -> Result<(), FsError> {
        if self.limit > MAX_QUERY_EVENTS {
            return Err(FsError::InvalidArgument(format!(
                "trace query limit {}: expected at most {MAX_QUERY_EVENTS}",
                self.limit
            )));
        }
        if matches!(self.slower_than_ns, Some(n) if n < 0) {
            return Err(FsError::InvalidArgument(
                "trace query --slower-than: expected a duration of 0 or more".into(),
            ));
        }
        for (name, v) in [
            ("actor", &self.actor),
            ("node", &self.node),
            ("kind", &self.kind),
        ] {
            if matches!(v, Some(s) if s.is_empty() || s.len() > 256) {
                return Err(FsError::InvalidArgument(format!(
                    "trace query --{name}: expected 1 to 256 characters"
                )));
            }
        }
        Ok(())
    }

    pub fn matches(&self, e: &TraceEvent) -> bool {
        self.actor
            .as_ref()
            .is_none_or(|a| e.actor.contains(a.as_str()))
            && self.node.as_ref().is_none_or(|n| e.node == *n)
            && self.trace.is_none_or(|t| e.trace == t)
            && self
                .kind
                .as_ref()
                .is_none_or(|k| e.kind.contains(k.as_str()))
            && self
                .slower_than_ns
                .is_none_or(|d| e.end_ns - e.enqueue_ns.min(e.start_ns) >= d)
            && self.since_ns.is_none_or(|s| e.end_ns >= s)
    }
}

/// A recorder's answer: matching events in the order recorded, the position
/// the next event will take (to follow from), and how many events the ring
/// has dropped since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceBatch {
    pub events: Vec<TraceEvent>,
    pub next_seq: u64,
    pub dropped: u64,
}

/// A message with the trace it belongs to and when it was sent, as an
/// actor's mailbox holds it. Untraced messages carry no context and no time.
#[derive(Debug)]
pub struct Traced<M> {
    pub msg: M,
    pub ctx: Option<TraceCtx>,
    /// When the message was sent (Unix ns; 0 when untraced).
    pub sent_ns: i64,
    /// The call a shard request belongs to, across its attempts.
    pub req: Option<crate::types::ReqId>,
}

impl<M> Traced<M> {
    pub fn new(msg: M, ctx: Option<TraceCtx>) -> Traced<M> {
        let sent_ns = if ctx.is_some() {
            crate::types::now_ns()
        } else {
            0
        };
        Traced {
            msg,
            ctx,
            sent_ns,
            req: None,
        }
    }

    /// A message outside any trace.
    pub fn untraced(msg: M) -> Traced<M> {
        Traced {
            msg,
            ctx: None,
            sent_ns: 0,
            req: None,
        }
    }

    /// The same message as an attempt of call `req`.
    pub fn of_call(mut self, req: Option<crate::types::ReqId>) -> Traced<M> {
        self.req = req;
        self
    }
}

impl<M: ractor::Message> ractor::Message for Traced<M> {}

/// Messages to a node's trace recorder.
#[derive(Debug)]
pub enum TraceMsg {
    /// Events recorded elsewhere (a FUSE process, a client) to keep here.
    Record(Vec<TraceEvent>),
    /// The events matching a query.
    Query {
        query: TraceQuery,
        reply: ractor::RpcReplyPort<crate::error::FsResult<TraceBatch>>,
    },
}

impl ractor::Message for TraceMsg {}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(actor: &str, kind: &str, start: i64, end: i64) -> TraceEvent {
        TraceEvent {
            trace: 7,
            span: 2,
            parent: 1,
            node: "n1".into(),
            actor: actor.into(),
            actor_id: "0.3".into(),
            kind: kind.into(),
            enqueue_ns: start - 5,
            start_ns: start,
            end_ns: end,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn ids_are_nonzero_distinct_and_round_trip() {
        let a = fresh_id();
        let b = fresh_id();
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!(parse_id(&format_id(a)).unwrap(), a);
        assert_eq!(parse_id("ff").unwrap(), 255);
        for bad in ["", "xyz", "12345678901234567", "-1", "0x12"] {
            let e = parse_id(bad).unwrap_err().to_string();
            assert!(e.contains("hex digits"), "{bad}: {e}");
        }
    }

    #[test]
    fn sampling_follows_the_rate() {
        assert!(sample(1.0));
        assert!(!sample(0.0));
        let hits = (0..20_000).filter(|_| sample(0.1)).count();
        assert!((1_500..2_500).contains(&hits), "{hits} of 20000 at 0.1");
    }

    #[test]
    fn filters_must_all_match() {
        let e = event("shard-3", "ShardMsg::Create", 1_000, 13_000_000);
        assert!(TraceQuery::default().matches(&e));
        let q = TraceQuery {
            actor: Some("shard".into()),
            kind: Some("Create".into()),
            node: Some("n1".into()),
            trace: Some(7),
            slower_than_ns: Some(10_000_000),
            since_ns: Some(2_000),
            ..Default::default()
        };
        assert!(q.matches(&e));
        for q in [
            TraceQuery {
                actor: Some("gateway".into()),
                ..Default::default()
            },
            TraceQuery {
                node: Some("n".into()),
                ..Default::default()
            },
            TraceQuery {
                trace: Some(8),
                ..Default::default()
            },
            TraceQuery {
                kind: Some("Unlink".into()),
                ..Default::default()
            },
            TraceQuery {
                slower_than_ns: Some(20_000_000),
                ..Default::default()
            },
            TraceQuery {
                since_ns: Some(14_000_000),
                ..Default::default()
            },
        ] {
            assert!(!q.matches(&e), "{q:?}");
        }
    }

    #[test]
    fn malformed_queries_name_the_field() {
        let cases = [
            (
                TraceQuery {
                    limit: MAX_QUERY_EVENTS + 1,
                    ..Default::default()
                },
                "limit",
            ),
            (
                TraceQuery {
                    slower_than_ns: Some(-1),
                    ..Default::default()
                },
                "--slower-than",
            ),
            (
                TraceQuery {
                    actor: Some(String::new()),
                    ..Default::default()
                },
                "--actor",
            ),
            (
                TraceQuery {
                    kind: Some("k".repeat(300)),
                    ..Default::default()
                },
                "--kind",
            ),
        ];
        for (q, field) in cases {
            let e = q.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        assert!(TraceQuery::default().validate().is_ok());
    }
}
