//! A real cluster of `curvine-node` processes on 127.0.0.x: joining, shards
//! and blocks across nodes, shard moves under load, a node killed and
//! restarted, replicas, decommission, refused cookies and clusters.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::{
    shard_groups, wait_for, wait_for_voters, Lazily, NodeProcess, ProcessCluster, WithLog,
    FAST_CLUSTER,
};
use curvine_messages::block::FileSpec;
use curvine_messages::FsError;

const BS: u64 = 1 << 20;

fn data(len: usize, seed: u64) -> Vec<u8> {
    curvine_integration::random_bytes(len, seed)
}

fn options(replicas: u16) -> WriteOptions {
    WriteOptions {
        spec: FileSpec {
            block_size: BS,
            replicas,
            storage: None,
        },
        ..WriteOptions::create()
    }
}

async fn put(client: &Client, path: &str, bytes: &[u8], replicas: u16) -> Result<(), FsError> {
    let mut w = FileWriter::open(client, path, &options(replicas)).await?;
    w.write(bytes).await?;
    w.close().await.map(drop)
}

async fn get(client: &Client, path: &str) -> Result<Vec<u8>, FsError> {
    let mut r = FileReader::open(client, path).await?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).await?;
    Ok(out)
}

use curvine_integration::runtime;

fn cli_ok(node: &NodeProcess, args: &[&str]) -> String {
    node.cli_ok(args)
}

/// The cluster map as node `node` reports it: shard -> node id.
fn shard_map(node: &NodeProcess) -> Vec<String> {
    let out = cli_ok(node, &["--json", "admin", "shards"]);
    let map: serde_json::Value = serde_json::from_str(&out).unwrap();
    map["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// A child process that is killed when dropped, also by a failed wait.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn assert_consistent(node: &NodeProcess) {
    let out = cli_ok(node, &["admin", "fsck"]);
    assert!(out.contains("namespace is consistent"), "{out}");
}

#[test]
fn three_nodes_join_and_serve_each_others_files() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let nodes = &cluster.nodes;
    // The founder serves every shard; the others joined its cluster.
    let map = shard_map(&nodes[2]);
    assert!(map.iter().all(|n| *n == nodes[0].node_id), "{map:?}");
    for n in &nodes[1..] {
        assert!(n.log_text().contains("joined the cluster"));
    }
    runtime().block_on(async {
        let clients = [
            nodes[0].client().await,
            nodes[1].client().await,
            nodes[2].client().await,
        ];
        for (i, c) in clients.iter().enumerate() {
            c.mkdir(&format!("/from-{i}"), false).await.unwrap();
            put(
                c,
                &format!("/from-{i}/f"),
                &data(3 * BS as usize + 7, i as u64),
                1,
            )
            .await
            .unwrap();
        }
        // A block is written on the node the writer talks to.
        for (i, n) in nodes.iter().enumerate() {
            let locs = n.block_nodes(&format!("/from-{i}/f"));
            assert!(
                locs.iter().all(|l| l == &vec![n.node_id.clone()]),
                "{locs:?}"
            );
        }
        for c in &clients {
            for i in 0..3 {
                let got = get(c, &format!("/from-{i}/f")).await.unwrap();
                assert!(
                    got == data(3 * BS as usize + 7, i as u64),
                    "file {i} via {}",
                    c.node_id()
                );
            }
        }
    });
    // Spread the shards; everything is still there, from every node.
    let out = cli_ok(&nodes[1], &["admin", "rebalance"]);
    assert!(out.contains("shard(s) moved"), "{out}");
    let map = shard_map(&nodes[0]);
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &map {
        *per_node.entry(n.as_str()).or_default() += 1;
    }
    assert_eq!(per_node.len(), 3, "{map:?}");
    assert!(
        per_node.values().all(|c| (5..=6).contains(c)),
        "{per_node:?}"
    );
    runtime().block_on(async {
        for n in nodes {
            let c = n.client().await;
            for i in 0..3 {
                assert_eq!(
                    get(&c, &format!("/from-{i}/f")).await.unwrap().len(),
                    3 * BS as usize + 7
                );
            }
            assert_eq!(c.list_all("/").await.unwrap().len(), 3);
        }
    });
    let report = cli_ok(&nodes[2], &["report"]);
    assert_eq!(report.matches("[up").count(), 3, "{report}");
    assert_consistent(&nodes[0]);
}

#[test]
fn shards_move_while_clients_keep_writing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let nodes = &cluster.nodes;
    let rt = runtime();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4usize {
        let conf = nodes[w % 3].client_conf();
        let stop = stop.clone();
        workers.push(rt.spawn(async move {
            let c = Client::connect(&conf).await.unwrap();
            let base = format!("/w{w}");
            c.mkdir(&base, false).await.unwrap();
            let mut done = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let d = format!("{base}/d{i}");
                c.mkdir(&d, false)
                    .await
                    .map_err(|e| format!("mkdir {d}: {e}"))?;
                let f = format!("{d}/f");
                put(&c, &f, format!("{w}-{i}").as_bytes(), 1)
                    .await
                    .map_err(|e| format!("put {f}: {e}"))?;
                done.push(i);
                i += 1;
            }
            Ok::<_, String>((w, done))
        }));
    }
    std::thread::sleep(Duration::from_millis(500));
    let second = nodes[1].node_id.clone();
    let third = nodes[2].node_id.clone();
    // Shard 0 holds the root and the map; move it, others, then spread all.
    cli_ok(&nodes[2], &["admin", "move-shard", "0", &second]);
    for shard in ["3", "7", "11"] {
        cli_ok(&nodes[0], &["admin", "move-shard", shard, &third]);
    }
    cli_ok(&nodes[1], &["admin", "rebalance"]);
    cli_ok(&nodes[0], &["admin", "move-shard", "0", &third]);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let results: Vec<_> = rt.block_on(async {
        let mut out = Vec::new();
        for w in workers {
            out.push(w.await.unwrap());
        }
        out
    });
    let map = shard_map(&nodes[0]);
    assert_eq!(map[0], third);
    rt.block_on(async {
        let c = nodes[1].client().await;
        let mut total = 0;
        for r in results {
            // No request failed during the moves: they waited and retried.
            let (w, done) = r.expect("a client request failed during a shard move");
            assert!(!done.is_empty());
            total += done.len();
            let listed = c.list_all(&format!("/w{w}")).await.unwrap();
            // Every acknowledged directory is there, and nothing more.
            assert_eq!(listed.len(), done.len(), "worker {w}");
            for i in done {
                let got = get(&c, &format!("/w{w}/d{i}/f")).await.unwrap();
                assert_eq!(got, format!("{w}-{i}").as_bytes());
            }
        }
        assert!(
            total > 20,
            "the workers ran during the moves ({total} files)"
        );
    });
    assert_consistent(&nodes[2]);
}

#[test]
fn a_killed_node_fails_fast_and_comes_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    // Shards of one copy each: those of the killed node fail fast (with
    // more copies they go on, as the replicated tests show).
    let mut cluster = ProcessCluster::start(dir.path(), 3, &["-c", "meta.replicas=1"]);
    cli_ok(&cluster.nodes[0], &["admin", "rebalance"]);
    let victim = cluster.nodes[2].node_id.clone();
    let rt = runtime();
    let dirs: Vec<String> = (0..16).map(|i| format!("/d{i}")).collect();
    rt.block_on(async {
        let c = cluster.nodes[0].client().await;
        for d in &dirs {
            c.mkdir(d, false).await.unwrap();
            c.touch(&format!("{d}/x")).await.unwrap();
        }
        // A file whose only copy is on the victim.
        let v = cluster.nodes[2].client().await;
        put(&v, "/d0/on-victim", &data(BS as usize, 9), 1)
            .await
            .unwrap();
    });
    cluster.nodes[2].kill();
    cluster.wait_down(&victim);
    let map = shard_map(&cluster.nodes[0]);
    rt.block_on(async {
        let c = cluster.nodes[0].client().await;
        let mut failed = 0;
        for d in &dirs {
            let started = Instant::now();
            let result = c.stat(&format!("{d}/x")).await;
            match result {
                Ok(_) => {}
                Err(e) => {
                    failed += 1;
                    assert_eq!(e.errno(), libc::EIO, "{e}");
                    assert!(e.to_string().contains(&victim), "{e}");
                    // Not a hang until the request timeout.
                    assert!(started.elapsed() < Duration::from_secs(10));
                }
            }
        }
        // The shards of the victim fail; the others still serve.
        let victim_dirs = map.iter().filter(|n| **n == victim).count();
        assert!(
            victim_dirs > 0 && failed > 0 && failed < dirs.len(),
            "{failed}"
        );
        let err = get(&c, "/d0/on-victim").await.err();
        if let Some(e) = err {
            assert_eq!(e.errno(), libc::EIO, "{e}");
            assert!(e.to_string().contains(&victim), "{e}");
        } else if map[0] != victim {
            panic!("a block whose only copy is on a dead node was read");
        }
    });
    let report = cli_ok(&cluster.nodes[1], &["report"]);
    assert!(report.contains(&format!("node {victim} [down")), "{report}");
    // Back again: everything is there.
    cluster.nodes[2].start_again();
    cluster.wait_up(3);
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        for d in &dirs {
            c.stat(&format!("{d}/x")).await.unwrap();
        }
        assert_eq!(
            get(&c, "/d0/on-victim").await.unwrap(),
            data(BS as usize, 9)
        );
    });
    assert_consistent(&cluster.nodes[0]);
}

#[test]
fn replicas_keep_data_readable_and_are_restored() {
    let dir = tempfile::tempdir().unwrap();
    // Block replicas, with the namespace on the first node alone
    // (meta.replicas = 1): two of the three nodes die in turn.
    let mut cluster = ProcessCluster::start(dir.path(), 3, &["-c", "meta.replicas=1"]);
    let bytes = data(3 * BS as usize + 100, 4);
    let rt = runtime();
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        put(&c, "/two", &bytes, 2).await.unwrap();
    });
    let locs = cluster.nodes[0].block_nodes("/two");
    assert_eq!(locs.len(), 4);
    for l in &locs {
        assert_eq!(l.len(), 2, "{locs:?}");
        assert_eq!(l[0], cluster.nodes[1].node_id, "local copy first");
        assert_ne!(l[0], l[1], "replicas on distinct nodes");
    }
    // The node that wrote it dies; reads go to the other copy.
    let dead = cluster.nodes[1].node_id.clone();
    cluster.nodes[1].kill();
    rt.block_on(async {
        let c = cluster.nodes[2].client().await;
        assert!(get(&c, "/two").await.unwrap() == bytes);
    });
    // After cluster.rereplicate_after every block has two live copies again.
    let seen = RefCell::new(Vec::new());
    let what = Lazily(|| format!("re-replication: {:?}", seen.borrow()));
    wait_for(what, Duration::from_secs(30), || {
        let locs = cluster.nodes[0].block_nodes("/two");
        let done = locs.iter().all(|l| l.len() == 2 && !l.contains(&dead));
        *seen.borrow_mut() = locs;
        done.then_some(())
    });
    // Now a second node may die too.
    let locs = cluster.nodes[0].block_nodes("/two");
    let second = if locs[0][0] == cluster.nodes[2].node_id {
        2
    } else {
        0
    };
    if second == 2 {
        cluster.nodes[2].kill();
        rt.block_on(async {
            let c = cluster.nodes[0].client().await;
            assert!(get(&c, "/two").await.unwrap() == bytes);
        });
    }
}

#[test]
fn a_decommissioned_node_hands_over_shards_and_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &[]);
    cli_ok(&cluster.nodes[0], &["admin", "rebalance"]);
    let leaving = cluster.nodes[2].node_id.clone();
    let rt = runtime();
    rt.block_on(async {
        let c = cluster.nodes[2].client().await;
        for i in 0..6u64 {
            c.mkdir(&format!("/k{i}"), false).await.unwrap();
            put(&c, &format!("/k{i}/f"), &data(BS as usize / 2, i), 1)
                .await
                .unwrap();
        }
    });
    let out = cli_ok(&cluster.nodes[0], &["admin", "decommission", &leaving[..6]]);
    assert!(out.contains("has left the cluster"), "{out}");
    assert!(shard_map(&cluster.nodes[1]).iter().all(|n| *n != leaving));
    let report = cli_ok(&cluster.nodes[1], &["report"]);
    assert!(
        report.contains(&format!("node {leaving} [left")),
        "{report}"
    );
    cluster.nodes[2].terminate();
    // A node that left does not come back by accident.
    let log = dir.path().join("left-again.log");
    let mut again = KillOnDrop(
        std::process::Command::new(curvine_integration::bin("curvine-node"))
            .args(["start", "--data-dir"])
            .arg(&cluster.nodes[2].data_dir)
            .args([
                "--listen",
                "127.0.0.3:0",
                "-c",
                "node.cluster_listen=127.0.0.3:0",
            ])
            .env_remove("CURVINE_CONF")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let status = wait_for(
        "a decommissioned node to exit: it started again",
        Duration::from_secs(20),
        || again.0.try_wait().unwrap(),
    );
    assert!(!status.success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("was decommissioned"), "{err}");
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        for i in 0..6u64 {
            assert!(get(&c, &format!("/k{i}/f")).await.unwrap() == data(BS as usize / 2, i));
        }
    });
    for i in 0..6 {
        let locs = cluster.nodes[0].block_nodes(&format!("/k{i}/f"));
        assert!(locs.iter().all(|l| !l.contains(&leaving)), "{locs:?}");
    }
    assert_consistent(&cluster.nodes[0]);
}

#[test]
fn a_wrong_cookie_or_another_cluster_is_refused_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 1, &[]);
    let seed = cluster.nodes[0].cluster_addr.clone();
    // A new node with another cookie cannot join, and says why.
    let out = std::process::Command::new(curvine_integration::bin("curvine-node"))
        .args(["start", "--data-dir"])
        .arg(dir.path().join("stranger"))
        .args(["--listen", "127.0.0.5:0", "--seeds", &seed])
        .args(["-c", "cluster.cookie=not-the-cookie"])
        .args([
            "-c",
            "node.cluster_listen=127.0.0.5:0",
            "-c",
            "data.listen=127.0.0.5:0",
        ])
        .env_remove("CURVINE_CONF")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused this node during authentication"),
        "{err}"
    );
    let founder = &cluster.nodes[0];
    wait_for(
        WithLog("the founder to log different cookies".into(), &founder.log),
        Duration::from_secs(10),
        || {
            founder
                .log_text()
                .contains("different cluster cookies")
                .then_some(())
        },
    );
    // A node formatted for another cluster (same cookie) is refused too.
    let other_dir = dir.path().join("other");
    let mut other = NodeProcess::start_on(&other_dir, "127.0.0.6", FAST_CLUSTER);
    other.terminate();
    let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
    args.extend_from_slice(&["--seeds", &seed]);
    let other = NodeProcess::start_on(&other_dir, "127.0.0.6", &args);
    let what = Lazily(|| {
        format!(
            "both sides to refuse the other cluster; founder:\n{}\nother:\n{}",
            founder.log_text(),
            other.log_text()
        )
    });
    wait_for(what, Duration::from_secs(10), || {
        let refusing =
            |n: &NodeProcess| n.log_text().contains("refusing a node of another cluster");
        (refusing(founder) && refusing(&other)).then_some(())
    });
    assert_eq!(cluster.nodes[0].members_up(), 1);
    assert_eq!(other.members_up(), 1);
}

#[test]
fn a_node_serves_clients_as_soon_as_it_has_joined() {
    // A node learns of the others from its seeds before their first
    // heartbeat reaches it: it asks clients to wait for them then, not
    // that they are down (a command run at once used to fail "node down
    // ... down for 0s").
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 1, &[]);
    let founder = &cluster.nodes[0];
    let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
    args.extend_from_slice(&["--seeds", &founder.cluster_addr]);
    let late = NodeProcess::start_on(&dir.path().join("late"), "127.0.0.2", &args);
    for i in 0..8 {
        late.cli_ok(&["fs", "mkdir", &format!("/early-{i}")]);
    }
    let listing = founder.cli_ok(&["fs", "ls", "/"]);
    for i in 0..8 {
        assert!(listing.contains(&format!("early-{i}")), "{listing}");
    }
}

#[test]
fn a_node_that_failed_after_joining_finds_its_cluster_without_seeds() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 1, &[]);
    let founder = &cluster.nodes[0];
    // The new node joins, then fails to start: its HTTP port is taken.
    let taken = std::net::TcpListener::bind("127.0.0.7:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let data_dir = dir.path().join("late");
    let mut args: Vec<String> = FAST_CLUSTER.iter().map(|s| s.to_string()).collect();
    args.extend(
        [
            "--listen",
            "127.0.0.7:0",
            "-c",
            "node.cluster_listen=127.0.0.7:0",
            "-c",
            "data.listen=127.0.0.7:0",
        ]
        .map(String::from),
    );
    let out = std::process::Command::new(curvine_integration::bin("curvine-node"))
        .args(["start", "--data-dir"])
        .arg(&data_dir)
        .args(&args)
        .args(["-c", &format!("http.listen={taken_addr}")])
        .args(["--seeds", &founder.cluster_addr])
        .env_remove("CURVINE_CONF")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("http.listen"),
        "the node should have joined and then failed on its HTTP port:\n{err}"
    );
    drop(taken);
    // Started again without seeds, it is a member of the founder's cluster.
    let args: Vec<&str> = FAST_CLUSTER.to_vec();
    let late = NodeProcess::start_on(&data_dir, "127.0.0.7", &args);
    wait_for(
        WithLog("the node to find its cluster again".into(), &late.log),
        Duration::from_secs(30),
        || (late.members_up() == 2 && founder.members_up() == 2).then_some(()),
    );
    let path = "/after-failed-start";
    runtime().block_on(async {
        let bytes = data(100_000, 3);
        put(&founder.client().await, path, &bytes, 1).await.unwrap();
        assert_eq!(get(&late.client().await, path).await.unwrap(), bytes);
    });
}

#[test]
fn nodes_in_one_process_form_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    runtime().block_on(async {
        let cluster = curvine_integration::InProcessCluster::start(dir.path(), 3).await;
        let a = cluster.client(1).await;
        let b = cluster.client(2).await;
        a.mkdir("/in", false).await.unwrap();
        let bytes = data(2 * BS as usize + 3, 11);
        put(&a, "/in/f", &bytes, 2).await.unwrap();
        assert!(get(&b, "/in/f").await.unwrap() == bytes);
        let moves = b.call(curvine_messages::rpc::Rebalance).await.unwrap();
        assert!(moves.len() >= 10, "{moves:?}");
        let c = cluster.client(0).await;
        assert!(get(&c, "/in/f").await.unwrap() == bytes);
        let report = c.report().await.unwrap();
        assert_eq!(report.nodes.len(), 3);
        assert!(report.nodes.iter().all(|n| n.state == "up"));
        // Each node now leads a share of the shards.
        for node in &report.nodes {
            let led = report.map.shards_of(&node.node_id).len();
            assert!(
                (4..=6).contains(&led),
                "{} leads {led} shards",
                node.node_id
            );
        }
        cluster.stop().await;
    });
}

#[test]
fn crossing_directory_moves_through_different_nodes_never_make_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 3, &[]);
    cli_ok(&cluster.nodes[0], &["admin", "rebalance"]);
    runtime().block_on(async {
        let c1 = cluster.nodes[1].client().await;
        let c2 = cluster.nodes[2].client().await;
        for round in 0..15 {
            let a = format!("/r{round}a");
            let b = format!("/r{round}b");
            c1.mkdir(&a, false).await.unwrap();
            c1.mkdir(&b, false).await.unwrap();
            let (x, y) = (a.clone(), b.clone());
            let into_b = {
                let c1 = c1.clone();
                let (a, b) = (x.clone(), y.clone());
                tokio::spawn(async move { c1.rename(&a, &format!("{b}/in")).await })
            };
            let into_a = {
                let c2 = c2.clone();
                tokio::spawn(async move { c2.rename(&y, &format!("{x}/in")).await })
            };
            let (r1, r2) = (into_b.await.unwrap(), into_a.await.unwrap());
            // One wins; the other finds its target inside what it moves.
            assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
            let (top, inner) = if r1.is_ok() { (&b, &a) } else { (&a, &b) };
            c1.stat(top).await.unwrap();
            c1.stat(&format!("{top}/in")).await.unwrap();
            assert!(c1.stat(inner).await.is_err());
        }
    });
    assert_consistent(&cluster.nodes[0]);
}

/// `x -> y` and `y -> x` at once, both directories whose inodes live on
/// other shards than their parent: each rename is an intent that holds its
/// own name and asks for the other's. One waits for the other or steps
/// back and tries again; neither waits forever.
#[test]
fn renames_that_cross_each_other_never_wait_for_each_other_forever() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 1, &["-c", "client.request_timeout=10s"]);
    runtime().block_on(async {
        let c = cluster.nodes[0].client().await;
        c.mkdir("/swap", false).await.unwrap();
        let tasks: Vec<_> = [("/swap/x", "/swap/y"), ("/swap/y", "/swap/x")]
            .into_iter()
            .map(|(from, to)| {
                let c = c.clone();
                tokio::spawn(async move {
                    let mut renamed = 0;
                    for round in 0..200 {
                        match c.mkdir(from, false).await {
                            Ok(_) | Err(FsError::AlreadyExists(_)) => {}
                            Err(e) => panic!("round {round}: mkdir {from}: {e}"),
                        }
                        match c.rename(from, to).await {
                            Ok(()) => renamed += 1,
                            // The other rename took `from` away first.
                            Err(FsError::NotFound(_)) => {}
                            Err(e) => panic!("round {round}: rename {from} {to}: {e}"),
                        }
                    }
                    renamed
                })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap() > 0);
        }
        let names: Vec<String> = c
            .list_all("/swap")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(!names.is_empty() && names.len() <= 2, "{names:?}");
    });
    assert_consistent(&cluster.nodes[0]);
}

/// An rmdir of a directory whose inode its parent's shard holds, while
/// another client renames over that name a directory whose inode another
/// shard holds: the rmdir removes whichever directory the name holds when
/// it acts, never fails with EIO.
#[test]
fn rmdir_of_a_name_renamed_over_by_a_directory_of_another_shard() {
    use curvine_messages::{dir_shard, shard_of};
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 1, &[]);
    runtime().block_on(async {
        let c = cluster.nodes[0].client().await;
        let parent = c.mkdir("/rm", false).await.unwrap();
        let home = shard_of(parent.ino);
        let shards = 16;
        // `y` made in place lives in the parent's shard; `z`, renamed over
        // it, in another.
        let name = |local: bool| {
            (0..)
                .map(|i| format!("n{i}"))
                .find(|n| (dir_shard(parent.ino, n, shards) == home) == local)
                .unwrap()
        };
        let (y, z) = (
            format!("/rm/{}", name(true)),
            format!("/rm/{}", name(false)),
        );
        let removing = {
            let (c, y) = (c.clone(), y.clone());
            tokio::spawn(async move {
                for round in 0..300 {
                    match c.mkdir(&y, false).await {
                        Ok(_) | Err(FsError::AlreadyExists(_)) => {}
                        Err(e) => panic!("round {round}: mkdir {y}: {e}"),
                    }
                    match c.rmdir(&y).await {
                        Ok(_) | Err(FsError::NotFound(_)) => {}
                        Err(e) => panic!("round {round}: rmdir {y}: {e}"),
                    }
                }
            })
        };
        for round in 0..300 {
            match c.mkdir(&z, false).await {
                Ok(_) | Err(FsError::AlreadyExists(_)) => {}
                Err(e) => panic!("round {round}: mkdir {z}: {e}"),
            }
            match c.rename(&z, &y).await {
                Ok(()) | Err(FsError::NotFound(_)) => {}
                Err(e) => panic!("round {round}: rename {z} {y}: {e}"),
            }
        }
        removing.await.unwrap();
    });
    assert_consistent(&cluster.nodes[0]);
}

#[test]
fn hard_links_and_exchanges_across_shards_and_clients() {
    use curvine_messages::{dir_shard, shard_of};
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 2, &[]);
    runtime().block_on(async {
        let c0 = cluster.nodes[0].client().await;
        let c1 = cluster.nodes[1].client().await;
        let root = c0.mkdir("/hl", false).await.unwrap();
        // Two directories in different shards: a link between them is a
        // cross-shard operation.
        let a = (0..)
            .map(|i| format!("a{i}"))
            .find(|n| dir_shard(root.ino, n, 16) != shard_of(root.ino))
            .unwrap();
        let a_ino = c0.mkdir(&format!("/hl/{a}"), false).await.unwrap().ino;
        let b = (0..)
            .map(|i| format!("b{i}"))
            .find(|n| dir_shard(root.ino, n, 16) != shard_of(a_ino))
            .unwrap();
        c0.mkdir(&format!("/hl/{b}"), false).await.unwrap();
        let (f, g, h) = (
            format!("/hl/{a}/f"),
            format!("/hl/{b}/g"),
            format!("/hl/{a}/h"),
        );
        let bytes = data(300_000, 5);
        put(&c0, &f, &bytes, 1).await.unwrap();
        let linked = c0.link(&f, &g).await.unwrap();
        assert_eq!(linked.nlink, 2);
        // Another client, through another node, sees one file of two names.
        let seen = c1.stat(&g).await.unwrap();
        assert_eq!((seen.ino, seen.nlink), (linked.ino, 2));
        assert!(get(&c1, &g).await.unwrap() == bytes);
        assert_eq!(c1.link(&g, &h).await.unwrap().nlink, 3);
        // Removing one name keeps the others and the content.
        c1.remove(&f, false).await.unwrap();
        assert_eq!(c0.stat(&h).await.unwrap().nlink, 2);
        assert!(get(&c0, &g).await.unwrap() == bytes);
        // What link refuses.
        let dir_link = c0.link(&format!("/hl/{a}"), "/hl/d").await.unwrap_err();
        assert!(matches!(dir_link, FsError::NotPermitted(_)), "{dir_link}");
        let taken = c0.link(&g, &h).await.unwrap_err();
        assert!(matches!(taken, FsError::AlreadyExists(_)), "{taken}");
        let missing = c0.link("/hl/nothing", "/hl/x").await.unwrap_err();
        assert!(matches!(missing, FsError::NotFound(_)), "{missing}");
        // Links made and removed by both clients at once, across shards:
        // the count stays the number of names (fsck checks each inode).
        let work = |c: Client, dir: String, tag: &'static str| {
            let g = g.clone();
            tokio::spawn(async move {
                for i in 0..40 {
                    let name = format!("/hl/{dir}/{tag}{i}");
                    c.link(&g, &name).await.unwrap();
                    if i % 2 == 0 {
                        c.remove(&name, false).await.unwrap();
                    }
                }
            })
        };
        let (w0, w1) = (
            work(c0.clone(), a.clone(), "x"),
            work(c1.clone(), b.clone(), "y"),
        );
        w0.await.unwrap();
        w1.await.unwrap();
        assert_eq!(c1.stat(&g).await.unwrap().nlink, 2 + 40);
        // RENAME_EXCHANGE across the two shards, seen by the other client.
        let (p, q) = (format!("/hl/{a}/p"), format!("/hl/{b}/q"));
        put(&c0, &p, b"P", 1).await.unwrap();
        put(&c0, &q, b"Q", 1).await.unwrap();
        c1.exchange(&p, &q).await.unwrap();
        assert_eq!(get(&c0, &p).await.unwrap(), b"Q");
        assert_eq!(get(&c0, &q).await.unwrap(), b"P");
        let gone = c0.exchange(&p, "/hl/none").await.unwrap_err();
        assert!(matches!(gone, FsError::NotFound(_)), "{gone}");
    });
    assert_consistent(&cluster.nodes[0]);
}

#[test]
fn a_client_moves_to_another_node_when_its_node_dies() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let victim = cluster.nodes[2].node_id.clone();
    let rt = runtime();
    // The client is configured with the victim's address only.
    let conf = cluster.nodes[2].client_conf();
    let c = rt.block_on(async {
        let c = Client::connect(&conf).await.unwrap();
        c.mkdir("/kept", false).await.unwrap();
        assert_eq!(c.node_id(), victim);
        // It learns the other nodes in the background.
        tokio::time::sleep(Duration::from_millis(300)).await;
        c
    });
    cluster.nodes[2].kill();
    rt.block_on(async {
        c.stat("/kept").await.unwrap();
        c.mkdir("/after", false).await.unwrap();
        assert_ne!(c.node_id(), victim);
        let other = cluster.nodes[0].client().await;
        other.stat("/after").await.unwrap();
    });
}

/// The listening sockets of this machine bound to `port` (from
/// /proc/net/tcp and tcp6), as "address:port" in hex as the kernel writes it.
fn listeners_on(port: u16) -> Vec<String> {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|text| {
            text.lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    // State 0A is LISTEN.
                    (f.len() > 3 && f[3] == "0A" && f[1].ends_with(&want)).then(|| f[1].to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn two_nodes_on_one_host_share_a_cluster_port_number_on_their_own_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let first = NodeProcess::start_on(&dir.path().join("a"), "127.0.0.11", FAST_CLUSTER);
    let port: u16 = first
        .cluster_addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("a cluster port");
    // The node listens on 127.0.0.11 (0B00007F as the kernel writes it),
    // and nothing listens on that port on every address (0.0.0.0 or ::).
    // Other tests' nodes on other loopback addresses may happen to take
    // the same port number on their own address.
    let found = listeners_on(port);
    assert!(
        found.contains(&format!("0B00007F:{port:04X}")),
        "the node does not listen on its --listen host: {found:?}"
    );
    let everywhere: Vec<&String> = found
        .iter()
        .filter(|a| {
            a.split(':')
                .next()
                .is_some_and(|h| h.chars().all(|c| c == '0'))
        })
        .collect();
    assert!(
        everywhere.is_empty(),
        "the cluster port must be bound to the --listen host only: {found:?}"
    );
    // A second node on 127.0.0.12 takes the same port number and joins.
    let cluster_listen = format!("node.cluster_listen=127.0.0.12:{port}");
    let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
    args.extend_from_slice(&["-c", &cluster_listen, "--seeds", &first.cluster_addr]);
    let second = NodeProcess::start_on(&dir.path().join("b"), "127.0.0.12", &args);
    assert_eq!(second.cluster_addr, format!("127.0.0.12:{port}"));
    wait_for(
        WithLog("both nodes to see each other".into(), &second.log),
        Duration::from_secs(30),
        || (first.members_up() == 2 && second.members_up() == 2).then_some(()),
    );
}

#[test]
fn replicated_shards_keep_serving_through_a_killed_node_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &["-c", "meta.replicas=3"]);
    // The founder's shards get a member on each node.
    wait_for_voters(&cluster.nodes[1], 16, 3);
    let rt = runtime();
    let dirs: Vec<String> = (0..16).map(|i| format!("/r{i}")).collect();
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        for (i, d) in dirs.iter().enumerate() {
            c.mkdir(d, false).await.unwrap();
            put(&c, &format!("{d}/f"), &data(1000, i as u64), 3)
                .await
                .unwrap();
        }
    });
    // The founder leads every group: killing it leaves each shard to its
    // other two members, which elect a new leader.
    let victim = cluster.nodes[0].node_id.clone();
    cluster.nodes[0].kill();
    let killed = Instant::now();
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        // Calls made during the failover wait for the new leaders, then
        // succeed: no error reaches the caller.
        for d in &dirs {
            let path = format!("{d}/after");
            if let Err(e) = c.touch(&path).await {
                let logs: String = cluster.nodes[1..]
                    .iter()
                    .map(|n| format!("{}\n", WithLog(n.node_id.clone(), &n.log)))
                    .collect();
                panic!(
                    "touch {path} {:?} after the kill: {e}\n{logs}",
                    killed.elapsed()
                );
            }
        }
        let failover = killed.elapsed();
        assert!(
            failover < Duration::from_secs(10),
            "writes to every shard took {failover:?} to resume"
        );
        eprintln!("writes to all 16 shards resumed {failover:?} after the kill");
        for (i, d) in dirs.iter().enumerate() {
            assert_eq!(
                get(&c, &format!("{d}/f")).await.unwrap(),
                data(1000, i as u64)
            );
            c.stat(&format!("{d}/after")).await.unwrap();
        }
    });
    let gone = curvine_messages::wal::member_id(&victim);
    wait_for(
        "every shard led by a live node",
        Duration::from_secs(20),
        || {
            let after = shard_groups(&cluster.nodes[2]);
            (after.len() == 16 && !after.values().any(|(_, leader)| *leader == gone)).then_some(())
        },
    );
    // Back again, the old node catches up with what it missed.
    cluster.nodes[0].start_again();
    cluster.wait_up(3);
    wait_for_voters(&cluster.nodes[1], 16, 3);
    assert_consistent(&cluster.nodes[1]);
}

/// Each shard's members by the cluster map (`admin shards --json`).
fn shard_members(node: &NodeProcess) -> Vec<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_str(&cli_ok(node, &["--json", "admin", "shards"])).unwrap();
    let names = |x: &serde_json::Value| -> Vec<String> {
        x.as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_string))
            .collect()
    };
    let owners = names(&v["shards"]);
    let followers: Vec<Vec<String>> = v["followers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(names)
        .collect();
    owners
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            let mut m = vec![o];
            m.extend(followers.get(i).cloned().unwrap_or_default());
            m
        })
        .collect()
}

#[test]
fn a_node_whose_disk_was_lost_rejoins_as_a_new_member_and_nothing_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &["-c", "meta.replicas=3"]);
    wait_for_voters(&cluster.nodes[0], 16, 3);
    cli_ok(&cluster.nodes[0], &["admin", "rebalance"]);
    let rt = runtime();
    let before: Vec<String> = (0..32).map(|i| format!("/w{i}")).collect();
    rt.block_on(async {
        let c = cluster.nodes[0].client().await;
        for d in &before {
            c.mkdir(d, false).await.unwrap();
            c.touch(&format!("{d}/f")).await.unwrap();
        }
    });
    // The third node dies and its data directory is lost.
    let lost = cluster.nodes[2].node_id.clone();
    cluster.nodes[2].kill();
    std::fs::remove_dir_all(&cluster.nodes[2].data_dir).unwrap();
    // The two others go on meanwhile (each shard keeps a majority).
    rt.block_on(async {
        let c = cluster.nodes[0].client().await;
        for d in &before {
            c.touch(&format!("{d}/during")).await.unwrap();
        }
    });
    // It comes back empty, with its seeds: a new node, which takes the
    // lost node's places by snapshot once those are given up.
    cluster.nodes[2].start_again();
    let fresh = cluster.nodes[2].node_id.clone();
    assert_ne!(fresh, lost);
    let seen = RefCell::new(Vec::new());
    let what = Lazily(|| format!("the new node to hold every shard: {:?}", seen.borrow()));
    wait_for(what, Duration::from_secs(60), || {
        let members = shard_members(&cluster.nodes[0]);
        let done = members.len() == 16
            && members
                .iter()
                .all(|m| m.contains(&fresh) && !m.contains(&lost));
        *seen.borrow_mut() = members;
        done.then_some(())
    });
    // The groups follow the map: the new node votes, the lost one is gone.
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("every group to have the map's members: {}", seen.borrow()));
    wait_for(what, Duration::from_secs(60), || {
        let members = shard_members(&cluster.nodes[0]);
        let report: serde_json::Value =
            serde_json::from_str(&cli_ok(&cluster.nodes[0], &["--json", "report"])).unwrap();
        let mut matched = 0;
        for n in report["nodes"].as_array().into_iter().flatten() {
            for s in n["shards"].as_array().into_iter().flatten() {
                let shard = s["shard"].as_u64().unwrap_or(u64::MAX) as usize;
                let ids = |k: &str| -> Vec<u64> {
                    let mut v: Vec<u64> = s["group"][k]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_u64())
                        .collect();
                    v.sort_unstable();
                    v
                };
                let mut want: Vec<u64> = members
                    .get(shard)
                    .into_iter()
                    .flatten()
                    .map(|m| curvine_messages::wal::member_id(m))
                    .collect();
                want.sort_unstable();
                if ids("voters") == want && ids("learners").is_empty() {
                    matched += 1;
                }
            }
        }
        *seen.borrow_mut() = format!("{matched} of 16 shards");
        (matched == 16).then_some(())
    });
    // The first node dies too: every shard now needs the new node's copy
    // to commit, and every acknowledged file is there.
    cluster.nodes[0].kill();
    rt.block_on(async {
        let c = cluster.nodes[1].client().await;
        for d in &before {
            c.touch(&format!("{d}/after")).await.unwrap();
            for name in ["f", "during", "after"] {
                c.stat(&format!("{d}/{name}")).await.unwrap();
            }
        }
    });
    let out = cli_ok(&cluster.nodes[1], &["admin", "fsck"]);
    assert!(out.contains("namespace is consistent"), "{out}");
}
