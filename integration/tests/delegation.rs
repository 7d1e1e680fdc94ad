//! Directory delegations on real processes: a node and a FUSE mount that
//! creates many files in one directory. The mount answers those creates
//! itself and sends them in batches; every file whose close returned is in
//! the cluster with its content; another client that creates, lists or
//! looks up names in the directory meanwhile sees every file closed
//! before, and the mount goes on creating afterwards.

use std::fs::{self, File};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use curvine_client::io::FileReader;
use curvine_integration::{runtime, FuseMount, NodeProcess};

fn content(i: usize) -> Vec<u8> {
    format!("file {i} ").repeat(i % 40 + 1).into_bytes()
}

/// Writes files `from..to` into `dir` from `threads` threads; returns the
/// names whose close returned.
fn write_files(dir: &std::path::Path, from: usize, to: usize, threads: usize) -> Vec<usize> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(from));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let next = next.clone();
            let dir = dir.to_path_buf();
            std::thread::spawn(move || {
                let mut closed = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= to {
                        return closed;
                    }
                    let mut f = File::create(dir.join(format!("f{i:05}"))).unwrap();
                    if !i.is_multiple_of(5) {
                        f.write_all(&content(i)).unwrap();
                    }
                    f.sync_all().unwrap();
                    drop(f);
                    closed.push(i);
                }
            })
        })
        .collect();
    let mut all: Vec<usize> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    all
}

fn expected(i: usize) -> Vec<u8> {
    if i.is_multiple_of(5) {
        Vec::new()
    } else {
        content(i)
    }
}

#[test]
fn creates_answered_by_the_mount_reach_the_cluster_and_others_see_them() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    fs::create_dir(m.path("d")).unwrap();
    let closed = write_files(&m.path("d"), 0, 400, 8);
    assert_eq!(closed.len(), 400);

    // Most creates were answered by the mount and sent in batches.
    let batches = m.counter("curvine_client_calls_total", "call=\"DirOps\"");
    let opens = m.counter("curvine_client_calls_total", "call=\"OpenFile\"");
    assert!(batches > 0, "no batch of creates was sent");
    assert!(batches < 400, "{batches} batches for 400 creates");
    assert!(
        opens < 40,
        "{opens} of 400 creates went to the node one by one"
    );

    // Another client sees every file closed, whole; its own create in the
    // directory the mount holds waits for the mount to give it back.
    let client = runtime().block_on(node.client());
    runtime().block_on(async {
        client.touch("/d/other").await.unwrap();
        assert_eq!(client.list_all("/d").await.unwrap().len(), 401);
        for i in [0usize, 1, 7, 199, 399] {
            let mut r = FileReader::open(&client, &format!("/d/f{i:05}"))
                .await
                .unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).await.unwrap();
            assert_eq!(out, expected(i), "file {i}");
        }
    });
    assert!(m.path("d/other").exists());
    assert_eq!(fs::read_dir(m.path("d")).unwrap().count(), 401);

    // The mount goes on creating there, while another client keeps
    // looking up names in the directory, present and absent.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        let client = client.clone();
        std::thread::spawn(move || {
            let mut looks = 0;
            while !stop.load(Ordering::SeqCst) {
                runtime().block_on(async {
                    client.stat("/d/f00003").await.unwrap();
                    assert!(client.stat("/d/never").await.is_err());
                });
                looks += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            looks
        })
    };
    let more = write_files(&m.path("d"), 400, 800, 8);
    stop.store(true, Ordering::SeqCst);
    assert!(prober.join().unwrap() > 0);
    assert_eq!(more.len(), 400);
    for i in 0..800usize {
        assert_eq!(
            fs::read(m.path(&format!("d/f{i:05}"))).unwrap(),
            expected(i),
            "file {i} through the mount"
        );
    }
    runtime().block_on(async {
        assert_eq!(client.list_all("/d").await.unwrap().len(), 801);
    });
    let fsck = node.cli_ok(&["admin", "fsck"]);
    assert!(fsck.contains("namespace is consistent"), "{fsck}");
}

#[test]
fn files_written_under_a_temporary_name_and_renamed_keep_the_directory() {
    // What rclone does per file: create NAME.partial, write, close, rename
    // to NAME (a name the directory lacks).
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    fs::create_dir(m.path("r")).unwrap();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let next = next.clone();
            let d = m.path("r");
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= 300 {
                    return;
                }
                let tmp = d.join(format!("p{i:04}.partial"));
                fs::write(&tmp, content(i)).unwrap();
                fs::rename(&tmp, d.join(format!("p{i:04}"))).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let batches = m.counter("curvine_client_calls_total", "call=\"DirOps\"");
    let releases = m.counter("curvine_client_calls_total", "call=\"ReleaseDelegation\"");
    let renames = m.counter("curvine_client_calls_total", "call=\"Rename\"");
    assert!(batches > 0, "no batch sent");
    assert!(
        renames < 30,
        "{renames} of 300 renames went to the node one by one"
    );
    assert!(
        releases < 10,
        "the directory was given back {releases} times"
    );
    let client = runtime().block_on(node.client());
    runtime().block_on(async {
        let names: Vec<String> = client
            .list_all("/r")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 300, "{names:?}");
        assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
        for i in [0usize, 150, 299] {
            let mut r = FileReader::open(&client, &format!("/r/p{i:04}"))
                .await
                .unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).await.unwrap();
            assert_eq!(out, content(i), "file {i}");
        }
    });
}

#[test]
fn a_mount_started_with_no_delegations_sends_each_create() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &["--no-delegations"]);
    fs::create_dir(m.path("d")).unwrap();
    assert_eq!(write_files(&m.path("d"), 0, 50, 4).len(), 50);
    assert_eq!(
        m.counter("curvine_client_calls_total", "call=\"DirOps\""),
        0
    );
    assert_eq!(
        m.counter("curvine_client_calls_total", "call=\"OpenFile\""),
        50
    );
    drop(node);
}

#[test]
fn attributes_set_through_a_file_being_created_go_with_its_close() {
    // What tar x does per file: create, write, then set times, owner and
    // mode through the open file, then close it.
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let src = dir.path().join("src/d");
    fs::create_dir_all(&src).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    for i in 0..40usize {
        let p = src.join(format!("f{i:03}"));
        let f = File::create(&p).unwrap();
        if i % 4 != 0 {
            fs::write(&p, content(i)).unwrap();
        }
        f.set_modified(mtime).unwrap();
        std::os::unix::fs::chown(&p, Some(1234), Some(567)).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o4750)).unwrap();
    }
    let archive = dir.path().join("a.tar");
    let tar = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new("tar")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tar: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    tar(&[
        "cf".as_ref(),
        archive.as_os_str(),
        "-C".as_ref(),
        src.parent().unwrap().as_os_str(),
        "d".as_ref(),
    ]);
    let before = m.counter("curvine_client_calls_total", "call=\"SetAttrs\"");
    tar(&[
        "xf".as_ref(),
        archive.as_os_str(),
        "-C".as_ref(),
        m.path("").as_os_str(),
    ]);
    // Each file's times, owner and mode (tar sets them through the open
    // file) went in its close's commit: the only changes of attributes on
    // their own are the directory's (times, owner, mode).
    let setattrs = m.counter("curvine_client_calls_total", "call=\"SetAttrs\"") - before;
    assert!(
        setattrs <= 3,
        "{setattrs} attribute changes on their own for 40 files and a directory"
    );
    // Another client sees every file whole, with its attributes.
    let client = runtime().block_on(node.client());
    runtime().block_on(async {
        for i in 0..40usize {
            let path = format!("/d/f{i:03}");
            let a = client.stat(&path).await.unwrap();
            assert_eq!(a.mode & 0o7777, 0o4750, "{path}");
            assert_eq!((a.uid, a.gid), (1234, 567), "{path}");
            assert_eq!(a.mtime_ns, 1_600_000_000 * 1_000_000_000, "{path}");
            let mut r = FileReader::open(&client, &path).await.unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).await.unwrap();
            let want = if i % 4 != 0 { content(i) } else { Vec::new() };
            assert_eq!(out, want, "{path}");
        }
    });

    // Through the mount, held changes show before the close.
    let p = m.path("d/new");
    let mut f = File::create(&p).unwrap();
    f.write_all(b"some bytes").unwrap();
    f.set_modified(mtime).unwrap();
    std::os::unix::fs::fchown(&f, Some(1234), Some(567)).unwrap();
    f.set_permissions(fs::Permissions::from_mode(0o4750))
        .unwrap();
    let seen = fs::metadata(&p).unwrap();
    assert_eq!(seen.mode() & 0o7777, 0o4750);
    assert_eq!((seen.uid(), seen.gid()), (1234, 567));
    assert_eq!(seen.mtime(), 1_600_000_000);
    // Not a terminal, and no error logged for asking.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, [0u8; 64].as_mut_ptr()) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    drop(f);
    let a = runtime().block_on(client.stat("/d/new")).unwrap();
    assert_eq!((a.mode & 0o7777, a.uid, a.gid), (0o4750, 1234, 567));
    assert_eq!(a.size, 10);
    assert!(!m.log_text().contains("ioctl"), "{}", m.log_text());
}
