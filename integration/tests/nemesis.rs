//! Nemesis schedules on real node processes (3 nodes, every shard a group
//! of 3): clients create, make directories, unlink, remove and rename a
//! few names, every call and answer recorded, while a writer replaces
//! files' contents and reads each back once it is acknowledged. After the
//! faults heal, every shard takes changes again within 10 s, the history
//! is linearizable against the sequential model, every acknowledged
//! content is there (or a later one the writer tried), `admin fsck` is
//! clean, and no node blamed the cluster cookie for a peer that merely
//! restarted.
//!
//! CI runs the crash loops and the partitions of the leaders' node; the
//! other schedules (single kills, two of three killed, pauses, partitions
//! of a follower, a full metadata disk, clock steps) are `#[ignore]`d here
//! and run by `bench/run-nemesis.sh` (with `--include-ignored`).
//! `NEMESIS_SEED` replays a schedule; `NEMESIS_ROUNDS` (default 2) sets
//! how many rounds a schedule runs (`bench/run-nemesis.sh` runs more).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::linear::{self, Call};
use curvine_integration::model::Op;
use curvine_integration::nemesis::{every_shard_serving, record, shard_probes, stop_clients};
use curvine_integration::netns::Netns;
use curvine_integration::{runtime, settle, wait_for_voters, ProcessCluster, FAST_CLUSTER};
use curvine_messages::XattrMode;

fn seed() -> u64 {
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("NEMESIS_SEED={seed}");
    seed
}

fn rounds() -> usize {
    std::env::var("NEMESIS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

const NAMES: [&str; 4] = ["/lin/a", "/lin/b", "/lin/c", "/lin/d"];

fn random_op(rng: &mut impl Rng) -> Op {
    let p = NAMES[rng.gen_range(0..NAMES.len())].to_string();
    let to = NAMES[rng.gen_range(0..NAMES.len())].to_string();
    match rng.gen_range(0..10) {
        0..=2 => Op::Create(p),
        3 | 4 => Op::Mkdir(p),
        5 | 6 => Op::Unlink(p),
        7 => Op::Rmdir(p),
        _ => Op::Rename(p, to),
    }
}

/// The writer's files and the versions of each: every version it tried,
/// and the last acknowledged and read back.
#[derive(Default)]
struct Contents {
    tried: BTreeMap<String, Vec<u64>>,
    acked: BTreeMap<String, u64>,
}

fn content(path: &str, version: u64) -> Vec<u8> {
    let line = format!("{path} version {version}\n");
    line.repeat(1 + (version as usize % 40)).into_bytes()
}

fn version_of(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let first = text.lines().next()?;
    first.rsplit(' ').next()?.parse().ok()
}

async fn put(c: &Client, path: &str, bytes: &[u8]) -> Result<(), String> {
    let mut w = FileWriter::open(c, path, &WriteOptions::create())
        .await
        .map_err(|e| e.to_string())?;
    w.write(bytes).await.map_err(|e| e.to_string())?;
    w.close().await.map(drop).map_err(|e| e.to_string())
}

async fn get(c: &Client, path: &str) -> Result<Vec<u8>, String> {
    let mut r = FileReader::open(c, path).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    Ok(out)
}

/// Replaces the contents of a few files, one call at a time, until
/// `stop`; a content acknowledged and then read back is recorded as acked.
async fn write_contents(
    c: Client,
    mut rng: rand::rngs::StdRng,
    contents: Arc<Mutex<Contents>>,
    stop: Arc<AtomicBool>,
) {
    let mut version = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let path = format!("/files/f{}", rng.gen_range(0..6));
        version += 1;
        contents
            .lock()
            .unwrap()
            .tried
            .entry(path.clone())
            .or_default()
            .push(version);
        let bytes = content(&path, version);
        if put(&c, &path, &bytes).await.is_ok() && get(&c, &path).await.ok() == Some(bytes) {
            contents.lock().unwrap().acked.insert(path, version);
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The cluster most schedules run on: 3 nodes on pinned ports (so the
/// whole cluster can be killed and started again), every shard a group of 3.
fn pinned(dir: &Path) -> ProcessCluster {
    ProcessCluster::start_pinned(dir, 3, &["-c", "meta.replicas=3"])
}

/// Runs `faults` (one round each call, given the cluster and the
/// schedule's random source) `rounds` times while the clients run, on the
/// cluster `start` makes in a new directory (node 0 formats and checks it),
/// then checks what the module's comment says.
fn run_schedule(
    name: &str,
    start: impl FnOnce(&Path) -> ProcessCluster,
    mut faults: impl FnMut(&mut ProcessCluster, &mut rand::rngs::StdRng),
) {
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = start(dir.path());
    wait_for_voters(&cluster.nodes[0], 16, 3);
    let rt = runtime();
    let confs: Vec<_> = cluster.nodes.iter().map(|n| n.client_conf()).collect();
    let probes = rt.block_on(async {
        let c = Client::connect(&confs[0]).await.unwrap();
        c.mkdir("/lin", false).await.unwrap();
        c.mkdir("/files", false).await.unwrap();
        shard_probes(&c, "/probes", 16).await
    });
    let history: Arc<Mutex<Vec<Call>>> = Arc::default();
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let contents: Arc<Mutex<Contents>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks: Vec<_> = (0..3)
        .map(|client| {
            let conf = confs[client % confs.len()].clone();
            let (history, failed, stop) = (history.clone(), failed.clone(), stop.clone());
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (client as u64 + 1));
            rt.spawn(async move {
                let c = Client::connect(&conf).await.unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let op = random_op(&mut rng);
                    record(&c, client, op, &history, &failed).await;
                }
            })
        })
        .collect();
    {
        let conf = confs[1].clone();
        let rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xf11e);
        let (contents, stop) = (contents.clone(), stop.clone());
        tasks.push(rt.spawn(async move {
            let c = Client::connect(&conf).await.unwrap();
            write_contents(c, rng, contents, stop).await
        }));
    }
    for _ in 0..rounds() {
        std::thread::sleep(Duration::from_millis(rng.gen_range(1000..2000)));
        faults(&mut cluster, &mut rng);
    }
    // Every shard takes changes again within 10 s of the last fault
    // healing.
    let serving = rt.block_on(async {
        let c = Client::connect(&confs[0]).await.unwrap();
        every_shard_serving(&c, &probes, Duration::from_secs(10)).await
    });
    let logs = || -> String {
        cluster
            .nodes
            .iter()
            .map(|n| format!("{}:\n{}", n.node_id, n.log_text()))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match serving {
        Ok(took) => eprintln!("{name}: every shard served again {took:?} after the last fault"),
        Err(shards) => panic!(
            "NEMESIS_SEED={seed}: {name}: shards not serving 10 s after the last fault: {shards:#?}\n{}",
            logs()
        ),
    }
    std::thread::sleep(Duration::from_millis(500));
    let (history, known) = stop_clients(&rt, &stop, tasks, &history);
    eprintln!(
        "{name}: {} calls, {known} with a known outcome",
        history.len()
    );
    if let Err(v) = linear::check("/lin", &history) {
        panic!("NEMESIS_SEED={seed}: {name}: {v}");
    }
    assert!(known >= 50, "only {known} calls completed");
    // Every acknowledged content is there, or a later one that was tried.
    let contents = contents.lock().unwrap();
    assert!(!contents.acked.is_empty(), "no content was acknowledged");
    rt.block_on(async {
        let c = Client::connect(&confs[0]).await.unwrap();
        for (path, acked) in &contents.acked {
            let bytes = get(&c, path)
                .await
                .unwrap_or_else(|e| panic!("NEMESIS_SEED={seed}: {path}: {e}"));
            let v = version_of(&bytes);
            let tried = &contents.tried[path];
            // An overwrite whose writer was cut off after its open (which
            // truncates, as O_TRUNC does) leaves the file empty.
            let interrupted = bytes.is_empty() && tried.iter().any(|t| t > acked);
            assert!(
                interrupted
                    || v.is_some_and(|v| v >= *acked && tried.contains(&v))
                        && content(path, v.unwrap()) == bytes,
                "NEMESIS_SEED={seed}: {name}: {path} holds version {v:?} ({} bytes); version {acked} was acknowledged and read back; tried {tried:?}",
                bytes.len()
            );
        }
    });
    // The namespace is consistent and the members' copies agree.
    let report = rt.block_on(async { settle(&Client::connect(&confs[0]).await.unwrap()).await });
    assert_eq!((report.pending_intents, report.locks), (0, 0), "{report:?}");
    let out = cluster.nodes[0].cli(&["admin", "fsck"]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.contains("namespace is consistent"), "{out}");
    // A peer that restarted is not a cookie mismatch.
    let logs = logs();
    assert!(
        !logs.contains("different cluster cookies"),
        "a node blamed the cluster cookie:\n{logs}"
    );
}

/// A crash loop: all three nodes killed, started again, and killed again
/// 0.3 to 1 s after they are ready (inside their recovery), then started
/// again.
#[test]
fn crash_loops_of_the_whole_cluster_lose_nothing() {
    run_schedule("crash loop", pinned, |cluster, rng| {
        cluster.kill_all();
        cluster.restart_all();
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..1000)));
        cluster.kill_all();
        cluster.restart_all();
    });
}

/// Kills of one node at a time (a follower of some shards, the leader of
/// others), each started again 0.5 to 2 s later.
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the crash loops and leader partitions"]
fn kills_of_single_nodes_lose_nothing() {
    run_schedule("single kills", pinned, |cluster, rng| {
        let victim = rng.gen_range(0..cluster.nodes.len());
        cluster.nodes[victim].kill();
        std::thread::sleep(Duration::from_millis(rng.gen_range(500..2000)));
        cluster.nodes[victim].restart_on_same_ports();
    });
}

/// Kills of two of the three nodes (every shard loses its majority until
/// one is back), started again one after the other.
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the crash loops and leader partitions"]
fn kills_of_two_of_three_nodes_lose_nothing() {
    run_schedule("two of three killed", pinned, |cluster, rng| {
        let spared = rng.gen_range(0..cluster.nodes.len());
        for (i, node) in cluster.nodes.iter_mut().enumerate() {
            if i != spared {
                node.kill();
            }
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(500..1500)));
        for (i, node) in cluster.nodes.iter_mut().enumerate() {
            if i != spared {
                node.restart_on_same_ports();
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..500)));
            }
        }
    });
}

/// SIGSTOP of one node (a paused leader keeps its term until it resumes
/// and finds another leader) for 1.5 to 4 s, then SIGCONT.
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the crash loops and leader partitions"]
fn paused_nodes_lose_nothing() {
    run_schedule("pauses", pinned, |cluster, rng| {
        let victim = rng.gen_range(0..cluster.nodes.len());
        let pid = cluster.nodes[victim].pid().expect("a running node") as i32;
        // SAFETY: signalling a child process of this test.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(rng.gen_range(1500..4000)));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
}

/// Partitions of node 2, in a network namespace (where this machine can
/// make one: root and `ip netns`): its link goes down for 2 to 4 s each
/// round, then up. `leader`: node 2 founded the cluster and leads every
/// shard's group (taking the leadership back once it has caught up);
/// otherwise it joined, and follows every shard.
fn partition_schedule(name: &str, net: u8, leader: bool) {
    let tag = format!("n{net}{}", std::process::id() % 10_000);
    let Some(ns) = Netns::create(&tag, net) else {
        eprintln!("skipping {name}: needs root and ip netns");
        return;
    };
    let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
    args.extend_from_slice(&["-c", "meta.replicas=3"]);
    run_schedule(
        name,
        |dir| {
            let nodes = if leader {
                let (inside, a, b) = ns.three_nodes(dir, &args);
                vec![a, b, inside]
            } else {
                let (founder, other, inside) = ns.three_nodes_follower_inside(dir, &args);
                vec![founder, other, inside]
            };
            ProcessCluster { nodes }
        },
        |_, rng| {
            ns.link(false);
            std::thread::sleep(Duration::from_millis(rng.gen_range(2000..4000)));
            ns.link(true);
        },
    );
}

/// Partitions of the leaders' node: the other two elect new leaders
/// meanwhile, and the cut-off leader's clients get errors, never a stale
/// answer.
#[test]
fn partitions_of_the_leader_lose_nothing() {
    partition_schedule("leader partitions", 4, true);
}

/// Partitions of a follower of every shard, which comes back to catch up
/// (by log or snapshot) while the others go on.
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the leader partitions"]
fn partitions_of_a_follower_lose_nothing() {
    partition_schedule("follower partitions", 5, false);
}

/// A full metadata disk: node 2 keeps its metadata on a small tmpfs, which
/// a file fills up. The node's next metadata commit fails, and it stops
/// (exit status 74, crash-only) rather than serve on with Raft ahead of its
/// store; the others go on. The file is removed and the node started
/// again (what `Restart=on-failure` does once an operator made room).
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the crash loops and leader partitions"]
fn a_full_metadata_disk_loses_nothing() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping the full-disk schedule: mounting a tmpfs needs root");
        return;
    }
    // Unmounted when the test ends, after the nodes are gone (or panics).
    let mounted: std::cell::RefCell<Option<Unmount>> = Default::default();
    run_schedule(
        "full metadata disk",
        |dir| {
            let meta = dir.join("n2").join("meta");
            std::fs::create_dir_all(&meta).unwrap();
            mount_tmpfs(&meta, "64m");
            *mounted.borrow_mut() = Some(Unmount(meta));
            pinned(dir)
        },
        |cluster, rng| {
            let filler = cluster.nodes[2].data_dir.join("meta").join("filler");
            fill(&filler);
            // Large extended attributes, until the node needs a page more
            // for its copy of them than its disk has (every member applies
            // every change).
            let conf = cluster.nodes[0].client_conf();
            let rt = runtime();
            let c = rt.block_on(Client::connect(&conf)).unwrap();
            let _ = rt.block_on(c.mkdir("/fill", false));
            let target = format!("/fill/f{}", rng.gen::<u32>());
            rt.block_on(c.create(&target)).unwrap();
            let value = vec![b'v'; 60 << 10];
            let node = &mut cluster.nodes[2];
            let started = std::time::Instant::now();
            let mut k = 0u64;
            let status = loop {
                if let Some(status) = node.exit_status() {
                    break status;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "node {} still runs 60 s after its metadata disk filled:\n{}",
                    node.node_id,
                    node.log_text()
                );
                rt.block_on(async {
                    for _ in 0..20 {
                        k += 1;
                        let name = format!("user.fill{k}");
                        let _ = c.set_xattr(&target, &name, &value, XattrMode::Any).await;
                    }
                });
            };
            assert_eq!(
                status,
                Some(74),
                "a node whose metadata disk is full stops with status 74:\n{}",
                node.log_text()
            );
            let log = node.log_text();
            assert!(
                log.contains("No space left on device") || log.contains("is full"),
                "the node's last words name the full disk:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(rng.gen_range(200..1000)));
            std::fs::remove_file(&filler).unwrap();
            node.restart_on_same_ports();
        },
    );
}

/// A mount point unmounted when dropped.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn mount_tmpfs(at: &Path, size: &str) {
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount a tmpfs at {}", at.display());
}

/// Writes zeros to `path` until its file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    let _ = f.sync_all();
}

/// Steps of one node's wall clock: node 2 runs on libfaketime, whose
/// offset each round sets 10 to 40 minutes ahead of or behind the others
/// (as a clock stepped by hand or by a bad time source), then a node is
/// killed and started again, so calls are made again on new leaders. The
/// stepped node's calls carry its clock in their ids, and members decide
/// leases and expiries on theirs: nothing may be applied twice or lost.
#[test]
#[ignore = "bench/run-nemesis.sh runs it; CI runs the crash loops and leader partitions"]
fn clock_steps_on_one_node_lose_nothing() {
    let lib = Path::new("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1");
    if !lib.exists() {
        eprintln!("skipping the clock-step schedule: needs libfaketime (Debian: faketime)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock");
    std::fs::write(&clock, "+0\n").unwrap();
    let wrapper = vec![
        "env".to_string(),
        format!("LD_PRELOAD={}", lib.display()),
        format!("FAKETIME_TIMESTAMP_FILE={}", clock.display()),
        // The offset is read again every second; monotonic clocks (timers,
        // timeouts) are left alone, as a wall-clock step leaves them.
        "FAKETIME_CACHE_DURATION=1".to_string(),
        "FAKETIME_DONT_FAKE_MONOTONIC=1".to_string(),
    ];
    run_schedule(
        "clock steps",
        |dir| {
            ProcessCluster::start_pinned_wrapped(dir, 3, &["-c", "meta.replicas=3"], |i| {
                if i == 2 {
                    wrapper.clone()
                } else {
                    Vec::new()
                }
            })
        },
        |cluster, rng| {
            let minutes = rng.gen_range(10..40) * if rng.gen_bool(0.5) { 1 } else { -1 };
            std::fs::write(&clock, format!("{minutes:+}m\n")).unwrap();
            std::thread::sleep(Duration::from_millis(rng.gen_range(1200..2000)));
            let victim = rng.gen_range(0..cluster.nodes.len());
            cluster.nodes[victim].kill();
            std::thread::sleep(Duration::from_millis(rng.gen_range(500..1500)));
            cluster.nodes[victim].restart_on_same_ports();
        },
    );
}
