//! A node cut off from the others by a network partition: one node runs in
//! its own network namespace behind a veth pair whose host end is taken
//! down. Nothing hangs past the configured timeouts, nothing acknowledged
//! is lost, and the cluster is whole again once the link is back.
//!
//! Needs root and `ip netns`; skipped (with a message) where they are missing.

use std::cell::RefCell;
use std::process::Command;
use std::time::{Duration, Instant};

use curvine_integration::netns::Netns;
use curvine_integration::{
    bin, read_file, wait_for, wait_for_async, write_file, Lazily, NodeProcess, FAST_CLUSTER,
};

fn cli_ok(node: &NodeProcess, args: &[&str]) -> String {
    node.cli_ok(args)
}

#[test]
fn a_partitioned_node_fails_fast_and_rejoins_without_loss() {
    let tag = format!("{}", std::process::id() % 100_000);
    let Some(ns) = Netns::create(&tag, 0) else {
        eprintln!("skipping the partition test: needs root and ip netns");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Shards of one copy each (meta.replicas = 1): those on the cut node
    // fail fast, the others go on.
    let mut single: Vec<&str> = FAST_CLUSTER.to_vec();
    single.extend_from_slice(&["-c", "meta.replicas=1"]);
    let a = NodeProcess::start_on(&dir.path().join("a"), &ns.host, &single);
    let mut joined = single.clone();
    joined.extend_from_slice(&["--seeds", &a.cluster_addr]);
    let b = NodeProcess::start_on(&dir.path().join("b"), &ns.host, &joined);
    let wrapper = ["ip", "netns", "exec", ns.name.as_str()];
    let cut = NodeProcess::start_wrapped(&dir.path().join("c"), &ns.inside, &joined, &wrapper);
    wait_for("three nodes up", Duration::from_secs(30), || {
        (a.members_up() == 3 && cut.members_up() == 3).then_some(())
    });
    cli_ok(&a, &["admin", "rebalance"]);
    let map: serde_json::Value =
        serde_json::from_str(&cli_ok(&a, &["--json", "admin", "shards"])).unwrap();
    let on_cut: Vec<usize> = map["shards"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, n)| n.as_str() == Some(cut.node_id.as_str()))
        .map(|(i, _)| i)
        .collect();
    assert!(!on_cut.is_empty());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dirs: Vec<String> = (0..16).map(|i| format!("/p{i}")).collect();
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    rt.block_on(async {
        let c = a.client().await;
        for d in &dirs {
            c.mkdir(d, false).await.unwrap();
        }
        write_file(&c, "/p0/both", &bytes, 2).await;
    });

    ns.link(false);
    rt.block_on(async {
        let c = a.client().await;
        // Until the node timeout passes requests to the cut node's shards
        // may wait; after it they fail at once. None waits past the timeouts.
        let mut failed = 0;
        let mut served = Vec::new();
        for d in &dirs {
            let started = Instant::now();
            let r = c.mkdir(&format!("{d}/during"), false).await;
            assert!(
                started.elapsed() < Duration::from_secs(40),
                "{d}: {:?}",
                started.elapsed()
            );
            match r {
                Ok(_) => served.push(d.clone()),
                Err(e) => {
                    failed += 1;
                    assert!(
                        matches!(e.errno(), libc::EIO | libc::ETIMEDOUT | libc::EAGAIN),
                        "{e}"
                    );
                }
            }
        }
        assert!(failed > 0 && !served.is_empty(), "failed {failed}");
        // The replicated file reads from the side that is still connected.
        assert!(read_file(&c, "/p0/both").await.unwrap() == bytes);
        // What was acknowledged during the partition is kept after it.
        ns.link(true);
        wait_for_async(
            "the cut node to come back",
            Duration::from_secs(40),
            || async {
                let up = c
                    .report()
                    .await
                    .map(|r| r.nodes.iter().filter(|n| n.state == "up").count());
                (up.unwrap_or(0) == 3).then_some(())
            },
        )
        .await;
        for d in &served {
            c.stat(&format!("{d}/during")).await.unwrap();
        }
        for d in &dirs {
            c.stat(d).await.unwrap();
        }
        // Everything works again, on every shard.
        for d in &dirs {
            c.mkdir(&format!("{d}/after"), false).await.unwrap();
        }
    });
    // Operations cut off mid-way finish (or roll back) once the shards
    // meet again; then nothing dangles.
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("fsck to pass: {}\n{}", seen.borrow(), a.log_text()));
    wait_for(what, Duration::from_secs(30), || {
        let out = a.cli(&["admin", "fsck"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            assert!(text.contains("namespace is consistent"), "{text}");
            return Some(());
        }
        *seen.borrow_mut() = text;
        None
    });
    drop(b);
}

/// Runs `tc ARGS`; false when it fails.
fn tc(args: &[&str]) -> bool {
    Command::new("tc")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn a_slow_lossy_link_loses_nothing_and_a_cut_shard_takes_a_write_once() {
    let tag = format!("{}", (std::process::id() + 50_000) % 100_000);
    let Some(ns) = Netns::create(&tag, 1) else {
        eprintln!("skipping the slow-link test: needs root and ip netns");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Shards of one copy each (meta.replicas = 1): with the link cut, the
    // far node's shards still take writes from its side. (Two nodes with
    // two copies would both stop: neither side is a majority.)
    let mut single: Vec<&str> = FAST_CLUSTER.to_vec();
    single.extend_from_slice(&["-c", "meta.replicas=1"]);
    let a = NodeProcess::start_on(&dir.path().join("a"), &ns.host, &single);
    let mut joined = single.clone();
    joined.extend_from_slice(&["--seeds", &a.cluster_addr]);
    let wrapper = ["ip", "netns", "exec", ns.name.as_str()];
    let far = NodeProcess::start_wrapped(&dir.path().join("far"), &ns.inside, &joined, &wrapper);
    wait_for("two nodes up", Duration::from_secs(30), || {
        (a.members_up() == 2 && far.members_up() == 2).then_some(())
    });
    cli_ok(&a, &["admin", "rebalance"]);
    // A slow link that loses packets: the host end shapes to 20 Mbit/s with
    // up to 300 ms of queue (tbf), and the far end drops 5% of the packets
    // it sends and receives over the link (iptables; netem is not in every
    // kernel). Traffic inside the namespace, to its own address, is spared.
    let shaped = tc(&[
        "qdisc",
        "add",
        "dev",
        ns.host_if.as_str(),
        "root",
        "tbf",
        "rate",
        "20mbit",
        "burst",
        "32kbit",
        "latency",
        "300ms",
    ]);
    let lossy = [("INPUT", "-i"), ("OUTPUT", "-o")]
        .iter()
        .all(|(chain, dir)| {
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    ns.name.as_str(),
                    "iptables",
                    "-A",
                    chain,
                    dir,
                    ns.ns_if.as_str(),
                    "-m",
                ])
                .args([
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    "0.05",
                    "-j",
                    "DROP",
                ])
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        });
    if !(shaped && lossy) {
        eprintln!("skipping the slow-link test: needs tc tbf and iptables (the statistic match)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let bytes: Vec<u8> = (0..2_500_000u32).map(|i| (i * 7 % 253) as u8).collect();
    rt.block_on(async {
        let c = a.client().await;
        // Every operation through the slow link completes, none beyond the
        // timeouts, and each took effect once.
        for i in 0..12 {
            let started = Instant::now();
            let d = format!("/slow{i}");
            c.mkdir(&d, false).await.unwrap();
            c.create(&format!("{d}/f")).await.unwrap();
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{d}: {:?}",
                started.elapsed()
            );
        }
        write_file(&c, "/slow0/data", &bytes, 2).await;
        assert!(read_file(&c, "/slow0/data").await.unwrap() == bytes);
        let listed = c.list_all("/").await.unwrap();
        assert_eq!(listed.len(), 12, "{listed:?}");
    });
    // Now cut the link. A shard on the far node takes no write from this
    // side (it fails once the node is down), while a client beside the far
    // node still writes to it: the name is created exactly once. (Shard 0,
    // where every path starts, goes to the far node first.)
    cli_ok(&a, &["admin", "move-shard", "0", &far.node_id]);
    let map: serde_json::Value =
        serde_json::from_str(&cli_ok(&a, &["--json", "admin", "shards"])).unwrap();
    // A directory whose entries (they live in its inode's shard) are on the
    // far node.
    let far_dir = rt.block_on(async {
        let c = a.client().await;
        for i in 0..12 {
            let d = format!("/slow{i}");
            let shard = curvine_messages::shard_of(c.stat(&d).await.unwrap().ino) as usize;
            if map["shards"][shard].as_str() == Some(far.node_id.as_str()) {
                return d;
            }
        }
        panic!("no directory on the far node's shards: {map}");
    });
    ns.link(false);
    let name = format!("{far_dir}/once");
    let near = a.cli(&["fs", "touch", &name]);
    assert!(
        !near.status.success(),
        "a write reached a shard across a cut link"
    );
    let inside = Command::new("ip")
        .args(["netns", "exec", ns.name.as_str()])
        .arg(curvine_integration::bin("curvine-cli"))
        .env("CURVINE_CLIENT_COOKIE", far.cookie())
        .args(["--cluster", &far.addr, "fs", "touch", &name])
        .output()
        .unwrap();
    assert!(
        inside.status.success(),
        "the far side's own client: {}",
        String::from_utf8_lossy(&inside.stderr)
    );
    ns.link(true);
    wait_for("both nodes up again", Duration::from_secs(30), || {
        (a.members_up() == 2).then_some(())
    });
    let out = cli_ok(&a, &["fs", "ls", &far_dir]);
    assert_eq!(out.lines().filter(|l| *l == "once").count(), 1, "{out}");
}

#[test]
fn a_leader_cut_off_from_its_replicas_accepts_no_change_and_the_majority_goes_on() {
    let tag = format!("r{}", std::process::id() % 10_000);
    let Some(ns) = Netns::create(&tag, 2) else {
        eprintln!("skipping the partition test: needs root and ip netns");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
    args.extend_from_slice(&["-c", "meta.replicas=3", "-c", "client.request_timeout=5s"]);
    // The founder leads every shard's group; it is the one cut off.
    let (cut, a, b) = ns.three_nodes(dir.path(), &args);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dirs: Vec<String> = (0..16).map(|i| format!("/q{i}")).collect();
    rt.block_on(async {
        let c = a.client().await;
        for d in &dirs {
            c.mkdir(d, false).await.unwrap();
        }
    });
    ns.link(false);
    let cut_off = Instant::now();
    // The majority elects new leaders and takes changes on every shard;
    // calls made meanwhile wait for them, then succeed.
    rt.block_on(async {
        let c = a.client().await;
        for d in &dirs {
            c.mkdir(&format!("{d}/majority"), false).await.unwrap();
        }
    });
    let failover = cut_off.elapsed();
    eprintln!("the majority took a change on every shard {failover:?} after the cut");
    assert!(failover < Duration::from_secs(10), "{failover:?}");
    // On the cut side a change is refused with a clear error once the
    // request timeout passes, and never applied.
    let out = Command::new("ip")
        .args(["netns", "exec", ns.name.as_str()])
        .arg(bin("curvine-cli"))
        .args(["--cluster", &cut.addr, "fs", "mkdir", "/q0/minority"])
        .env("CURVINE_CLIENT_COOKIE", cut.cookie())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the cut-off side took a change");
    assert!(
        stderr.contains("shard") && (stderr.contains("leader") || stderr.contains("leadership")),
        "{stderr}"
    );
    ns.link(true);
    wait_for("the cut node to come back", Duration::from_secs(40), || {
        (a.members_up() == 3 && cut.members_up() == 3).then_some(())
    });
    rt.block_on(async {
        let c = a.client().await;
        assert!(
            c.stat("/q0/minority").await.is_err(),
            "a refused change appeared"
        );
        for d in &dirs {
            c.stat(&format!("{d}/majority")).await.unwrap();
        }
    });
    // Through the node that was cut off, clients see the majority's changes.
    wait_for("the cut node to catch up", Duration::from_secs(30), || {
        let out = cut.cli(&["fs", "ls", "/q0"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success() && text.contains("majority")).then_some(())
    });
    assert!(a
        .cli_ok(&["admin", "fsck"])
        .contains("namespace is consistent"));
    drop(b);
}
