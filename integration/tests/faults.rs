//! Disk faults on real node processes: a block file flipped or truncated on
//! disk is caught by its checksums and read from another copy or from the
//! UFS, else fails with EIO; `admin scrub` finds every bad block, and with
//! `--repair` drops the copies whose data is whole elsewhere (replicas are
//! restored, UFS blocks read again) and keeps the only copy; a tier
//! directory that turns read-only fails writes with a clear error while
//! reads and metadata keep working.

use std::cell::RefCell;
use std::io::{Seek, SeekFrom, Write};
use std::process::Command;
use std::time::Duration;

use curvine_client::io::{FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_integration::{
    random_bytes, read_file, runtime, wait_for, wait_for_async, write_file, Lazily, NodeProcess,
    ProcessCluster, TestS3,
};

const BS: u64 = 1 << 20;

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// The file holding block `index` of `path` on node `node`, and where the
/// block starts in it (its own file, or an extent file).
fn block_file(via: &NodeProcess, path: &str, index: usize, node: &str) -> (String, u64) {
    let v = json(&via.cli_ok(&["--json", "fs", "blocks", path]));
    let replicas = v["blocks"][index]["replicas"].as_array().unwrap().clone();
    replicas
        .iter()
        .find(|r| r["node_id"] == node)
        .and_then(|r| Some((r["path"].as_str()?.to_string(), r["offset"].as_u64()?)))
        .unwrap_or_else(|| panic!("block {index} of {path} has no copy on {node}: {v}"))
}

fn flip_byte(file: &str, at: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x5a]).unwrap();
    f.sync_all().unwrap();
}

/// `admin scrub` as JSON, and whether it exited 0.
fn scrub(node: &NodeProcess, args: &[&str]) -> (serde_json::Value, bool) {
    let mut all = vec!["--json", "admin", "scrub"];
    all.extend_from_slice(args);
    let out = node.cli(&all);
    (
        json(&String::from_utf8_lossy(&out.stdout)),
        out.status.success(),
    )
}

fn problems_of<'a>(scrubbed: &'a serde_json::Value, node: &str) -> Vec<&'a serde_json::Value> {
    scrubbed
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node)
        .unwrap_or_else(|| panic!("no scrub of {node}: {scrubbed}"))["problems"]
        .as_array()
        .unwrap()
        .iter()
        .collect()
}

#[test]
fn bad_block_files_are_caught_read_elsewhere_and_scrubbed() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = ProcessCluster::start(dir.path(), 2, &["-c", "cluster.rereplicate_after=2s"]);
    let (n0, n1) = (&cluster.nodes[0], &cluster.nodes[1]);
    let rt = runtime();
    let two = random_bytes(3 * BS as usize + 99, 1);
    let one = random_bytes(2 * BS as usize, 2);
    let c = rt.block_on(n0.client());
    rt.block_on(async {
        write_file(&c, "/two", &two, 2).await;
        write_file(&c, "/one", &one, 1).await;
    });
    // A flipped byte in node 0's copy of /two, and node 0's only copy of
    // block 1 of /one cut short.
    let (file, at) = block_file(n0, "/two", 0, &n0.node_id);
    flip_byte(&file, at + 70_000);
    let (short, at) = block_file(n0, "/one", 1, &n0.node_id);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&short)
        .unwrap()
        .set_len(at + 1000)
        .unwrap();

    rt.block_on(async {
        // The other copy serves /two, on the short-circuit path and over
        // the data port alike; /one fails with EIO, never wrong bytes.
        assert!(
            read_file(&c, "/two").await.unwrap() == two,
            "/two read wrong bytes"
        );
        let far = Client::connect(&curvine_conf::ClientConf {
            short_circuit: false,
            ..n0.client_conf()
        })
        .await
        .unwrap();
        assert!(read_file(&far, "/two").await.unwrap() == two);
        let e = read_file(&c, "/one").await.unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "{e}");
    });

    // Scrub finds both, on node 0 only, and says what a repair would do.
    let (found, ok) = scrub(n0, &[]);
    assert!(!ok, "scrub exits 1 when it finds problems: {found}");
    assert!(problems_of(&found, &n1.node_id).is_empty(), "{found}");
    let bad = problems_of(&found, &n0.node_id);
    assert_eq!(bad.len(), 2, "{found}");
    let flipped = bad
        .iter()
        .find(|p| p["problem"].as_str().unwrap().contains("checksum mismatch"))
        .unwrap_or_else(|| panic!("{found}"));
    assert_eq!(flipped["recoverable"], true, "{found}");
    let cut = bad
        .iter()
        .find(|p| p["problem"].as_str().unwrap().starts_with("short"))
        .unwrap_or_else(|| panic!("{found}"));
    assert_eq!(cut["recoverable"], false, "{found}");
    assert!(
        cut["action"].as_str().unwrap().contains("only copy"),
        "{found}"
    );

    // Repair drops the bad replica and keeps the only copy; the replica
    // count comes back, verified.
    let (repaired, ok) = scrub(n0, &["--repair", "--node", &n0.node_id[..6]]);
    assert!(!ok, "the only copy is a problem left: {repaired}");
    let after = problems_of(&repaired, &n0.node_id);
    assert!(
        after.iter().any(|p| p["action"]
            .as_str()
            .unwrap()
            .starts_with("dropped this copy")),
        "{repaired}"
    );
    let seen = RefCell::new(serde_json::Value::Null);
    let what = Lazily(|| format!("the replicas to be restored: {}", seen.borrow()));
    wait_for(what, Duration::from_secs(30), || {
        // Both nodes list the block again, and node 0 holds a file for it
        // (a node names the block files of its own copies only).
        let v = json(&n0.cli_ok(&["--json", "fs", "blocks", "/two"]));
        let locs = v["blocks"][0]["info"]["locs"].as_array().unwrap().len();
        let here = v["blocks"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["node_id"] == n0.node_id.as_str() && !r["path"].is_null());
        *seen.borrow_mut() = v;
        (locs == 2 && here).then_some(())
    });
    let (again, _) = scrub(n1, &[]);
    let left = problems_of(&again, &n0.node_id);
    assert_eq!(left.len(), 1, "{again}");
    assert!(left[0]["problem"].as_str().unwrap().starts_with("short"));
    rt.block_on(async {
        assert!(read_file(&c, "/two").await.unwrap() == two);
    });
    // A bad --node is refused clearly.
    let out = n0.cli(&["admin", "scrub", "--node", "nosuchnode"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no node \"nosuchnode\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_bad_cached_block_of_a_ufs_file_is_read_from_the_ufs_and_refetched() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &[]);
    let loc = s3.location("scrub");
    let content = random_bytes(3 * BS as usize + 5, 3);
    rt_put(&s3, &loc, "big", content.clone());
    let mut args: Vec<String> = vec![
        "mount".into(),
        loc.clone(),
        "/u".into(),
        "--block-size".into(),
        "1MiB".into(),
    ];
    args.extend(s3.props());
    node.cli_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let rt = runtime();
    let c = rt.block_on(node.client());
    rt.block_on(async { assert!(read_file(&c, "/u/big").await.unwrap() == content) });
    let (file, at) = block_file(&node, "/u/big", 1, &node.node_id);
    flip_byte(&file, at + 5);
    // The object still has the bytes: the read goes there.
    rt.block_on(async { assert!(read_file(&c, "/u/big").await.unwrap() == content) });
    let (found, _) = scrub(&node, &[]);
    let bad = problems_of(&found, &node.node_id);
    assert_eq!(bad.len(), 1, "{found}");
    assert_eq!(bad[0]["recoverable"], true, "{found}");
    assert!(
        bad[0]["action"].as_str().unwrap().contains("UFS object"),
        "{found}"
    );
    let (repaired, ok) = scrub(&node, &["--repair"]);
    assert!(ok, "every problem was repaired: {repaired}");
    // Read again: from the object, and cached again, whole (a fill records
    // its block just after its last bytes reach the reader).
    rt.block_on(async { assert!(read_file(&c, "/u/big").await.unwrap() == content) });
    let seen = RefCell::new(serde_json::Value::Null);
    let what = Lazily(|| format!("/u/big cached in 4 blocks: {}", seen.borrow()));
    wait_for(what, Duration::from_secs(10), || {
        let v = json(&node.cli_ok(&["--json", "fs", "blocks", "/u/big"]));
        let done = v["blocks"].as_array().unwrap().len() == 4;
        *seen.borrow_mut() = v;
        done.then_some(())
    });
    let (clean, ok) = scrub(&node, &[]);
    assert!(ok, "{clean}");
}

fn rt_put(s3: &TestS3, loc: &str, key: &str, bytes: Vec<u8>) {
    let ufs = s3.ufs(loc);
    runtime().block_on(async { ufs.write_all(key, bytes).await.unwrap() });
}

/// Runs `mount` with `args`; false when this host does not allow it.
fn mount(args: &[&str]) -> bool {
    Command::new("mount")
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

#[test]
fn a_read_only_tier_fails_writes_clearly_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let tier = dir.path().join("ssd");
    std::fs::create_dir_all(&tier).unwrap();
    let t = tier.to_str().unwrap();
    if !mount(&["--bind", t, t]) {
        eprintln!("skipped: this host does not allow bind mounts (needs root)");
        return;
    }
    struct Unmount(String);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _guard = Unmount(t.to_string());
    let tiers = format!("data.tiers=[SSD:1GiB]{t}");
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    let rt = runtime();
    let c = rt.block_on(node.client());
    let a = random_bytes(BS as usize + 3, 4);
    rt.block_on(write_file(&c, "/a", &a, 1));
    assert!(mount(&["-o", "remount,bind,ro", t]), "remount read-only");
    rt.block_on(async {
        let opts = WriteOptions::create();
        let result = async {
            let mut w = FileWriter::open(&c, "/b", &opts).await?;
            w.write(&random_bytes(BS as usize, 5)).await?;
            w.close().await
        }
        .await;
        let e = result.expect_err("a write to a read-only tier succeeded");
        let text = e.to_string();
        eprintln!("write to a read-only tier: {text}");
        assert!(
            text.contains("read-only") || text.contains("Read-only"),
            "the error names the cause: {text}"
        );
        // Reads and metadata go on.
        assert!(read_file(&c, "/a").await.unwrap() == a);
        c.mkdir("/still", false).await.unwrap();
    });
    assert!(mount(&["-o", "remount,bind,rw", t]), "remount read-write");
    rt.block_on(async {
        let c2 = random_bytes(BS as usize, 6);
        let seen = RefCell::new(String::new());
        let what = Lazily(|| format!("writes to come back: {}", seen.borrow()));
        wait_for_async(what, Duration::from_secs(20), || async {
            let opts = WriteOptions::create();
            let ok = async {
                let mut w = FileWriter::open(&c, "/c", &opts).await?;
                w.write(&c2).await?;
                w.close().await
            }
            .await;
            *seen.borrow_mut() = format!("{ok:?}");
            ok.ok()
        })
        .await;
        assert!(read_file(&c, "/c").await.unwrap() == c2);
    });
}
