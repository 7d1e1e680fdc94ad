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
//! `NEMESIS_SEED` replays a schedule; `NEMESIS_ROUNDS` (default 2) sets
//! how many rounds a schedule runs (`bench/run-nemesis.sh` runs more).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::linear::{self, Call};
use curvine_integration::model::Op;
use curvine_integration::nemesis::{every_shard_serving, record, shard_probes, stop_clients};
use curvine_integration::{runtime, settle, wait_for_voters, ProcessCluster};

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

/// Runs `faults` (one round each call, given the cluster and the
/// schedule's random source) `rounds` times while the clients run, then
/// checks what the module's comment says.
fn run_schedule(name: &str, faults: impl Fn(&mut ProcessCluster, &mut rand::rngs::StdRng)) {
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start_pinned(dir.path(), 3, &["-c", "meta.replicas=3"]);
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
        let c = Client::connect(&confs[2]).await.unwrap();
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
    run_schedule("crash loop", |cluster, rng| {
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
fn kills_of_single_nodes_lose_nothing() {
    run_schedule("single kills", |cluster, rng| {
        let victim = rng.gen_range(0..cluster.nodes.len());
        cluster.nodes[victim].kill();
        std::thread::sleep(Duration::from_millis(rng.gen_range(500..2000)));
        cluster.nodes[victim].restart_on_same_ports();
    });
}

/// Kills of two of the three nodes (every shard loses its majority until
/// one is back), started again one after the other.
#[test]
fn kills_of_two_of_three_nodes_lose_nothing() {
    run_schedule("two of three killed", |cluster, rng| {
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
fn paused_nodes_lose_nothing() {
    run_schedule("pauses", |cluster, rng| {
        let victim = rng.gen_range(0..cluster.nodes.len());
        let pid = cluster.nodes[victim].pid().expect("a running node") as i32;
        // SAFETY: signalling a child process of this test.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        std::thread::sleep(Duration::from_millis(rng.gen_range(1500..4000)));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
}
