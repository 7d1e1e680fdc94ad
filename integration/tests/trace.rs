//! Actor traces on real node processes: a traced command that crosses three
//! nodes yields one connected tree; the ring keeps its bound under load;
//! filters, following and Chrome JSON; malformed queries get clear errors.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::process::Stdio;
use std::time::Duration;

use curvine_integration::{random_bytes, wait_for, Lazily, NodeProcess, ProcessCluster, TestS3};

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Runs a command traced; returns the trace id it printed.
fn traced(node: &NodeProcess, command: &str) -> String {
    let out = node.cli(&["trace", "--run", command]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "trace --run {command}: {stderr}");
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("trace "))
        .unwrap_or_else(|| panic!("no trace id in: {stderr}"))
        .trim()
        .to_string()
}

/// The events of one trace, as `trace --tree ID --json` gives them.
fn tree(node: &NodeProcess, id: &str) -> Vec<serde_json::Value> {
    let v = json(&node.cli_ok(&["--json", "trace", "--tree", id]));
    v.as_array().unwrap().clone()
}

/// Asserts the events form one tree: one root, every other event's parent
/// is an event of the trace. Returns the nodes the trace touched.
fn assert_connected(events: &[serde_json::Value], id: &str) -> BTreeSet<String> {
    assert!(!events.is_empty(), "trace {id} has no events");
    let spans: BTreeSet<&str> = events.iter().map(|e| e["span"].as_str().unwrap()).collect();
    let roots: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| !spans.contains(e["parent"].as_str().unwrap()))
        .collect();
    assert_eq!(
        roots.len(),
        1,
        "trace {id} has {} roots: {events:#?}",
        roots.len()
    );
    assert_eq!(roots[0]["actor"], "rpc", "{:#?}", roots[0]);
    for e in events {
        assert_eq!(e["trace"].as_str().unwrap(), id);
        assert!(e["start_ns"].as_i64() <= e["end_ns"].as_i64(), "{e:#?}");
        assert!(e["queued_ns"].as_i64().unwrap() >= 0);
    }
    events
        .iter()
        .map(|e| e["node"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_traced_command_across_three_nodes_is_one_connected_tree() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let nodes = &cluster.nodes;
    let out = nodes[1].cli_ok(&["admin", "rebalance"]);
    assert!(out.contains("shard(s) moved"), "{out}");

    // A nested mkdir creates each level on the shard of its parent, so
    // with the shards spread it reaches the other nodes; try a few names
    // until one reaches all three.
    let mut crossed = None;
    for attempt in 0..10 {
        let path = format!("/t{attempt}/a/b/c/d/e/f/g");
        let id = traced(&nodes[0], &format!("fs mkdir -p {path}"));
        let events = tree(&nodes[0], &id);
        let touched = assert_connected(&events, &id);
        let kinds: BTreeSet<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
        assert!(kinds.contains("Mkdir"), "{kinds:?}");
        assert!(
            kinds.iter().any(|k| k.starts_with("ShardMsg::")),
            "{kinds:?}"
        );
        assert!(kinds.contains("commit"), "{kinds:?}");
        if touched.len() == 3 {
            crossed = Some((id, events));
            break;
        }
    }
    let (id, events) = crossed.expect("no traced mkdir reached all three nodes");
    // Remote shard requests go through the gateway of the serving node.
    assert!(events
        .iter()
        .any(|e| e["actor"] == "gateway" && e["node"] != nodes[0].node_id));
    // The text tree shows the request on top and nested spans below.
    let text = nodes[2].cli_ok(&["trace", "--tree", &id]);
    let first = text.lines().next().unwrap();
    assert!(first.contains("Mkdir rpc@"), "{text}");
    assert!(text.lines().any(|l| l.contains("  ShardMsg::")), "{text}");

    // Chrome trace JSON of the same trace.
    let chrome = dir.path().join("trace.json");
    nodes[1].cli_ok(&["trace", "--tree", &id, "--chrome", chrome.to_str().unwrap()]);
    let v = json(&std::fs::read_to_string(&chrome).unwrap());
    let list = v["traceEvents"].as_array().unwrap();
    assert_eq!(list.iter().filter(|e| e["ph"] == "X").count(), events.len());
    assert_eq!(
        list.iter().filter(|e| e["name"] == "process_name").count(),
        3
    );

    // Filters: by node and by actor.
    let on2 = json(&nodes[0].cli_ok(&[
        "--json",
        "trace",
        "--trace-id",
        &id,
        "--node",
        &nodes[2].node_id,
    ]));
    let on2 = on2.as_array().unwrap();
    assert!(!on2.is_empty());
    assert!(on2.iter().all(|e| e["node"] == nodes[2].node_id.as_str()));
    let shards =
        json(&nodes[0].cli_ok(&["--json", "trace", "--trace-id", &id, "--actor", "shard"]));
    assert!(shards
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["actor"].as_str().unwrap().starts_with("shard-")));
}

#[test]
fn the_ring_keeps_its_bound_and_queries_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(
        &dir.path().join("n"),
        &["-c", "trace.ring_events=1000", "-c", "trace.sample_rate=1"],
    );
    node.cli_ok(&["fs", "mkdir", "/d"]);

    // Follow while requests run: the stream shows them.
    let mut follow = node
        .command("curvine-cli")
        .args([
            "--cluster",
            &node.addr,
            "--json",
            "trace",
            "--follow",
            "--kind",
            "Stat",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    curvine_integration::runtime().block_on(async {
        let c = node.client().await;
        for _ in 0..3000 {
            c.stat("/d").await.unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    follow.kill().unwrap();
    let mut streamed = String::new();
    follow
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut streamed)
        .unwrap();
    let _ = follow.wait();
    let stat_lines = streamed.lines().filter(|l| l.contains("\"Stat\"")).count();
    assert!(
        stat_lines >= 100,
        "follow streamed {stat_lines} Stat events:\n{streamed:.2000}"
    );

    // Every request was sampled; the ring holds the latest 1000 events.
    let all = json(&node.cli_ok(&["--json", "trace", "--limit", "100000"]));
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), 1000, "the ring holds {} events", all.len());
    let mut per_trace: HashMap<&str, usize> = HashMap::new();
    for e in all {
        *per_trace.entry(e["trace"].as_str().unwrap()).or_default() += 1;
    }
    assert!(per_trace.len() > 100);

    // --slower-than keeps only slow events; --since 1h keeps these.
    let slow = json(&node.cli_ok(&["--json", "trace", "--slower-than", "1h"]));
    assert!(slow.as_array().unwrap().is_empty());
    let recent = json(&node.cli_ok(&["--json", "trace", "--since", "1h", "--limit", "5"]));
    assert_eq!(recent.as_array().unwrap().len(), 5);

    // Malformed queries: a clear error naming what was wrong.
    for (args, expect) in [
        (vec!["trace", "--trace-id", "zz"], "hex digits"),
        (vec!["trace", "--slower-than", "5 parsecs"], "--slower-than"),
        (vec!["trace", "--since=-3s"], "--since"),
        (vec!["trace", "--limit", "999999"], "limit"),
        (vec!["trace", "--node", "nosuch"], "no such node"),
        (vec!["trace", "--actor", ""], "--actor"),
        (
            vec!["trace", "--tree", "abc", "--trace-id", "abc"],
            "not both",
        ),
        (vec!["trace", "--tree", "1234"], "no events of this trace"),
        (
            vec!["trace", "--run", "fs frobnicate /"],
            "unrecognized subcommand",
        ),
    ] {
        let out = node.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[test]
fn data_path_requests_join_the_trace_of_their_command() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 2, &[]);
    let n0 = &cluster.nodes[0];
    let local = dir.path().join("payload");
    std::fs::write(&local, curvine_integration::random_bytes(3 << 20, 9)).unwrap();
    // Without short-circuit the bytes go through the data port.
    let put = format!(
        "-c client.short_circuit=false fs put {} /payload",
        local.display()
    );
    let id = traced(n0, &put);
    let events = tree(n0, &id);
    let by_actor = |actor: &str| -> Vec<&serde_json::Value> {
        events.iter().filter(|e| e["actor"] == actor).collect()
    };
    let writes = by_actor("data-server");
    assert!(
        writes.iter().any(|e| e["kind"] == "write"),
        "no data-port write in {events:#?}"
    );
    // The block manager's commit is a child of the data port's request.
    let commits = by_actor("block-manager");
    assert!(
        commits
            .iter()
            .any(|c| c["kind"] == "commit" && writes.iter().any(|w| w["span"] == c["parent"])),
        "{events:#?}"
    );
    for e in &events {
        assert_eq!(e["trace"].as_str().unwrap(), id);
    }
    let id = traced(n0, "-c client.short_circuit=false fs cat /payload");
    let reads: Vec<serde_json::Value> = tree(n0, &id)
        .into_iter()
        .filter(|e| e["actor"] == "data-server")
        .collect();
    assert!(reads.iter().any(|e| e["kind"] == "read"), "{reads:#?}");
}

/// Mounts `location` at `path` on `node`, with the test server's properties.
fn mount(node: &NodeProcess, s3: &TestS3, location: &str, path: &str, extra: &[&str]) {
    let mut args: Vec<String> = vec!["mount".into(), location.into(), path.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(s3.props());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.cli_ok(&args);
}

/// Whether span `span` is `ancestor` or below it.
fn descends(events: &[serde_json::Value], span: &str, ancestor: &str) -> bool {
    let parent: HashMap<&str, &str> = events
        .iter()
        .map(|e| (e["span"].as_str().unwrap(), e["parent"].as_str().unwrap()))
        .collect();
    let mut at = span;
    for _ in 0..events.len() + 1 {
        if at == ancestor {
            return true;
        }
        match parent.get(at) {
            Some(p) => at = p,
            None => return false,
        }
    }
    false
}

#[test]
fn ufs_work_joins_the_trace_of_its_request() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 2, &[]);
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);
    let loc = s3.location("traced-load");
    let ufs = s3.ufs(&loc);
    curvine_integration::runtime().block_on(async {
        for i in 0..6 {
            ufs.write_all(&format!("d/obj{i}"), random_bytes(300_000, i))
                .await
                .unwrap();
        }
    });
    mount(n0, &s3, &loc, "/m", &["--block-size", "64KiB"]);

    // A traced load job: its listing and every file are spans of the node
    // running it, under the request that created the job; the blocks given
    // to the other node are a gateway span there, with its UFS reads below.
    let id = traced(n0, "load /m --wait");
    let events = tree(n0, &id);
    let of = |actor: &str, kind: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["actor"] == actor && e["kind"] == kind)
            .collect()
    };
    let create = events
        .iter()
        .find(|e| e["actor"] == "rpc" && e["kind"] == "Load")
        .unwrap_or_else(|| panic!("no Load request in {events:#?}"));
    let list = of("ufs-loader", "list");
    assert_eq!(list.len(), 1, "{events:#?}");
    assert_eq!(list[0]["parent"], create["span"]);
    assert!(of("ufs", "list").iter().any(|e| descends(
        &events,
        e["span"].as_str().unwrap(),
        list[0]["span"].as_str().unwrap()
    )));
    let files = of("ufs-loader", "load-file");
    assert_eq!(files.len(), 6, "{events:#?}");
    assert!(files.iter().all(|f| f["outcome"] == "ok"), "{files:#?}");
    let remote = of("gateway", "PeerMsg::Load");
    let remote_part = remote
        .iter()
        .find(|e| e["node"] == n1.node_id.as_str())
        .unwrap_or_else(|| panic!("no part loaded on the other node: {events:#?}"));
    assert!(files.iter().any(|f| f["span"] == remote_part["parent"]));
    assert!(
        of("ufs", "read")
            .iter()
            .any(|r| r["node"] == n1.node_id.as_str()
                && descends(
                    &events,
                    r["span"].as_str().unwrap(),
                    remote_part["span"].as_str().unwrap()
                )),
        "{events:#?}"
    );

    // A first read of an uncached object: the name comes from a UFS stat,
    // the bytes from a fill on the data port that reads the object.
    let loc2 = s3.location("traced-read");
    curvine_integration::runtime().block_on(async {
        s3.ufs(&loc2)
            .write_all("hello", b"hello\n".to_vec())
            .await
            .unwrap();
    });
    mount(n0, &s3, &loc2, "/r", &[]);
    let id = traced(n0, "fs cat /r/hello");
    let events = tree(n0, &id);
    let stat = events
        .iter()
        .find(|e| e["actor"] == "ufs" && e["kind"] == "stat")
        .unwrap_or_else(|| panic!("no UFS stat in {events:#?}"));
    assert_eq!(stat["outcome"], "ok");
    let fill = events
        .iter()
        .find(|e| e["actor"] == "data-server" && e["kind"] == "fill")
        .unwrap_or_else(|| panic!("no fill in {events:#?}"));
    assert!(events.iter().any(|e| e["actor"] == "ufs"
        && e["kind"] == "read"
        && descends(
            &events,
            e["span"].as_str().unwrap(),
            fill["span"].as_str().unwrap()
        )));

    // fs_mode: the upload after a traced close joins the close's trace.
    let loc3 = s3.location("traced-persist");
    mount(n0, &s3, &loc3, "/p", &["--write-type", "fs_mode"]);
    let local = dir.path().join("f");
    std::fs::write(&local, random_bytes(100_000, 3)).unwrap();
    let id = traced(n0, &format!("fs put {} /p/f", local.display()));
    let seen = RefCell::new(Vec::new());
    let what = Lazily(|| format!("an upload span to join the trace: {:#?}", seen.borrow()));
    wait_for(what, Duration::from_secs(30), || {
        let events = tree(n0, &id);
        let persist = events
            .iter()
            .find(|e| e["actor"] == "ufs-loader" && e["kind"] == "persist");
        if let Some(persist) = persist {
            assert_eq!(persist["outcome"], "ok", "{events:#?}");
            let close = events
                .iter()
                .find(|e| e["span"] == persist["parent"])
                .unwrap_or_else(|| panic!("the upload's parent is not in {events:#?}"));
            assert_eq!(close["kind"], "CompleteFile", "{events:#?}");
            assert!(events.iter().any(|e| e["actor"] == "ufs"
                && e["kind"] == "write"
                && e["parent"] == persist["span"]));
            return Some(());
        }
        *seen.borrow_mut() = events;
        None
    });
}
