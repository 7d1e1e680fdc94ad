//! A soak: many clients (the client library and a FUSE mount) mix metadata
//! and data operations against one node for a bounded time (`SOAK_SECS`,
//! default 30). Every process's peak memory stays bounded (printed), no
//! file descriptor leaks (the counts return to where they were after a
//! warm-up), and everything written reads back.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_integration::{process_usage, random_bytes, runtime, FuseMount, NodeProcess};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Peak memory each process may reach here.
const MEMORY_BOUND: u64 = 1 << 30;
/// Descriptors a process may hold more after the soak than after the
/// warm-up (pooled connections, the runtime's own).
const FD_SLACK: usize = 24;

#[test]
fn mixed_load_keeps_memory_bounded_and_leaks_no_descriptors() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    // Every writer reserves a whole block (64 MiB) in the tier while it
    // writes: room for the 16 writers at once.
    let tiers = format!("data.tiers=[MEM:4GiB]{}", dir.path().join("mem").display());
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let rt = runtime();
    let ops = Arc::new(AtomicU64::new(0));

    // One round of everything first, so pools and caches exist before the
    // descriptors are counted.
    let run = |secs: u64| {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for t in 0..12u64 {
            let (conf, stop, ops) = (node.client_conf(), stop.clone(), ops.clone());
            tasks.push(rt.spawn(async move {
                let c = curvine_client::Client::connect(&conf).await.unwrap();
                let mut rng = StdRng::seed_from_u64(t);
                let base = format!("/c{t}");
                let _ = c.mkdir(&base, false).await;
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let f = format!("{base}/f{}", k % 50);
                    match rng.gen_range(0..6) {
                        0 | 1 => {
                            let bytes = random_bytes(rng.gen_range(0..300_000), k);
                            let mut w = FileWriter::open(&c, &f, &WriteOptions::create())
                                .await
                                .unwrap();
                            w.write(&bytes).await.unwrap();
                            w.close().await.unwrap();
                            let mut r = FileReader::open(&c, &f).await.unwrap();
                            let mut back = Vec::new();
                            r.read_to_end(&mut back).await.unwrap();
                            assert!(back == bytes, "{f} read back differs");
                        }
                        2 => {
                            let _ = c.stat(&f).await;
                            let _ = c.list_all(&base).await.unwrap();
                        }
                        3 => {
                            let _ = c.rename(&f, &format!("{base}/moved{}", k % 7)).await;
                        }
                        4 => {
                            let _ = c.remove(&f, false).await;
                        }
                        _ => {
                            let d = format!("{base}/d{}", k % 9);
                            if c.mkdir(&d, false).await.is_err() {
                                let _ = c.remove(&d, true).await;
                            }
                        }
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                    k += 1;
                }
            }));
        }
        // Plain system calls through the mount, from threads.
        let mut threads = Vec::new();
        for t in 0..4u64 {
            let (root, stop, ops) = (mnt.path(&format!("m{t}")), stop.clone(), ops.clone());
            threads.push(std::thread::spawn(move || {
                let _ = std::fs::create_dir_all(&root);
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = root.join(format!("f{}", k % 20));
                    let bytes = random_bytes(((k * 7919) % 200_000) as usize, k);
                    std::fs::File::create(&p)
                        .unwrap()
                        .write_all(&bytes)
                        .unwrap();
                    let mut back = Vec::new();
                    std::fs::File::open(&p)
                        .unwrap()
                        .read_to_end(&mut back)
                        .unwrap();
                    assert!(back == bytes, "{} read back differs", p.display());
                    if k.is_multiple_of(5) {
                        let _ = std::fs::rename(&p, root.join("renamed"));
                    }
                    if k.is_multiple_of(11) {
                        let _ = std::fs::read_dir(&root).map(|d| d.count());
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                    k += 1;
                }
            }));
        }
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Ordering::Relaxed);
        rt.block_on(async {
            for t in tasks {
                t.await.unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
    };
    run(3);
    // Idle connections are dropped and the counts settle.
    std::thread::sleep(Duration::from_secs(2));
    let node_pid = node.pid().unwrap();
    let mount_pid = mnt.pid().unwrap();
    let (_, node_fds) = process_usage(node_pid);
    let (_, mount_fds) = process_usage(mount_pid);
    let started = Instant::now();
    run(secs);
    let done = ops.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(2));
    let (node_peak, node_after) = process_usage(node_pid);
    let (mount_peak, mount_after) = process_usage(mount_pid);
    eprintln!(
        "soak: {done} operations in {:.0}s; node peak RSS {} MiB, fds {node_fds} -> {node_after}; mount peak RSS {} MiB, fds {mount_fds} -> {mount_after}",
        started.elapsed().as_secs_f64(),
        node_peak >> 20,
        mount_peak >> 20
    );
    assert!(done > 1000, "only {done} operations ran");
    assert!(node_peak < MEMORY_BOUND, "node peak RSS {node_peak}");
    assert!(mount_peak < MEMORY_BOUND, "mount peak RSS {mount_peak}");
    assert!(
        node_after <= node_fds + FD_SLACK,
        "node descriptors {node_fds} -> {node_after}"
    );
    assert!(
        mount_after <= mount_fds + FD_SLACK,
        "mount descriptors {mount_fds} -> {mount_after}"
    );
    let out = node.cli_ok(&["admin", "fsck"]);
    assert!(out.contains("namespace is consistent"), "{out}");
}
