//! Full tiers on a real node: a write that finds no room fails with ENOSPC
//! (never EIO), so does every later one that still finds none, a later one
//! that finds room succeeds, and the close keeps exactly the bytes whose
//! writes succeeded; through the client library (short-circuit and the
//! data port) and a FUSE mount, streamed and staged.

use std::fs::File;
use std::io::Write;
use std::os::unix::io::IntoRawFd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::{random_bytes, runtime, FuseMount, NodeProcess};
use curvine_messages::block::FileSpec;
use curvine_messages::FsError;

const MIB: usize = 1 << 20;

/// A node whose only tier is `mem` of memory, giving freed blocks back at
/// once (no reader keeps an old version in these tests).
fn small_node(dir: &Path, mem: &str) -> NodeProcess {
    let tiers = format!("data.tiers=[MEM:{mem}]{}", dir.join("mem").display());
    NodeProcess::start(&dir.join("n"), &["-c", &tiers, "-c", "data.freed_grace=0s"])
}

async fn client(node: &NodeProcess, short_circuit: bool) -> Client {
    node.client_short_circuit(short_circuit).await
}

async fn get(client: &Client, path: &str) -> Vec<u8> {
    let mut r = FileReader::open(client, path).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

/// Waits until the node's tier holds at most `bytes` (removed files' blocks
/// are removed by a background sweep).
async fn wait_tier_at_most(c: &Client, bytes: u64) {
    curvine_integration::wait_for_async("room in the tier", Duration::from_secs(30), || async {
        let report = c.report().await.ok()?;
        let t = &report.nodes[0].tiers[0];
        (t.used + t.reserved <= bytes).then_some(())
    })
    .await;
}

fn assert_no_space(e: &FsError) {
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(e.to_string().contains("tier MEM"), "names the tier: {e}");
}

/// Through the client library, blocks larger than the tier (reserved as
/// they grow) and blocks smaller than it (reserved whole), short-circuit
/// and through the data port: writes of 1 MiB until the tier is full, a
/// few more that are refused, then room made by removing another file and
/// the writer going on; the close keeps every byte whose write succeeded.
#[test]
fn a_full_tier_refuses_writes_with_enospc_and_the_close_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node(dir.path(), "12MiB");
    runtime().block_on(async {
        for short_circuit in [true, false] {
            for block_size in [64 << 20, 1 << 20] {
                let c = client(&node, short_circuit).await;
                let name = format!("{short_circuit}-{block_size}");
                let options = WriteOptions {
                    spec: FileSpec {
                        block_size,
                        ..Default::default()
                    },
                    ..WriteOptions::create()
                };
                // Another file takes a third of the tier.
                let other = format!("/other-{name}");
                let mut w = FileWriter::open(&c, &other, &options).await.unwrap();
                w.write(&random_bytes(4 * MIB, 1)).await.unwrap();
                w.close().await.unwrap();

                let path = format!("/f-{name}");
                let bytes = random_bytes(16 * MIB, 2);
                let mut w = FileWriter::open(&c, &path, &options).await.unwrap();
                let mut stored = 0;
                let mut refused = 0;
                for piece in bytes.chunks(MIB) {
                    match w.write_some(piece).await {
                        Ok(n) if n == piece.len() && refused == 0 => stored += n,
                        Ok(n) if refused == 0 => {
                            // A short write: the rest of it found no room.
                            stored += n;
                            refused += 1;
                        }
                        Ok(n) => panic!("{name}: a write after a refusal stored {n} bytes"),
                        Err(e) => {
                            assert_no_space(&e);
                            refused += 1;
                        }
                    }
                    if refused > 0 {
                        break;
                    }
                }
                assert!(refused > 0, "{name}: 16 MiB fit a tier of 12 MiB");
                assert!(stored >= 4 * MIB, "{name}: only {stored} bytes stored");
                // Every later write still finding no room is refused the same way.
                for _ in 0..3 {
                    let e = w
                        .write_some(&bytes[stored..stored + MIB])
                        .await
                        .unwrap_err();
                    assert_no_space(&e);
                }
                // Room made: the writer goes on where it was.
                c.remove(&other, false).await.unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                let n = loop {
                    match w.write_some(&bytes[stored..stored + MIB]).await {
                        Ok(n) => break n,
                        Err(e) if Instant::now() < deadline => {
                            assert_no_space(&e);
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        Err(e) => panic!("{name}: no room 20 s after a removal: {e}"),
                    }
                };
                stored += n;
                let attr = w.close().await.unwrap();
                assert_eq!(attr.size, stored as u64, "{name}");
                assert!(get(&c, &path).await == bytes[..stored], "{name}: content");
                c.remove(&path, false).await.unwrap();
                wait_tier_at_most(&c, 0).await;
            }
        }
    });
}

/// What a program sees through a mount when the tier fills (700 writes of
/// 1 MiB on a tier of 512 MiB, scaled down): the writes that fit succeed,
/// the first that does not is short or fails with ENOSPC, every later one
/// fails with ENOSPC, never EIO; fsync and close succeed, and the file
/// holds exactly the bytes written. `dd` says the same.
#[test]
fn through_a_mount_a_full_tier_gives_enospc_and_the_file_keeps_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node(dir.path(), "24MiB");
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let path = mnt.dir.join("a");
    let bytes = random_bytes(40 * MIB, 3);
    let mut file = File::create(&path).unwrap();
    let mut stored = 0;
    let mut errors = Vec::new();
    for piece in bytes.chunks(MIB) {
        if errors.is_empty() {
            match file.write(piece) {
                Ok(n) => stored += n,
                Err(e) => errors.push(e.raw_os_error()),
            }
        } else {
            errors.push(file.write(piece).err().and_then(|e| e.raw_os_error()));
        }
    }
    assert!(!errors.is_empty(), "40 MiB fit a tier of 24 MiB");
    assert!(
        errors.iter().all(|e| *e == Some(libc::ENOSPC)),
        "every refused write fails with ENOSPC: {errors:?}"
    );
    assert!(stored >= 16 * MIB, "only {stored} bytes stored");
    file.sync_all()
        .expect("fsync of a file whose written bytes are stored");
    let fd = file.into_raw_fd();
    assert_eq!(
        unsafe { libc::close(fd) },
        0,
        "close: {}",
        std::io::Error::last_os_error()
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), stored as u64);
    assert!(
        std::fs::read(&path).unwrap() == bytes[..stored],
        "content through the mount"
    );
    let client = runtime().block_on(node.client());
    assert!(
        runtime().block_on(get(&client, "/a")) == bytes[..stored],
        "content through the cluster"
    );

    // dd reports ENOSPC once and closes its file cleanly.
    std::fs::remove_file(&path).unwrap();
    runtime().block_on(wait_tier_at_most(&client, 0));
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", mnt.dir.join("b").display()))
        .args(["bs=1M", "count=40"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!stderr.contains("Input/output error"), "{stderr}");
    let len = std::fs::metadata(mnt.dir.join("b")).unwrap().len();
    assert!(
        len >= 16 * MIB as u64,
        "dd's file holds what it wrote: {len}"
    );
}

/// Random writes through a mount wait in a stage file and are committed by
/// a flush or fsync, which rewrites the blocks they touch: with no room
/// for that, fsync fails with ENOSPC and the staged writes stay, so the
/// fsync after a removal made room commits them.
#[test]
fn staged_writes_a_full_tier_refuses_stay_for_the_next_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node(dir.path(), "24MiB");
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let client = runtime().block_on(node.client());
    let base = random_bytes(8 * MIB, 4);
    std::fs::write(mnt.dir.join("r"), &base).unwrap();
    std::fs::write(mnt.dir.join("filler"), random_bytes(14 * MIB, 5)).unwrap();
    // Two writes inside the file (the first not at its start): staged;
    // their commit rewrites the file's 8 MiB block, and the tier has 2 MiB
    // left.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.dir.join("r"))
        .unwrap();
    let patch = random_bytes(MIB, 6);
    use std::os::unix::fs::FileExt;
    file.write_all_at(&patch, 4 * MIB as u64).unwrap();
    file.write_all_at(&patch, 0).unwrap();
    let e = file.sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    std::fs::remove_file(mnt.dir.join("filler")).unwrap();
    runtime().block_on(wait_tier_at_most(&client, 8 * MIB as u64));
    file.sync_all().expect("fsync once room is made");
    drop(file);
    let mut want = base;
    want[..MIB].copy_from_slice(&patch);
    want[4 * MIB..5 * MIB].copy_from_slice(&patch);
    assert!(
        runtime().block_on(get(&client, "/r")) == want,
        "the staged writes committed"
    );
}

/// A client past `node.max_connections` is refused at once with an error
/// naming the key (EBUSY), the node keeps serving the others, and a place
/// freed is taken again; the node raised its open files limit at start.
#[test]
fn a_client_past_max_connections_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", "node.max_connections=3"]);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", node.pid().unwrap())).unwrap();
    let open_files: Vec<&str> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        open_files[3], open_files[4],
        "soft limit raised to the hard one: {limits}"
    );
    runtime().block_on(async {
        // Clients of one connection each (client.connections).
        let conf = curvine_conf::ClientConf {
            connections: 1,
            ..node.client_conf()
        };
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(Client::connect(&conf).await.unwrap());
        }
        let started = Instant::now();
        let e = Client::connect(&conf)
            .await
            .err()
            .expect("a fourth client refused");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused after {:?}",
            started.elapsed()
        );
        assert_eq!(e.errno(), libc::EBUSY, "{e}");
        assert!(e.to_string().contains("node.max_connections"), "{e}");
        // The others are served.
        for (i, c) in clients.iter().enumerate() {
            c.mkdir(&format!("/d{i}"), false).await.unwrap();
        }
        // A place freed is taken again.
        drop(clients.pop());
        let deadline = Instant::now() + Duration::from_secs(10);
        let again = loop {
            match Client::connect(&conf).await {
                Ok(c) => break c,
                Err(e) if Instant::now() < deadline => {
                    assert_eq!(e.errno(), libc::EBUSY, "{e}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("no place 10 s after a client left: {e}"),
            }
        };
        again.mkdir("/again", false).await.unwrap();
    });
    assert!(
        curvine_integration::node_counter(&node, "curvine_client_connections_refused_total", "")
            >= 1
    );
}
