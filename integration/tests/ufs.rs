//! UFS mounts on real node processes against the real test S3 server:
//! cache_mode read-through and write-through, objects changing underneath,
//! mount errors, and secrets kept out of every output.

use std::cell::RefCell;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use curvine_client::io::FileReader;
use curvine_integration::{
    random_bytes, runtime, wait_for, wait_for_async, Lazily, NodeProcess, TestS3, FAST_PERSIST,
};
use curvine_messages::FsError;

fn node(dir: &std::path::Path) -> NodeProcess {
    NodeProcess::start(&dir.join("n"), &[])
}

fn mount(node: &NodeProcess, s3: &TestS3, location: &str, path: &str, extra: &[&str]) -> String {
    let mut args: Vec<String> = vec!["mount".into(), location.into(), path.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(s3.props());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.cli_ok(&args)
}

#[test]
fn cache_mode_reads_through_and_keeps_what_it_read() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let loc = s3.location("readthrough");
    let ufs = s3.ufs(&loc);
    let big = random_bytes(5 * 1024 * 1024 + 123, 7);
    runtime().block_on(async {
        ufs.write_all("hello.txt", b"hello from s3\n".to_vec())
            .await
            .unwrap();
        ufs.write_all("data/big.bin", big.clone()).await.unwrap();
        for i in 0..30 {
            ufs.write_all(&format!("many/f{i:02}"), vec![b'x'; i])
                .await
                .unwrap();
        }
    });
    let out = mount(&node, &s3, &loc, "/s3", &["--block-size", "1MiB"]);
    assert!(out.contains("cache_mode"), "{out}");

    // Names appear on first access, with the objects' sizes.
    assert_eq!(
        node.cli_ok(&["fs", "cat", "/s3/hello.txt"]),
        "hello from s3\n"
    );
    let ls = node.cli_ok(&["fs", "ls", "/s3"]);
    let names: Vec<&str> = ls.lines().collect();
    assert_eq!(names, ["data", "hello.txt", "many"], "{ls}");
    let many = node.cli_ok(&["fs", "ls", "-l", "/s3/many"]);
    assert_eq!(many.lines().count(), 30, "{many}");
    let f29 = many
        .lines()
        .find(|l| l.ends_with(" f29"))
        .expect("f29 listed");
    assert_eq!(
        f29.split_whitespace().nth(4),
        Some("29"),
        "size of f29: {f29}"
    );
    let stat = node.cli_ok(&["--json", "fs", "stat", "/s3/data/big.bin"]);
    let v: serde_json::Value = serde_json::from_str(stat.trim()).unwrap();
    assert_eq!(v["size"], big.len() as u64, "{stat}");
    assert_eq!(v["ufs"]["state"], "persisted", "{stat}");

    // A read streams from the UFS and leaves every block cached.
    let before = node.cli_ok(&["fs", "blocks", "/s3/data/big.bin"]);
    assert!(
        before.contains("in 0 blocks"),
        "nothing cached yet: {before}"
    );
    let got = dir.path().join("big.out");
    node.cli_ok(&["fs", "get", "/s3/data/big.bin", got.to_str().unwrap()]);
    assert!(
        std::fs::read(&got).unwrap() == big,
        "read-through content differs"
    );
    // A fill records its block just after its last bytes reach the reader.
    wait_blocks(&node, "/s3/data/big.bin", 6, Duration::from_secs(10));

    // Cached reads no longer need the UFS object (within the check interval).
    runtime().block_on(async {
        let client = node.client().await;
        let mut r = FileReader::open(&client, "/s3/data/big.bin").await.unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        assert!(out == big);
    });
}

#[test]
fn an_object_changed_underneath_is_read_anew_never_mixed() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let loc = s3.location("changed");
    let ufs = s3.ufs(&loc);
    let first = random_bytes(3 * 1024 * 1024, 1);
    let second = random_bytes(2 * 1024 * 1024 + 5, 2);
    runtime()
        .block_on(ufs.write_all("obj", first.clone()))
        .unwrap();
    mount(
        &node,
        &s3,
        &loc,
        "/m",
        &["--block-size", "1MiB", "--check-interval", "0s"],
    );
    let got = dir.path().join("out");
    node.cli_ok(&["fs", "get", "/m/obj", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == first);
    std::thread::sleep(Duration::from_millis(1100));
    runtime()
        .block_on(ufs.write_all("obj", second.clone()))
        .unwrap();
    // The next open sees the new object: new size, new bytes.
    node.cli_ok(&["fs", "get", "/m/obj", got.to_str().unwrap()]);
    assert!(
        std::fs::read(&got).unwrap() == second,
        "the new content is read"
    );
    // A fill records its block just after its last bytes reach the reader.
    wait_blocks(&node, "/m/obj", 3, Duration::from_secs(10));
    let blocks = node.cli_ok(&["fs", "blocks", "/m/obj"]);
    assert!(
        blocks.contains(&format!("{} bytes in 3 blocks", second.len())),
        "{blocks}"
    );

    // A reader that opened the old object and reads on after it changed
    // gets ESTALE, not a mix of both.
    runtime().block_on(async {
        std::thread::sleep(Duration::from_millis(1100));
        ufs.write_all("obj", first.clone()).await.unwrap();
        let client = node.client().await;
        let mut r = FileReader::open(&client, "/m/obj").await.unwrap();
        let mut buf = vec![0u8; 1024 * 1024];
        let n = r.read_full_at(0, &mut buf).await.unwrap();
        assert_eq!(&buf[..n], &first[..n]);
        std::thread::sleep(Duration::from_millis(1100));
        ufs.write_all("obj", second.clone()).await.unwrap();
        let e = r.read_full_at(2 * 1024 * 1024, &mut buf).await.unwrap_err();
        assert!(matches!(e, FsError::Stale(_)), "{e}");
        assert_eq!(e.errno(), libc::ESTALE);
    });

    // An object deleted in the UFS disappears here too.
    runtime().block_on(ufs.delete("obj")).unwrap();
    let out = node.cli(&["fs", "cat", "/m/obj"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no such file"), "{err}");
    assert!(!node.cli_ok(&["fs", "ls", "/m"]).contains("obj"));
}

#[test]
fn cache_mode_writes_deletes_and_renames_reach_the_ufs() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let loc = s3.location("writes");
    let ufs = s3.ufs(&loc);
    mount(&node, &s3, &loc, "/w", &["--block-size", "1MiB"]);
    // A large file goes up in parts (ufs.part_size is 8MiB).
    let big = random_bytes(18 * 1024 * 1024 + 77, 3);
    let src = dir.path().join("big");
    std::fs::write(&src, &big).unwrap();
    node.cli_ok(&["fs", "mkdir", "-p", "/w/a/b"]);
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/w/a/b/big"]);
    runtime().block_on(async {
        let obj = ufs.stat("a/b/big").await.unwrap().expect("uploaded");
        assert_eq!(obj.len, big.len() as u64);
        assert!(ufs.read_all("a/b/big").await.unwrap() == big);
        assert!(ufs.stat("a/b").await.unwrap().unwrap().is_dir);
    });
    let stat = node.cli_ok(&["--json", "fs", "stat", "/w/a/b/big"]);
    assert!(stat.contains("\"persisted\""), "{stat}");
    node.cli_ok(&["fs", "touch", "/w/empty"]);
    node.cli_ok(&["fs", "mv", "/w/a/b/big", "/w/moved"]);
    node.cli_ok(&["fs", "mv", "/w/a", "/w/c"]);
    node.cli_ok(&["fs", "rm", "/w/empty"]);
    runtime().block_on(async {
        assert_eq!(ufs.stat("a/b/big").await.unwrap(), None);
        assert_eq!(
            ufs.stat("moved").await.unwrap().unwrap().len,
            big.len() as u64
        );
        assert_eq!(ufs.stat("a").await.unwrap(), None, "the directory moved");
        assert!(ufs.stat("c/b").await.unwrap().unwrap().is_dir);
        assert_eq!(ufs.stat("empty").await.unwrap(), None);
    });
    // The moved file still reads from the cache.
    let got = dir.path().join("got");
    node.cli_ok(&["fs", "get", "/w/moved", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == big);
    // A name the UFS already has is not created anew: it is that object.
    runtime()
        .block_on(ufs.write_all("preexisting", b"old".to_vec()))
        .unwrap();
    let out = node.cli(&["fs", "mkdir", "/w/preexisting"]);
    assert!(!out.status.success(), "mkdir over an object must fail");
    assert_eq!(node.cli_ok(&["fs", "cat", "/w/preexisting"]), "old");
    // The UFS cannot hold a FIFO: a clear error naming the mount.
    let err = runtime().block_on(async {
        let client = node.client().await;
        client
            .mknod("/w/pipe", curvine_messages::FileKind::Fifo, 0o644)
            .await
            .unwrap_err()
    });
    assert!(
        matches!(err, FsError::NotSupported(ref m) if m.contains("mount /w")),
        "{err}"
    );
    // Nor a hard link.
    let out = node.cli(&["fs", "ln", "/w/moved", "/w/second"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("hard links under mount /w"),
        "{out:?}"
    );
    // Mount points are not renamed or removed while mounted.
    let out = node.cli(&["fs", "rm", "-r", "/w"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("umount"),
        "{out:?}"
    );
    let out = node.cli(&["fs", "mv", "/w/moved", "/elsewhere"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in the same mount"),
        "{out:?}"
    );
    node.cli_ok(&["umount", "/w"]);
    assert_eq!(node.cli_ok(&["fs", "ls", "/w"]), "");
    assert_eq!(node.cli_ok(&["mount"]), "");
    runtime().block_on(async {
        assert!(
            ufs.stat("moved").await.unwrap().is_some(),
            "umount keeps the objects"
        );
    });
}

#[test]
fn mounts_are_checked_and_secrets_never_shown() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let loc = s3.location("secrets");
    // Wrong secret, missing bucket, unknown property, nested mount: refused, clearly.
    let mut args: Vec<String> = vec!["mount".into(), loc.clone(), "/bad".into()];
    args.extend(s3.props_with("not-the-secret"));
    let out = node.cli(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(err.contains("SignatureDoesNotMatch"), "{err}");
    assert!(!err.contains("not-the-secret"), "{err}");
    let mut args: Vec<String> = vec![
        "mount".into(),
        "s3://curvine-missing-bucket/x".into(),
        "/bad".into(),
    ];
    args.extend(s3.props());
    let err = String::from_utf8_lossy(
        &node
            .cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .stderr,
    )
    .to_string();
    assert!(err.contains("NoSuchBucket"), "{err}");
    let out = node.cli(&["mount", &loc, "/bad", "-c", "s3.nonsense=1"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("s3.nonsense"),
        "{out:?}"
    );
    assert!(
        node.cli_ok(&["fs", "ls", "/"]).trim().is_empty(),
        "a refused mount leaves nothing"
    );

    mount(
        &node,
        &s3,
        &loc,
        "/ok",
        &["--write-type", "fs_mode", "--ttl", "7d"],
    );
    let out = node.cli(&[
        "mount",
        &loc,
        "/ok/inner",
        "-c",
        &format!("s3.endpoint_url={}", s3.endpoint),
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("do not nest"),
        "{out:?}"
    );

    // The secret appears nowhere a user or operator looks.
    let outputs = [
        node.cli_ok(&["mount"]),
        node.cli_ok(&["--json", "mount"]),
        node.cli_ok(&["report"]),
        node.cli_ok(&["--json", "report"]),
        node.cli_ok(&["conf", "show"]),
        node.log_text(),
    ];
    for text in &outputs {
        assert!(!text.contains(&s3.secret), "secret shown: {text}");
    }
    assert!(
        outputs[0].contains("s3.credentials.secret=<redacted>"),
        "{}",
        outputs[0]
    );
    assert!(
        outputs[0].contains("fs_mode") && outputs[0].contains(&loc),
        "{}",
        outputs[0]
    );
    // The table survives a restart of the node.
    let mut node = node;
    node.restart(&[]);
    let listed = node.cli_ok(&["mount"]);
    assert!(listed.contains(&loc) && listed.contains("/ok"), "{listed}");
    assert!(!node.log_text().contains(&s3.secret));
}

/// Polls `fs stat --json` until the file's UFS state is `want`.
fn wait_state(node: &NodeProcess, path: &str, want: &str, within: Duration) -> serde_json::Value {
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("{path} to become {want}: {}", seen.borrow()));
    wait_for(what, within, || {
        let out = node.cli(&["--json", "fs", "stat", path]);
        if !out.status.success() {
            *seen.borrow_mut() = format!("stat {path}: {out:?}");
            return None;
        }
        let v: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        if v["ufs"]["state"] == want {
            return Some(v);
        }
        *seen.borrow_mut() = v.to_string();
        None
    })
}

/// Polls `fs blocks` until the file is cached in `n` blocks.
fn wait_blocks(node: &NodeProcess, path: &str, n: usize, within: Duration) {
    let want = format!("in {n} blocks");
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("`fs blocks {path}` to say {want:?}: {}", seen.borrow()));
    wait_for(what, within, || {
        let listing = node.cli_ok(&["fs", "blocks", path]);
        let done = listing.contains(&want);
        *seen.borrow_mut() = listing;
        done.then_some(())
    });
}

#[test]
fn fs_mode_writes_at_cache_speed_and_persists_in_order() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = node(dir.path());
    let loc = s3.location("fsmode");
    let ufs = s3.ufs(&loc);
    mount(
        &node,
        &s3,
        &loc,
        "/fs",
        &["--write-type", "fs_mode", "--block-size", "1MiB"],
    );
    let content = random_bytes(3 * 1024 * 1024 + 11, 5);
    let src = dir.path().join("src");
    std::fs::write(&src, &content).unwrap();
    node.cli_ok(&["fs", "mkdir", "-p", "/fs/d"]);
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/fs/d/file"]);
    let v = wait_state(&node, "/fs/d/file", "persisted", Duration::from_secs(20));
    runtime().block_on(async {
        let obj = ufs.stat("d/file").await.unwrap().expect("persisted object");
        assert_eq!(obj.len, content.len() as u64);
        assert_eq!(v["ufs"]["etag"], obj.etag.as_str());
        assert!(ufs.read_all("d/file").await.unwrap() == content);
    });

    // Renames and deletes are replayed in order; a name reused after a
    // delete keeps its new content.
    node.cli_ok(&["fs", "mv", "/fs/d/file", "/fs/moved"]);
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/fs/gone"]);
    node.cli_ok(&["fs", "rm", "/fs/gone"]);
    std::fs::write(&src, b"second life").unwrap();
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/fs/gone"]);
    wait_state(&node, "/fs/gone", "persisted", Duration::from_secs(20));
    runtime().block_on(async {
        let seen = RefCell::new(String::new());
        let what = Lazily(|| format!("the rename to be replayed: {}", seen.borrow()));
        wait_for_async(what, Duration::from_secs(20), || async {
            let old = ufs.stat("d/file").await.unwrap();
            let new = ufs.stat("moved").await.unwrap();
            let done = old.is_none() && new.is_some();
            *seen.borrow_mut() = format!("{old:?} {new:?}");
            done.then_some(())
        })
        .await;
        assert!(ufs.read_all("moved").await.unwrap() == content);
        assert_eq!(ufs.read_all("gone").await.unwrap(), b"second life");
    });

    // A persisted file whose cached blocks were dropped reads back from the UFS.
    node.cli_ok(&["fs", "free", "/fs/moved"]);
    wait_blocks(&node, "/fs/moved", 0, Duration::from_secs(10));
    let got = dir.path().join("got");
    node.cli_ok(&["fs", "get", "/fs/moved", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == content);
    // The blocks read are cached again (recorded just after they were sent).
    wait_blocks(&node, "/fs/moved", 4, Duration::from_secs(10));
    node.cli_ok(&["fs", "rm", "-r", "/fs/d"]);

    // A name that is not UTF-8 cannot be an object key: refused at once,
    // never accepted and then left out of the bucket.
    let raw = curvine_messages::names::from_bytes(b"/fs/caf\xe9");
    runtime().block_on(async {
        let client = node.client().await;
        let e = client.mkdir(&raw, false).await.unwrap_err();
        assert!(matches!(e, FsError::IllegalName(_)), "{e}");
        let e = client.rename("/fs/moved", &raw).await.unwrap_err();
        assert!(matches!(e, FsError::IllegalName(_)), "{e}");
    });
    let out = node.cli(&[
        std::ffi::OsStr::new("fs"),
        std::ffi::OsStr::new("put"),
        src.as_os_str(),
        std::ffi::OsStr::from_bytes(b"/fs/caf\xe9"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("/fs/caf\\xe9") && err.contains("holds only UTF-8 names"),
        "{err}"
    );
}

#[test]
fn fs_mode_failed_uploads_retry_and_survive_a_restart() {
    // A local directory as the UFS, so the test can make uploads fail:
    // a file where the upload needs a directory.
    let dir = tempfile::tempdir().unwrap();
    let ufs_dir = dir.path().join("ufs");
    std::fs::create_dir_all(&ufs_dir).unwrap();
    let mut node = NodeProcess::start(&dir.path().join("n"), FAST_PERSIST);
    let loc = format!("file://{}", ufs_dir.display());
    node.cli_ok(&["mount", &loc, "/local", "--write-type", "fs_mode"]);
    std::fs::write(ufs_dir.join("blocker"), b"not a directory").unwrap();
    node.cli_ok(&["fs", "mkdir", "/local/blocker"]);
    let src = dir.path().join("src");
    std::fs::write(&src, b"persist me").unwrap();
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/local/blocker/f"]);
    let v = wait_state(&node, "/local/blocker/f", "failed", Duration::from_secs(20));
    assert!(v["ufs"]["attempts"].as_u64().unwrap() >= 1, "{v}");
    let text = node.cli_ok(&["fs", "stat", "/local/blocker/f"]);
    assert!(text.contains("UFS: failed"), "{text}");
    // Unmounting would drop the only copy: refused while it waits.
    let out = node.cli(&["umount", "/local"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not persisted"),
        "{err}"
    );
    // The node dies with the file not persisted; its cached content stays.
    node.kill();
    std::fs::remove_file(ufs_dir.join("blocker")).unwrap();
    node.restart(&[]);
    assert_eq!(
        node.cli_ok(&["fs", "cat", "/local/blocker/f"]),
        "persist me"
    );
    wait_state(
        &node,
        "/local/blocker/f",
        "persisted",
        Duration::from_secs(20),
    );
    assert_eq!(
        std::fs::read(ufs_dir.join("blocker/f")).unwrap(),
        b"persist me"
    );
    node.cli_ok(&["umount", "/local"]);
}

/// Puts `n` small objects (1-4KiB) under `dir/` and `big` objects of 3MiB
/// plus a bit, 16 requests at a time; returns (name, content) of all.
fn fill_bucket(ufs: &curvine_actors::ufs::Ufs, n: usize, big: usize) -> Vec<(String, Vec<u8>)> {
    use futures::StreamExt;
    let mut objects: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            (
                format!("small/d{}/f{i:04}", i % 7),
                random_bytes(1024 + (i * 37) % 3072, i as u64),
            )
        })
        .collect();
    for i in 0..big {
        objects.push((
            format!("large/l{i}"),
            random_bytes(3 * 1024 * 1024 + 999 * i, 1000 + i as u64),
        ));
    }
    runtime().block_on(async {
        futures::stream::iter(objects.iter())
            .map(|(name, data)| async move {
                ufs.write_all(name, data.clone()).await.expect("put object");
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await;
    });
    objects
}

/// Polls `load-status` until the job ends; returns its JSON.
fn wait_job(node: &NodeProcess, id: &str, within: Duration) -> serde_json::Value {
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("job {id} to end: {}", seen.borrow()));
    wait_for(what, within, || {
        let out = node.cli(&["--json", "load-status", id]);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            if ["done", "failed", "cancelled"].contains(&v["state"].as_str().unwrap_or("")) {
                return Some(v);
            }
        }
        *seen.borrow_mut() = format!("{out:?}");
        None
    })
}

/// Waits until the job has loaded `files` files.
fn wait_progress(node: &NodeProcess, id: &str, files: u64) {
    wait_for(
        format!("job {id} to load {files} files: it makes no progress"),
        Duration::from_secs(60),
        || (job_progress(node, id) >= files).then_some(()),
    );
}

fn job_progress(node: &NodeProcess, id: &str) -> u64 {
    let out = node.cli(&["--json", "load-status", id]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map(|v| v["files_done"].as_u64().unwrap_or(0))
        .unwrap_or(0)
}

#[test]
fn load_spreads_over_the_nodes_and_survives_a_killed_node() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = curvine_integration::ProcessCluster::start(dir.path(), 3, &[]);
    let loc = s3.location("load");
    let ufs = s3.ufs(&loc);
    let objects = fill_bucket(&ufs, 1000, 3);
    let n0 = &cluster.nodes[0];
    mount(n0, &s3, &loc, "/data", &["--block-size", "1MiB"]);
    let started = n0.cli_ok(&["--json", "load", "/data"]);
    let job: serde_json::Value = serde_json::from_str(started.trim()).unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    // Kill a node while the job runs.
    wait_progress(&cluster.nodes[0], &id, 100);
    cluster.nodes[2].kill();
    let n0 = &cluster.nodes[0];
    let done = wait_job(n0, &id, Duration::from_secs(120));
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["files_total"], 1003, "{done}");
    assert_eq!(done["files_failed"], 0, "{done}");
    assert_eq!(done["files_done"], 1003, "{done}");
    let total: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(done["bytes_total"], total, "{done}");
    // Every file reads back whole (blocks on the dead node come from the UFS).
    runtime().block_on(async {
        let client = n0.client().await;
        for (name, data) in objects
            .iter()
            .step_by(41)
            .chain(objects.iter().rev().take(3))
        {
            let mut r = FileReader::open(&client, &format!("/data/{name}"))
                .await
                .unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).await.unwrap();
            assert!(out == *data, "{name} differs");
        }
    });
    // The blocks were spread over the nodes.
    let report = n0.cli_ok(&["--json", "report"]);
    let v: serde_json::Value = serde_json::from_str(&report).unwrap();
    let with_blocks = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["tiers"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["blocks"].as_u64() > Some(0)))
        })
        .count();
    assert!(with_blocks >= 2, "blocks on {with_blocks} nodes: {report}");
    // Loading again without overwrite skips everything cached and unchanged.
    let again = n0.cli_ok(&[
        "--json",
        "load",
        "--wait",
        "--no-overwrite",
        &format!("{loc}/small/d3"),
    ]);
    let v: serde_json::Value = serde_json::from_str(again.trim()).unwrap();
    assert_eq!(v["state"], "done", "{again}");
    assert_eq!(v["files_total"], 143, "{again}");
}

#[test]
fn a_load_job_resumes_after_its_node_restarts_and_reports_failures() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut node = node(dir.path());
    let loc = s3.location("resume");
    let ufs = s3.ufs(&loc);
    let objects = fill_bucket(&ufs, 300, 2);
    mount(&node, &s3, &loc, "/r", &["--block-size", "1MiB"]);
    let started = node.cli_ok(&["--json", "load", "/r"]);
    let id = serde_json::from_str::<serde_json::Value>(started.trim()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_progress(&node, &id, 20);
    node.kill();
    node.restart(&[]);
    let done = wait_job(&node, &id, Duration::from_secs(120));
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["files_total"], 302, "{done}");
    assert_eq!(done["files_failed"], 0, "{done}");
    let out = node.cli(&["fs", "cat", "/r/small/d0/f0000"]);
    assert!(out.status.success());
    assert!(out.stdout == objects[0].1, "content after the resumed load");
    let missing = node.cli(&["load", "--wait", "/r/nothing-here"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stdout).contains("failed"),
        "{missing:?}"
    );

    // A file that cannot be cached (no room) fails the job's --wait, named
    // with its cause; the others load.
    let small = NodeProcess::start(
        &dir.path().join("small"),
        &[
            "-c",
            &format!(
                "data.tiers=[MEM:6MiB]{}",
                dir.path().join("small-mem").display()
            ),
        ],
    );
    let loc2 = s3.location("noroom");
    let ufs2 = s3.ufs(&loc2);
    runtime().block_on(async {
        ufs2.write_all("a", b"fits".to_vec()).await.unwrap();
        ufs2.write_all("huge", random_bytes(9 * 1024 * 1024, 9))
            .await
            .unwrap();
    });
    mount(&small, &s3, &loc2, "/n", &["--block-size", "1MiB"]);
    // `a` first, so the big one cannot take its room.
    small.cli_ok(&["load", "--wait", "/n/a"]);
    let out = small.cli(&["load", "--wait", "--no-overwrite", "/n"]);
    assert!(!out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("failed: /n/huge") && text.contains("no space"),
        "{text}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 2 files failed"),
        "{out:?}"
    );
    assert_eq!(small.cli_ok(&["fs", "cat", "/n/a"]), "fits");
}

#[test]
fn cached_data_expires_after_the_mount_ttl() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", "ufs.persist_sweep=500ms"]);
    let loc = s3.location("ttl");
    let ufs = s3.ufs(&loc);
    let data = random_bytes(200_000, 4);
    runtime()
        .block_on(ufs.write_all("f", data.clone()))
        .unwrap();
    mount(&node, &s3, &loc, "/t", &["--ttl", "2s"]);
    let got = dir.path().join("got");
    node.cli_ok(&["fs", "get", "/t/f", got.to_str().unwrap()]);
    wait_blocks(&node, "/t/f", 1, Duration::from_secs(10));
    // Dropped after the ttl; the file stays and reads from the UFS again.
    wait_blocks(&node, "/t/f", 0, Duration::from_secs(20));
    node.cli_ok(&["fs", "get", "/t/f", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == data);
}

#[test]
fn an_fs_mode_file_closed_on_a_node_that_dies_before_its_upload_is_read_and_persisted() {
    // A local directory as the UFS, shared by both nodes; a file where the
    // upload needs a directory holds the upload back.
    let dir = tempfile::tempdir().unwrap();
    let ufs_dir = dir.path().join("ufs");
    std::fs::create_dir_all(&ufs_dir).unwrap();
    // Three nodes: the shards' groups keep a majority when one dies.
    let mut cluster = curvine_integration::ProcessCluster::start(
        dir.path(),
        3,
        curvine_integration::FAST_PERSIST,
    );
    let loc = format!("file://{}", ufs_dir.display());
    let founder = &cluster.nodes[0];
    founder.cli_ok(&["mount", &loc, "/local", "--write-type", "fs_mode"]);
    std::fs::write(ufs_dir.join("blocker"), b"not a directory").unwrap();
    founder.cli_ok(&["fs", "mkdir", "/local/blocker"]);
    // Written through the second node (which leads no shard: the founder
    // keeps the leadership of the namespace), so its first copy is there.
    let bytes = random_bytes(3 << 20, 17);
    let src = dir.path().join("src");
    std::fs::write(&src, &bytes).unwrap();
    let writer = &cluster.nodes[1];
    writer.cli_ok(&["fs", "put", src.to_str().unwrap(), "/local/blocker/f"]);
    wait_state(
        founder,
        "/local/blocker/f",
        "failed",
        Duration::from_secs(20),
    );
    // Before the close returned, every block had a copy on the writer's
    // node and on another (ufs.pending_replicas = 2).
    runtime().block_on(async {
        let c = founder.client().await;
        let blocks = c.blocks("/local/blocker/f").await.unwrap().blocks;
        assert!(!blocks.is_empty());
        for b in &blocks {
            let mut locs = b.info.locs.clone();
            locs.sort();
            locs.dedup();
            assert!(
                locs.len() >= 2 && locs.contains(&writer.node_id),
                "block {:#x} of a file not yet persisted is on {:?} only",
                b.info.id,
                b.info.locs
            );
        }
    });
    // The writer's node dies before the upload: the file reads whole
    // through the other node, and is persisted once the UFS takes it.
    cluster.nodes[1].kill();
    let founder = &cluster.nodes[0];
    let got = runtime().block_on(async {
        let c = founder.client().await;
        curvine_integration::read_file(&c, "/local/blocker/f").await
    });
    assert!(got.unwrap() == bytes, "the file read back differs");
    std::fs::remove_file(ufs_dir.join("blocker")).unwrap();
    wait_state(
        founder,
        "/local/blocker/f",
        "persisted",
        Duration::from_secs(30),
    );
    assert!(std::fs::read(ufs_dir.join("blocker/f")).unwrap() == bytes);
}

/// A tier full of cached objects makes way for new writes: the least
/// recently used blocks whose data the UFS holds are dropped (the objects
/// still read, from the UFS again), and data only the cache holds is never
/// dropped (a write that would need it gets ENOSPC, and it stays whole).
#[test]
fn a_tier_full_of_cached_objects_makes_room_for_new_writes() {
    let Some(s3) = TestS3::get() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!("data.tiers=[MEM:32MiB]{}", dir.path().join("mem").display());
    let node = NodeProcess::start(&dir.path().join("n"), &["-c", &tiers]);
    let loc = s3.location("makeroom");
    let ufs = s3.ufs(&loc);
    let objects: Vec<Vec<u8>> = (0..3).map(|i| random_bytes(8 << 20, 40 + i)).collect();
    runtime().block_on(async {
        for (i, o) in objects.iter().enumerate() {
            ufs.write_all(&format!("o{i}"), o.clone()).await.unwrap();
        }
    });
    mount(&node, &s3, &loc, "/s3", &["--block-size", "1MiB"]);
    let read = |path: &str| {
        let out = dir.path().join("read.out");
        node.cli_ok(&["fs", "get", path, out.to_str().unwrap()]);
        std::fs::read(&out).unwrap()
    };
    for (i, o) in objects.iter().enumerate() {
        assert!(read(&format!("/s3/o{i}")) == *o);
        wait_blocks(&node, &format!("/s3/o{i}"), 8, Duration::from_secs(10));
    }

    // 20 MiB of new data on a tier of 32 MiB holding 24 MiB of cached objects.
    let local = random_bytes(20 << 20, 50);
    let src = dir.path().join("local.bin");
    std::fs::write(&src, &local).unwrap();
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/local"]);
    assert!(read("/local") == local);
    assert!(
        curvine_integration::node_counter(&node, "curvine_evictions_total", "outcome=\"dropped\"")
            >= 1
    );
    for (i, o) in objects.iter().enumerate() {
        assert!(read(&format!("/s3/o{i}")) == *o, "o{i} read again");
    }

    // 30 MiB more would need /local's blocks, the only copy of its data.
    let more = dir.path().join("more.bin");
    std::fs::write(&more, random_bytes(30 << 20, 51)).unwrap();
    let out = node.cli(&["fs", "put", more.to_str().unwrap(), "/more"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "30 MiB fit beside 20 MiB in 32 MiB");
    assert!(err.contains("No space") || err.contains("no room"), "{err}");
    assert!(read("/local") == local, "the only copy was kept");
}

/// Write-back under pressure: when the tier is full of fs_mode data not
/// yet uploaded, a writer waits for uploads (uploaded blocks are dropped to
/// make room) instead of failing, and gets ENOSPC naming the uploads only
/// when none finishes for `data.upload_wait`. `report` and `/metrics` show
/// what waits.
#[test]
fn write_back_under_pressure_slows_writers_instead_of_failing() {
    // A local directory as the UFS, so the test can hold uploads back: a
    // file where the upload needs a directory.
    let dir = tempfile::tempdir().unwrap();
    let ufs_dir = dir.path().join("ufs");
    std::fs::create_dir_all(&ufs_dir).unwrap();
    let tiers = format!("data.tiers=[MEM:24MiB]{}", dir.path().join("mem").display());
    let mut args = vec!["-c", &tiers, "-c", "data.upload_wait=5s"];
    args.extend(FAST_PERSIST);
    let node = NodeProcess::start(&dir.path().join("n"), &args);
    let loc = format!("file://{}", ufs_dir.display());
    node.cli_ok(&["mount", &loc, "/wb", "--write-type", "fs_mode"]);
    std::fs::write(ufs_dir.join("held"), b"not a directory").unwrap();
    node.cli_ok(&["fs", "mkdir", "/wb/held"]);
    let put = |name: &str, mib: usize, seed: u64| {
        let content = random_bytes(mib << 20, seed);
        let src = dir.path().join(name.replace('/', "-"));
        std::fs::write(&src, &content).unwrap();
        let out = node.cli(&["fs", "put", src.to_str().unwrap(), &format!("/wb/{name}")]);
        (out, content)
    };
    let mut waiting = Vec::new();
    for i in 0..3 {
        let name = format!("held/f{i}");
        let (out, content) = put(&name, 6, 60 + i);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        waiting.push((name, content));
    }
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("report to show 3 files waiting: {}", seen.borrow()));
    wait_for(what, Duration::from_secs(20), || {
        let r = node.cli_ok(&["--json", "report"]);
        let v: serde_json::Value = serde_json::from_str(r.trim()).unwrap();
        let p = v["nodes"][0]["persist"].clone();
        *seen.borrow_mut() = p.to_string();
        (p["files"] == 3 && p["bytes"] == 18u64 << 20).then_some(())
    });
    assert!(node.cli_ok(&["report"]).contains("write-back: 3 file(s)"));
    assert!(
        curvine_integration::node_counter(&node, "curvine_persist_waiting_bytes", "") == 18 << 20
    );

    // No upload finishes: refused after data.upload_wait, naming why.
    let (out, _) = put("refused", 12, 70);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "12 MiB fit beside 18 MiB in 24 MiB");
    assert!(err.contains("upload"), "{err}");

    // Uploads resume while a writer waits: it goes on.
    let blocker = ufs_dir.join("held");
    let unblock = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        std::fs::remove_file(blocker).unwrap();
    });
    let (out, content) = put("next", 12, 71);
    unblock.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        curvine_integration::node_counter(&node, "curvine_writes_waited_for_upload_total", "") >= 1
    );
    let got = dir.path().join("got");
    node.cli_ok(&["fs", "get", "/wb/next", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == content);
    for (name, content) in &waiting {
        wait_state(
            &node,
            &format!("/wb/{name}"),
            "persisted",
            Duration::from_secs(20),
        );
        assert!(std::fs::read(ufs_dir.join(name)).unwrap() == *content);
    }
}
