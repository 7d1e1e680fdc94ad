//! What a process's actors and subsystems have done: per-actor counters for
//! `curvine-cli actors`, and Prometheus metrics (counters, gauges and
//! latency histograms) rendered in the text exposition format.
//!
//! Everything here is atomics behind handles that callers keep, so counting
//! on a hot path is an atomic add (an actor's per-kind latency takes one
//! uncontended lock: the actor handles one message at a time).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use ractor::{ActorCell, ActorId, ActorStatus};

use curvine_messages::stats::ActorInfo;
use curvine_messages::{now_ns, ShardId};

/// The content type of the Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of the latency histogram buckets.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 10.0,
];

/// A latency histogram with [`LATENCY_BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS.partition_point(|b| *b < secs);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in self.buckets.iter().enumerate() {
            cumulative += b.load(Ordering::Relaxed);
            let le = match LATENCY_BUCKETS.get(i) {
                Some(le) => format!("{le}"),
                None => "+Inf".into(),
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// What one actor (one role: a restarted actor keeps its counters) did.
#[derive(Debug)]
pub struct ActorStats {
    pub role: String,
    /// Whether every sender counts its sends ([`ActorStats::sent`]), so the
    /// mailbox depth is known.
    counts_sends: bool,
    sent: AtomicU64,
    handled: AtomicU64,
    errors: AtomicU64,
    restarts: AtomicU64,
    started_ns: AtomicI64,
    kinds: Mutex<Vec<(&'static str, Arc<Histogram>)>>,
}

impl ActorStats {
    fn new(role: &str, counts_sends: bool) -> ActorStats {
        ActorStats {
            role: role.to_string(),
            counts_sends,
            sent: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            started_ns: AtomicI64::new(now_ns()),
            kinds: Mutex::new(Vec::new()),
        }
    }

    /// A message was put in the actor's mailbox.
    pub fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A sent message was not delivered (the actor was gone).
    pub fn unsent(&self) {
        self.sent.fetch_sub(1, Ordering::Relaxed);
    }

    /// Starts handling a message of `kind`; the returned guard records the
    /// message as handled, with its latency, when dropped.
    pub fn handling(&self, kind: &'static str) -> Handling<'_> {
        Handling {
            stats: self,
            kind,
            start: Instant::now(),
        }
    }

    /// The actor failed (its handler returned an error or panicked).
    pub fn failed(&self) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Its supervisor starts it again.
    pub fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
    }

    pub fn handled(&self) -> u64 {
        self.handled.load(Ordering::Relaxed)
    }

    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Messages waiting, when every sender is counted.
    pub fn mailbox(&self) -> Option<u64> {
        // `handled` is counted when a message is done, so the one in hand
        // is part of the depth.
        self.counts_sends.then(|| {
            self.sent
                .load(Ordering::Relaxed)
                .saturating_sub(self.handled.load(Ordering::Relaxed))
        })
    }

    fn kind(&self, kind: &'static str) -> Arc<Histogram> {
        let mut kinds = self.kinds.lock();
        if let Some((_, h)) = kinds.iter().find(|(k, _)| *k == kind) {
            return h.clone();
        }
        let h = Arc::new(Histogram::default());
        kinds.push((kind, h.clone()));
        h
    }
}

/// Records one handled message when dropped.
pub struct Handling<'a> {
    stats: &'a ActorStats,
    kind: &'static str,
    start: Instant,
}

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        let elapsed = self.start.elapsed();
        self.stats.kind(self.kind).observe(elapsed);
        self.stats.handled.fetch_add(1, Ordering::Relaxed);
    }
}

/// A value computed when metrics are read (tier bytes, job progress).
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: &'static str,
    pub help: &'static str,
    /// `gauge` or `counter`.
    pub kind: &'static str,
    pub labels: Vec<(&'static str, String)>,
    pub value: f64,
}

impl Sample {
    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Sample {
        Sample {
            name,
            help,
            kind: "gauge",
            labels: Vec::new(),
            value,
        }
    }

    pub fn label(mut self, key: &'static str, value: impl Into<String>) -> Sample {
        self.labels.push((key, value.into()));
        self
    }
}

type Key = (&'static str, String);

/// Reads one counter of an actor.
type Getter = fn(&ActorStats) -> u64;

#[derive(Default)]
struct Inner {
    actors: RwLock<BTreeMap<String, Arc<ActorStats>>>,
    ids: RwLock<HashMap<ActorId, Arc<ActorStats>>>,
    shards: RwLock<Vec<Arc<ActorStats>>>,
    help: Mutex<BTreeMap<&'static str, (&'static str, &'static str)>>,
    counters: Mutex<BTreeMap<Key, Arc<AtomicU64>>>,
    histograms: Mutex<BTreeMap<Key, Arc<Histogram>>>,
}

/// A process's registry of actor statistics and metrics. Cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

/// `key="value",...` with values escaped as the text format wants.
fn label_text(labels: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// The statistics of the actor in `role` (created on first use).
    /// `counts_sends`: every sender to it calls [`ActorStats::sent`].
    pub fn actor(&self, role: &str, counts_sends: bool) -> Arc<ActorStats> {
        if let Some(s) = self.0.actors.read().get(role) {
            return s.clone();
        }
        self.0
            .actors
            .write()
            .entry(role.to_string())
            .or_insert_with(|| Arc::new(ActorStats::new(role, counts_sends)))
            .clone()
    }

    /// Called by an actor in `pre_start`: its id now names `stats`.
    pub fn started(&self, id: ActorId, stats: &Arc<ActorStats>) {
        stats.started_ns.store(now_ns(), Ordering::Relaxed);
        // What waited in a failed actor's mailbox was dropped with it.
        stats
            .sent
            .store(stats.handled.load(Ordering::Relaxed), Ordering::Relaxed);
        let mut ids = self.0.ids.write();
        ids.retain(|_, s| !Arc::ptr_eq(s, stats));
        ids.insert(id, stats.clone());
    }

    /// Called by a supervisor for a child it started: names `stats` by the
    /// child's id unless the child did so itself in `pre_start`.
    pub fn child_started(&self, id: ActorId, stats: &Arc<ActorStats>) {
        if !self.0.ids.read().contains_key(&id) {
            self.started(id, stats);
        }
    }

    /// The statistics of namespace shard `shard` (its senders are counted).
    pub fn shard(&self, shard: ShardId) -> Arc<ActorStats> {
        if let Some(s) = self.0.shards.read().get(shard as usize) {
            return s.clone();
        }
        let mut shards = self.0.shards.write();
        while shards.len() <= shard as usize {
            let n = shards.len();
            shards.push(self.actor(&format!("shard-{n}"), true));
        }
        shards[shard as usize].clone()
    }

    /// Counts a sent message to shard `shard`.
    pub fn shard_sent(&self, shard: ShardId) {
        match self.0.shards.read().get(shard as usize) {
            Some(s) => s.sent(),
            None => self.shard(shard).sent(),
        }
    }

    fn describe(&self, name: &'static str, help: &'static str, kind: &'static str) {
        self.0.help.lock().entry(name).or_insert((help, kind));
    }

    /// A counter (`name` should end in `_total`); keep the handle on hot paths.
    pub fn counter(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
    ) -> Arc<AtomicU64> {
        self.describe(name, help, "counter");
        self.0
            .counters
            .lock()
            .entry((name, label_text(labels)))
            .or_default()
            .clone()
    }

    /// Adds `n` to a counter.
    pub fn add(&self, name: &'static str, help: &'static str, labels: &[(&str, &str)], n: u64) {
        self.counter(name, help, labels)
            .fetch_add(n, Ordering::Relaxed);
    }

    /// A latency histogram (`name` should end in `_seconds`).
    pub fn histogram(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
    ) -> Arc<Histogram> {
        self.describe(name, help, "histogram");
        self.0
            .histograms
            .lock()
            .entry((name, label_text(labels)))
            .or_default()
            .clone()
    }

    /// The actor tree under `root` as `curvine-cli actors` shows it.
    pub fn tree(&self, root: &ActorCell) -> ActorInfo {
        let ids = self.0.ids.read();
        fn go(cell: &ActorCell, ids: &HashMap<ActorId, Arc<ActorStats>>) -> ActorInfo {
            let stats = ids.get(&cell.get_id());
            let name = match (stats, cell.get_name()) {
                (Some(s), _) => s.role.clone(),
                (None, Some(n)) => n,
                (None, None) => "actor".into(),
            };
            let status = match cell.get_status() {
                ActorStatus::Unstarted => "unstarted",
                ActorStatus::Starting => "starting",
                ActorStatus::Running => "running",
                ActorStatus::Upgrading => "upgrading",
                ActorStatus::Draining => "draining",
                ActorStatus::Stopping => "stopping",
                ActorStatus::Stopped => "stopped",
            };
            let mut children: Vec<ActorInfo> =
                cell.get_children().iter().map(|c| go(c, ids)).collect();
            children.sort_by_key(|a| natural_key(&a.name));
            ActorInfo {
                name,
                id: cell.get_id().to_string(),
                status: status.into(),
                mailbox: stats.and_then(|s| s.mailbox()),
                handled: stats.map_or(0, |s| s.handled()),
                errors: stats.map_or(0, |s| s.errors()),
                restarts: stats.map_or(0, |s| s.restarts()),
                uptime_ms: stats.map_or(0, |s| {
                    ((now_ns() - s.started_ns.load(Ordering::Relaxed)).max(0) / 1_000_000) as u64
                }),
                children,
            }
        }
        go(root, &ids)
    }

    /// The counters and histograms alone (no actor families).
    pub fn render_plain(&self) -> String {
        let mut out = String::new();
        let family = |out: &mut String, name: &str, help: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };
        let help = self.0.help.lock().clone();
        let counters: Vec<(Key, u64)> = self
            .0
            .counters
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect();
        let mut last = "";
        for ((name, labels), value) in &counters {
            if *name != last {
                let (h, k) = help.get(name).copied().unwrap_or(("", "counter"));
                family(&mut out, name, h, k);
                last = name;
            }
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        }
        let histograms: Vec<(Key, Arc<Histogram>)> = self
            .0
            .histograms
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut last = "";
        for ((name, labels), h) in &histograms {
            if *name != last {
                let (hp, k) = help.get(name).copied().unwrap_or(("", "histogram"));
                family(&mut out, name, hp, k);
                last = name;
            }
            h.render(&mut out, name, labels);
        }

        out
    }

    /// Every metric in the Prometheus text format (version 0.0.4), with
    /// `extra` samples computed by the caller.
    pub fn render(&self, extra: &[Sample]) -> String {
        let mut out = String::new();
        // Per-actor counters and per message kind latencies.
        let actors: Vec<Arc<ActorStats>> = self.0.actors.read().values().cloned().collect();
        let family = |out: &mut String, name: &str, help: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };
        let per_actor: [(&str, &str, Getter); 3] = [
            (
                "curvine_actor_messages_total",
                "Messages an actor handled.",
                ActorStats::handled,
            ),
            (
                "curvine_actor_failures_total",
                "Times an actor failed (handler error or panic).",
                ActorStats::errors,
            ),
            (
                "curvine_actor_restarts_total",
                "Times a supervisor restarted an actor.",
                ActorStats::restarts,
            ),
        ];
        for (name, help, get) in per_actor {
            family(&mut out, name, help, "counter");
            for a in &actors {
                let _ = writeln!(
                    out,
                    "{name}{{{}}} {}",
                    label_text(&[("actor", &a.role)]),
                    get(a)
                );
            }
        }
        family(
            &mut out,
            "curvine_actor_mailbox_messages",
            "Messages waiting in an actor's mailbox (actors whose senders are counted).",
            "gauge",
        );
        for a in &actors {
            if let Some(depth) = a.mailbox() {
                let _ = writeln!(
                    out,
                    "curvine_actor_mailbox_messages{{{}}} {depth}",
                    label_text(&[("actor", &a.role)])
                );
            }
        }
        family(
            &mut out,
            "curvine_actor_message_duration_seconds",
            "Time an actor spent handling a message, per actor and message kind.",
            "histogram",
        );
        for a in &actors {
            let kinds: Vec<_> = a.kinds.lock().clone();
            for (kind, h) in kinds {
                h.render(
                    &mut out,
                    "curvine_actor_message_duration_seconds",
                    &label_text(&[("actor", &a.role), ("kind", kind)]),
                );
            }
        }

        out.push_str(&self.render_plain());
        let mut extra: Vec<&Sample> = extra.iter().collect();
        extra.sort_by_key(|s| s.name);
        let mut last = "";
        for s in extra {
            if s.name != last {
                family(&mut out, s.name, s.help, s.kind);
                last = s.name;
            }
            let labels: Vec<(&str, &str)> =
                s.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            if labels.is_empty() {
                let _ = writeln!(out, "{} {}", s.name, s.value);
            } else {
                let _ = writeln!(out, "{}{{{}}} {}", s.name, label_text(&labels), s.value);
            }
        }
        out
    }
}

/// Counters of the whole process that no single node owns (UFS calls,
/// which the mounts of every node in the process share).
pub fn process() -> &'static Metrics {
    static PROCESS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();
    PROCESS.get_or_init(Metrics::new)
}

/// Sorts `shard-10` after `shard-9`.
fn natural_key(name: &str) -> (String, u64) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = name.split_at(name.len() - digits);
    (head.to_string(), tail.parse().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(30));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(20));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "a=\"b\"");
        assert!(
            out.contains("x_seconds_bucket{a=\"b\",le=\"0.00005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{a=\"b\",le=\"0.005\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{a=\"b\",le=\"10\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{a=\"b\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_count{a=\"b\"} 3\n"), "{out}");
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn mailbox_is_sent_minus_handled() {
        let m = Metrics::new();
        let s = m.shard(2);
        m.shard_sent(2);
        m.shard_sent(2);
        assert_eq!(s.mailbox(), Some(2));
        drop(s.handling("lookup"));
        assert_eq!(s.mailbox(), Some(1));
        assert_eq!(s.handled(), 1);
        // An actor whose senders are not counted has no known depth.
        assert_eq!(m.actor("membership", false).mailbox(), None);
    }

    #[test]
    fn labels_are_escaped_and_families_described_once() {
        let m = Metrics::new();
        m.add("curvine_t_total", "Things.", &[("path", "a\"b\\c\nd")], 2);
        m.add("curvine_t_total", "Things.", &[("path", "x")], 1);
        let out = m.render(&[Sample::gauge("curvine_g", "A gauge.", 1.5).label("tier", "mem")]);
        assert!(
            out.contains("curvine_t_total{path=\"a\\\"b\\\\c\\nd\"} 2\n"),
            "{out}"
        );
        assert_eq!(out.matches("# TYPE curvine_t_total counter").count(), 1);
        assert!(out.contains("curvine_g{tier=\"mem\"} 1.5\n"), "{out}");
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["shard-10", "shard-9", "gateway"];
        v.sort_by_key(|n| natural_key(n));
        assert_eq!(v, vec!["gateway", "shard-9", "shard-10"]);
    }
}
