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

/// A node whose only tier is `mem` of memory (on defaults otherwise: a
/// freed block goes as soon as no reader holds it).
fn small_node(dir: &Path, mem: &str) -> NodeProcess {
    small_node_with(dir, mem, &[])
}

fn small_node_with(dir: &Path, mem: &str, extra: &[&str]) -> NodeProcess {
    let tiers = format!("data.tiers=[MEM:{mem}]{}", dir.join("mem").display());
    let mut args = vec!["-c", tiers.as_str()];
    for e in extra {
        args.extend(["-c", e]);
    }
    NodeProcess::start(&dir.join("n"), &args)
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

/// The first `n` bytes a reader reads.
async fn read_first(reader: &mut FileReader, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut at = 0;
    while at < n {
        let got = reader.read(&mut out[at..]).await.unwrap();
        assert!(got > 0, "the file ended at {at}");
        at += got;
    }
    out
}

/// The node's only tier, as `report` shows it.
async fn tier(c: &Client) -> curvine_messages::block::TierStats {
    c.report().await.unwrap().nodes[0].tiers[0].clone()
}

/// Writes `bytes` of zeros to `path` with dd; its stderr when it failed.
fn dd(path: &Path, mib: usize) -> Result<(), String> {
    let out = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", path.display()))
        .args(["bs=1M", &format!("count={mib}")])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
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
                // Room made: the writer goes on where it was, at once.
                c.remove(&other, false).await.unwrap();
                let n = w
                    .write_some(&bytes[stored..stored + MIB])
                    .await
                    .unwrap_or_else(|e| panic!("{name}: no room right after a removal: {e}"));
                stored += n;
                let attr = w.close().await.unwrap();
                assert_eq!(attr.size, stored as u64, "{name}");
                assert!(get(&c, &path).await == bytes[..stored], "{name}: content");
                c.remove(&path, false).await.unwrap();
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
    file.sync_all().expect("fsync right after room is made");
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
    // Started with a soft limit of open files below the hard one (as most
    // service managers start processes), the node and a mount raise it.
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    let hard = r.rlim_max;
    assert!(hard > 1024, "a hard limit of open files above 1024 here");
    r.rlim_cur = 1024;
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", "node.max_connections=3"]);
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    for pid in [node.pid().unwrap(), mnt.pid().unwrap()] {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let open_files: Vec<&str> = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            open_files[3],
            hard.to_string(),
            "soft limit raised to the hard one: {limits}"
        );
    }
    drop(mnt);
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

/// Space `rm` or a truncation gave back serves the next write at once,
/// through a mount, on defaults (the rows of the issue this came from: a
/// `dd` right after an `rm` failed, and two writers with `rm` between
/// rounds ran out of a tier three times the size of their live data while
/// freed blocks waited `data.freed_grace`).
#[test]
fn space_freed_by_rm_or_truncation_serves_the_next_write_at_once() {
    let dir = tempfile::tempdir().unwrap();
    // Room for 48 MiB and the writers' reservations, which run up to
    // twice what they wrote; not for 48 MiB more while freed space waits.
    let node = small_node(dir.path(), "80MiB");
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let at = |name: &str| mnt.dir.join(name);
    dd(&at("a"), 48).unwrap();
    // Read back first: the reader's close reaches the node a moment after
    // the program's.
    assert_eq!(std::fs::read(at("a")).unwrap().len(), 48 * MIB);
    std::fs::remove_file(at("a")).unwrap();
    dd(&at("b"), 48).expect("a write right after rm");
    File::options()
        .write(true)
        .open(at("b"))
        .unwrap()
        .set_len(0)
        .unwrap();
    dd(&at("c"), 48).expect("a write right after a truncation");
    std::fs::remove_file(at("c")).unwrap();
    for round in 0..3 {
        let writers: Vec<_> = ["w1", "w2"]
            .into_iter()
            .map(|name| {
                let path = at(&format!("{name}-{round}"));
                std::thread::spawn(move || dd(&path, 24))
            })
            .collect();
        for w in writers {
            w.join()
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
        }
        for name in ["w1", "w2"] {
            let path = at(&format!("{name}-{round}"));
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 24 * MIB as u64);
            std::fs::remove_file(path).unwrap();
        }
    }
}

/// A writer that has begun a block holds room for what it wrote, not for
/// the whole block ahead: on an empty tier of 80 MiB with blocks of 64
/// MiB, a second writer stores 48 MiB while the first has written 1 MiB,
/// and the first then goes on; short-circuit and through the data port.
/// (A whole block reserved by the first writer left the second 16 MiB.)
#[test]
fn a_begun_writer_leaves_the_room_it_has_not_written_to_others() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node(dir.path(), "80MiB");
    runtime().block_on(async {
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            let first = format!("/first-{short_circuit}");
            let second = format!("/second-{short_circuit}");
            let head = random_bytes(MIB, 1);
            let mut w1 = FileWriter::open(&c, &first, &WriteOptions::create())
                .await
                .unwrap();
            w1.write(&head).await.unwrap();
            let big = random_bytes(48 * MIB, 2);
            let mut w2 = FileWriter::open(&c, &second, &WriteOptions::create())
                .await
                .unwrap();
            for piece in big.chunks(4 * MIB) {
                w2.write(piece).await.unwrap_or_else(|e| {
                    panic!("short_circuit {short_circuit}: the second writer: {e}")
                });
            }
            w2.close().await.unwrap();
            let tail = random_bytes(8 * MIB, 3);
            w1.write(&tail).await.unwrap();
            w1.close().await.unwrap();
            assert!(get(&c, &second).await == big);
            assert!(get(&c, &first).await == [head, tail].concat());
            c.remove(&first, false).await.unwrap();
            c.remove(&second, false).await.unwrap();
            assert_eq!(tier(&c).await.reserved, 0, "every reservation given back");
        }
    });
}

/// A reader that opened a file before it was removed reads it whole
/// (through the data port and short-circuit), its blocks stay in use
/// meanwhile (a write needing them is refused), and its close gives their
/// room to the next write at once.
#[test]
fn a_reader_holds_the_version_it_opened_and_its_close_gives_the_room_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node(dir.path(), "64MiB");
    runtime().block_on(async {
        for short_circuit in [false, true] {
            let c = client(&node, short_circuit).await;
            let old = random_bytes(40 * MIB, 7);
            let mut w = FileWriter::open(&c, "/old", &WriteOptions::create())
                .await
                .unwrap();
            w.write(&old).await.unwrap();
            w.close().await.unwrap();
            let mut reader = FileReader::open(&c, "/old").await.unwrap();
            let mut seen = read_first(&mut reader, MIB).await;
            c.remove("/old", false).await.unwrap();

            let mut w = FileWriter::open(&c, "/new", &WriteOptions::create())
                .await
                .unwrap();
            let e = w
                .write(&random_bytes(30 * MIB, 8))
                .await
                .expect_err("the reader's 40 MiB are not free");
            assert_no_space(&e);
            w.close().await.unwrap();
            c.remove("/new", false).await.unwrap();

            let mut rest = Vec::new();
            reader.read_to_end(&mut rest).await.unwrap();
            seen.extend(rest);
            assert!(seen == old, "the reader read the version it opened whole");
            reader.close().await.unwrap();

            let mut w = FileWriter::open(&c, "/new", &WriteOptions::create())
                .await
                .unwrap();
            w.write(&random_bytes(60 * MIB, 9))
                .await
                .unwrap_or_else(|e| panic!("right after the reader closed ({short_circuit}): {e}"));
            w.close().await.unwrap();
            c.remove("/new", false).await.unwrap();
        }
    });
}

/// A process holding a removed block file open keeps its bytes in use:
/// the node counts them as held (`fs df`), the reader reads them whole,
/// and once it closes them they serve the next write at once. (Readers
/// hold nothing past `data.read_hold_max`, 0 here, so the block is removed
/// while the short-circuit reader has its file open.)
#[test]
fn a_removed_block_file_held_open_counts_as_held_until_closed() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_node_with(dir.path(), "64MiB", &["data.read_hold_max=0s"]);
    runtime().block_on(async {
        let c = client(&node, true).await;
        let bytes = random_bytes(40 * MIB, 10);
        let mut w = FileWriter::open(&c, "/h", &WriteOptions::create())
            .await
            .unwrap();
        w.write(&bytes).await.unwrap();
        w.close().await.unwrap();
        let mut reader = FileReader::open(&c, "/h").await.unwrap();
        let mut seen = read_first(&mut reader, MIB).await;
        c.remove("/h", false).await.unwrap();
        let held = curvine_integration::wait_for_async(
            "the removed block counted as held",
            Duration::from_secs(10),
            || async {
                let t = tier(&c).await;
                (t.held > 0).then_some(t)
            },
        )
        .await;
        assert_eq!(held.held, 40 * MIB as u64, "{held:?}");
        assert!(held.used >= held.held, "held is part of used: {held:?}");
        let df = node.cli(&["fs", "df"]);
        let df = String::from_utf8_lossy(&df.stdout);
        assert!(df.contains("held"), "{df}");
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await.unwrap();
        seen.extend(rest);
        assert!(seen == bytes, "the reader read the removed file whole");
        drop(reader);
        let mut w = FileWriter::open(&c, "/next", &WriteOptions::create())
            .await
            .unwrap();
        w.write(&random_bytes(60 * MIB, 11))
            .await
            .expect("the closed file's room serves the next write");
        w.close().await.unwrap();
        assert_eq!(tier(&c).await.held, 0);
    });
}
