//! `curvine-cli trace`: trace events of every node, merged by time, as a
//! list, a live stream, the causal tree of one request, or Chrome
//! trace-event JSON; or a command run traced, with its tree.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use curvine_client::Client;
use curvine_conf::Dur;
use curvine_messages::rpc::NodeTrace;
use curvine_messages::trace::{format_id, parse_id, Outcome, TraceEvent, TraceQuery};
use curvine_messages::{now_ns, FsError};

use crate::args::{Command, TraceArgs};
use crate::ctx::Ctx;
use crate::output::{print_json, print_json_line};
use crate::{fail, run_traced, Cli, Failure, Global};

fn bad(flag: &str, e: impl std::fmt::Display) -> FsError {
    FsError::InvalidArgument(format!("--{flag}: {e}"))
}

fn duration(flag: &str, text: &Option<String>) -> Result<Option<Duration>, FsError> {
    text.as_deref()
        .map(|t| Dur::parse(t).map(|d| d.0).map_err(|e| bad(flag, e)))
        .transpose()
}

impl TraceArgs {
    /// The command to run traced, if one was given.
    pub fn command_words(&self) -> Result<Option<Vec<String>>, FsError> {
        match (&self.run, self.command.is_empty()) {
            (Some(_), false) => Err(bad(
                "run",
                "give the command with --run or after --, not both",
            )),
            (Some(run), true) => {
                let words: Vec<String> = run.split_whitespace().map(String::from).collect();
                if words.is_empty() {
                    return Err(bad("run", "empty command"));
                }
                Ok(Some(words))
            }
            (None, false) => Ok(Some(self.command.clone())),
            (None, true) => Ok(None),
        }
    }

    /// The query the filters describe.
    pub fn query(&self) -> Result<TraceQuery, FsError> {
        let trace = match (&self.tree, &self.trace_id) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "tree",
                    "give a trace id with --tree or --trace-id, not both",
                ))
            }
            (Some(t), None) | (None, Some(t)) => Some(parse_id(t)?),
            (None, None) => None,
        };
        let since_ns = duration("since", &self.since)?.map(|d| now_ns() - d.as_nanos() as i64);
        let query = TraceQuery {
            from_seq: None,
            actor: self.actor.clone(),
            node: self.node.clone(),
            trace,
            kind: self.kind.clone(),
            slower_than_ns: duration("slower-than", &self.slower_than)?
                .map(|d| d.as_nanos() as i64),
            since_ns,
            limit: self.limit,
        };
        query.validate()?;
        Ok(query)
    }
}

/// Events of every node, oldest start first; prints which nodes failed.
pub fn merge(nodes: &[NodeTrace]) -> Vec<TraceEvent> {
    let mut events: Vec<TraceEvent> = Vec::new();
    for n in nodes {
        if let Some(e) = &n.error {
            eout!("curvine-cli: trace: node {}: {e}", n.node);
        }
        events.extend(n.batch.events.iter().cloned());
    }
    events.sort_by_key(|e| (e.start_ns, e.end_ns));
    events
}

fn ms(ns: i64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn outcome(o: &Outcome) -> String {
    match o {
        Outcome::Ok => "ok".into(),
        Outcome::Error(kind) => format!("error {kind}"),
    }
}

fn clock(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let micros = ns.rem_euclid(1_000_000_000) / 1000;
    let day = secs.rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}.{micros:06}",
        day / 3600,
        day / 60 % 60,
        day % 60
    )
}

/// One event per line: time (UTC), node, actor, kind, duration, queueing,
/// outcome and ids.
pub fn print_line(e: &TraceEvent) {
    out!(
        "{} {:<12} {:<24} {:<28} {:>11} queued {:>11} {:<14} trace {} span {}",
        clock(e.start_ns),
        e.node,
        e.actor,
        e.kind,
        ms(e.handled_ns()),
        ms(e.queued_ns()),
        outcome(&e.outcome),
        format_id(e.trace),
        format_id(e.span),
    )
}

pub fn event_json(e: &TraceEvent) -> serde_json::Value {
    json!({
        "trace": format_id(e.trace),
        "span": format_id(e.span),
        "parent": if e.parent == 0 { String::new() } else { format_id(e.parent) },
        "node": e.node,
        "actor": e.actor,
        "actor_id": e.actor_id,
        "kind": e.kind,
        "enqueue_ns": e.enqueue_ns,
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
        "queued_ns": e.queued_ns(),
        "duration_ns": e.handled_ns(),
        "outcome": outcome(&e.outcome),
    })
}

/// The causal tree of the events of one trace, as lines: offset from the
/// request's start, kind, actor@node, duration and queueing, outcome.
pub fn tree_lines(events: &[TraceEvent]) -> Vec<String> {
    let spans: HashMap<u64, &TraceEvent> = events.iter().map(|e| (e.span, e)).collect();
    let mut children: BTreeMap<u64, Vec<&TraceEvent>> = BTreeMap::new();
    let mut roots: Vec<&TraceEvent> = Vec::new();
    for e in events {
        if e.parent != 0 && spans.contains_key(&e.parent) {
            children.entry(e.parent).or_default().push(e);
        } else {
            roots.push(e);
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|e| (e.start_ns, e.end_ns));
    }
    roots.sort_by_key(|e| (e.start_ns, e.end_ns));
    let t0 = events
        .iter()
        .map(|e| e.enqueue_ns.min(e.start_ns))
        .min()
        .unwrap_or(0);
    let mut out = Vec::new();
    fn walk(
        e: &TraceEvent,
        depth: usize,
        t0: i64,
        children: &BTreeMap<u64, Vec<&TraceEvent>>,
        out: &mut Vec<String>,
    ) {
        out.push(format!(
            "{:>10} {}{} {}@{} {} (queued {}) {}",
            format!("+{}", ms(e.start_ns - t0)),
            "  ".repeat(depth),
            e.kind,
            e.actor,
            e.node,
            ms(e.handled_ns()),
            ms(e.queued_ns()),
            outcome(&e.outcome)
        ));
        for c in children.get(&e.span).into_iter().flatten() {
            walk(c, depth + 1, t0, children, out);
        }
    }
    for r in roots {
        walk(r, 0, t0, &children, &mut out);
    }
    out
}

/// Chrome trace-event JSON: a process per node, a thread per actor, a
/// complete event per message (queueing in its arguments).
pub fn chrome_json(events: &[TraceEvent]) -> serde_json::Value {
    let mut pids: BTreeMap<&str, usize> = BTreeMap::new();
    let mut tids: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    let mut out = Vec::new();
    for e in events {
        let next = pids.len() + 1;
        let pid = *pids.entry(e.node.as_str()).or_insert(next);
        let next = tids.len() + 1;
        let tid = *tids
            .entry((e.node.as_str(), e.actor.as_str()))
            .or_insert(next);
        out.push(json!({
            "name": e.kind,
            "cat": e.actor,
            "ph": "X",
            "ts": e.start_ns as f64 / 1000.0,
            "dur": e.handled_ns() as f64 / 1000.0,
            "pid": pid,
            "tid": tid,
            "args": {
                "trace": format_id(e.trace),
                "span": format_id(e.span),
                "parent": format_id(e.parent),
                "queued_us": e.queued_ns() as f64 / 1000.0,
                "outcome": outcome(&e.outcome),
                "actor_id": e.actor_id,
            },
        }));
    }
    for (node, pid) in &pids {
        out.push(json!({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": format!("node {node}")}}));
    }
    for ((node, actor), tid) in &tids {
        out.push(json!({"name": "thread_name", "ph": "M", "pid": pids[node], "tid": tid, "args": {"name": actor}}));
    }
    json!({ "traceEvents": out, "displayTimeUnit": "ms" })
}

/// Streams new events of every node until interrupted.
pub async fn follow(client: &Client, query: TraceQuery, json_out: bool) -> Result<(), FsError> {
    // Start at the end of each node's ring: only what happens from now on.
    let mut cursors: Vec<(String, u64)> = client
        .trace_events(
            TraceQuery {
                limit: 1,
                ..query.clone()
            },
            Vec::new(),
        )
        .await?
        .into_iter()
        .map(|n| (n.node, n.batch.next_seq))
        .collect();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let nodes = client.trace_events(query.clone(), cursors.clone()).await?;
        for n in &nodes {
            match cursors.iter_mut().find(|(node, _)| *node == n.node) {
                Some(c) if n.error.is_none() => c.1 = n.batch.next_seq,
                Some(_) => {}
                None => cursors.push((n.node.clone(), n.batch.next_seq)),
            }
        }
        for e in merge(&nodes) {
            if json_out {
                print_json_line(&event_json(&e));
            } else {
                print_line(&e);
            }
        }
    }
}

/// `curvine-cli trace`: a traced command's tree, a live stream, or the
/// recent events of every node (a list, one request's tree, Chrome JSON).
pub async fn run(cx: &Ctx<'_>, global: Global, args: TraceArgs) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let err = |e: FsError| fail("trace", "", e);
    let query = args.query().map_err(err)?;
    if let Some(words) = args.command_words().map_err(err)? {
        return run_command(cx, global, &args, query, words).await;
    }
    if args.follow {
        return follow(client, query, json_out).await.map_err(err);
    }
    let nodes = client.trace_events(query, Vec::new()).await.map_err(err)?;
    let events = merge(&nodes);
    if let Some(file) = &args.chrome {
        write_chrome(file, &events)?;
        eout!("wrote {} events to {file}", events.len());
    }
    if json_out {
        print_json(&events.iter().map(event_json).collect::<Vec<_>>());
    } else if args.tree.is_some() {
        if events.is_empty() {
            return Err(fail(
                "trace",
                args.tree.as_deref().unwrap_or_default(),
                FsError::NotFound(
                    "no events of this trace on any node (the rings keep only recent events)"
                        .into(),
                ),
            ));
        }
        for line in tree_lines(&events) {
            out!("{line}");
        }
    } else if args.chrome.is_none() {
        for e in &events {
            print_line(e);
        }
    }
    Ok(())
}

/// Runs a command (`trace -- COMMAND` or `--run`) with tracing forced,
/// then prints its tree to stderr; the command's own outcome is returned.
async fn run_command(
    cx: &Ctx<'_>,
    global: Global,
    args: &TraceArgs,
    mut query: TraceQuery,
    words: Vec<String>,
) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let err = |e: FsError| fail("trace", "", e);
    // The command runs with the same global options, traced.
    let inner = Cli::try_parse_from(std::iter::once("curvine-cli".to_string()).chain(words))
        .map_err(|e| Failure {
            what: "trace --run".into(),
            error: e.to_string().trim().to_string(),
            code: 2,
        })?;
    if matches!(
        inner.command,
        Command::Trace(_) | Command::Fuse(_) | Command::Conf(_)
    ) {
        return Err(fail(
            "trace",
            "",
            FsError::InvalidArgument("only commands that talk to the cluster can be traced".into()),
        ));
    }
    // Options given inside the command win over the outer ones; `-c`
    // settings add to them.
    let mut overrides = global.overrides;
    overrides.extend(inner.global.overrides);
    let inner = Cli {
        global: Global {
            conf: inner.global.conf.or(global.conf),
            cluster: inner.global.cluster.or(global.cluster),
            overrides,
            json: false,
        },
        command: inner.command,
    };
    let ctx = curvine_messages::trace::TraceCtx::root();
    // The task-local context makes the data port's requests join too.
    let outcome =
        curvine_client::trace_scope(Some(ctx), Box::pin(run_traced(inner, Some(ctx)))).await;
    // Casts sent by the command may still be on their way.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    query.trace = Some(ctx.trace);
    let nodes = client.trace_events(query, Vec::new()).await.map_err(err)?;
    let events = merge(&nodes);
    if let Some(file) = &args.chrome {
        write_chrome(file, &events)?;
    }
    eout!("trace {}", curvine_messages::trace::format_id(ctx.trace));
    if json_out {
        print_json(&events.iter().map(event_json).collect::<Vec<_>>());
    } else {
        for line in tree_lines(&events) {
            eout!("{line}");
        }
    }
    outcome
}

fn write_chrome(file: &str, events: &[TraceEvent]) -> Result<(), Failure> {
    let text = serde_json::to_string(&chrome_json(events)).unwrap_or_default();
    std::fs::write(file, text).map_err(|e| fail("trace --chrome", file, FsError::Io(e.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(span: u64, parent: u64, node: &str, kind: &str, start: i64, end: i64) -> TraceEvent {
        TraceEvent {
            trace: 1,
            span,
            parent,
            node: node.into(),
            actor: "a".into(),
            actor_id: String::new(),
            kind: kind.into(),
            enqueue_ns: start - 1000,
            start_ns: start,
            end_ns: end,
            outcome: Outcome::Ok,
        }
    }

    #[test]
    fn a_tree_nests_children_under_their_parents_in_time_order() {
        let events = vec![
            ev(3, 1, "b", "second", 5_000, 6_000),
            ev(1, 0, "a", "root", 1_000, 9_000),
            ev(2, 1, "b", "first", 2_000, 4_000),
            ev(4, 2, "c", "grandchild", 3_000, 3_500),
        ];
        let lines = tree_lines(&events);
        let kinds: Vec<&str> = lines
            .iter()
            .map(|l| l.split_whitespace().nth(1).unwrap())
            .collect();
        assert_eq!(kinds, vec!["root", "first", "grandchild", "second"]);
        assert!(lines[2].contains("    grandchild a@c"), "{}", lines[2]);
        assert!(lines[0].starts_with("  +0.001ms"), "{}", lines[0]);
    }

    #[test]
    fn chrome_json_has_a_complete_event_per_message_and_names() {
        let events = vec![
            ev(1, 0, "a", "root", 1_000, 9_000),
            ev(2, 1, "b", "x", 2_000, 4_000),
        ];
        let v = chrome_json(&events);
        let list = v["traceEvents"].as_array().unwrap();
        assert_eq!(list.iter().filter(|e| e["ph"] == "X").count(), 2);
        assert_eq!(
            list.iter().filter(|e| e["name"] == "process_name").count(),
            2
        );
        assert_eq!(list[0]["dur"], 8.0);
    }

    #[test]
    fn bad_flags_name_the_flag() {
        let mut a = TraceArgs {
            follow: false,
            actor: None,
            node: None,
            trace_id: Some("xyz".into()),
            kind: None,
            slower_than: None,
            since: None,
            tree: None,
            chrome: None,
            limit: 10,
            run: None,
            command: vec![],
        };
        assert!(a.query().unwrap_err().to_string().contains("hex digits"));
        a.trace_id = None;
        a.slower_than = Some("10 parsecs".into());
        assert!(a.query().unwrap_err().to_string().contains("--slower-than"));
        a.slower_than = Some("10ms".into());
        assert_eq!(a.query().unwrap().slower_than_ns, Some(10_000_000));
        a.limit = 1_000_000;
        assert!(a.query().unwrap_err().to_string().contains("limit"));
        a.limit = 10;
        a.run = Some("fs ls /".into());
        a.command = vec!["fs".into()];
        assert!(a
            .command_words()
            .unwrap_err()
            .to_string()
            .contains("not both"));
    }
}
