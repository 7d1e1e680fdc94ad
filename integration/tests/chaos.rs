//! SIGKILL at random moments of real node processes, beyond the metadata
//! stream of `crash.rs`: during large writes while the tier evictor demotes
//! blocks, during shard moves on a cluster, and during a load job. After
//! every restart each acknowledged file reads back whole (every byte checked
//! against its unit checksums and the expected content), the namespace
//! checks clean, no block outlives the grace period without a file, and an
//! interrupted load job finishes.
//!
//! `CHAOS_SEED` picks the random moments (printed, so a failure can be
//! replayed); `CHAOS_KILLS` scales the number of kills (default 1: 12 + 10
//! + 6).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::{
    random_bytes, runtime, settle, wait_for, wait_for_async, Lazily, NodeProcess, ProcessCluster,
    TestS3,
};
use curvine_messages::block::FileSpec;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn seed() -> u64 {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("CHAOS_SEED={seed}");
    seed
}

fn kills(base: u64) -> u64 {
    let scale: u64 = std::env::var("CHAOS_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    base * scale.max(1)
}

async fn read_all(c: &Client, path: &str) -> Result<Vec<u8>, String> {
    let mut r = FileReader::open(c, path)
        .await
        .map_err(|e| format!("open {path}: {e}"))?;
    let mut out = Vec::new();
    r.read_to_end(&mut out)
        .await
        .map_err(|e| format!("read {path}: {e}"))?;
    Ok(out)
}

/// Block and extent files under a tier directory.
fn block_files(tier: &Path) -> Vec<std::path::PathBuf> {
    fn walk(p: &Path, out: &mut Vec<std::path::PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(p) {
            for e in entries.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&tier.join("blocks"), &mut out);
    walk(&tier.join("extents"), &mut out);
    out
}

/// What the writers had acknowledged: path -> (length, content seed).
type Acked = Arc<Mutex<BTreeMap<String, (usize, u64)>>>;
/// Replacements of acknowledged files whose close did not return: a kill
/// may have landed after their commit, so the file may hold one of them.
type Tried = Arc<Mutex<BTreeMap<String, Vec<(usize, u64)>>>>;

/// Whether `got` is what `path` may hold: its acknowledged content, or a
/// replacement whose close the kill interrupted (which then counts as
/// acknowledged from here on, as a reader has seen it).
fn holds_acked_or_tried(acked: &Acked, tried: &Tried, path: &str, got: &[u8]) -> bool {
    let Some((len, seed)) = acked.lock().get(path).copied() else {
        return false;
    };
    if got == random_bytes(len, seed) {
        return true;
    }
    let attempts = tried.lock().get(path).cloned().unwrap_or_default();
    match attempts
        .into_iter()
        .find(|(l, s)| got == random_bytes(*l, *s))
    {
        Some(found) => {
            acked.lock().insert(path.to_string(), found);
            tried.lock().remove(path);
            true
        }
        None => false,
    }
}

#[test]
fn large_writes_and_evictions_survive_kills() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("mem");
    let ssd = dir.path().join("ssd");
    // A MEM tier of 8 MiB under ~20 MiB written per round: the evictor
    // demotes to the SSD tier all the time, so kills land in demotions too.
    let tiers = format!(
        "data.tiers=[MEM:8MiB]{},[SSD:2GiB]{}",
        mem.display(),
        ssd.display()
    );
    let extra = [
        "-c",
        &tiers,
        "-c",
        "data.orphan_grace=2s",
        "-c",
        "data.write_lease=2s",
    ];
    let mut node = NodeProcess::start(&dir.path().join("n"), &extra);
    let rt = runtime();
    let acked: Acked = Default::default();
    let tried: Tried = Default::default();
    let deadline = Instant::now() + Duration::from_secs(300);
    for round in 0..kills(12) {
        let client = rt.block_on(node.client());
        let stop = Arc::new(AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..3u64 {
            let (c, acked, tried, stop) =
                (client.clone(), acked.clone(), tried.clone(), stop.clone());
            let mut wrng = StdRng::seed_from_u64(rng.gen());
            writers.push(rt.spawn(async move {
                let opts = WriteOptions {
                    spec: FileSpec {
                        block_size: 512 << 10,
                        ..Default::default()
                    },
                    ..WriteOptions::create()
                };
                for k in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    // New files, and now and then a replacement of one.
                    let path = match acked.lock().keys().nth(wrng.gen_range(0..64)) {
                        Some(p) if wrng.gen_bool(0.2) => p.clone(),
                        _ => format!("/w{round}-{w}-{k}"),
                    };
                    let len = wrng.gen_range(1..3 << 20);
                    let content_seed: u64 = wrng.gen();
                    let bytes = random_bytes(len, content_seed);
                    // A replacement keeps the old content until its close.
                    let opts = WriteOptions {
                        truncate: false,
                        replace: true,
                        ..opts.clone()
                    };
                    let Ok(mut f) = FileWriter::open(&c, &path, &opts).await else {
                        return;
                    };
                    for part in bytes.chunks(256 << 10) {
                        if f.write(part).await.is_err() {
                            return;
                        }
                    }
                    let replacing = acked.lock().contains_key(&path);
                    if replacing {
                        let attempt = (len, content_seed);
                        tried.lock().entry(path.clone()).or_default().push(attempt);
                    }
                    if f.close().await.is_err() {
                        return;
                    }
                    acked.lock().insert(path.clone(), (len, content_seed));
                    tried.lock().remove(&path);
                }
            }));
        }
        // The kill lands at a random moment after the round acknowledged
        // a few files (or its writers all stopped): how much a round writes
        // in a given time depends on the machine's load, and the rounds
        // must add up to enough files to check.
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..700)));
        let prefix = format!("/w{round}-");
        wait_for(
            format!("round {round} to acknowledge 2 files"),
            Duration::from_secs(60),
            || {
                let done = acked
                    .lock()
                    .keys()
                    .filter(|p| p.starts_with(&prefix))
                    .count();
                (done >= 2 || writers.iter().all(|w| w.is_finished())).then_some(())
            },
        );
        node.kill();
        stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for w in writers {
                let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
            }
        });
        node.restart(&extra);
        let c = rt.block_on(node.client());
        let snapshot = acked.lock().clone();
        rt.block_on(async {
            let report = settle(&c).await;
            assert!(
                report.problems.is_empty(),
                "round {round}: {:?}",
                report.problems
            );
            // This round's files and a sample of the older ones.
            for path in snapshot
                .keys()
                .filter(|p| p.starts_with(&format!("/w{round}-")) || rand::random::<u8>() < 32)
            {
                let got = read_all(&c, path)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                assert!(
                    holds_acked_or_tried(&acked, &tried, path, &got),
                    "round {round}: {path} differs from what was acknowledged"
                );
            }
        });
        assert!(Instant::now() < deadline, "the rounds took too long");
    }
    // Everything acknowledged, in full.
    let c = rt.block_on(node.client());
    let snapshot = acked.lock().clone();
    assert!(
        snapshot.len() > 20,
        "only {} files were written",
        snapshot.len()
    );
    rt.block_on(async {
        for path in snapshot.keys() {
            let got = read_all(&c, path).await.unwrap();
            assert!(holds_acked_or_tried(&acked, &tried, path, &got), "{path}");
        }
        // Files left half-written by a kill are dropped once their lease
        // expires; then no block may outlive the grace period.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for e in c.list_all("/").await.unwrap() {
            let path = format!("/{}", e.name);
            if !snapshot.contains_key(&path) {
                c.remove(&path, false).await.unwrap();
            }
        }
        // The files on disk (block files, and extent files holding blocks
        // of files written in order) and those no block of a file is in,
        // last seen; the evictor may move blocks meanwhile, so where the
        // files' blocks are is asked each time.
        let seen = RefCell::new((0, 0, Vec::new()));
        let what = Lazily(|| {
            let (on_disk, live, extra) = &*seen.borrow();
            format!(
                "only the blocks in files on disk: {on_disk} block and extent files on disk, {live} holding blocks of files; holding none: {extra:?}\n{}",
                node.log_text()
            )
        });
        let (c, snapshot, seen, mem, ssd) = (&c, &snapshot, &seen, &mem, &ssd);
        wait_for_async(what, Duration::from_secs(60), || async move {
            let mut live = std::collections::BTreeSet::new();
            for path in snapshot.keys() {
                for b in c.blocks(path).await.unwrap().blocks {
                    live.extend(b.replicas.iter().filter_map(|r| r.path.clone()));
                }
            }
            let mut on_disk = block_files(mem);
            on_disk.extend(block_files(ssd));
            let extra: Vec<_> = on_disk
                .iter()
                .filter(|p| !live.contains(&p.display().to_string()))
                .cloned()
                .collect();
            let done = on_disk.len() == live.len() && extra.is_empty();
            *seen.borrow_mut() = (on_disk.len(), live.len(), extra);
            done.then_some(())
        })
        .await;
    });
    let out = node.cli_ok(&["admin", "fsck"]);
    assert!(out.contains("namespace is consistent"), "{out}");
}

#[test]
fn shard_moves_survive_kills_of_any_node() {
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &[]);
    let rt = runtime();
    let acked: Arc<Mutex<Vec<String>>> = Default::default();
    let ids: Vec<String> = cluster.nodes.iter().map(|n| n.node_id.clone()).collect();
    cluster.nodes[0].cli_ok(&["admin", "rebalance"]);
    let deadline = Instant::now() + Duration::from_secs(300);
    for round in 0..kills(10) {
        let victim = rng.gen_range(0..3);
        // Clients on the two nodes that stay.
        let stop = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for (w, n) in (0..3).filter(|i| *i != victim).enumerate() {
            let conf = cluster.nodes[n].client_conf();
            let (acked, stop) = (acked.clone(), stop.clone());
            workers.push(rt.spawn(async move {
                let Ok(c) = Client::connect(&conf).await else {
                    return;
                };
                for k in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let d = format!("/r{round}-{w}-{k}");
                    if c.mkdir(&d, false).await.is_err() {
                        continue;
                    }
                    let f = format!("{d}/f");
                    if c.create(&f).await.is_ok() {
                        acked.lock().push(f);
                    }
                }
            }));
        }
        // Moves meanwhile, through a node that stays.
        let mover = (victim + 1) % 3;
        let shard = rng.gen_range(0..16).to_string();
        let target = ids[rng.gen_range(0..3)].clone();
        let out = cluster.nodes[mover].cli(&["admin", "move-shard", &shard, &target]);
        let _ = out; // it may fail when the kill lands in it
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..400)));
        cluster.nodes[victim].kill();
        let shard = rng.gen_range(0..16).to_string();
        let target = ids[(victim + 1 + rng.gen_range(0..2)) % 3].clone();
        let _ = cluster.nodes[mover].cli(&["admin", "move-shard", &shard, &target]);
        std::thread::sleep(Duration::from_millis(200));
        cluster.nodes[victim].start_again();
        cluster.wait_up(3);
        stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for w in workers {
                let _ = tokio::time::timeout(Duration::from_secs(60), w).await;
            }
        });
        // Every acknowledged file is there, seen from every node, and each
        // shard is served by exactly one node that is up.
        let c = rt.block_on(cluster.nodes[round as usize % 3].client());
        let snapshot = acked.lock().clone();
        rt.block_on(async {
            let report = settle(&c).await;
            assert!(
                report.problems.is_empty() && report.pending_intents == 0,
                "round {round}: {report:?}"
            );
            for f in &snapshot {
                c.stat(f)
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: acknowledged {f}: {e}"));
            }
        });
        let out = cluster.nodes[0].cli_ok(&["--json", "admin", "shards"]);
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        let owners = map["shards"].as_array().unwrap();
        assert_eq!(owners.len(), 16);
        for o in owners {
            assert!(ids.contains(&o.as_str().unwrap().to_string()), "{map}");
        }
        assert!(Instant::now() < deadline, "the rounds took too long");
    }
    assert!(acked.lock().len() > 30, "{} files", acked.lock().len());
    let out = cluster.nodes[1].cli_ok(&["admin", "fsck"]);
    assert!(out.contains("namespace is consistent"), "{out}");
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn a_load_job_finishes_after_kills_of_its_node() {
    let Some(s3) = TestS3::get() else { return };
    let mut rng = StdRng::seed_from_u64(seed());
    let dir = tempfile::tempdir().unwrap();
    let loc = s3.location("chaos-load");
    let ufs = s3.ufs(&loc);
    let count = 400u64;
    rt_write_objects(&ufs, count);
    let mut node = NodeProcess::start(&dir.path().join("n"), &[]);
    let mut args: Vec<String> = vec!["mount".into(), loc.clone(), "/l".into()];
    args.extend(s3.props());
    node.cli_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let job = json(&node.cli_ok(&["--json", "load", "/l"]));
    let id = job["id"].as_str().unwrap().to_string();
    let mut mid_job = 0;
    for _ in 0..kills(6) {
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..500)));
        let status = json(&node.cli_ok(&["--json", "load-status", &id]));
        if status["state"] != "done" {
            mid_job += 1;
        }
        node.kill();
        node.start_again();
    }
    assert!(mid_job > 0, "every kill came after the job had finished");
    let seen = RefCell::new(serde_json::Value::Null);
    let what = Lazily(|| format!("the job to finish: {}", seen.borrow()));
    let status = wait_for(what, Duration::from_secs(120), || {
        let status = json(&node.cli_ok(&["--json", "load-status", &id]));
        if status["state"] == "done" || status["state"] == "failed" {
            return Some(status);
        }
        *seen.borrow_mut() = status;
        None
    });
    assert_eq!(status["state"], "done", "{status}");
    assert_eq!(status["files_failed"], 0, "{status}");
    assert_eq!(
        status["files_done"].as_u64().unwrap() + status["files_skipped"].as_u64().unwrap(),
        count,
        "{status}"
    );
    // Every file is cached whole and holds its object's bytes.
    let rt = runtime();
    let c = rt.block_on(node.client());
    rt.block_on(async {
        for i in 0..count {
            let path = format!("/l/d{}/o{i}", i % 7);
            let b = c.blocks(&path).await.unwrap();
            assert!(!b.blocks.is_empty(), "{path} is not cached");
            assert_eq!(read_all(&c, &path).await.unwrap(), object(i), "{path}");
        }
    });
}

fn object(i: u64) -> Vec<u8> {
    random_bytes(1000 + (i as usize * 37) % 9000, i)
}

fn rt_write_objects(ufs: &curvine_actors::ufs::Ufs, count: u64) {
    runtime().block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..count {
            let ufs = ufs.clone();
            tasks.spawn(async move {
                ufs.write_all(&format!("d{}/o{i}", i % 7), object(i))
                    .await
                    .unwrap();
            });
            while tasks.len() >= 16 {
                tasks.join_next().await;
            }
        }
        while tasks.join_next().await.is_some() {}
    });
}
