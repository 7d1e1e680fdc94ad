//! File data on a real node: round trips through the data port and
//! short-circuit, positional reads, copy-on-write overwrites and appends,
//! concurrent writers and readers, corruption detection, tier demotion,
//! ENOSPC, bad peers on the data port, a node frozen mid-read, and a node
//! killed while writing.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_conf::ClientConf;
use curvine_integration::{wait_for_async, NodeProcess};
use curvine_messages::block::{FileSpec, CHECKSUM_UNIT, MAX_CHUNK};
use curvine_messages::FsError;
use rand::{Rng, SeedableRng};

const BS: u64 = 1 << 20;

fn data(len: usize, seed: u64) -> Vec<u8> {
    curvine_integration::random_bytes(len, seed)
}

fn spec(block_size: u64) -> WriteOptions {
    WriteOptions {
        spec: FileSpec {
            block_size,
            ..Default::default()
        },
        ..WriteOptions::create()
    }
}

async fn client(node: &NodeProcess, short_circuit: bool) -> Client {
    node.client_short_circuit(short_circuit).await
}

/// Writes `bytes` in pieces of `piece` bytes.
async fn put(client: &Client, path: &str, bytes: &[u8], options: &WriteOptions, piece: usize) {
    let mut w = FileWriter::open(client, path, options).await.unwrap();
    for part in bytes.chunks(piece.max(1)) {
        w.write(part).await.unwrap();
    }
    let attr = w.close().await.unwrap();
    assert_eq!(attr.size, bytes.len() as u64, "{path}");
}

/// `admin scrub` finds every block whole.
fn scrub_is_clean(node: &NodeProcess) {
    let out = node.cli_ok(&["--json", "admin", "scrub"]);
    assert!(
        !out.contains("mismatch") && !out.contains("missing"),
        "{out}"
    );
}

async fn get(client: &Client, path: &str) -> Vec<u8> {
    let mut r = FileReader::open(client, path).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

use curvine_integration::runtime;

#[test]
fn round_trips_of_edge_sizes_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    runtime().block_on(async {
        let unit = CHECKSUM_UNIT;
        let sizes = [
            0,
            1,
            unit - 1,
            unit + 1,
            MAX_CHUNK - 1,
            MAX_CHUNK + 1,
            BS as usize - 1,
            BS as usize,
            BS as usize + 1,
            3 * BS as usize + 12345,
        ];
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            for (i, &size) in sizes.iter().enumerate() {
                let path = format!("/rt-{short_circuit}-{i}");
                let bytes = data(size, i as u64);
                // Odd write sizes cross unit and block boundaries.
                put(&c, &path, &bytes, &spec(BS), 100_003).await;
                let back = get(&c, &path).await;
                assert!(
                    back == bytes,
                    "{path}: {size} bytes differ after a round trip"
                );
                // The other path reads what this one wrote.
                let other = client(&node, !short_circuit).await;
                assert!(
                    get(&other, &path).await == bytes,
                    "{path} via the other path"
                );
                let attr = c.stat(&path).await.unwrap();
                assert_eq!(attr.size, size as u64);
                assert!(attr.writing.is_none());
            }
        }
    });
}

/// `pread` (what the mount calls) in every pattern reads the source:
/// random reads fetch their bytes, runs continue one stream from there,
/// reads far ahead of a stream inside a block restart it.
async fn check_preads(
    r: &mut FileReader,
    bytes: &[u8],
    bs: u64,
    rng: &mut rand::rngs::StdRng,
    short_circuit: bool,
) {
    let mut off = 0u64;
    for i in 0..120 {
        if i % 3 == 0 {
            off = rng.gen_range(0..bytes.len() as u64 + 10);
        } else if i % 7 == 0 {
            off += rng.gen_range(0..bs / 2);
        }
        let len = rng.gen_range(1..300_000);
        let mut buf = vec![0u8; len];
        let n = r.pread(off, &mut buf).await.unwrap();
        let want = &bytes[(off as usize).min(bytes.len())..(off as usize + len).min(bytes.len())];
        assert_eq!(
            &buf[..n],
            want,
            "pread at {off} of {len} (short-circuit {short_circuit})"
        );
        off += n as u64;
    }
}

#[test]
fn positional_reads_match_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    runtime().block_on(async {
        let bytes = data(5 * BS as usize + 777, 7);
        let c = client(&node, true).await;
        put(&c, "/pos", &bytes, &spec(BS), 1 << 20).await;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            let mut r = FileReader::open(&c, "/pos").await.unwrap();
            for _ in 0..60 {
                let off = rng.gen_range(0..bytes.len() as u64 + 10);
                let len = rng.gen_range(0..3 * CHECKSUM_UNIT);
                let mut buf = vec![0u8; len];
                let n = r.read_full_at(off, &mut buf).await.unwrap();
                let want =
                    &bytes[(off as usize).min(bytes.len())..(off as usize + len).min(bytes.len())];
                assert_eq!(
                    &buf[..n],
                    want,
                    "read at {off} of {len} (short-circuit {short_circuit})"
                );
            }
            check_preads(&mut r, &bytes, BS, &mut rng, short_circuit).await;
            // The same in blocks of 8MiB, where reads jump far ahead of a
            // stream inside one block.
            let big = data(20 * BS as usize + 3, 8);
            put(
                &c,
                &format!("/pos8-{short_circuit}"),
                &big,
                &spec(8 * BS),
                1 << 20,
            )
            .await;
            let mut r8 = FileReader::open(&c, &format!("/pos8-{short_circuit}"))
                .await
                .unwrap();
            check_preads(&mut r8, &big, 8 * BS, &mut rng, short_circuit).await;
            // Sequential reads after seeks, backwards too.
            for off in [4 * BS + 5, 10, BS - 1, 0] {
                r.seek(off);
                let mut buf = vec![0u8; 200_000];
                let n = r.read(&mut buf).await.unwrap();
                assert!(n > 0);
                assert_eq!(&buf[..n], &bytes[off as usize..off as usize + n]);
            }
        }
    });
}

#[test]
fn overwrite_append_truncate_are_copy_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    runtime().block_on(async {
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            let path = format!("/cow-{short_circuit}");
            let mut model = data(2 * BS as usize + 5000, 11);
            put(&c, &path, &model, &spec(BS), 65536).await;

            // A reader opened before the overwrite keeps the old content.
            let mut before = FileReader::open(&c, &path).await.unwrap();

            // Overwrite a range crossing a block boundary.
            let patch = data(300_000, 12);
            let at = BS as usize - 100_000;
            let mut w = FileWriter::open(&c, &path, &WriteOptions::default())
                .await
                .unwrap();
            w.seek(at as u64).await.unwrap();
            w.write(&patch).await.unwrap();
            // And a few bytes inside the first block, after the other write.
            w.seek(10).await.unwrap();
            w.write(b"hello").await.unwrap();
            w.close().await.unwrap();
            let old = model.clone();
            model[at..at + patch.len()].copy_from_slice(&patch);
            model[10..15].copy_from_slice(b"hello");
            assert!(get(&c, &path).await == model, "overwrite ({short_circuit})");
            // It still does after the node's sweeps of freed blocks ran
            // (every second): the reader holds the old blocks until it
            // closes.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let mut seen = Vec::new();
            before.read_to_end(&mut seen).await.unwrap();
            assert!(seen == old, "a reader opened before sees the old version");

            // Append.
            let tail = data(BS as usize + 3, 13);
            let mut w = FileWriter::open(
                &c,
                &path,
                &WriteOptions {
                    append: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            w.write(&tail).await.unwrap();
            w.close().await.unwrap();
            model.extend_from_slice(&tail);
            assert!(get(&c, &path).await == model, "append ({short_circuit})");

            // Replace: the old content stays until the close, and after an abort.
            let replace = WriteOptions {
                replace: true,
                ..Default::default()
            };
            let mut w = FileWriter::open(&c, &path, &replace).await.unwrap();
            w.write(b"short").await.unwrap();
            assert!(get(&c, &path).await == model, "old content until the close");
            w.abort().await.unwrap();
            assert!(get(&c, &path).await == model, "old content after an abort");
            let mut w = FileWriter::open(&c, &path, &replace).await.unwrap();
            w.write(&model[..BS as usize + 3]).await.unwrap();
            w.close().await.unwrap();
            model.truncate(BS as usize + 3);
            assert!(get(&c, &path).await == model, "replaced");

            // Truncate down inside a block, then up (a hole reads as zeros).
            let set = |size| curvine_messages::SetAttr {
                size: Some(size),
                ..Default::default()
            };
            c.setattr(&path, set(BS - 10)).await.unwrap();
            model.truncate(BS as usize - 10);
            assert!(get(&c, &path).await == model, "truncate down");
            c.setattr(&path, set(3 * BS)).await.unwrap();
            model.resize(3 * BS as usize, 0);
            assert!(get(&c, &path).await == model, "truncate up");
            // Writing past a hole.
            let mut w = FileWriter::open(&c, &path, &WriteOptions::default())
                .await
                .unwrap();
            w.seek(4 * BS + 7).await.unwrap();
            w.write(b"end").await.unwrap();
            w.close().await.unwrap();
            model.resize(4 * BS as usize + 7, 0);
            model.extend_from_slice(b"end");
            assert!(get(&c, &path).await == model, "write past a hole");
        }
        // Replaced blocks are freed: only the live ones remain on the node.
        let blocks: u64 = node_blocks(&c_any(&node).await).await;
        let mut live = 0;
        for short_circuit in [true, false] {
            let fb = c_any(&node)
                .await
                .blocks(&format!("/cow-{short_circuit}"))
                .await
                .unwrap();
            live += fb.blocks.len() as u64;
        }
        wait_for_async(
            format!("the node to keep only the {live} live blocks"),
            Duration::from_secs(30),
            || async { (node_blocks(&c_any(&node).await).await == live).then_some(()) },
        )
        .await;
        assert!(blocks >= live);
    });
}

async fn c_any(node: &NodeProcess) -> Client {
    node.client().await
}

async fn node_blocks(c: &Client) -> u64 {
    let report = c.report().await.unwrap();
    report
        .nodes
        .iter()
        .flat_map(|n| &n.tiers)
        .map(|t| t.blocks)
        .sum()
}

#[test]
fn concurrent_writers_and_readers() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    runtime().block_on(async {
        let c = node.client().await;
        let mut tasks = Vec::new();
        for i in 0..6u64 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let bytes = data((i as usize + 1) * 700_000, 100 + i);
                let path = format!("/cc-{i}");
                put(&c, &path, &bytes, &spec(BS), 131072).await;
                for _ in 0..3 {
                    assert!(get(&c, &path).await == bytes, "{path}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Many readers of one file at once, through both paths.
        let bytes = data(3 * BS as usize, 200);
        put(&c, "/shared", &bytes, &spec(BS), 1 << 20).await;
        let mut readers = Vec::new();
        for i in 0..8 {
            let c = client(&node, i % 2 == 0).await;
            let want = bytes.clone();
            readers.push(tokio::spawn(async move {
                assert!(get(&c, "/shared").await == want);
            }));
        }
        for r in readers {
            r.await.unwrap();
        }
        // A second writer is refused while the first holds the file.
        let mut w = FileWriter::open(&c, "/shared", &WriteOptions::default())
            .await
            .unwrap();
        w.write(b"x").await.unwrap();
        let second = FileWriter::open(&c, "/shared", &WriteOptions::default()).await;
        assert!(
            matches!(second, Err(FsError::InUse(_))),
            "{:?}",
            second.err()
        );
        assert!(c.stat("/shared").await.unwrap().writing.is_some());
        w.close().await.unwrap();
    });
}

#[test]
fn a_flipped_byte_is_detected_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    runtime().block_on(async {
        let c = node.client().await;
        let bytes = data(2 * BS as usize, 5);
        put(&c, "/bad", &bytes, &spec(BS), 1 << 20).await;
        let fb = c.blocks("/bad").await.unwrap();
        let file = fb.blocks[1].replicas[0].path.clone().expect("block path");
        // (The second block starts at its offset in the file holding it.)
        let at = fb.blocks[1].replicas[0].offset as usize + 12345;
        let mut raw = std::fs::read(&file).unwrap();
        raw[at] ^= 0x40;
        std::fs::write(&file, &raw).unwrap();
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            let mut r = FileReader::open(&c, "/bad").await.unwrap();
            let mut out = Vec::new();
            let err = r.read_to_end(&mut out).await.unwrap_err();
            assert_eq!(err.errno(), libc::EIO, "{err}");
            assert!(err.to_string().contains("checksum"), "{err}");
            assert!(
                curvine_client::io::checksum_errors() > 0,
                "the mismatch is counted"
            );
            // The intact block still reads.
            let mut first = vec![0u8; 1000];
            r.read_full_at(0, &mut first).await.unwrap();
            assert_eq!(&first[..], &bytes[..1000]);
        }
        // The CLI reports it as an error with a non-zero exit.
        let out = node.cli(&["fs", "cat", "/bad"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("checksum"));
    });
}

#[test]
fn a_tiny_mem_tier_demotes_to_disk_while_data_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("mem");
    let hdd = dir.path().join("hdd");
    let tiers = format!(
        "data.tiers=[MEM:4MiB]{},[HDD:256MiB]{}",
        mem.display(),
        hdd.display()
    );
    let node = NodeProcess::start(
        &dir.path().join("n"),
        &["-c", &tiers, "-c", "data.evict_interval=100ms"],
    );
    runtime().block_on(async {
        let c = node.client().await;
        let mut files = Vec::new();
        for i in 0..12u64 {
            let bytes = data(BS as usize * 2 - 1000, 300 + i);
            put(&c, &format!("/t{i}"), &bytes, &spec(BS), 1 << 20).await;
            files.push(bytes);
        }
        // Read everything repeatedly while the evictor works.
        for round in 0..3 {
            for (i, bytes) in files.iter().enumerate() {
                let sc = (i + round) % 2 == 0;
                let cc = client(&node, sc).await;
                assert!(
                    get(&cc, &format!("/t{i}")).await == *bytes,
                    "/t{i} round {round}"
                );
            }
        }
        wait_for_async(
            "blocks demoted until the first tier is at most 90% full",
            Duration::from_secs(30),
            || async {
                let report = c.report().await.unwrap();
                let t = &report.nodes[0].tiers;
                (t[0].used as f64 <= 0.9 * t[0].capacity as f64 && t[1].blocks > 0).then_some(())
            },
        )
        .await;
        let report = c.report().await.unwrap();
        let total: u64 = report.nodes[0].tiers.iter().map(|t| t.blocks).sum();
        assert_eq!(
            total, 24,
            "every unique block is kept: {:?}",
            report.nodes[0].tiers
        );
        for (i, bytes) in files.iter().enumerate() {
            assert!(get(&c, &format!("/t{i}")).await == *bytes);
        }
        let fb = c.blocks("/t0").await.unwrap();
        assert!(fb.blocks.iter().all(|b| b.replicas[0].tier.is_some()));
        // free keeps blocks that are the only copy.
        let out = node.cli(&["fs", "free", "/"]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("kept 24 blocks"));
    });
}

#[test]
fn blocks_laid_out_in_one_file_are_read_scrubbed_and_demoted_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("mem");
    let tiers = format!(
        "data.tiers=[MEM:10MiB]{},[HDD:256MiB]{}",
        mem.display(),
        dir.path().join("hdd").display()
    );
    let node = NodeProcess::start(
        &dir.path().join("n"),
        &["-c", &tiers, "-c", "data.evict_interval=100ms"],
    );
    runtime().block_on(async {
        let c = node.client().await;
        let model = data(4 * BS as usize - 333, 77);
        // Written over the data port: each block in a file of its own.
        put(
            &client(&node, false).await,
            "/model",
            &model,
            &spec(BS),
            1 << 20,
        )
        .await;
        let before = c.blocks("/model").await.unwrap();
        assert!(before.backing_file().is_none() && before.all_here());
        // Laid out in one extent file in the MEM tier, each block at its
        // offset in the file; the blocks' own files go.
        let after = c.assemble("/model").await.unwrap();
        let extent = after.backing_file().expect("one file").to_string();
        assert!(extent.starts_with(&mem.display().to_string()), "{extent}");
        assert_eq!(std::fs::read(&extent).unwrap(), model);
        for (i, b) in after.blocks.iter().enumerate() {
            assert_eq!(b.replicas[0].offset, i as u64 * BS);
            let own = before.blocks[i].replicas[0].path.clone().unwrap();
            assert!(!std::path::Path::new(&own).exists(), "{own}");
        }
        // Asked again, nothing changes.
        assert_eq!(c.assemble("/model").await.unwrap(), after);
        // Every reader finds the blocks at their offsets.
        for sc in [true, false] {
            assert!(get(&client(&node, sc).await, "/model").await == model);
        }
        scrub_is_clean(&node);
        // Other files fill the MEM tier: the evictor demotes the extent's
        // blocks to the disk tier one by one, copied from their offsets
        // and verified; the extent file goes with the last.
        for i in 0..8u64 {
            let bytes = data(BS as usize, 900 + i);
            put(&c, &format!("/fill{i}"), &bytes, &spec(BS), 1 << 20).await;
        }
        wait_for_async(
            "the extent's blocks demoted and its file removed",
            Duration::from_secs(30),
            || async {
                let fb = c.blocks("/model").await.unwrap();
                let on_disk = fb
                    .blocks
                    .iter()
                    .all(|b| b.replicas[0].tier == Some(curvine_messages::block::TierKind::Hdd));
                (on_disk && !std::path::Path::new(&extent).exists()).then_some(())
            },
        )
        .await;
        assert!(get(&c, "/model").await == model);
        scrub_is_clean(&node);
    });
}

#[test]
fn a_file_written_in_order_on_its_node_is_one_extent_file_from_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mem = dir.path().join("mem");
    let tiers = format!("data.tiers=[MEM:64MiB]{}", mem.display());
    let mut node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    let model = data(5 * BS as usize + 1234, 78);
    let extent = runtime().block_on(async {
        let c = node.client().await;
        // Written short-circuit in pieces that straddle blocks: each block
        // follows the one before in one extent file, at its file offset.
        put(&c, "/model", &model, &spec(BS), 300_000).await;
        let fb = c.blocks("/model").await.unwrap();
        assert_eq!(fb.blocks.len(), 6);
        let extent = fb
            .backing_file()
            .unwrap_or_else(|| panic!("one file: {fb:#?}"))
            .to_string();
        assert!(extent.starts_with(&mem.display().to_string()), "{extent}");
        assert_eq!(std::fs::read(&extent).unwrap(), model);
        for (i, b) in fb.blocks.iter().enumerate() {
            assert_eq!(b.replicas[0].offset, i as u64 * BS);
        }
        // No block file of its own, nothing left in tmp; the tier counts
        // the file's bytes once.
        let own = std::fs::read_dir(mem.join("blocks"))
            .unwrap()
            .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
            .count();
        assert_eq!(own, 0);
        assert_eq!(std::fs::read_dir(mem.join("tmp")).unwrap().count(), 0);
        let report = c.report().await.unwrap();
        let mem_tier = &report.nodes[0].tiers[0];
        assert_eq!((mem_tier.used, mem_tier.blocks), (model.len() as u64, 6));
        // Asked to lay it out, the node has nothing to do.
        assert_eq!(c.assemble("/model").await.unwrap(), fb);
        // Every reader finds the bytes; scrub checks each block in place.
        for sc in [true, false] {
            assert!(get(&client(&node, sc).await, "/model").await == model);
        }
        scrub_is_clean(&node);
        // A writer that seeks back writes a block of its own: the rest of
        // the file stays in the extent, and a second file written in order
        // gets an extent of its own.
        let mut w = FileWriter::open(
            &c,
            "/model",
            &WriteOptions {
                create: false,
                truncate: false,
                ..spec(BS)
            },
        )
        .await
        .unwrap();
        w.seek(BS + 10).await.unwrap();
        w.write(b"patched").await.unwrap();
        w.close().await.unwrap();
        let mut patched = model.clone();
        patched[BS as usize + 10..][..7].copy_from_slice(b"patched");
        assert!(get(&c, "/model").await == patched);
        let fb = c.blocks("/model").await.unwrap();
        assert!(fb.backing_file().is_none());
        assert_eq!(fb.blocks[0].replicas[0].path.as_deref(), Some(&extent[..]));
        let other = data(2 * BS as usize, 79);
        put(&c, "/other", &other, &spec(BS), 1 << 20).await;
        let second = c.blocks("/other").await.unwrap();
        assert_ne!(second.backing_file().expect("one file"), extent);
        extent
    });
    // After a restart the store finds the blocks in the extent file.
    node.restart(&["-c", &tiers]);
    runtime().block_on(async {
        let c = node.client().await;
        let mut patched = model.clone();
        patched[BS as usize + 10..][..7].copy_from_slice(b"patched");
        assert!(get(&c, "/model").await == patched);
        // Removing the file removes the extent file with its last block.
        c.remove("/model", false).await.unwrap();
        wait_for_async(
            "the extent file removed",
            Duration::from_secs(30),
            || async { (!std::path::Path::new(&extent).exists()).then_some(()) },
        )
        .await;
        let report = c.report().await.unwrap();
        assert_eq!(report.nodes[0].tiers[0].used, 2 * BS);
    });
}

#[test]
fn enospc_when_every_tier_is_full_and_nothing_written_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!("data.tiers=[MEM:5MiB]{}", dir.path().join("mem").display());
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    runtime().block_on(async {
        let c = node.client().await;
        let first = data(3 * BS as usize, 1);
        put(&c, "/first", &first, &spec(BS), 1 << 20).await;
        let mut w = FileWriter::open(&c, "/second", &spec(BS)).await.unwrap();
        let mut err = None;
        for part in data(4 * BS as usize, 2).chunks(1 << 20) {
            if let Err(e) = w.write(part).await {
                err = Some(e);
                break;
            }
        }
        let err = match err {
            Some(e) => e,
            None => w.close().await.unwrap_err(),
        };
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert!(err.to_string().contains("tier MEM"), "{err}");
        assert!(get(&c, "/first").await == first);
        // The CLI says the same.
        let src = dir.path().join("big");
        std::fs::write(&src, data(4 * BS as usize, 3)).unwrap();
        let out = node.cli(&[
            "fs",
            "put",
            "--block-size",
            "1MiB",
            src.to_str().unwrap(),
            "/third",
        ]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("no space left on device") && stderr.contains("MEM"),
            "{stderr}"
        );
    });
}

/// Many writers of small files at once on a tier far smaller than one
/// block per writer (24 MiB against 64 MiB blocks): each reserves room as
/// it writes, not a whole block, so all of them fit, through short-circuit
/// and through the data port; a larger file grows its reservation as it
/// goes; the tier's reservations are all given back.
#[test]
fn many_small_file_writers_fit_a_tier_smaller_than_their_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!("data.tiers=[MEM:24MiB]{}", dir.path().join("mem").display());
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    runtime().block_on(async {
        for short_circuit in [true, false] {
            let c = client(&node, short_circuit).await;
            let writers: Vec<_> = (0..16u64)
                .map(|w| {
                    let c = c.clone();
                    tokio::spawn(async move {
                        for f in 0..2u64 {
                            let path = format!("/small-{short_circuit}-{w}-{f}");
                            let bytes = data(100_000, w * 10 + f);
                            put(&c, &path, &bytes, &WriteOptions::create(), 16 << 10).await;
                        }
                    })
                })
                .collect();
            for w in writers {
                w.await.expect("a writer failed");
            }
            for w in 0..16u64 {
                for f in 0..2u64 {
                    let path = format!("/small-{short_circuit}-{w}-{f}");
                    assert!(get(&c, &path).await == data(100_000, w * 10 + f), "{path}");
                }
            }
            let big = data(3 << 20, 99);
            let path = format!("/big-{short_circuit}");
            put(&c, &path, &big, &WriteOptions::create(), 128 << 10).await;
            assert!(get(&c, &path).await == big);
        }
        let report = node.client().await.report().await.unwrap();
        let mem = &report.nodes[0].tiers[0];
        assert_eq!(mem.reserved, 0, "{mem:?}");
        assert_eq!(mem.used, 2 * (32 * 100_000 + (3 << 20)), "{mem:?}");
    });
}

#[test]
fn the_data_port_refuses_bad_peers_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    let rt = runtime();
    let (data_addr, bytes) = rt.block_on(async {
        let c = node.client().await;
        let bytes = data(BS as usize, 9);
        put(&c, "/ok", &bytes, &spec(BS), 1 << 20).await;
        let report = c.report().await.unwrap();
        (report.nodes[0].data_addr.clone(), bytes)
    });
    // Garbage instead of a hello.
    let mut s = std::net::TcpStream::connect(&data_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    assert!(String::from_utf8_lossy(&buf).contains("data port"));
    // A good hello, then a read with a forged token.
    let mut s = std::net::TcpStream::connect(&data_addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = curvine_messages::block::DATA_MAGIC.to_vec();
    hello.extend_from_slice(&curvine_messages::block::DATA_VERSION.to_be_bytes());
    s.write_all(&hello).unwrap();
    let forged = curvine_messages::block::DataRequest::Read {
        token: curvine_messages::block::Token {
            block: 1,
            access: curvine_messages::block::Access::Read,
            expires_s: u64::MAX,
            mac: [0; 16],
        },
        offset: 0,
        len: 100,
    };
    let frame = curvine_messages::codec::to_bytes(
        "req",
        &curvine_messages::block::DataFrameRef {
            trace: None,
            request: &forged,
        },
    )
    .unwrap();
    s.write_all(&(frame.len() as u32).to_be_bytes()).unwrap();
    s.write_all(&frame).unwrap();
    let mut read_reply = || {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut payload).unwrap();
        curvine_messages::codec::from_bytes::<curvine_messages::block::DataReply>("reply", &payload)
            .unwrap()
    };
    assert!(matches!(
        read_reply(),
        curvine_messages::block::DataReply::Hello { accepted: true, .. }
    ));
    match read_reply() {
        curvine_messages::block::DataReply::Error(e) => {
            assert!(e.to_string().contains("invalid access token"), "{e}")
        }
        other => panic!("a forged token was answered with {other:?}"),
    }
    // A frame that claims to be huge closes the connection.
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    // The node still serves everyone else.
    rt.block_on(async {
        let c = client(&node, false).await;
        assert!(get(&c, "/ok").await == bytes);
    });
    assert!(node.log_text().contains("data connection closed"));
}

/// Sends SIGCONT to a stopped process when dropped.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        // SAFETY: signalling a child process of this test.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_node_that_stops_answering_mid_read_fails_it_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    // Blocks larger than what the sockets between client and node buffer,
    // so the node stops in the middle of a block's stream.
    let block = 32 << 20;
    let bytes = data(2 * block as usize, 5);
    let rt = runtime();
    rt.block_on(async {
        put(
            &client(&node, false).await,
            "/stall",
            &bytes,
            &spec(block),
            1 << 20,
        )
        .await;
    });
    let conf = ClientConf {
        short_circuit: false,
        request_timeout: curvine_conf::Dur(Duration::from_secs(2)),
        ..node.client_conf()
    };
    let started = rt.block_on(async {
        let c = Client::connect(&conf).await.unwrap();
        let mut r = FileReader::open(&c, "/stall").await.unwrap();
        let mut first = vec![0u8; 64 << 10];
        let n = r.read(&mut first).await.unwrap();
        assert!(n > 0 && first[..n] == bytes[..n]);
        // The node freezes (it neither answers nor closes its connections).
        let _frozen = Stopped::stop(node.pid().unwrap());
        let started = Instant::now();
        let mut rest = Vec::new();
        let e = r.read_to_end(&mut rest).await.unwrap_err();
        assert!(
            matches!(e, FsError::Io(_) | FsError::TimedOut(_)),
            "a stalled read failed with {e:?}"
        );
        assert!(
            e.to_string().contains("nothing moved"),
            "the error does not say the node stalled: {e}"
        );
        started
    });
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(30),
        "a read of a frozen node waited {waited:?} with a 2s request timeout"
    );
    // Thawed, the node serves the file whole.
    rt.block_on(async {
        assert!(get(&client(&node, false).await, "/stall").await == bytes);
    });
}

#[test]
fn a_node_killed_during_writes_keeps_acknowledged_files() {
    let dir = tempfile::tempdir().unwrap();
    let extra = ["-c", "data.orphan_grace=2s", "-c", "data.write_lease=2s"];
    let mut node = NodeProcess::start(&dir.path().join("n"), &extra);
    let rt = runtime();
    let mut done: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..4u64 {
        let c = rt.block_on(node.client());
        let (finished, unfinished) = rt.block_on(async {
            let mut finished = Vec::new();
            for i in 0..3 {
                let path = format!("/k{round}-{i}");
                let bytes = data(BS as usize + 4321 * i, round * 10 + i as u64);
                put(&c, &path, &bytes, &spec(BS), 1 << 20).await;
                finished.push((path, bytes));
            }
            // A writer in the middle of a file when the node dies.
            let path = format!("/k{round}-open");
            let mut w = FileWriter::open(&c, &path, &spec(BS)).await.unwrap();
            w.write(&data(2 * BS as usize + 5, 99)).await.unwrap();
            std::mem::forget(w);
            (finished, path)
        });
        done.extend(finished);
        node.restart(&extra);
        let c = rt.block_on(node.client());
        rt.block_on(async {
            for (path, bytes) in &done {
                assert!(
                    get(&c, path).await == *bytes,
                    "{path} after restart {round}"
                );
            }
            let attr = c.stat(&unfinished).await.unwrap();
            assert!(
                attr.writing.is_some(),
                "the unfinished file is reported as being written"
            );
            assert_eq!(attr.size, 0, "no half-file is visible as complete");
            // The abandoned file's lease expires; its blocks go with it.
            c.remove(&unfinished, false).await.unwrap();
        });
    }
    // A block no file knows (written straight to the data port with a valid
    // token) is removed once the grace period is over.
    let identity = std::fs::read_to_string(dir.path().join("n").join("identity.toml")).unwrap();
    let cookie = identity
        .lines()
        .find_map(|l| l.strip_prefix("cookie = "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let key = curvine_actors::token::TokenKey::new(&cookie, Duration::from_secs(600));
    let orphan = curvine_messages::make_id(3, 1 << 40);
    let data_addr = rt.block_on(async {
        node.client().await.report().await.unwrap().nodes[0]
            .data_addr
            .clone()
    });
    raw_write(
        &data_addr,
        key.issue(orphan, curvine_messages::block::Access::Write),
        b"stray",
    );
    // No leaked blocks: only the blocks of the acknowledged files remain.
    rt.block_on(async {
        let c = node.client().await;
        let mut live = 0;
        for (path, _) in &done {
            live += c.blocks(path).await.unwrap().blocks.len() as u64;
        }
        wait_for_async(
            format!("the node to keep only the {live} blocks of the acknowledged files"),
            Duration::from_secs(30),
            || async { (node_blocks(&c).await == live).then_some(()) },
        )
        .await;
    });
}

/// Writes one block over a raw data-port connection.
fn raw_write(addr: &str, token: curvine_messages::block::Token, bytes: &[u8]) {
    use curvine_messages::block::{DataReply, DataRequest, DATA_MAGIC, DATA_VERSION};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let mut hello = DATA_MAGIC.to_vec();
    hello.extend_from_slice(&DATA_VERSION.to_be_bytes());
    s.write_all(&hello).unwrap();
    let reply = |s: &mut std::net::TcpStream| {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut payload).unwrap();
        curvine_messages::codec::from_bytes::<DataReply>("reply", &payload).unwrap()
    };
    reply(&mut s);
    let req = curvine_messages::codec::to_bytes(
        "req",
        &curvine_messages::block::DataFrameRef {
            trace: None,
            request: &DataRequest::Write {
                token,
                tier: None,
                size_hint: bytes.len() as u64,
            },
        },
    )
    .unwrap();
    let mut out = (req.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&req);
    let mut chunk = Vec::new();
    curvine_messages::block::chunk_header(
        bytes.len(),
        &[curvine_messages::block::crc32c(bytes)],
        &mut chunk,
    );
    out.extend_from_slice(&chunk);
    out.extend_from_slice(bytes);
    out.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&out).unwrap();
    assert!(matches!(reply(&mut s), DataReply::Ready));
    assert!(matches!(reply(&mut s), DataReply::Committed { len: 5, .. }));
}

/// The readers of one client keep at most `client.read_buffer_budget` of
/// what they streamed last together (one chunk each past it), and nothing
/// once closed; under the default budget one reader keeps up to 16 MiB.
#[test]
fn readers_keep_what_they_streamed_within_the_clients_budget() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    curvine_integration::runtime().block_on(async {
        let bytes = data(24 << 20, 90);
        let writer = client(&node, false).await;
        put(&writer, "/big", &bytes, &spec(8 << 20), 1 << 20).await;
        let read_all = |c: Client, bytes: Vec<u8>| async move {
            let mut readers = Vec::new();
            let mut most = 0;
            for _ in 0..3 {
                let mut r = FileReader::open(&c, "/big").await.unwrap();
                let mut buf = vec![0u8; 1 << 20];
                let mut seen = Vec::new();
                loop {
                    let n = r.read(&mut buf).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    most = most.max(c.read_buffers());
                }
                assert!(seen == bytes);
                readers.push(r);
            }
            drop(readers);
            (most, c.read_buffers())
        };
        let budget = 4 << 20;
        let small = Client::connect(&ClientConf {
            short_circuit: false,
            read_buffer_budget: curvine_conf::ByteSize(budget as u64),
            ..node.client_conf()
        })
        .await
        .unwrap();
        let (most, left) = read_all(small, bytes.clone()).await;
        assert!(most <= budget + 3 * MAX_CHUNK, "kept {most} bytes");
        assert_eq!(left, 0, "closed readers keep nothing");
        let default = client(&node, false).await;
        let (most, left) = read_all(default, bytes.clone()).await;
        assert!(
            most > budget + 3 * MAX_CHUNK,
            "the default keeps more: {most}"
        );
        assert_eq!(left, 0);
    });
}
