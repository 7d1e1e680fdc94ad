//! Observability on real processes: `curvine-cli actors` shows every node's
//! supervision tree with live counters; `/metrics` of the nodes and of a
//! FUSE mount parse as Prometheus text and carry what the cluster did; the
//! dashboard renders real cluster data in a real headless Chromium.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_integration::{
    http_get, http_get_with, random_bytes, runtime, wait_for, FuseMount, Lazily, NodeProcess,
    ProcessCluster, TestS3,
};

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The names in an actor tree (as `actors --json` gives it), depth first.
fn names(tree: &serde_json::Value, out: &mut Vec<String>) {
    out.push(tree["name"].as_str().unwrap().to_string());
    for c in tree["children"].as_array().unwrap() {
        names(c, out);
    }
}

fn find<'a>(tree: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    if tree["name"] == name {
        return Some(tree);
    }
    tree["children"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|c| find(c, name))
}

/// Parses a scrape with a Prometheus text-format parser, after checking the
/// rules that parser is lenient about: every sample belongs to a family
/// declared once by `# TYPE`, and a family's lines are contiguous.
fn scrape(text: &str) -> prometheus_parse::Scrape {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "bad type: {line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "family {name} declared twice"
            );
            if !current.is_empty() {
                finished.insert(std::mem::take(&mut current));
            }
            current = name.to_string();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).expect("sample name");
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in: {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| types.get(*f).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        assert_eq!(family, current, "sample outside its family: {line}");
        assert!(!finished.contains(family), "family {family} split");
        let value = line.rsplit(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value in: {line}"
        );
    }
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text format")
}

/// The value of `metric` with every label of `labels`.
fn value(s: &prometheus_parse::Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .filter(|x| x.metric == metric)
        .filter(|x| labels.iter().all(|(k, v)| x.labels.get(k) == Some(*v)))
        .map(|x| match &x.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => h.last().map_or(0.0, |c| c.count),
            prometheus_parse::Value::Summary(_) => 0.0,
        })
        .reduce(|a, b| a + b)
}

fn metrics(addr: &str) -> prometheus_parse::Scrape {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    scrape(&body)
}

#[test]
fn http_port_with_a_token_refuses_requests_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &["-c", "http.token=s3cret-tok"]);
    let addr = node.http_addr.clone();
    for path in ["/metrics", "/api/overview", "/"] {
        let (status, head, body) = http_get_with(&addr, path, &[]);
        assert_eq!(status, 401, "GET {path} without a token: {head}\n{body}");
        assert!(
            body.contains("no bearer token") && body.contains("http.token"),
            "{body}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: bearer"),
            "{head}"
        );
    }
    let wrong = [("Authorization", "Bearer s3cret-tox")];
    let (status, _, body) = http_get_with(&addr, "/metrics", &wrong);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("wrong bearer token"), "{body}");
    let right = [("Authorization", "Bearer s3cret-tok")];
    let (status, _, body) = http_get_with(&addr, "/metrics", &right);
    assert_eq!(status, 200, "{body}");
    assert!(value(&scrape(&body), "curvine_shards_served", &[]).unwrap() >= 1.0);
    // The dashboard in a browser: the token once in the address, then a
    // cookie carries it to the API calls of the page.
    let (status, head, body) = http_get_with(&addr, "/?token=s3cret-tok", &[]);
    assert_eq!(status, 200, "{body}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie:")
                .then(|| l["set-cookie:".len()..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("no cookie set: {head}"));
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    let pair = cookie.split(';').next().unwrap().to_string();
    let (status, _, body) = http_get_with(&addr, "/api/overview", &[("Cookie", &pair)]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&node.node_id), "{body}");
    // The refusals are logged; the token is printed nowhere.
    let log = node.log_text();
    assert!(log.contains("http request refused"), "{log}");
    assert!(!log.contains("s3cret-tok"), "the token is in the log");
    let shown = node.cli_ok(&["conf", "show", "-c", "http.token=s3cret-tok"]);
    assert!(
        !shown.contains("s3cret-tok") && shown.contains("<redacted>"),
        "{shown}"
    );
}

#[test]
fn actors_and_metrics_of_a_three_node_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let nodes = &cluster.nodes;
    nodes[0].cli_ok(&["admin", "rebalance"]);
    // Metadata and data traffic on every node's shards and blocks.
    let data = random_bytes(3 << 20, 5);
    runtime().block_on(async {
        let client = nodes[1].client().await;
        for i in 0..12 {
            let path = format!("/m/d{i}/f");
            client.mkdir(&format!("/m/d{i}"), true).await.unwrap();
            let mut w = FileWriter::open(&client, &path, &WriteOptions::create())
                .await
                .unwrap();
            w.write(&data).await.unwrap();
            w.close().await.unwrap();
        }
        let mut r = FileReader::open(&client, "/m/d3/f").await.unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        assert!(out == data);
    });

    let trees = json(&nodes[2].cli_ok(&["--json", "actors"]));
    let trees = trees.as_array().unwrap();
    let ids: BTreeSet<&str> = trees.iter().map(|t| t["node"].as_str().unwrap()).collect();
    let want: BTreeSet<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    assert_eq!(ids, want);
    let mut shard_messages = 0;
    for t in trees {
        assert!(t["error"].is_null(), "{t}");
        let root = &t["root"];
        assert_eq!(root["name"], "node");
        let mut all = Vec::new();
        names(root, &mut all);
        for role in [
            "shard-host",
            "shard-0",
            "block-manager",
            "data-server",
            "gateway",
            "membership",
            "ufs-loader",
            "trace-recorder",
            "tier-evictors",
            "client-port",
            "re-replicator",
        ] {
            assert!(all.iter().any(|n| n == role), "{role} missing: {all:?}");
        }
        assert!(all.iter().any(|n| n.starts_with("evictor-")), "{all:?}");
        // Shards sit under the shard host; mailboxes are counted there.
        let host = find(root, "shard-host").unwrap();
        for shard in host["children"].as_array().unwrap() {
            assert!(shard["name"].as_str().unwrap().starts_with("shard-"));
            assert!(shard["mailbox"].is_u64(), "{shard}");
            assert_eq!(shard["status"], "running");
            shard_messages += shard["handled"].as_u64().unwrap();
        }
        let membership = find(root, "membership").unwrap();
        assert!(membership["handled"].as_u64().unwrap() > 0, "{membership}");
        assert!(membership["mailbox"].is_null());
        assert!(membership["uptime_ms"].as_u64().unwrap() > 0);
    }
    assert!(shard_messages > 50, "shards handled {shard_messages}");

    // The table, one node, and a node that does not exist.
    let one = nodes[0].cli_ok(&["actors", "--node", &nodes[1].node_id]);
    assert!(
        one.starts_with(&format!("node {}\n", nodes[1].node_id)),
        "{one}"
    );
    assert!(
        one.contains("MAILBOX") && one.contains("shard-host"),
        "{one}"
    );
    assert_eq!(one.matches("\nnode ").count(), 0, "{one}");
    let bad = nodes[0].cli(&["actors", "--node", "nosuchnode"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("nosuchnode") && err.contains("no such node"),
        "{err}"
    );

    // /metrics of every node.
    let mut blocks = 0.0;
    for n in nodes {
        assert!(!n.http_addr.is_empty(), "no http port in {}", n.log_text());
        let s = metrics(&n.http_addr);
        assert_eq!(
            value(&s, "curvine_cluster_nodes", &[("state", "up")]),
            Some(3.0)
        );
        assert!(value(&s, "curvine_tier_capacity_bytes", &[]).unwrap() > 0.0);
        blocks += value(&s, "curvine_tier_blocks", &[]).unwrap();
        assert!(
            value(
                &s,
                "curvine_actor_messages_total",
                &[("actor", "membership")]
            )
            .unwrap()
                > 0.0
        );
        let handled: f64 = value(
            &s,
            "curvine_actor_message_duration_seconds",
            &[("actor", "membership"), ("kind", "tick")],
        )
        .unwrap();
        assert!(handled > 0.0);
        assert!(value(&s, "curvine_shards_served", &[]).unwrap() >= 1.0);
        assert!(s.docs.contains_key("curvine_actor_restarts_total"));
    }
    assert!(blocks >= 12.0, "{blocks} blocks in the tiers");
    // The reader's node served reads and somebody's data port wrote blocks.
    let total = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        nodes
            .iter()
            .map(|n| value(&metrics(&n.http_addr), metric, labels).unwrap_or(0.0))
            .sum()
    };
    assert!(total("curvine_cache_hits_total", &[]) >= 1.0);
    assert!(
        total(
            "curvine_data_requests_total",
            &[("kind", "create_local"), ("outcome", "ok")]
        ) + total(
            "curvine_data_requests_total",
            &[("kind", "write"), ("outcome", "ok")]
        ) >= 12.0
    );
    // Metadata latencies per shard and message kind.
    let shard_latencies: f64 = nodes
        .iter()
        .map(|n| {
            metrics(&n.http_addr)
                .samples
                .iter()
                .filter(|x| x.metric == "curvine_actor_message_duration_seconds")
                .filter(|x| {
                    x.labels
                        .get("actor")
                        .is_some_and(|a| a.starts_with("shard-"))
                        && x.labels
                            .get("kind")
                            .is_some_and(|k| k.starts_with("ShardMsg::"))
                })
                .map(|x| match &x.value {
                    prometheus_parse::Value::Histogram(h) => h.last().map_or(0.0, |c| c.count),
                    _ => 0.0,
                })
                .sum::<f64>()
        })
        .sum();
    assert!(shard_latencies >= 36.0, "{shard_latencies}");
}

#[test]
fn fuse_mount_serves_its_metrics_and_traces_its_requests() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    // Every request of the mount traced.
    let mnt = FuseMount::start(
        &node,
        &dir.path().join("mnt"),
        &["-c", "trace.sample_rate=1"],
    );
    let addr = mnt
        .metrics_addr()
        .unwrap_or_else(|| panic!("no metrics address: {}", mnt.log_text()));
    std::fs::create_dir(mnt.path("d")).unwrap();
    std::fs::write(mnt.path("d/f"), vec![7u8; 300_000]).unwrap();
    assert_eq!(std::fs::read(mnt.path("d/f")).unwrap().len(), 300_000);
    assert!(std::fs::metadata(mnt.path("d/nothing")).is_err());
    let s = metrics(&addr);
    for op in ["lookup", "mkdir", "create", "write", "flush", "getattr"] {
        assert!(
            value(&s, "curvine_fuse_operations_total", &[("op", op)]).unwrap_or(0.0) >= 1.0,
            "no {op} counted"
        );
    }
    assert!(value(&s, "curvine_fuse_written_bytes_total", &[]).unwrap() >= 300_000.0);
    assert!(
        value(&s, "curvine_fuse_errors_total", &[("error", "not_found")]).unwrap_or(0.0) >= 1.0,
        "the failed lookup is counted"
    );
    assert!(
        value(
            &s,
            "curvine_fuse_operation_duration_seconds",
            &[("op", "lookup")]
        )
        .unwrap()
            >= 1.0
    );

    // The mount's spans reach the node; the mkdir's trace is one tree from
    // the mount's span through the node's request to the shards.
    let mkdir = wait_for(
        "a fuse span to reach the node",
        Duration::from_secs(20),
        || {
            let events =
                json(&node.cli_ok(&["--json", "trace", "--actor", "fuse", "--kind", "mkdir"]));
            events.as_array().unwrap().first().cloned()
        },
    );
    assert_eq!(mkdir["outcome"], "ok", "{mkdir}");
    let id = mkdir["trace"].as_str().unwrap();
    let tree = json(&node.cli_ok(&["--json", "trace", "--tree", id]));
    let tree = tree.as_array().unwrap();
    let rpc = tree
        .iter()
        .find(|e| e["actor"] == "rpc")
        .unwrap_or_else(|| panic!("no node span in {tree:#?}"));
    assert_eq!(rpc["parent"], mkdir["span"], "{tree:#?}");
    assert_eq!(rpc["kind"], "Mkdir");
    assert!(
        tree.iter()
            .any(|e| e["actor"].as_str().unwrap().starts_with("shard-")),
        "{tree:#?}"
    );
    // A failed lookup's span names the error.
    let failed = json(&node.cli_ok(&["--json", "trace", "--actor", "fuse", "--kind", "lookup"]));
    assert!(
        failed
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["outcome"].to_string().contains("not_found")),
        "{failed}"
    );
}

/// Chromium, headless, as the test command installs it.
fn chromium(user_dir: &Path, args: &[&str]) -> std::process::Output {
    let bin = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect(
            "no chromium: the test command installs it (apt-get install chromium chromium-driver)",
        );
    Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,1600",
        ])
        .arg(format!("--user-data-dir={}", user_dir.display()))
        .args(args)
        .output()
        .expect("run chromium")
}

#[test]
fn dashboard_renders_the_cluster_in_chromium() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 2, &[]);
    let n0 = &cluster.nodes[0];
    let loc = s3.location("dash");
    let ufs = s3.ufs(&loc);
    runtime().block_on(async {
        for i in 0..20 {
            ufs.write_all(&format!("obj{i}"), random_bytes(10_000, i))
                .await
                .unwrap();
        }
    });
    let mut args: Vec<String> = vec!["mount".into(), loc.clone(), "/dash".into()];
    args.extend(s3.props());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    n0.cli_ok(&args);
    let job = json(&n0.cli_ok(&["--json", "load", "--wait", "/dash"]));
    let job_id = job["id"].as_str().unwrap().to_string();

    // The API never shows the mount's secret.
    let (status, mounts) = http_get(&n0.http_addr, "/api/mounts");
    assert_eq!(status, 200);
    assert!(mounts.contains(&loc), "{mounts}");
    assert!(!mounts.contains(&s3.secret), "secret in {mounts}");
    let (status, bad) = http_get(&n0.http_addr, "/api/traces?slower_than=fast");
    assert_eq!(status, 400, "{bad}");
    assert!(bad.contains("slower_than=fast"), "{bad}");

    let url = format!("http://{}/", n0.http_addr);
    let profile = dir.path().join("chromium");
    // The page fills itself from the API: wait until it has.
    // Chromium's stderr and the page, last seen.
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("the dashboard to render the cluster: {}", seen.borrow()));
    let dom = wait_for(what, Duration::from_secs(60), || {
        let out = chromium(
            &profile,
            &["--virtual-time-budget=10000", "--dump-dom", &url],
        );
        let dom = String::from_utf8_lossy(&out.stdout).to_string();
        if dom.contains(&job_id) && dom.contains("data-loaded") {
            return Some(dom);
        }
        *seen.borrow_mut() = format!("{}\n{dom}", String::from_utf8_lossy(&out.stderr));
        None
    });
    for want in [
        n0.node_id.as_str(),
        cluster.nodes[1].node_id.as_str(),
        "/dash",
        loc.as_str(),
        job_id.as_str(),
        "block-manager",
        "shard-host",
        "trace-recorder",
    ] {
        assert!(dom.contains(want), "{want} not on the page:\n{dom}");
    }
    assert!(!dom.contains(&s3.secret), "the secret is on the page");
    assert!(dom.contains(">done<"), "the job's state:\n{dom}");
    let errors = dom
        .split("<div id=\"error\">")
        .nth(1)
        .and_then(|r| r.split("</div>").next())
        .unwrap_or("");
    assert!(errors.is_empty(), "the page shows errors: {errors}");

    // A screenshot of the rendered page holds far more than an empty one.
    let shot = dir.path().join("dashboard.png");
    let blank = dir.path().join("blank.png");
    chromium(
        &profile,
        &[
            "--virtual-time-budget=10000",
            &format!("--screenshot={}", shot.display()),
            &url,
        ],
    );
    chromium(
        &profile,
        &[&format!("--screenshot={}", blank.display()), "about:blank"],
    );
    let png = std::fs::read(&shot).expect("screenshot written");
    let empty = std::fs::read(&blank).expect("blank screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    assert!(
        png.len() > 5 * empty.len(),
        "the screenshot looks empty: {} bytes against {} for a blank page",
        png.len(),
        empty.len()
    );
    if let Ok(keep) = std::env::var("DASHBOARD_SCREENSHOT") {
        let _ = std::fs::copy(&shot, keep);
    }
}

/// The `data-peak-NAME` of chart `id` in a dumped dashboard page.
fn chart_peak(dom: &str, id: &str, name: &str) -> Option<f64> {
    let fig = dom.split(&format!("id=\"chart-{id}\"")).nth(1)?;
    let fig = fig.split('>').next()?;
    let v = fig.split(&format!("data-peak-{name}=\"")).nth(1)?;
    v.split('"').next()?.parse().ok()
}

#[test]
fn dashboard_charts_follow_traffic_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n1"), &["-c", "http.history_interval=1s"]);
    let url = format!("http://{}/", node.http_addr);
    let profile = dir.path().join("chromium");
    let dump = || {
        let out = chromium(
            &profile,
            &["--virtual-time-budget=5000", "--dump-dom", &url],
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    // Idle: the charts are drawn from a few samples and show nothing moving.
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("the dashboard to draw its charts: {}", seen.borrow()));
    let idle = wait_for(what, Duration::from_secs(60), || {
        let dom = dump();
        let points = dom
            .split("id=\"chart-throughput\"")
            .nth(1)
            .and_then(|f| f.split("data-points=\"").nth(1))
            .and_then(|v| v.split('"').next())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0);
        if points >= 2 {
            return Some(dom);
        }
        *seen.borrow_mut() = dom;
        None
    });
    for id in [
        "throughput",
        "cache",
        "evictions",
        "load",
        "writeback",
        "ufs",
    ] {
        assert!(
            idle.contains(&format!("id=\"chart-{id}\"")),
            "no {id} chart:\n{idle}"
        );
    }
    assert_eq!(chart_peak(&idle, "throughput", "in"), Some(0.0), "{idle}");
    let shot = |name: &str| {
        let path = dir.path().join(name);
        chromium(
            &profile,
            &[
                "--virtual-time-budget=5000",
                &format!("--screenshot={}", path.display()),
                &url,
            ],
        );
        std::fs::read(&path).expect("screenshot written")
    };
    let before = shot("idle.png");

    // Traffic: 64 MiB written, then read short-circuit (the reader opens
    // the block file on this host: no byte passes the data port), so the
    // out line moves with reads it never streamed.
    let rt = runtime();
    let bytes = random_bytes(64 << 20, 5);
    rt.block_on(async {
        let writer = node.client().await;
        curvine_integration::write_file(&writer, "/traffic.bin", &bytes, 1).await;
    });
    let read_back = |short_circuit| {
        rt.block_on(async {
            let reader = node.client_short_circuit(short_circuit).await;
            let back = curvine_integration::read_file(&reader, "/traffic.bin")
                .await
                .unwrap();
            assert_eq!(back.len(), bytes.len());
        })
    };
    curvine_integration::assert_short_circuit(&node, 1, || read_back(true));
    let counter = |name| curvine_integration::node_counter(&node, name, "");
    assert!(counter("curvine_data_bytes_local_total") >= 64 << 20);
    assert_eq!(counter("curvine_data_bytes_sent_total"), 0);
    let what = Lazily(|| format!("the charts to show the traffic: {}", seen.borrow()));
    let busy = wait_for(what, Duration::from_secs(60), || {
        let dom = dump();
        let moved = chart_peak(&dom, "throughput", "in").unwrap_or(0.0) > 0.0
            && chart_peak(&dom, "throughput", "out").unwrap_or(0.0) > 0.0
            && chart_peak(&dom, "cache", "hits").unwrap_or(0.0) > 0.0;
        if moved {
            return Some(dom);
        }
        *seen.borrow_mut() = dom;
        None
    });
    // Per second over a 1s sample: at least a tenth of what passed, in
    // and out (what the metrics counted).
    for line in ["in", "out"] {
        let peak = chart_peak(&busy, "throughput", line).unwrap();
        assert!(
            peak >= (6 << 20) as f64,
            "{line} at most {peak} B/s for 64 MiB"
        );
    }
    // The value axis's label of a rate of megabytes a second fits the
    // chart (it was cut at the left edge).
    let left = busy
        .split("id=\"chart-throughput\"")
        .nth(1)
        .and_then(|f| f.split('>').next())
        .and_then(|f| f.split("data-axis-left=\"").nth(1))
        .and_then(|v| v.split('"').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert!(
        left.is_some_and(|l| l >= 0.0),
        "axis label starts at {left:?}:\n{busy}"
    );
    // Reads through the data port are out too.
    read_back(false);
    assert!(counter("curvine_data_bytes_sent_total") >= 64 << 20);
    let after = shot("busy.png");
    assert!(before.starts_with(b"\x89PNG") && after.starts_with(b"\x89PNG"));
    assert_ne!(
        before, after,
        "the screenshot did not change with the traffic"
    );
    if let Ok(keep) = std::env::var("DASHBOARD_SCREENSHOT") {
        let _ = std::fs::write(format!("{keep}.charts.png"), &after);
    }
}

/// Every metric the shipped Grafana dashboard queries is one a node or a
/// mount exports (a typo would leave a panel empty).
#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("conf/grafana/curvine.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let mut exported = BTreeSet::new();
    let mut stack = vec![root.join("actors"), root.join("nodes"), root.join("fuse")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() && !p.ends_with("target") {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).unwrap();
                for piece in src.split('"') {
                    if piece.starts_with("curvine_")
                        && piece.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                    {
                        exported.insert(piece.to_string());
                    }
                }
            }
        }
    }
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .filter(|w| w.starts_with("curvine_"))
                .collect();
            assert!(!names.is_empty(), "{expr}");
            for n in names {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s))
                    .unwrap_or(n);
                assert!(
                    exported.contains(base),
                    "panel {:?} queries {n}, which nothing exports",
                    p["title"]
                );
            }
        }
    }
}
