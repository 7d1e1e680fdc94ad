//! The FUSE mount on real processes: a node, `curvine-fuse` mounted on a
//! local directory, and ordinary system calls and tools against it.

use std::cell::RefCell;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use curvine_client::io::FileReader;
use curvine_integration::{
    node_counter, random_bytes, runtime, wait_for, FuseMount, Lazily, NodeProcess,
};

fn errno<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn setup(extra: &[&str]) -> (tempfile::TempDir, NodeProcess, FuseMount) {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let mnt = FuseMount::start(&node, &dir.path().join("mnt"), extra);
    (dir, node, mnt)
}

/// Reads a path through the client library (what other clients see).
fn cluster_read(node: &NodeProcess, path: &str) -> Vec<u8> {
    runtime().block_on(async {
        let client = node.client().await;
        let mut r = FileReader::open(&client, path).await.unwrap();
        let mut out = Vec::new();
        r.read_to_end(&mut out).await.unwrap();
        out
    })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn files_directories_and_their_errnos() {
    let (_dir, node, m) = setup(&[]);
    let f = m.path("a.txt");
    fs::write(&f, b"hello").unwrap();
    assert_eq!(fs::read(&f).unwrap(), b"hello");
    // Close-to-open: another client sees the content after the close.
    assert_eq!(cluster_read(&node, "/a.txt"), b"hello");
    // And a file written by a client shows in the mount.
    node.cli_ok(&["fs", "mkdir", "/from-cli"]);
    let src = _dir.path().join("local");
    fs::write(&src, b"from the cli").unwrap();
    node.cli_ok(&["fs", "put", src.to_str().unwrap(), "/from-cli/x"]);
    assert_eq!(fs::read(m.path("from-cli/x")).unwrap(), b"from the cli");

    // O_EXCL, O_APPEND, O_TRUNC.
    assert_eq!(
        errno(OpenOptions::new().write(true).create_new(true).open(&f)),
        libc::EEXIST
    );
    let mut a = OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b" world").unwrap();
    drop(a);
    assert_eq!(fs::read(&f).unwrap(), b"hello world");
    let mut t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&f)
        .unwrap();
    assert_eq!(t.metadata().unwrap().len(), 0);
    t.write_all(b"new").unwrap();
    drop(t);
    assert_eq!(fs::read(&f).unwrap(), b"new");
    assert_eq!(cluster_read(&node, "/a.txt"), b"new");

    // Missing names, wrong kinds.
    assert_eq!(errno(fs::read(m.path("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::read(m.path("a.txt/x"))), libc::ENOTDIR);
    fs::create_dir(m.path("d")).unwrap();
    assert_eq!(errno(fs::create_dir(m.path("d"))), libc::EEXIST);
    fs::write(m.path("d/f"), b"x").unwrap();
    assert_eq!(errno(fs::remove_dir(m.path("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_file(m.path("d"))), libc::EISDIR);
    assert_eq!(errno(fs::read_dir(m.path("a.txt"))), libc::ENOTDIR);
    assert_eq!(
        errno(fs::write(m.path(&"n".repeat(256)), b"")),
        libc::ENAMETOOLONG
    );

    // Modes, owners, times.
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::chown(cpath(&f).as_ptr(), 1234, 5678) }, 0);
    let md = fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let times = [
        libc::timespec {
            tv_sec: 1_000_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 2_000_000,
            tv_nsec: 7,
        },
    ];
    // SAFETY: valid path and two timespecs.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, cpath(&f).as_ptr(), times.as_ptr(), 0) },
        0
    );
    let md = fs::metadata(&f).unwrap();
    assert_eq!(
        (md.atime(), md.mtime(), md.mtime_nsec()),
        (1_000_000, 2_000_000, 7)
    );

    // Symlinks; hard links and special files are not supported.
    std::os::unix::fs::symlink("a.txt", m.path("ln")).unwrap();
    assert_eq!(fs::read_link(m.path("ln")).unwrap(), Path::new("a.txt"));
    assert_eq!(fs::read(m.path("ln")).unwrap(), b"new");
    assert!(fs::symlink_metadata(m.path("ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    fs::hard_link(&f, m.path("hard")).unwrap();
    assert_eq!(fs::metadata(&f).unwrap().nlink(), 2);
    fs::remove_file(m.path("hard")).unwrap();
    // SAFETY: valid path.
    let rc = unsafe { libc::mkfifo(cpath(&m.path("fifo")).as_ptr(), 0o644) };
    assert_eq!(rc, 0);
    // A mode that is no file type at all.
    let rc = unsafe { libc::mknod(cpath(&m.path("odd")).as_ptr(), 0o170644, 0) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // lchown changes the link, not its target.
    // SAFETY: valid path.
    assert_eq!(
        unsafe { libc::lchown(cpath(&m.path("ln")).as_ptr(), 42, 42) },
        0
    );
    assert_eq!(fs::symlink_metadata(m.path("ln")).unwrap().uid(), 42);
    assert_eq!(fs::metadata(&f).unwrap().uid(), 1234);

    // Rename: replace, RENAME_NOREPLACE, RENAME_EXCHANGE.
    fs::write(m.path("r1"), b"one").unwrap();
    fs::write(m.path("r2"), b"two").unwrap();
    let renameat2 = |a: &str, b: &str, flags: u32| {
        // SAFETY: valid paths.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cpath(&m.path(a)).as_ptr(),
                libc::AT_FDCWD,
                cpath(&m.path(b)).as_ptr(),
                flags,
            )
        };
        if rc == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    assert_eq!(renameat2("r1", "r2", libc::RENAME_NOREPLACE), libc::EEXIST);
    assert_eq!(renameat2("r1", "r2", libc::RENAME_EXCHANGE), 0);
    assert_eq!(fs::read(m.path("r1")).unwrap(), b"two");
    assert_eq!(renameat2("r1", "r2", libc::RENAME_EXCHANGE), 0);
    fs::rename(m.path("r1"), m.path("r2")).unwrap();
    assert_eq!(fs::read(m.path("r2")).unwrap(), b"one");
    assert_eq!(errno(fs::metadata(m.path("r1"))), libc::ENOENT);
    fs::rename(m.path("d"), m.path("d2")).unwrap();
    assert_eq!(fs::read(m.path("d2/f")).unwrap(), b"x");
    assert_eq!(
        errno(fs::rename(m.path("d2"), m.path("d2/sub"))),
        libc::EINVAL
    );

    // Extended attributes.
    let xf = cpath(&f);
    let name = CString::new("user.k").unwrap();
    // SAFETY: valid pointers and lengths below.
    unsafe {
        assert_eq!(
            libc::setxattr(xf.as_ptr(), name.as_ptr(), b"v1".as_ptr().cast(), 2, 0),
            0
        );
        assert_eq!(
            libc::setxattr(
                xf.as_ptr(),
                name.as_ptr(),
                b"v2".as_ptr().cast(),
                2,
                libc::XATTR_CREATE
            ),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EEXIST)
        );
        let mut buf = [0u8; 16];
        assert_eq!(
            libc::getxattr(xf.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0),
            2
        );
        assert_eq!(
            libc::getxattr(xf.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 1),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ERANGE)
        );
        assert_eq!(
            libc::getxattr(xf.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16),
            2
        );
        assert_eq!(&buf[..2], b"v1");
        let n = libc::listxattr(xf.as_ptr(), buf.as_mut_ptr().cast(), 16);
        assert_eq!(&buf[..n as usize], b"user.k\0");
        assert_eq!(libc::removexattr(xf.as_ptr(), name.as_ptr()), 0);
        assert_eq!(
            libc::getxattr(xf.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 16),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENODATA)
        );
    }

    // statfs reports the cluster's capacity.
    // SAFETY: zeroed statvfs is a valid out parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cpath(&m.dir).as_ptr(), &mut st) }, 0);
    assert!(st.f_blocks > 0 && st.f_bavail > 0 && st.f_bavail <= st.f_blocks);
    assert_eq!(st.f_namemax, 255);

    // A directory of many entries lists whole (several listing pages).
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..2_500 {
        File::create(m.path(&format!("many/f{i:05}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(m.path("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2_500);
    assert_eq!(names[0], "f00000");
    assert_eq!(names[2_499], "f02499");
}

/// Runs `script` in `sh` as user and group `id` (no other groups), with
/// `$M` the mount point: whether it succeeded, and its stdout and stderr.
fn as_user(id: u32, m: &FuseMount, script: &str) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid", &id.to_string(), "--regid", &id.to_string()])
        .args(["--clear-groups", "--", "sh", "-c", script])
        .env("M", m.path(""))
        .output()
        .expect("setpriv (util-linux)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn a_stream_of_writes_is_not_asked_about_security_capability_each_time() {
    // The mount takes away set-user-ID and set-group-ID itself on writes
    // (FUSE_HANDLE_KILLPRIV_V2), so the kernel no longer asks it for
    // security.capability before every write: that was one request of
    // two on a stream of writes.
    let (_dir, _node, m) = setup(&[]);
    let asked = || m.counter("curvine_fuse_operations_total", "op=\"getxattr\"");
    let mut f = File::create(m.path("stream")).unwrap();
    let before = asked();
    let chunk = vec![7u8; 128 << 10];
    for _ in 0..64 {
        f.write_all(&chunk).unwrap();
    }
    drop(f);
    let during = asked() - before;
    assert!(
        during <= 1,
        "security.capability asked {during} times for 64 writes"
    );
    assert_eq!(fs::metadata(m.path("stream")).unwrap().len(), 64 << 17);
    // New files written through write-only handles, which bypass the page
    // cache (fuse.direct_writes): the kernel leaves taking away the
    // set-user-ID bits to the mount there too, so not even a new inode's
    // first write costs the question (a small file's request less).
    let before = asked();
    for i in 0..16 {
        fs::write(m.path(&format!("small{i}")), &chunk[..100_000]).unwrap();
    }
    let during = asked() - before;
    assert!(
        during == 0,
        "security.capability asked {during} times for 16 new files"
    );
    for i in 0..16 {
        assert_eq!(
            fs::read(m.path(&format!("small{i}"))).unwrap(),
            &chunk[..100_000]
        );
    }
}

#[test]
fn check_permission_holds_other_users_to_modes_and_owners() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (dir, _node, m) = setup(&["--check-permission"]);
    // Other users must reach the mount point.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(m.path("secret"), b"top").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(m.path("open"), b"pub").unwrap();
    fs::set_permissions(m.path("open"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::create_dir(m.path("ro")).unwrap();
    fs::set_permissions(m.path("ro"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o777)).unwrap();
    let (alice, bob) = (65534, 65533);
    let denied = |id: u32, script: &str, what: &str| {
        let (ok, out) = as_user(id, &m, script);
        assert!(!ok && out.contains(what), "{script} as {id}: {out}");
    };
    denied(alice, "cat $M/secret", "Permission denied");
    denied(alice, "echo x > $M/open", "Permission denied");
    denied(alice, "touch $M/ro/x", "Permission denied");
    denied(alice, "chmod 666 $M/open", "Operation not permitted");
    let (ok, out) = as_user(alice, &m, "cat $M/open");
    assert!(ok && out == "pub", "{out}");
    // A file a user creates is theirs, and their modes hold others out.
    let (ok, out) = as_user(
        alice,
        &m,
        "echo mine > $M/shared/a && chmod 600 $M/shared/a",
    );
    assert!(ok, "{out}");
    let meta = fs::metadata(m.path("shared/a")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (alice, alice, 0o600)
    );
    denied(bob, "cat $M/shared/a", "Permission denied");
    denied(bob, "chmod 666 $M/shared/a", "Operation not permitted");
    let (ok, out) = as_user(alice, &m, "cat $M/shared/a");
    assert!(ok && out == "mine\n", "{out}");
    // Root is not held back.
    assert_eq!(fs::read(m.path("shared/a")).unwrap(), b"mine\n");
    // A write or truncate by a user who is not the owner of a set-user-ID
    // file succeeds and clears the bit (set-group-ID too, when the group
    // may execute), as Linux does.
    for (name, mode, after) in [
        ("suid", 0o4777, 0o777),
        ("sgid", 0o2777, 0o777),
        ("both", 0o6757, 0o757),
    ] {
        fs::write(m.path(name), b"root's").unwrap();
        fs::set_permissions(m.path(name), fs::Permissions::from_mode(mode)).unwrap();
        let (ok, out) = as_user(bob, &m, &format!("echo more >> $M/{name}"));
        assert!(ok, "{name}: {out}");
        let meta = fs::metadata(m.path(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, after, "{name} after a write");
        assert_eq!(fs::read(m.path(name)).unwrap(), b"root'smore\n");
        fs::set_permissions(m.path(name), fs::Permissions::from_mode(mode)).unwrap();
        let (ok, out) = as_user(bob, &m, &format!("truncate -s 2 $M/{name}"));
        assert!(ok, "{name}: {out}");
        let meta = fs::metadata(m.path(name)).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.len()),
            (after, 2),
            "{name} after a truncate"
        );
    }
    // The same for an open that empties the file, and for a chown, even
    // by root; root's own writes and truncations keep the bits.
    for (name, mode, after) in [("suid", 0o4777, 0o777), ("both", 0o6757, 0o757)] {
        fs::set_permissions(m.path(name), fs::Permissions::from_mode(mode)).unwrap();
        let (ok, out) = as_user(bob, &m, &format!("echo new > $M/{name}"));
        assert!(ok, "{name}: {out}");
        let meta = fs::metadata(m.path(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, after, "{name} after an O_TRUNC open");
        assert_eq!(fs::read(m.path(name)).unwrap(), b"new\n");
        fs::set_permissions(m.path(name), fs::Permissions::from_mode(mode)).unwrap();
        let mut f = OpenOptions::new().append(true).open(m.path(name)).unwrap();
        f.write_all(b"root\n").unwrap();
        f.set_len(3).unwrap();
        drop(f);
        let meta = fs::metadata(m.path(name)).unwrap();
        assert_eq!(meta.mode() & 0o7777, mode, "{name} after root's write");
        std::os::unix::fs::chown(m.path(name), None, Some(bob)).unwrap();
        let meta = fs::metadata(m.path(name)).unwrap();
        assert_eq!(
            (meta.mode() & 0o7777, meta.gid()),
            (after, bob),
            "{name} after a chown"
        );
    }
    // A non-owner still cannot change a mode otherwise.
    fs::set_permissions(m.path("suid"), fs::Permissions::from_mode(0o4777)).unwrap();
    denied(bob, "chmod 777 $M/suid", "Operation not permitted");
}

#[test]
fn posix_acls_are_enforced_and_inherited_with_acl() {
    let (Some(setfacl), Some(getfacl)) = (tool("setfacl"), tool("getfacl")) else {
        return;
    };
    let (dir, _node, m) = setup(&["--check-permission", "--acl"]);
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (alice, bob) = (65534, 65533);
    let facl = |args: &[&str], path: &Path| {
        run(Command::new(&setfacl).args(args).arg(path));
    };
    let show = |path: &Path| run(Command::new(&getfacl).args(["-n", "-p"]).arg(path));
    fs::write(m.path("secret"), b"top").unwrap();
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let (ok, _) = as_user(alice, &m, "cat $M/secret");
    assert!(!ok, "the mode keeps alice out");
    // A named user entry lets alice read, and only alice.
    facl(&["-m", &format!("u:{alice}:r")], &m.path("secret"));
    let (ok, out) = as_user(alice, &m, "cat $M/secret");
    assert!(ok && out == "top", "{out}");
    let (ok, _) = as_user(bob, &m, "cat $M/secret");
    assert!(!ok, "bob has no entry");
    let acl = show(&m.path("secret"));
    assert!(acl.contains(&format!("user:{alice}:r--")), "{acl}");
    // The group bits of the mode show the mask.
    let mode = fs::metadata(m.path("secret")).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o640);
    // chmod sets the mask: alice's entry no longer grants anything.
    fs::set_permissions(m.path("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    let acl = show(&m.path("secret"));
    assert!(acl.contains("mask::---"), "{acl}");
    let (ok, _) = as_user(alice, &m, "cat $M/secret");
    assert!(!ok, "the mask holds alice out after chmod 600");
    // A directory's default ACL is inherited by what is made in it, and
    // replaces the umask.
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o755)).unwrap();
    facl(&["-d", "-m", &format!("u:{alice}:rwx")], &m.path("shared"));
    facl(&["-m", &format!("u:{alice}:rwx")], &m.path("shared"));
    let (ok, out) = as_user(alice, &m, "echo from-alice > $M/shared/hers");
    assert!(ok, "{out}");
    fs::write(m.path("shared/f"), b"root's").unwrap();
    let acl = show(&m.path("shared/f"));
    assert!(acl.contains(&format!("user:{alice}:rwx")), "{acl}");
    let (ok, out) = as_user(alice, &m, "echo more >> $M/shared/f");
    assert!(ok, "alice inherits write access: {out}");
    fs::create_dir(m.path("shared/sub")).unwrap();
    // (With -d, getfacl prints the default ACL's entries unprefixed.)
    let acl = run(Command::new(&getfacl)
        .args(["-n", "-p", "-d"])
        .arg(m.path("shared/sub")));
    assert!(acl.contains(&format!("user:{alice}:rwx")), "{acl}");
    // ACLs are extended attributes of the namespace: a new mount sees them.
    drop(m);
    let m = FuseMount::start(
        &_node,
        &dir.path().join("mnt2"),
        &["--check-permission", "--acl"],
    );
    let (ok, out) = as_user(alice, &m, "cat $M/shared/f");
    assert!(ok && out == "root'smore\n", "{out}");
}

/// A counter of the mount's `/metrics`, summed over its label sets that
/// contain `label`.
#[test]
fn files_made_in_a_directory_keep_its_times_without_asking_the_node() {
    let (_dir, node, m) = setup(&[]);
    fs::create_dir(m.path("d")).unwrap();
    let client = runtime().block_on(node.client());
    let cluster_mtime = || runtime().block_on(async { client.stat("/d").await.unwrap().mtime_ns });
    let mount_mtime = || {
        let md = fs::metadata(m.path("d")).unwrap();
        md.mtime() * 1_000_000_000 + md.mtime_nsec()
    };
    assert_eq!(mount_mtime(), cluster_mtime());
    let stats_before = m.counter("curvine_client_calls_total", "call=\"Stat\"");
    let mut last = mount_mtime();
    for i in 0..20 {
        let mut f = File::create(m.path(&format!("d/f{i}"))).unwrap();
        f.write_all(b"some bytes").unwrap();
        drop(f);
        // The directory's times, as the mount shows them, are the ones
        // the cluster gave it.
        let now = mount_mtime();
        assert_eq!(now, cluster_mtime(), "after file {i}");
        assert!(now >= last);
        last = now;
        assert_eq!(fs::metadata(m.path(&format!("d/f{i}"))).unwrap().len(), 10);
    }
    // Neither the kernel's check of the directory before each create nor
    // its look for security.capability before each first write went to
    // the node (what remains: the lookup of each new name).
    let stats = m.counter("curvine_client_calls_total", "call=\"Stat\"") - stats_before;
    assert!(stats <= 25, "{stats} Stat calls for 20 files");
    let xattr_calls = m.counter("curvine_client_calls_total", "call=\"GetXattr\"");
    assert_eq!(xattr_calls, 0);
}

#[test]
fn a_small_file_closes_with_its_block_commit_in_one_call() {
    let (_dir, node, m) = setup(&[]);
    fs::create_dir(m.path("small")).unwrap();
    let files: Vec<Vec<u8>> = (0..20)
        .map(|i| random_bytes(70_000 + i * 1_000, i as u64))
        .collect();
    for (i, bytes) in files.iter().enumerate() {
        fs::write(m.path(&format!("small/{i}")), bytes).unwrap();
    }
    // Each file's block was made on the node the mount talks to; its
    // commit went with the close, not as a call of its own.
    let made = node_counter(
        &node,
        "curvine_data_requests_total",
        "kind=\"create_local\"",
    );
    let committed = node_counter(
        &node,
        "curvine_data_requests_total",
        "kind=\"commit_local\"",
    );
    assert!(made >= 20, "{made} blocks made for 20 files");
    assert_eq!(committed, 0, "blocks committed by calls of their own");
    for (i, bytes) in files.iter().enumerate() {
        assert!(
            cluster_read(&node, &format!("/small/{i}")) == *bytes,
            "file {i}"
        );
    }
    // The checksums the node recorded at the close match the data.
    let out = node.cli_ok(&["--json", "admin", "scrub"]);
    let scrubbed: serde_json::Value = serde_json::from_str(&out).unwrap();
    let problems: usize = scrubbed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["problems"].as_array().map(Vec::len).unwrap_or(0))
        .sum();
    assert_eq!(problems, 0, "{out}");
    let blocks: u64 = scrubbed
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["blocks"].as_u64().unwrap_or(0))
        .sum();
    assert!(blocks >= 20, "{out}");
}

#[test]
fn writeback_cache_mount_streams_large_writes_and_keeps_their_times() {
    // With the kernel's writeback cache, its writes of a file arrive at once
    // and in any order, and it sends the file's mtime while they do.
    let (_dir, node, m) = setup(&["--writeback-cache", "-c", "data.block_size=4MiB"]);
    for round in 0..3u64 {
        let data = random_bytes(48 * 1024 * 1024 + 777, 50 + round);
        let name = format!("big{round}");
        let mut f = File::create(m.path(&name)).unwrap();
        for chunk in data.chunks(128 * 1024) {
            f.write_all(chunk).unwrap();
        }
        drop(f);
        assert!(
            fs::read(m.path(&name)).unwrap() == data,
            "round {round}: read back through the mount"
        );
        assert!(
            cluster_read(&node, &format!("/{name}")) == data,
            "round {round}: what other clients see"
        );
    }
    // Times set while writes are still in the kernel's cache stay set.
    let data = random_bytes(8 * 1024 * 1024, 60);
    let mut f = File::create(m.path("dated")).unwrap();
    f.write_all(&data).unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    f.set_times(fs::FileTimes::new().set_modified(when))
        .unwrap();
    drop(f);
    let meta = fs::metadata(m.path("dated")).unwrap();
    assert_eq!(meta.modified().unwrap(), when);
    assert_eq!(meta.len(), data.len() as u64);
    let attr = runtime().block_on(async { node.client().await.stat("/dated").await.unwrap() });
    assert_eq!(
        attr.mtime_ns,
        1_600_000_000 * 1_000_000_000,
        "the cluster keeps the time set"
    );
    assert!(cluster_read(&node, "/dated") == data);
}

#[test]
fn writes_sequential_random_sparse_and_truncated() {
    let (_dir, node, m) = setup(&["-c", "data.block_size=1MiB"]);
    // Sequential, several blocks, odd buffer sizes.
    let data = random_bytes(5 * 1024 * 1024 + 12_345, 1);
    let mut f = File::create(m.path("seq")).unwrap();
    for chunk in data.chunks(100_003) {
        f.write_all(chunk).unwrap();
    }
    drop(f);
    assert_eq!(fs::read(m.path("seq")).unwrap(), data);
    assert_eq!(cluster_read(&node, "/seq"), data);

    // Random overwrites in place, read back through the same handle before
    // the close, and through the cluster after it.
    let mut expect = data.clone();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("seq"))
        .unwrap();
    let mut rng = 7u64;
    for i in 0..300 {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let off = (rng >> 16) as usize % (expect.len() - 5000);
        let len = 1 + (rng >> 40) as usize % 4096;
        let bytes = random_bytes(len, 100 + i);
        f.write_all_at(&bytes, off as u64).unwrap();
        expect[off..off + len].copy_from_slice(&bytes);
    }
    let mut back = vec![0u8; expect.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back == expect,
        "reads through the writing handle see the writes"
    );
    f.sync_all().unwrap();
    assert!(cluster_read(&node, "/seq") == expect, "fsync commits");
    drop(f);
    assert!(fs::read(m.path("seq")).unwrap() == expect);

    // Sparse: a write far past the end leaves zeros before it.
    let mut s = File::create(m.path("sparse")).unwrap();
    s.seek(SeekFrom::Start(3 * 1024 * 1024 + 10)).unwrap();
    s.write_all(b"tail").unwrap();
    drop(s);
    let got = fs::read(m.path("sparse")).unwrap();
    assert_eq!(got.len(), 3 * 1024 * 1024 + 14);
    assert!(got[..3 * 1024 * 1024 + 10].iter().all(|b| *b == 0));
    assert_eq!(&got[got.len() - 4..], b"tail");

    // Truncate down and up, by path and by handle.
    let t = OpenOptions::new().write(true).open(m.path("seq")).unwrap();
    t.set_len(1000).unwrap();
    assert_eq!(fs::metadata(m.path("seq")).unwrap().len(), 1000);
    t.set_len(5000).unwrap();
    drop(t);
    let got = fs::read(m.path("seq")).unwrap();
    assert_eq!(&got[..1000], &expect[..1000]);
    assert!(got[1000..].iter().all(|b| *b == 0));
    assert_eq!(got.len(), 5000);

    // Write, then append through another handle while the first is open.
    let mut w1 = File::create(m.path("two")).unwrap();
    w1.write_all(b"first ").unwrap();
    let mut w2 = OpenOptions::new().append(true).open(m.path("two")).unwrap();
    w2.write_all(b"second").unwrap();
    drop(w2);
    drop(w1);
    assert_eq!(fs::read(m.path("two")).unwrap(), b"first second");

    // fallocate mode 0 (posix_fallocate) extends with zeros; KEEP_SIZE
    // changes nothing; punching holes is not done.
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("falloc"))
        .unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    f.write_all_at(b"head", 0).unwrap();
    // SAFETY: a valid descriptor.
    assert_eq!(unsafe { libc::fallocate(fd, 0, 4096, 1 << 19) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 4096 + (1 << 19));
    assert_eq!(unsafe { libc::posix_fallocate(fd, 4096, 1 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 4096 + (1 << 20));
    assert_eq!(
        unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 8 << 20) },
        0
    );
    assert_eq!(f.metadata().unwrap().len(), 4096 + (1 << 20));
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    assert_eq!(unsafe { libc::fallocate(fd, punch, 0, 4096) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
    drop(f);
    let got = fs::read(m.path("falloc")).unwrap();
    assert_eq!(got.len(), 4096 + (1 << 20));
    assert_eq!(&got[..4], b"head");
    assert!(got[4..].iter().all(|b| *b == 0));
}

#[test]
fn write_only_handles_write_past_the_page_cache_and_readers_see_their_bytes() {
    // A handle opened write-only has its writes handed to the mount from
    // the writer's own pages (fuse.direct_writes): no copy into the page
    // cache of the mount's file. Readers holding pages of that file on this
    // host must still see every byte written, before and after the close.
    let (_dir, node, m) = setup(&[]);
    let p = m.path("f");
    let old = random_bytes(300_000, 11);
    fs::write(&p, &old).unwrap();
    let reader = File::open(&p).unwrap();
    assert_eq!(
        whole(&reader),
        old,
        "first read, which fills the page cache"
    );

    let writer = OpenOptions::new().write(true).open(&p).unwrap();
    let inside = random_bytes(5_000, 12);
    let appended = random_bytes(70_000, 13);
    writer.write_all_at(&inside, 1_000).unwrap();
    writer.write_all_at(&appended, old.len() as u64).unwrap();
    let mut expect = old.clone();
    expect[1_000..6_000].copy_from_slice(&inside);
    expect.extend_from_slice(&appended);
    // Before the writer closes: the cached pages the writes covered (the
    // one at the old end of file too) are not served stale.
    let mut got = vec![0u8; 5_000];
    reader.read_exact_at(&mut got, 1_000).unwrap();
    assert!(got == inside, "a cached range overwritten by the writer");
    assert_eq!(whole(&reader), expect, "the whole file while it is written");
    drop(writer);

    assert_eq!(whole(&reader), expect, "the open reader after the close");
    assert_eq!(fs::read(&p).unwrap(), expect, "a new open");
    assert_eq!(cluster_read(&node, "/f"), expect, "another client");
    // A handle that can read as well writes through the page cache, as
    // before; both kinds of handle agree on the bytes.
    let rw = OpenOptions::new().read(true).write(true).open(&p).unwrap();
    rw.write_all_at(b"both", 0).unwrap();
    expect[..4].copy_from_slice(b"both");
    assert_eq!(whole(&rw), expect);
    assert_eq!(whole(&reader), expect);
}

#[test]
fn an_unlinked_open_file_stays_readable() {
    let (_dir, node, m) = setup(&[]);
    fs::write(m.path("gone"), b"still here").unwrap();
    let mut r = File::open(m.path("gone")).unwrap();
    fs::remove_file(m.path("gone")).unwrap();
    assert_eq!(errno(fs::metadata(m.path("gone"))), libc::ENOENT);
    let names: Vec<_> = fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        names.is_empty(),
        "the name is gone from the directory: {names:?}"
    );
    assert_eq!(r.metadata().unwrap().nlink(), 0);
    let mut s = String::new();
    r.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here");
    drop(r);
    // After the last close nothing is left in the namespace.
    let seen = RefCell::new(String::new());
    let what = Lazily(|| format!("an empty namespace; left behind: {}", seen.borrow()));
    wait_for(what, Duration::from_secs(10), || {
        let listing = node.cli_ok(&["fs", "ls", "/"]);
        let empty = listing.trim().is_empty();
        *seen.borrow_mut() = listing;
        empty.then_some(())
    });
    // A directory stream read again from its start (rewinddir) lists the
    // directory as it is now.
    fs::create_dir(m.path("listed")).unwrap();
    fs::write(m.path("listed/a"), b"a").unwrap();
    let dirp = unsafe { libc::opendir(cpath(&m.path("listed")).as_ptr()) };
    assert!(!dirp.is_null());
    let names = || {
        let mut out = Vec::new();
        // SAFETY: an open directory stream; each entry's name is a C string.
        unsafe {
            libc::rewinddir(dirp);
            loop {
                let e = libc::readdir(dirp);
                if e.is_null() {
                    break;
                }
                let name = std::ffi::CStr::from_ptr((*e).d_name.as_ptr());
                out.push(name.to_string_lossy().into_owned());
            }
        }
        out.retain(|n| n != "." && n != "..");
        out.sort();
        out
    };
    assert_eq!(names(), ["a"]);
    fs::write(m.path("listed/b"), b"b").unwrap();
    fs::remove_file(m.path("listed/a")).unwrap();
    assert_eq!(names(), ["b"]);
    unsafe { libc::closedir(dirp) };
    // A file written, closed and removed at once leaves its directory
    // empty: the kernel's release of the closed file may come after the
    // unlink, which waits for it rather than hiding the file.
    for i in 0..30 {
        let d = m.path(&format!("quick{i}"));
        fs::create_dir(&d).unwrap();
        fs::write(d.join("f"), b"written and gone").unwrap();
        fs::remove_file(d.join("f")).unwrap();
        fs::remove_dir(&d).unwrap();
    }
}

#[test]
fn locks_conflict_between_processes_of_a_node() {
    let (_dir, _node, m) = setup(&[]);
    fs::write(m.path("lock"), b"").unwrap();
    let a = File::open(m.path("lock")).unwrap();
    let b = File::open(m.path("lock")).unwrap();
    // SAFETY: valid descriptors.
    unsafe {
        assert_eq!(
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&a),
                libc::LOCK_EX | libc::LOCK_NB
            ),
            0
        );
        assert_eq!(
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&b),
                libc::LOCK_EX | libc::LOCK_NB
            ),
            -1
        );
    }
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EWOULDBLOCK)
    );
    // A POSIX record lock held by a child process blocks this one.
    let out = Command::new("flock")
        .args(["--nonblock", "--exclusive"])
        .arg(m.path("lock"))
        .arg("true")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "flock(1) got a lock another holder has"
    );
}

#[test]
fn kill_9_leaves_a_recoverable_mount_point() {
    let (dir, node, mut m) = setup(&[]);
    fs::write(m.path("kept"), b"data").unwrap();
    m.kill();
    let e = fs::metadata(&m.dir).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "a dead mount: {e}");
    // `fuse umount` clears it and says what it did.
    let out = node.cli(&["fuse", "umount", m.dir.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("process was gone"), "{text}");
    assert!(fs::metadata(&m.dir).unwrap().is_dir());
    // Mounting again works and the data is there.
    let m2 = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    assert_eq!(fs::read(m2.path("kept")).unwrap(), b"data");
    // A dead mount found by `mount` itself is cleared too.
    drop(m2);
    let mut m3 = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    m3.kill();
    let m4 = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    assert!(
        m4.log_text().contains("process was gone"),
        "{}",
        m4.log_text()
    );
    assert_eq!(fs::read(m4.path("kept")).unwrap(), b"data");
}

#[test]
fn daemon_mount_and_umount_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    node.cli_ok(&["fs", "mkdir", "/sub"]);
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let log = dir.path().join("fuse.log");
    let out = node.cli_ok(&[
        "fuse",
        "mount",
        mnt.to_str().unwrap(),
        "--daemon",
        "--fs-path",
        "/sub",
        "--log-file",
        log.to_str().unwrap(),
    ]);
    assert!(out.contains("mounted on"), "{out}");
    fs::write(mnt.join("inside"), b"x").unwrap();
    assert_eq!(node.cli_ok(&["fs", "cat", "/sub/inside"]), "x");
    // A second mount on the same point is refused.
    let again = node.cli(&["fuse", "mount", mnt.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already there"));
    // Busy: a file open keeps a plain unmount from happening.
    let open = File::open(mnt.join("inside")).unwrap();
    let busy = node.cli(&["fuse", "umount", mnt.to_str().unwrap()]);
    assert!(!busy.status.success());
    assert!(String::from_utf8_lossy(&busy.stderr).contains("busy"));
    drop(open);
    node.cli_ok(&["fuse", "umount", mnt.to_str().unwrap()]);
    assert!(!curvine_fuse::mountpoint::is_mounted(&mnt));
    // The daemon exits by itself after the unmount.
    wait_for(
        "the mount process to exit: it is still running",
        Duration::from_secs(10),
        || {
            let ps = run(Command::new("ps").args(["-eo", "args"]));
            let running = ps
                .lines()
                .any(|l| l.contains("fuse mount") && l.contains(mnt.to_str().unwrap()));
            (!running).then_some(())
        },
    );
    // Bad input: a missing mount point and a file as fs_path.
    let bad = node.cli(&[
        "fuse",
        "mount",
        dir.path().join("missing").to_str().unwrap(),
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("No such file"));
    node.cli_ok(&["fs", "touch", "/file"]);
    let bad = node.cli(&["fuse", "mount", mnt.to_str().unwrap(), "--fs-path", "/file"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a directory"));
    let bad = node.cli(&[
        "fuse",
        "mount",
        mnt.to_str().unwrap(),
        "--max-write",
        "lots",
    ]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("fuse.max_write"));
}

#[test]
fn sigterm_unmounts_cleanly() {
    let (_dir, _node, mut m) = setup(&[]);
    fs::write(m.path("x"), b"1").unwrap();
    assert_eq!(m.terminate(), Some(0), "{}", m.log_text());
    assert!(!curvine_fuse::mountpoint::is_mounted(&m.dir));
    assert!(m.log_text().contains("unmount"), "{}", m.log_text());
}

/// A tool the test needs: CI has it (the test command installs it);
/// elsewhere its absence skips the test.
fn tool(name: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").is_err(),
            "{name} is missing: integration/run-tests.sh installs it"
        );
        eprintln!("{name} not installed: skipping");
    }
    found
}

#[test]
fn hard_links_through_the_mount() {
    let (dir, node, m) = setup(&[]);
    // Directories spread over shards: most links here cross shards.
    let dirs: Vec<_> = (0..6).map(|i| m.path(&format!("d{i}"))).collect();
    for d in &dirs {
        fs::create_dir(d).unwrap();
    }
    let first = dirs[0].join("f");
    fs::write(&first, b"one file, many names").unwrap();
    for d in &dirs[1..] {
        fs::hard_link(&first, d.join("f")).unwrap();
    }
    let ino = fs::metadata(&first).unwrap().ino();
    for d in &dirs {
        let md = fs::metadata(d.join("f")).unwrap();
        assert_eq!((md.ino(), md.nlink()), (ino, 6));
    }
    // A write through one name is read through another.
    fs::write(dirs[3].join("f"), b"changed through d3").unwrap();
    assert_eq!(fs::read(dirs[5].join("f")).unwrap(), b"changed through d3");
    // Another client sees the names and the count.
    let stat = node.cli_ok(&["--json", "fs", "stat", "/d4/f"]);
    assert!(stat.contains("\"nlink\":6"), "{stat}");
    // Unlink of one name keeps the others.
    fs::remove_file(&first).unwrap();
    assert_eq!(fs::metadata(dirs[1].join("f")).unwrap().nlink(), 5);
    // A rename between two names of one file changes nothing (POSIX);
    // a rename over a name drops that link only.
    fs::rename(dirs[1].join("f"), dirs[2].join("f")).unwrap();
    assert!(dirs[1].join("f").exists() && dirs[2].join("f").exists());
    let other = m.path("other");
    fs::write(&other, b"another file").unwrap();
    fs::rename(&other, dirs[2].join("f")).unwrap();
    assert_eq!(fs::read(dirs[2].join("f")).unwrap(), b"another file");
    assert_eq!(fs::metadata(dirs[1].join("f")).unwrap().nlink(), 4);
    // An open file stays readable while every name goes.
    let mut open = File::open(dirs[1].join("f")).unwrap();
    for d in [&dirs[1], &dirs[3], &dirs[4], &dirs[5]] {
        fs::remove_file(d.join("f")).unwrap();
    }
    let mut got = String::new();
    open.read_to_string(&mut got).unwrap();
    assert_eq!(got, "changed through d3");
    drop(open);
    // Links to a symlink and to a FIFO; a directory cannot have two names.
    std::os::unix::fs::symlink("nowhere", m.path("sym")).unwrap();
    fs::hard_link(m.path("sym"), m.path("sym2")).unwrap();
    assert_eq!(
        fs::read_link(m.path("sym2")).unwrap().to_str(),
        Some("nowhere")
    );
    assert_eq!(
        unsafe { libc::mkfifo(cpath(&m.path("pipe")).as_ptr(), 0o644) },
        0
    );
    fs::hard_link(m.path("pipe"), dirs[0].join("pipe")).unwrap();
    assert_eq!(fs::symlink_metadata(m.path("pipe")).unwrap().nlink(), 2);
    assert_eq!(
        errno(fs::hard_link(&dirs[0], m.path("dirlink"))),
        libc::EPERM
    );
    assert_eq!(
        errno(fs::hard_link(m.path("sym"), m.path("pipe"))),
        libc::EEXIST
    );
    // cp -al makes a tree of links; rsync -aH keeps the links of a tree,
    // as on tmpfs.
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("x/y")).unwrap();
    fs::write(src.join("x/a"), b"a").unwrap();
    fs::hard_link(src.join("x/a"), src.join("x/y/a2")).unwrap();
    fs::hard_link(src.join("x/a"), src.join("top")).unwrap();
    fs::write(src.join("x/y/b"), b"b").unwrap();
    run(Command::new("cp").arg("-a").arg(&src).arg(m.path("tree")));
    run(Command::new("cp")
        .arg("-al")
        .arg(m.path("tree"))
        .arg(m.path("linked")));
    for rel in ["x/a", "x/y/a2", "top", "x/y/b"] {
        let (a, b) = (m.path("tree").join(rel), m.path("linked").join(rel));
        assert_eq!(
            fs::metadata(&a).unwrap().ino(),
            fs::metadata(&b).unwrap().ino()
        );
    }
    assert_eq!(fs::metadata(m.path("tree/x/a")).unwrap().nlink(), 6);
    if tool("rsync").is_some() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        for target in [m.path("synced"), shm.path().join("synced")] {
            run(Command::new("rsync")
                .arg("-aH")
                .arg(format!("{}/", src.display()))
                .arg(&target));
            let ino = |rel: &str| fs::metadata(target.join(rel)).unwrap().ino();
            assert_eq!(ino("x/a"), ino("x/y/a2"));
            assert_eq!(ino("x/a"), ino("top"));
            assert_ne!(ino("x/a"), ino("x/y/b"));
            assert_eq!(fs::metadata(target.join("top")).unwrap().nlink(), 3);
        }
    }
    let fsck = node.cli_ok(&["admin", "fsck"]);
    assert!(fsck.contains("namespace is consistent"), "{fsck}");
}

#[test]
fn paths_longer_than_path_max_from_the_root_work_relative_to_a_directory() {
    let (_dir, node, m) = setup(&[]);
    // SAFETY (every libc call below): valid descriptors and C strings.
    let at = |dir: i32, rel: &str, flags: i32| {
        let c = CString::new(rel).unwrap();
        unsafe { libc::openat(dir, c.as_ptr(), flags, 0o644) }
    };
    fs::create_dir(m.path("deep")).unwrap();
    let top = at(
        libc::AT_FDCWD,
        m.path("deep").to_str().unwrap(),
        libc::O_DIRECTORY,
    );
    assert!(top >= 0);
    // 40 levels of 120-byte names: about 4,840 bytes from the root.
    let names: Vec<String> = (0..40)
        .map(|i| format!("{i:03}{}", "d".repeat(117)))
        .collect();
    let mut fds = vec![top];
    for name in &names {
        let c = CString::new(name.as_str()).unwrap();
        let parent = *fds.last().unwrap();
        assert_eq!(
            unsafe { libc::mkdirat(parent, c.as_ptr(), 0o755) },
            0,
            "mkdirat"
        );
        let fd = at(parent, name, libc::O_DIRECTORY);
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        fds.push(fd);
    }
    // A 3,000-byte relative path from level 15 to a file at the bottom.
    let rel = format!("{}/file", names[15..40].join("/"));
    assert!(rel.len() > 3000, "{}", rel.len());
    let fd = at(fds[15], &rel, libc::O_CREAT | libc::O_WRONLY);
    assert!(fd >= 0, "create: {}", std::io::Error::last_os_error());
    let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.write_all(b"at the bottom").unwrap();
    drop(f);
    let fd = at(fds[40], "file", libc::O_RDONLY);
    let mut f = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut got = String::new();
    f.read_to_string(&mut got).unwrap();
    assert_eq!(got, "at the bottom");
    drop(f);
    // Other clients reach it by its whole path.
    let full = format!("/deep/{}/file", names.join("/"));
    assert!(full.len() > 4096);
    assert_eq!(cluster_read(&node, &full), b"at the bottom");
    // rename and unlink through relative paths, as deep as that.
    let to = format!("{}/moved", names[15..40].join("/"));
    let (a, b) = (
        CString::new(rel).unwrap(),
        CString::new(to.clone()).unwrap(),
    );
    assert_eq!(
        unsafe { libc::renameat(fds[15], a.as_ptr(), fds[15], b.as_ptr()) },
        0
    );
    assert_eq!(unsafe { libc::unlinkat(fds[15], b.as_ptr(), 0) }, 0);
    for fd in fds {
        unsafe { libc::close(fd) };
    }
    fs::remove_dir_all(m.path("deep")).unwrap();
}

/// The names in `dir` as bytes, sorted.
fn byte_names(dir: &Path) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    v.sort();
    v
}

#[test]
fn names_that_are_not_utf8_keep_their_bytes_through_tar_the_cli_and_other_clients() {
    use std::ffi::OsStr;
    let (dir, node, m) = setup(&[]);
    let os = |b: &[u8]| OsStr::from_bytes(b).to_os_string();
    // A tree with Latin-1 names, as an old archive has them.
    let src = dir.path().join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join(os(b"caf\xe9.txt")), b"latin-1 name").unwrap();
    fs::write(src.join("café-utf8.txt"), b"utf-8 name").unwrap();
    fs::create_dir(src.join(os(b"r\xe9pertoire"))).unwrap();
    fs::write(src.join(os(b"r\xe9pertoire/\xff\xfe")), b"two bad bytes").unwrap();
    std::os::unix::fs::symlink(os(b"caf\xe9.txt"), src.join("lien")).unwrap();
    let tar = dir.path().join("latin1.tar");
    run(Command::new("tar")
        .arg("cf")
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("."));
    fs::create_dir(m.path("t")).unwrap();
    run(Command::new("tar")
        .arg("xf")
        .arg(&tar)
        .arg("-C")
        .arg(m.path("t")));
    let t = m.path("t");
    assert_eq!(byte_names(&t), byte_names(&src));
    assert_eq!(
        byte_names(&t.join(os(b"r\xe9pertoire"))),
        vec![b"\xff\xfe".to_vec()]
    );
    assert_eq!(
        fs::read(t.join(os(b"caf\xe9.txt"))).unwrap(),
        b"latin-1 name"
    );
    assert_eq!(fs::read(t.join("café-utf8.txt")).unwrap(), b"utf-8 name");
    assert_eq!(
        fs::read(t.join(os(b"r\xe9pertoire/\xff\xfe"))).unwrap(),
        b"two bad bytes"
    );
    assert_eq!(
        fs::read_link(t.join("lien"))
            .unwrap()
            .as_os_str()
            .as_bytes(),
        b"caf\xe9.txt"
    );
    assert_eq!(fs::read(t.join("lien")).unwrap(), b"latin-1 name");
    // Another client names it by the bytes' string form.
    let other = curvine_messages::names::from_bytes(b"/t/caf\xe9.txt");
    assert_eq!(cluster_read(&node, &other), b"latin-1 name");
    // Names are 1 to 255 bytes, however they decode.
    fs::write(t.join(os(&[0xE9; 255])), b"x").unwrap();
    assert_eq!(
        errno(fs::write(t.join(os(&[0xE9; 256])), b"x")),
        libc::ENAMETOOLONG
    );
    // Renamed to another such name, listed, removed.
    fs::rename(t.join(os(b"caf\xe9.txt")), t.join(os(b"\xe0 bient\xf4t"))).unwrap();
    assert!(byte_names(&t).contains(&b"\xe0 bient\xf4t".to_vec()));
    assert!(!byte_names(&t).contains(&b"caf\xe9.txt".to_vec()));
    fs::remove_file(t.join(os(&[0xE9; 255]))).unwrap();
    // The CLI takes such a path as its bytes and shows them as \xNN; its
    // JSON gives Python the bytes back through os.fsencode.
    let cli = |args: &[&OsStr]| {
        let out = node.cli(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("the CLI prints UTF-8")
    };
    let text = cli(&[OsStr::new("fs"), OsStr::new("ls"), OsStr::new("/t")]);
    assert!(text.lines().any(|l| l == "r\\xe9pertoire"), "{text}");
    assert!(text.lines().any(|l| l == "\\xe0 bient\\xf4t"), "{text}");
    let stat = cli(&[
        OsStr::new("fs"),
        OsStr::new("stat"),
        OsStr::from_bytes(b"/t/r\xe9pertoire/\xff\xfe"),
    ]);
    assert!(stat.contains("Size: 13"), "{stat}");
    let json = cli(&[
        OsStr::new("--json"),
        OsStr::new("fs"),
        OsStr::new("ls"),
        OsStr::new("/t"),
    ]);
    assert!(json.contains("\"r\\udce9pertoire\""), "{json}");
    let py = "import json, os, sys\n\
              names = sorted(os.fsencode(e['name']) for e in json.load(sys.stdin))\n\
              print(names)";
    let mut child = Command::new("python3")
        .args(["-c", py])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(json.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[b'caf\\xc3\\xa9-utf8.txt', b'lien', b'r\\xe9pertoire', b'\\xe0 bient\\xf4t']"
    );
    fs::remove_dir_all(&t).unwrap();
}

#[test]
fn o_trunc_opens_empty_a_file_but_never_a_running_programs() {
    let (_dir, node, m) = setup(&[]);
    let trunc_ro = |p: &Path| {
        let c = cpath(p);
        // SAFETY: a valid C string; the descriptor is closed at once.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_TRUNC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        unsafe { libc::close(fd) };
        Ok(fd)
    };
    // O_RDONLY|O_TRUNC empties a file, as on Linux, for every client.
    fs::write(m.path("data"), b"some content").unwrap();
    trunc_ro(&m.path("data")).unwrap();
    assert_eq!(fs::metadata(m.path("data")).unwrap().len(), 0);
    assert_eq!(cluster_read(&node, "/data"), b"");
    // A program started from the mount: its file cannot be emptied while
    // it runs (ETXTBSY) and stays whole, however soon after the start.
    let sleep = fs::read("/usr/bin/sleep").unwrap();
    for i in 0..20 {
        let prog = m.path(&format!("sleep{i}"));
        fs::write(&prog, &sleep).unwrap();
        fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(&prog).arg("10").spawn().unwrap();
        assert_eq!(errno(trunc_ro(&prog)), libc::ETXTBSY);
        assert_eq!(
            errno(OpenOptions::new().write(true).open(&prog)),
            libc::ETXTBSY
        );
        assert!(child.try_wait().unwrap().is_none(), "the program died");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            fs::read(&prog).unwrap() == sleep,
            "the program's file changed"
        );
        // Once it has ended, its file can be overwritten at once.
        File::create(&prog).unwrap().write_all(b"new").unwrap();
        assert_eq!(fs::read(&prog).unwrap(), b"new");
    }
}

#[test]
fn rename_exchange_swaps_names_and_whiteout_leaves_a_whiteout() {
    use std::os::unix::fs::FileTypeExt;
    let (_dir, node, m) = setup(&[]);
    let renameat2 = |a: &Path, b: &Path, flags: u32| {
        let (a, b) = (cpath(a), cpath(b));
        // SAFETY: valid C strings.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                flags,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // Two files of one directory.
    fs::write(m.path("a"), b"A").unwrap();
    fs::write(m.path("b"), b"B").unwrap();
    renameat2(&m.path("a"), &m.path("b"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("a")).unwrap(), b"B");
    assert_eq!(fs::read(m.path("b")).unwrap(), b"A");
    assert_eq!(node.cli_ok(&["fs", "cat", "/a"]), "B");
    // A directory and a file of different directories (and shards): the
    // directory's `..` and both directories' link counts follow.
    for d in ["d1", "d2"] {
        fs::create_dir(m.path(d)).unwrap();
    }
    fs::create_dir(m.path("d1/sub")).unwrap();
    fs::write(m.path("d1/sub/inner"), b"inside").unwrap();
    fs::write(m.path("d2/f"), b"a file").unwrap();
    let links = |d: &str| fs::metadata(m.path(d)).unwrap().nlink();
    let (d1_links, d2_links) = (links("d1"), links("d2"));
    renameat2(&m.path("d1/sub"), &m.path("d2/f"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.path("d1/sub")).unwrap(), b"a file");
    assert_eq!(fs::read(m.path("d2/f/inner")).unwrap(), b"inside");
    assert_eq!((links("d1"), links("d2")), (d1_links - 1, d2_links + 1));
    assert_eq!(
        fs::metadata(m.path("d2/f/..")).unwrap().ino(),
        fs::metadata(m.path("d2")).unwrap().ino()
    );
    // Both must exist; a directory cannot go inside itself.
    let missing = renameat2(&m.path("a"), &m.path("nothing"), libc::RENAME_EXCHANGE);
    assert_eq!(errno(missing), libc::ENOENT);
    fs::create_dir(m.path("d2/f/deeper")).unwrap();
    let inside = renameat2(
        &m.path("d2/f"),
        &m.path("d2/f/deeper"),
        libc::RENAME_EXCHANGE,
    );
    assert_eq!(errno(inside), libc::EINVAL);
    // RENAME_WHITEOUT: the file moves and a whiteout (0/0) takes its name.
    fs::write(m.path("w"), b"moved").unwrap();
    renameat2(&m.path("w"), &m.path("w2"), libc::RENAME_WHITEOUT).unwrap();
    assert_eq!(fs::read(m.path("w2")).unwrap(), b"moved");
    let md = fs::symlink_metadata(m.path("w")).unwrap();
    assert!(md.file_type().is_char_device() && md.rdev() == 0);
    let fsck = node.cli_ok(&["admin", "fsck"]);
    assert!(fsck.contains("namespace is consistent"), "{fsck}");
}

#[test]
fn the_mount_helper_mounts_fstab_entries_and_remounts_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    node.cli_ok(&["fs", "mkdir", "/sub"]);
    node.cli_ok(&["fs", "touch", "/sub/from-cli"]);
    // mount(8) runs /sbin/mount.fuse.curvine, a link to curvine-fuse.
    let helper = dir.path().join("mount.fuse.curvine");
    std::os::unix::fs::symlink(curvine_integration::bin("curvine-fuse"), &helper).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // The helper's mount runs in the background: a failure below leaves
    // no mount behind.
    struct Cleared<'a>(&'a Path);
    impl Drop for Cleared<'_> {
        fn drop(&mut self) {
            if curvine_fuse::mountpoint::is_mounted(self.0) {
                let _ = curvine_fuse::mountpoint::clear(self.0);
            }
        }
    }
    let _cleared = Cleared(&mnt);
    let helper_run = |args: &[&str]| {
        Command::new(&helper)
            .args(args)
            .env("CURVINE_CLIENT_COOKIE", node.cookie())
            .env_remove("CURVINE_CONF")
            .output()
            .unwrap()
    };
    let mnt_s = mnt.to_str().unwrap();
    // What an fstab line `curvine:/sub MNT fuse.curvine
    // cluster=...,noauto,_netdev 0 0` makes mount(8) run.
    let opts = format!(
        "cluster={},fuse.metrics_listen=off,noauto,_netdev",
        node.addr
    );
    let out = helper_run(&["curvine:/sub", mnt_s, "-o", &opts]);
    assert!(out.status.success(), "{out:?}");
    assert!(mnt.join("from-cli").exists());
    fs::write(mnt.join("w"), b"writable").unwrap();
    // The kernel shows its type as fuse.curvine, so `mount -o remount,ro
    // MNT` (mount(8) running the helper) makes it read-only, keeping the
    // mount's nosuid and nodev, and `remount,rw` undoes it.
    let mounted_with = |flags: &str| {
        let line = fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .find(|l| l.split(' ').nth(1) == Some(mnt_s))
            .map(str::to_string)
            .unwrap_or_default();
        let want = format!("curvine:/sub {mnt_s} fuse.curvine {flags},");
        assert!(line.starts_with(&want), "{line}");
    };
    mounted_with("rw,nosuid,nodev");
    let remount = |how: &str| {
        let out = curvine_integration::with_mount_helper(dir.path(), "mount")
            .args(["-o", how, mnt_s])
            .output()
            .unwrap();
        assert!(out.status.success(), "mount -o {how}: {out:?}");
    };
    remount("remount,ro");
    assert_eq!(errno(fs::write(mnt.join("w2"), b"x")), libc::EROFS);
    assert_eq!(fs::read(mnt.join("w")).unwrap(), b"writable");
    remount("remount,rw");
    fs::write(mnt.join("w2"), b"x").unwrap();
    // The helper itself does the same, keeping the mount's flags.
    let out = helper_run(&["curvine:/sub", mnt_s, "-o", "rw,remount,ro"]);
    assert!(out.status.success(), "{out:?}");
    mounted_with("ro,nosuid,nodev");
    assert_eq!(errno(fs::write(mnt.join("w3"), b"x")), libc::EROFS);
    let out = helper_run(&["curvine:/sub", mnt_s, "-o", "ro,remount,rw"]);
    assert!(out.status.success(), "{out:?}");
    mounted_with("rw,nosuid,nodev");
    // Bad sources and options are named.
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    let out = helper_run(&["nfs:/x", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(32));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected curvine:PATH"));
    let out = helper_run(&["curvine:/", other.to_str().unwrap(), "-o", "bogus"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown option \"bogus\""));
    run(Command::new(curvine_integration::bin("curvine-cli"))
        .args(["fuse", "umount"])
        .arg(&mnt));
    assert_eq!(node.cli_ok(&["fs", "cat", "/sub/w2"]), "x");
}

#[test]
fn the_pjdfstest_posix_suite_passes() {
    let Some(pjdfstest) = tool("pjdfstest") else {
        return;
    };
    let (dir, _node, m) = setup(&["--allow-other"]);
    // The suite switches to other users, who must reach the mount.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    // Every feature the mount has is on, cross-device renames and links
    // go to a tmpfs directory, and the read-only cases remount the mount
    // with `mount -o remount,ro|rw` (mount(8) running the helper). Those
    // run first, in a process of their own: later cases of the suite leave
    // files open for writing until it exits (posix_fallocate's keep the
    // descriptors `open` returns), and the kernel refuses (EBUSY) to make
    // any file system read-only while one is. The suite skips its LINK_MAX
    // case itself: pathconf answers glibc's "unknown" (127) for every FUSE
    // mount, so the namespace's own tests check the limit
    // (`a_file_has_at_most_max_links_names`).
    let other_fs = tempfile::tempdir_in("/dev/shm").unwrap();
    let suite = m.path("suite");
    fs::create_dir(&suite).unwrap();
    fs::set_permissions(&suite, fs::Permissions::from_mode(0o755)).unwrap();
    let run = |remount: bool, pattern: Option<&str>| {
        let conf = dir.path().join(format!("pjdfstest-{remount}.toml"));
        fs::write(
            &conf,
            format!(
                r#"
[features]
posix_fallocate = {{}}
rename_ctime = {{}}
utimensat = {{}}
utime_now = {{}}
secondary_fs = "{}"

[settings]
naptime = 0.02
allow_remount = {remount}

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
"#,
                other_fs.path().display()
            ),
        )
        .unwrap();
        let out = curvine_integration::with_mount_helper(dir.path(), &pjdfstest)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(&suite)
            .args(pattern)
            .current_dir(&suite)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        let mut results: Vec<(String, String)> = Vec::new();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if let (Some(case), Some(result @ ("ok" | "FAILED" | "skipped")), None) =
                (words.next(), words.next(), words.next())
            {
                results.push((case.to_string(), result.to_string()));
            }
        }
        let failed: Vec<_> = results.iter().filter(|(_, r)| r == "FAILED").collect();
        assert!(failed.is_empty(), "POSIX cases failed: {failed:?}\n{text}");
        results
    };
    let read_only = run(true, Some("erofs"));
    let rest = run(false, None);
    let passed = |results: &[(String, String)]| {
        results
            .iter()
            .filter(|(_, r)| r == "ok")
            .map(|(c, _)| c.clone())
            .collect::<Vec<_>>()
    };
    let passed_read_only = passed(&read_only);
    assert!(passed_read_only.len() >= 13, "{read_only:?}");
    // Every case the second run skipped passed in the first, but LINK_MAX.
    let skipped: Vec<_> = rest
        .iter()
        .filter(|(c, r)| r == "skipped" && !passed_read_only.contains(c))
        .map(|(c, _)| c.as_str())
        .collect();
    assert_eq!(skipped, ["link::link_count_max"]);
    let total = passed_read_only.len() + passed(&rest).len();
    assert!(total >= 397, "only {total} cases passed");
    eprintln!("pjdfstest: {total} of {} passed", rest.len());
}

#[test]
fn fio_verifies_random_writes_and_concurrent_readers_and_writers() {
    let Some(fio) = tool("fio") else { return };
    let (dir, _node, m) = setup(&["-c", "data.block_size=4MiB"]);
    let job = |args: &[&str]| {
        // fio saves its verify state in the working directory.
        let out = Command::new(&fio)
            .current_dir(dir.path())
            .args([
                "--ioengine=psync",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--output-format=terse",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fio {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let f = m.path("rand").to_string_lossy().into_owned();
    // Random 4k writes over 16 MiB, then every block read back and checked.
    job(&[
        "--name=randwrite",
        &format!("--filename={f}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=16m",
    ]);
    // The same through direct I/O (no page cache), with mixed sizes.
    job(&[
        "--name=direct",
        &format!("--filename={f}"),
        "--rw=randwrite",
        "--bsrange=4k-256k",
        "--size=16m",
        "--direct=1",
    ]);
    // Readers of one file while writers write others.
    let d = m.path("mix");
    fs::create_dir(&d).unwrap();
    let shared = d.join("shared").to_string_lossy().into_owned();
    // Each 64k block of the shared file holds its own offset, which the
    // readers check (a block served from the wrong place fails too).
    job(&[
        "--name=layout",
        &format!("--filename={shared}"),
        "--rw=write",
        "--size=24m",
        "--bs=64k",
        "--verify=pattern",
        "--verify_pattern=%o",
    ]);
    job(&[
        "--name=readers",
        &format!("--filename={shared}"),
        "--rw=randread",
        "--bs=64k",
        "--verify=pattern",
        "--verify_pattern=%o",
        "--size=24m",
        "--numjobs=4",
        "--io_size=16m",
        "--name=writers",
        &format!("--directory={}", d.display()),
        "--rw=write",
        "--bs=128k",
        "--size=8m",
        "--numjobs=3",
    ]);
}

/// `find` output of a tree: type, mode, size, mtime, owner, link target, path.
fn listing(root: &Path) -> String {
    let out = run(Command::new("find")
        .arg(".")
        .args(["-printf", "%y %m %s %T@ %u %g %l %p\n"])
        .current_dir(root));
    // Directory sizes are each file system's own (tmpfs counts entries).
    let mut lines: Vec<String> = out
        .lines()
        .filter(|l| !l.ends_with(" ."))
        .map(|l| match l.strip_prefix("d ") {
            Some(rest) => {
                let mut w: Vec<&str> = rest.splitn(3, ' ').collect();
                w[1] = "-";
                format!("d {}", w.join(" "))
            }
            None => l.to_string(),
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

/// A tree with files of several sizes and modes, symlinks (one dangling),
/// an empty directory, FIFOs, sockets and device nodes when `specials`,
/// and set times.
fn make_tree(root: &Path, specials: bool) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("zero"), b"").unwrap();
    fs::write(root.join("a/one"), b"1").unwrap();
    fs::write(root.join("a/b/mid"), random_bytes(100_000, 3)).unwrap();
    fs::write(root.join("a/b/c/big"), random_bytes(3 * 1024 * 1024 + 5, 4)).unwrap();
    fs::set_permissions(root.join("a/one"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(root.join("a/b/mid"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("b/mid", root.join("a/link")).unwrap();
    std::os::unix::fs::symlink("../nowhere", root.join("a/dangling")).unwrap();
    if specials {
        make_special_files(root);
    }
    // Times in the past (tools skip setting a time within the same second).
    run(Command::new("find").arg(root).args([
        "-exec",
        "touch",
        "-h",
        "-d",
        "2005-06-07 08:09:10.111",
        "{}",
        "+",
    ]));
    run(Command::new("touch")
        .args(["-h", "-d", "2001-02-03 04:05:06.789"])
        .arg(root.join("a/link")));
    run(Command::new("touch")
        .args(["-d", "2002-03-04 05:06:07.123456789"])
        .arg(root.join("a/one")));
    run(Command::new("touch")
        .args(["-d", "2003-01-01"])
        .arg(root.join("a/b")));
}

/// Adds a FIFO, a socket and two device nodes to a tree.
fn make_special_files(root: &Path) {
    let node = |name: &str, mode: u32, dev: libc::dev_t| {
        let p = cpath(&root.join(name));
        assert_eq!(
            unsafe { libc::mknod(p.as_ptr(), mode, dev) },
            0,
            "mknod {name}"
        );
    };
    node("a/pipe", libc::S_IFIFO | 0o640, 0);
    node("a/null", libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    node("a/b/disk", libc::S_IFBLK | 0o660, libc::makedev(8, 17));
    // The socket's listener is gone: its name stays, as on any file system.
    drop(std::os::unix::net::UnixListener::bind(root.join("a/sock")).unwrap());
}

/// The FIFOs, sockets and device nodes under `root`: path, type, device
/// number and mode, one a line.
fn special_files(root: &Path) -> String {
    use std::os::unix::fs::FileTypeExt;
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = fs::symlink_metadata(e.path()).unwrap();
            let t = md.file_type();
            if t.is_dir() {
                stack.push(e.path());
                continue;
            }
            let kind = if t.is_fifo() {
                "fifo"
            } else if t.is_socket() {
                "socket"
            } else if t.is_char_device() {
                "char"
            } else if t.is_block_device() {
                "block"
            } else {
                continue;
            };
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            out.push(format!("{rel} {kind} {:x} {:o}", md.rdev(), md.mode()));
        }
    }
    out.sort();
    out.join("\n")
}

#[test]
fn cp_rsync_and_tar_give_what_they_give_on_tmpfs() {
    let Some(_rsync) = tool("rsync") else { return };
    let (dir, _node, m) = setup(&[]);
    let src = dir.path().join("src");
    make_tree(&src, true);
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let archive = dir.path().join("tree.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."));
    for target in [m.dir.as_path(), shm.path()] {
        run(Command::new("cp")
            .arg("-a")
            .arg(&src)
            .arg(target.join("cp")));
        run(Command::new("rsync")
            .arg("-a")
            .arg(format!("{}/", src.display()))
            .arg(target.join("rsync")));
        fs::create_dir(target.join("tar")).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(target.join("tar")));
    }
    for copy in ["cp", "rsync", "tar"] {
        let ours = listing(&m.dir.join(copy));
        let tmpfs = listing(&shm.path().join(copy));
        assert_eq!(
            ours, tmpfs,
            "{copy} into the mount differs from {copy} into tmpfs"
        );
        // (diff cannot compare FIFOs, sockets and devices: they are
        // compared by type, device number and mode.)
        run(Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .args(["-x", "pipe", "-x", "null", "-x", "disk", "-x", "sock"])
            .arg(m.dir.join(copy))
            .arg(shm.path().join(copy)));
        let specials = special_files(&m.dir.join(copy));
        assert_eq!(specials, special_files(&shm.path().join(copy)));
        assert!(specials.contains("a/null char 103"), "{specials}");
    }
    // rsync again finds nothing to do (sizes and times match).
    let again = run(Command::new("rsync")
        .args(["-a", "--itemize-changes"])
        .arg(format!("{}/", src.display()))
        .arg(m.dir.join("rsync")));
    assert_eq!(again.trim(), "", "rsync found differences: {again}");
}

#[test]
fn git_init_add_commit_inside_the_mount() {
    let Some(git) = tool("git") else { return };
    let (dir, _node, m) = setup(&[]);
    let src = dir.path().join("src");
    make_tree(&src, false);
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut ids = Vec::new();
    for target in [m.dir.join("repo"), shm.path().join("repo")] {
        run(Command::new("cp").arg("-a").arg(&src).arg(&target));
        let g = |args: &[&str]| {
            run(Command::new(&git)
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@e",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(&target)
                .env("GIT_AUTHOR_DATE", "2020-01-01T00:00:00Z")
                .env("GIT_COMMITTER_DATE", "2020-01-01T00:00:00Z"))
        };
        g(&["init", "-q"]);
        g(&["add", "-A"]);
        g(&["commit", "-q", "-m", "tree"]);
        fs::write(target.join("a/one"), b"changed").unwrap();
        g(&["commit", "-q", "-a", "-m", "change"]);
        g(&["fsck", "--full", "--strict"]);
        assert_eq!(g(&["status", "--porcelain"]), "");
        assert_eq!(g(&["log", "--oneline"]).lines().count(), 2);
        ids.push(g(&["rev-parse", "HEAD"]));
    }
    assert_eq!(ids[0], ids[1], "the same commits as on tmpfs");
}

#[test]
fn reads_stay_correct_while_blocks_move_between_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!(
        "data.tiers=[MEM:6MiB]{},[HDD:512MiB]{}",
        dir.path().join("mem").display(),
        dir.path().join("hdd").display()
    );
    let node = NodeProcess::start(
        &dir.path().join("n0"),
        &[
            "-c",
            &tiers,
            "-c",
            "data.evict_interval=50ms",
            "-c",
            "data.block_size=1MiB",
        ],
    );
    // Direct I/O: every read goes to the cluster, not the page cache.
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &["--direct-io"]);
    let files: Vec<Vec<u8>> = (0..6)
        .map(|i| random_bytes(3 * 1024 * 1024 + i, 50 + i as u64))
        .collect();
    for (i, data) in files.iter().enumerate() {
        fs::write(m.path(&format!("f{i}")), data).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..3 {
            let (m, files) = (&m, &files);
            s.spawn(move || {
                for round in 0..4 {
                    for (i, data) in files.iter().enumerate() {
                        let got = fs::read(m.path(&format!("f{i}"))).unwrap();
                        assert!(got == *data, "reader {t} round {round}: f{i} differs");
                    }
                }
            });
        }
        // More data keeps the MEM tier over its watermark meanwhile.
        s.spawn(|| {
            for i in 0..6 {
                fs::write(
                    m.path(&format!("extra{i}")),
                    random_bytes(2 * 1024 * 1024, 90 + i),
                )
                .unwrap();
            }
        });
    });
    let report = node.cli_ok(&["report"]);
    assert!(report.contains("HDD"), "{report}");
}

#[test]
fn s3_objects_read_and_written_through_the_mount() {
    let Some(s3) = curvine_integration::TestS3::get() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let loc = s3.location("fuse");
    let ufs = s3.ufs(&loc);
    let big = random_bytes(3 * 1024 * 1024 + 17, 11);
    runtime().block_on(async {
        ufs.write_all("in/hello.txt", b"from s3".to_vec())
            .await
            .unwrap();
        ufs.write_all("in/big", big.clone()).await.unwrap();
    });
    let mut args: Vec<String> = vec![
        "mount".into(),
        loc.clone(),
        "/s3".into(),
        "--block-size".into(),
        "1MiB".into(),
    ];
    args.extend(s3.props());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.cli_ok(&args);
    let mut args: Vec<String> = vec![
        "mount".into(),
        s3.location("fuse-fs-mode"),
        "/s3w".into(),
        "--write-type".into(),
        "fs_mode".into(),
    ];
    args.extend(s3.props());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    node.cli_ok(&args);
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    let names: Vec<String> = fs::read_dir(m.path("s3/in"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(names, ["big", "hello.txt"]);
    assert_eq!(fs::read(m.path("s3/in/hello.txt")).unwrap(), b"from s3");
    assert!(fs::read(m.path("s3/in/big")).unwrap() == big);
    // A file written through the mount reaches the bucket at close.
    fs::write(m.path("s3/out.txt"), b"written through fuse").unwrap();
    let obj = runtime().block_on(ufs.read_all("out.txt")).unwrap();
    assert_eq!(obj, b"written through fuse");
    // Object keys are UTF-8: a name that is not is refused (EILSEQ), in
    // cache_mode and in fs_mode, whose directories the mount holds.
    let raw = |dir: &str, b: &[u8]| m.path(dir).join(std::ffi::OsStr::from_bytes(b));
    assert_eq!(errno(fs::write(raw("s3", b"caf\xe9"), b"x")), libc::EILSEQ);
    assert_eq!(errno(fs::create_dir(raw("s3", b"r\xe9p"))), libc::EILSEQ);
    for i in 0..20 {
        fs::write(m.path(&format!("s3w/f{i}")), b"fs_mode").unwrap();
    }
    assert_eq!(errno(fs::write(raw("s3w", b"caf\xe9"), b"x")), libc::EILSEQ);
    assert_eq!(
        errno(fs::rename(m.path("s3w/f0"), raw("s3w", b"caf\xe9"))),
        libc::EILSEQ
    );
    assert_eq!(fs::read(m.path("s3w/f0")).unwrap(), b"fs_mode");
}

/// Read-only opens the mount passed through, or read through the mount
/// for reason `result` (`curvine_fuse_passthrough_opens_total`).
/// Everything an open file holds, read with `pread` from the start.
fn whole(f: &File) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = f.read_at(&mut buf, got.len() as u64).unwrap();
        if k == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..k]);
    }
}

/// Has `readers` read their whole content again and again, each time
/// `opened`, while `write` runs (and at least 3 times each).
fn readers_keep_while(readers: [&File; 2], opened: &[u8], write: impl FnOnce()) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for r in readers {
            let done = &done;
            scope.spawn(move || {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 3 {
                    assert!(whole(r) == opened, "a reader saw content it did not open");
                    reads += 1;
                }
            });
        }
        write();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    });
}

fn passthrough_opens(m: &FuseMount, result: &str) -> u64 {
    m.counter(
        "curvine_fuse_passthrough_opens_total",
        &format!("result=\"{result}\""),
    )
}

#[test]
fn blocks_read_only_through_passthrough_count_as_recently_used_for_eviction() {
    use curvine_messages::block::TierKind;
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!(
        "data.tiers=[MEM:64MiB]{},[HDD:256MiB]{}",
        dir.path().join("mem").display(),
        dir.path().join("hdd").display()
    );
    let node = NodeProcess::start(
        &dir.path().join("n0"),
        &[
            "-c",
            &tiers,
            "-c",
            "data.evict_interval=100ms",
            // Demote from 12.8 MiB down to 12.16 MiB: far from full, so
            // every file is placed in the MEM tier.
            "-c",
            "data.high_watermark=0.2",
            "-c",
            "data.low_watermark=0.19",
        ],
    );
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &["--block-size", "4MiB"]);
    let tier_of = |path: &str| {
        runtime().block_on(async {
            let blocks = node.client().await.blocks(path).await.unwrap();
            blocks.blocks[0].replicas[0].tier
        })
    };
    // Files of one block each in the MEM tier: `hot` (2 MiB) written
    // first, then four of 1 MiB.
    let hot = random_bytes(2 << 20, 41);
    fs::write(m.path("hot"), &hot).unwrap();
    for i in 0..4 {
        fs::write(m.path(&format!("cold{i}")), random_bytes(1 << 20, 42 + i)).unwrap();
    }
    // Only `hot` is read again, and only through passthrough handles: the
    // kernel reads its block file without asking the node.
    let passed = passthrough_opens(&m, "passthrough");
    let local = || node_counter(&node, "curvine_data_bytes_local_total", "");
    let local_before = local();
    for _ in 0..3 {
        assert!(fs::read(m.path("hot")).unwrap() == hot);
    }
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 3);
    wait_for(
        "the mount told the node which blocks were read",
        Duration::from_secs(10),
        || (m.counter("curvine_fuse_passthrough_touched_blocks_total", "") >= 3).then_some(()),
    );
    // The node counts them out (its dashboard's throughput), a block's
    // length per open.
    assert_eq!(local() - local_before, 3 * hot.len() as u64);
    // 8 MiB more take the tier to 14 MiB, past its high watermark: its
    // evictor demotes the least recently used blocks down to the low one,
    // never more than the 4 MiB of the files not read since (it frees
    // 1.84 MiB, in blocks of 1 MiB, each time it finds the tier too full).
    for i in 0..4 {
        fs::write(m.path(&format!("fill{i}")), random_bytes(2 << 20, 50 + i)).unwrap();
    }
    let files = ["/hot", "/cold0", "/cold1", "/cold2", "/cold3"];
    wait_for(
        "a block demoted to the HDD tier",
        Duration::from_secs(30),
        || {
            files
                .iter()
                .any(|f| tier_of(f) == Some(TierKind::Hdd))
                .then_some(())
        },
    );
    assert_eq!(
        tier_of("/hot"),
        Some(TierKind::Mem),
        "the file read since was demoted before those that were not"
    );
    assert_eq!(tier_of("/cold0"), Some(TierKind::Hdd));
    assert!(fs::read(m.path("hot")).unwrap() == hot);
}

#[test]
fn passthrough_is_on_by_default_and_its_readers_keep_their_content_while_another_client_writes() {
    let (_dir, node, m) = setup(&["--block-size", "2MiB"]);
    assert!(m.log_text().contains("passthrough on"), "{}", m.log_text());
    // (`small` is one block, above fuse.passthrough_min_size.)
    let small = random_bytes(1_500_000, 21);
    let big = random_bytes(5 * 1024 * 1024 + 9, 22);
    fs::write(m.path("small"), &small).unwrap();
    // (Written over the data port: each block in a file of its own.)
    write_over_data_port(&node, "/big", &big, 2 * 1024 * 1024);
    // Files under fuse.passthrough_min_size (1MiB) keep the page cache.
    let tiny = random_bytes(100_000, 25);
    fs::write(m.path("tiny"), &tiny).unwrap();
    let small_opens = passthrough_opens(&m, "small");
    assert!(fs::read(m.path("tiny")).unwrap() == tiny);
    assert_eq!(passthrough_opens(&m, "small"), small_opens + 1);
    // One block on this host: the kernel reads the block file itself.
    let passed = passthrough_opens(&m, "passthrough");
    let r1 = File::open(m.path("small")).unwrap();
    let r2 = File::open(m.path("small")).unwrap();
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 2);
    assert!(whole(&r1) == small);
    let mut part = vec![0u8; 1000];
    r2.read_exact_at(&mut part, 5000).unwrap();
    assert_eq!(part, small[5000..6000]);

    // The block file is never written in place, and the kernel takes no
    // open of the file that does not pass through: a writer through this
    // mount is refused while the readers are open.
    let busy = OpenOptions::new().write(true).open(m.path("small"));
    assert_eq!(errno(busy), libc::ETXTBSY);
    // Another client (a second mount) replaces the file while both readers
    // are open: they keep the content they opened, whole, at every point
    // of the write.
    let other = FuseMount::start(&node, &_dir.path().join("other"), &[]);
    let new = random_bytes(1_700_000, 23);
    readers_keep_while([&r1, &r2], &small, || {
        let mut w = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(other.path("small"))
            .unwrap();
        for chunk in new.chunks(200_000) {
            w.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert!(whole(&r1) == small);
    assert_eq!(cluster_read(&node, "/small"), new);
    drop(r1);
    drop(r2);
    // Once they are closed, opens read the new content, through the new
    // block; a writer is let in again.
    let passed = passthrough_opens(&m, "passthrough");
    wait_for(
        "the new block passed through",
        Duration::from_secs(10),
        || {
            let got = fs::read(m.path("small")).unwrap();
            (got == new && passthrough_opens(&m, "passthrough") > passed).then_some(())
        },
    );
    let mut w = OpenOptions::new()
        .write(true)
        .open(m.path("small"))
        .unwrap();
    w.write_all(b"changed").unwrap();
    drop(w);
    let now = fs::read(m.path("small")).unwrap();
    assert_eq!(&now[..7], b"changed");
    assert!(now[7..] == new[7..]);

    // A file of several blocks, each in a file of its own, is read through
    // the mount while the node lays its blocks out in one file, and says why.
    let assembling = passthrough_opens(&m, "assembling");
    assert!(fs::read(m.path("big")).unwrap() == big);
    assert_eq!(passthrough_opens(&m, "assembling"), assembling + 1);
    assert!(m.log_text().contains("the node is laying them out in one"));
}

/// Writes a file with the library over the data port (no short-circuit):
/// each of its blocks lands in a file of its own on the node.
fn write_over_data_port(node: &NodeProcess, path: &str, bytes: &[u8], block_size: u64) {
    runtime().block_on(async {
        let conf = curvine_conf::ClientConf {
            short_circuit: false,
            ..node.client_conf()
        };
        let client = curvine_client::Client::connect(&conf).await.unwrap();
        let options = curvine_client::io::WriteOptions {
            spec: curvine_messages::block::FileSpec {
                block_size,
                ..Default::default()
            },
            ..curvine_client::io::WriteOptions::create()
        };
        let mut w = curvine_client::io::FileWriter::open(&client, path, &options)
            .await
            .unwrap();
        w.write(bytes).await.unwrap();
        w.close().await.unwrap();
    })
}

/// The extent files in the node's MEM tier.
fn extent_files(node: &NodeProcess) -> Vec<PathBuf> {
    match fs::read_dir(node.data_dir.with_extension("mem").join("extents")) {
        Ok(d) => d.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_file_of_several_blocks_passes_through_once_they_share_one_file_and_its_readers_keep_it_whole()
{
    let (dir, node, m) = setup(&["--block-size", "1MiB"]);
    // Each block in a file of its own: the first open reads through the
    // mount and has the node lay the blocks out in one extent file; an
    // open after that passes through.
    let laid = random_bytes(2 * 1024 * 1024 + 5, 30);
    write_over_data_port(&node, "/laid", &laid, 1024 * 1024);
    assert!(extent_files(&node).is_empty());
    let passed = passthrough_opens(&m, "passthrough");
    assert!(fs::read(m.path("laid")).unwrap() == laid);
    assert_eq!(passthrough_opens(&m, "assembling"), 1);
    wait_for(
        "the file's blocks laid out in one file",
        Duration::from_secs(20),
        || (extent_files(&node).len() == 1).then_some(()),
    );
    wait_for("an open passed through", Duration::from_secs(20), || {
        let got = fs::read(m.path("laid")).unwrap();
        assert!(got == laid, "a read through the extent differs");
        (passthrough_opens(&m, "passthrough") > passed).then_some(())
    });
    fs::remove_file(m.path("laid")).unwrap();
    wait_for("its extent file removed", Duration::from_secs(20), || {
        extent_files(&node).is_empty().then_some(())
    });
    // Written in order through the mount, a file's blocks follow each
    // other in one extent file from the start: its first open passes
    // through, with nothing to lay out.
    let old = random_bytes(3 * 1024 * 1024 + 4321, 31);
    fs::write(m.path("model"), &old).unwrap();
    assert_eq!(extent_files(&node).len(), 1);
    let extent = extent_files(&node).remove(0);
    assert_eq!(fs::metadata(&extent).unwrap().len(), old.len() as u64);
    // (An open of the first file between its extent file's making and
    // the namespace's record of it asked for the layout again: count
    // from here.)
    let (passed, assembling) = (
        passthrough_opens(&m, "passthrough"),
        passthrough_opens(&m, "assembling"),
    );
    assert!(fs::read(m.path("model")).unwrap() == old);
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 1);
    assert_eq!(passthrough_opens(&m, "assembling"), assembling);
    // The library reads the same bytes from the extent file, on this host
    // (short-circuit) and over the data port.
    for short_circuit in [true, false] {
        let got = runtime().block_on(async {
            let conf = curvine_conf::ClientConf {
                short_circuit,
                ..node.client_conf()
            };
            let client = curvine_client::Client::connect(&conf).await.unwrap();
            let mut r = FileReader::open(&client, "/model").await.unwrap();
            let mut out = Vec::new();
            r.read_to_end(&mut out).await.unwrap();
            let mut part = vec![0u8; 100_000];
            r.read_full_at(2 * 1024 * 1024 - 50_000, &mut part)
                .await
                .unwrap();
            assert!(part[..] == old[2 * 1024 * 1024 - 50_000..][..100_000]);
            out
        });
        assert!(got == old, "short_circuit={short_circuit}");
    }
    // Two readers pass through; a second mount rewrites the file: they keep
    // reading the content they opened, whole.
    let passed = passthrough_opens(&m, "passthrough");
    let (r1, r2) = (
        File::open(m.path("model")).unwrap(),
        File::open(m.path("model")).unwrap(),
    );
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 2);
    let other = FuseMount::start(&node, &dir.path().join("other"), &["--block-size", "1MiB"]);
    let new = random_bytes(2 * 1024 * 1024 + 777, 32);
    readers_keep_while([&r1, &r2], &old, || {
        let mut w = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(other.path("model"))
            .unwrap();
        for chunk in new.chunks(300_000) {
            w.write_all(chunk).unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert_eq!(cluster_read(&node, "/model"), new);
    // The rewrite freed the old blocks, and their extent file went with
    // the last of them; the readers keep the bytes they opened (an
    // unlinked file lives while it is open).
    assert!(whole(&r1) == old);
    drop((r1, r2));
    wait_for(
        "the old extent file removed",
        Duration::from_secs(20),
        || (!extent.exists()).then_some(()),
    );
    // The new content is laid out in its turn, and passes through (this
    // mount sees another mount's change within its attribute cache's time;
    // until then it reads the old content, whole).
    let passed = passthrough_opens(&m, "passthrough");
    wait_for(
        "the new content passed through",
        Duration::from_secs(20),
        || {
            let got = fs::read(m.path("model")).unwrap();
            assert!(
                got == new || got == old,
                "a read after the rewrite is torn: {} bytes (new {}, old {}); first byte unlike the new at {:?}, unlike the old at {:?}",
                got.len(),
                new.len(),
                old.len(),
                got.iter().zip(&new).position(|(a, b)| a != b),
                got.iter().zip(&old).position(|(a, b)| a != b)
            );
            (got == new && passthrough_opens(&m, "passthrough") > passed).then_some(())
        },
    );
    let blocks = node.cli_ok(&["fs", "blocks", "/model"]);
    assert!(blocks.contains("3 blocks of 1.0MiB"), "{blocks}");
    assert!(blocks.contains("laid out in one extent file"), "{blocks}");
    assert_eq!(extent_files(&node).len(), 1);
    // Removing the file removes its extent file.
    fs::remove_file(m.path("model")).unwrap();
    wait_for(
        "the extent file removed with the file",
        Duration::from_secs(20),
        || extent_files(&node).is_empty().then_some(()),
    );
}

#[test]
fn a_read_right_after_a_write_passes_through_and_an_open_writer_is_not_waited_for() {
    let (_dir, _node, m) = setup(&[]);
    // The kernel sends a closed file's RELEASE without waiting for it: the
    // read's open can reach the mount first, and waits for that release
    // (cp then a checksum; a checkpoint read back).
    let data = random_bytes(1536 * 1024, 40);
    let passed = passthrough_opens(&m, "passthrough");
    let busy = passthrough_opens(&m, "being_written") + passthrough_opens(&m, "cached_handles");
    for i in 0..20 {
        let path = m.path(&format!("ckpt-{i}"));
        fs::write(&path, &data).unwrap();
        assert!(fs::read(&path).unwrap() == data);
    }
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 20);
    assert_eq!(
        passthrough_opens(&m, "being_written") + passthrough_opens(&m, "cached_handles"),
        busy
    );
    // A file still open for writing (through a descriptor its writer
    // duplicated and closed, as a shell's redirection does) reads through
    // the mount, with what was written.
    let mut w = File::create(m.path("log")).unwrap();
    w.write_all(&data).unwrap();
    drop(w.try_clone().unwrap());
    assert!(fs::read(m.path("log")).unwrap() == data);
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 20);
    w.write_all(b"more").unwrap();
    drop(w);
    assert_eq!(fs::read(m.path("log")).unwrap().len(), data.len() + 4);
    assert_eq!(passthrough_opens(&m, "passthrough"), passed + 21);
}

/// Reads up to `len` bytes at `at` of a file opened with O_DIRECT (into
/// a page-aligned buffer, as O_DIRECT asks).
fn read_direct(file: &File, at: u64, len: usize) -> Vec<u8> {
    let mut raw = vec![0u8; len + 4096];
    let skip = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[skip..skip + len];
    let mut done = 0;
    while done < len {
        let n = file.read_at(&mut buf[done..], at + done as u64).unwrap();
        if n == 0 {
            break;
        }
        done += n;
    }
    buf[..done].to_vec()
}

#[test]
fn a_file_of_other_nodes_blocks_opened_twice_is_copied_here_and_passes_through() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = curvine_integration::ProcessCluster::start(dir.path(), 2, &[]);
    let (here, far) = (&cluster.nodes[0], &cluster.nodes[1]);
    let m = FuseMount::start(here, &dir.path().join("mnt"), &["--block-size", "1MiB"]);
    // This one reads the other node's blocks over its data port, as from
    // another host.
    let off = FuseMount::start(
        here,
        &dir.path().join("off"),
        &[
            "-c",
            "fuse.local_copies=false",
            "-c",
            "client.short_circuit=false",
        ],
    );
    // A file of four blocks, all on the other node.
    let data = random_bytes(3 * 1024 * 1024 + 999, 41);
    let local = dir.path().join("data");
    fs::write(&local, &data).unwrap();
    far.cli_ok(&[
        "fs",
        "put",
        "--block-size",
        "1MiB",
        local.to_str().unwrap(),
        "/far",
    ]);
    let only_far = vec![vec![far.node_id.clone()]; 4];
    assert_eq!(here.block_nodes("/far"), only_far);
    // Read once: through the mount, and not copied (a file read once costs
    // no second copy).
    assert!(fs::read(m.path("far")).unwrap() == data);
    assert_eq!(passthrough_opens(&m, "not_local"), 1);
    assert_eq!(passthrough_opens(&m, "copying"), 0);
    // A mount with local copies off reads it again through itself.
    for _ in 0..2 {
        assert!(fs::read(off.path("far")).unwrap() == data);
    }
    // Reads as the program asks them (O_DIRECT: no readahead between):
    // in order in pieces that fit the reader's chunks and pieces that
    // straddle them, and here and there.
    let direct = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(off.path("far"))
        .unwrap();
    for piece in [256 << 10, 96 << 10, 1 << 20] {
        let mut at = 0;
        while at < data.len() {
            let got = read_direct(&direct, at as u64, piece);
            let want = &data[at..(at + piece).min(data.len())];
            assert!(got == want, "{piece}-byte read at {at}");
            at += piece;
        }
    }
    for at in [3 << 20, 4096, (2 << 20) - 8192, 1 << 20, 0] {
        let got = read_direct(&direct, at as u64, 128 << 10);
        assert!(
            got == data[at..(at + (128 << 10)).min(data.len())],
            "read at {at}"
        );
    }
    assert_eq!(passthrough_opens(&off, "copying"), 0);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(here.block_nodes("/far"), only_far);
    // Opened again through the default mount: the node of its host copies
    // the blocks into one extent file, each one more replica, and later
    // opens pass through to it.
    assert!(fs::read(m.path("far")).unwrap() == data);
    assert_eq!(passthrough_opens(&m, "copying"), 1);
    wait_for("the blocks copied here", Duration::from_secs(30), || {
        let both = [far.node_id.clone(), here.node_id.clone()];
        (here
            .block_nodes("/far")
            .iter()
            .all(|h| h.len() == 2 && both.iter().all(|n| h.contains(n))))
        .then_some(())
    });
    assert_eq!(extent_files(here).len(), 1);
    let extent = extent_files(here).remove(0);
    assert_eq!(fs::read(&extent).unwrap(), data);
    let passed = passthrough_opens(&m, "passthrough");
    wait_for("an open passed through", Duration::from_secs(20), || {
        let got = fs::read(m.path("far")).unwrap();
        assert!(got == data, "a read through the copies differs");
        (passthrough_opens(&m, "passthrough") > passed).then_some(())
    });
    let blocks = here.cli_ok(&["fs", "blocks", "/far"]);
    assert!(blocks.contains("laid out in one extent file"), "{blocks}");
    // The copies are replicas like the others: removing the file removes
    // them (and their extent file) too, once no reader holds the version
    // removed (the O_DIRECT reader above still reads it whole).
    fs::remove_file(m.path("far")).unwrap();
    let mut at = 0;
    while at < data.len() {
        assert!(
            read_direct(&direct, at as u64, 1 << 20) == data[at..(at + (1 << 20)).min(data.len())]
        );
        at += 1 << 20;
    }
    drop(direct);
    wait_for(
        "the copies removed with the file",
        Duration::from_secs(30),
        || extent_files(here).is_empty().then_some(()),
    );
}

#[test]
fn a_mount_that_cannot_pass_through_says_why_and_reads_through_itself() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let data = random_bytes(200_000, 24);
    for (name, flags, why) in [
        (
            "wb",
            &["--writeback-cache"][..],
            "passthrough off: fuse.writeback_cache is on",
        ),
        ("no", &["--no-passthrough"][..], ""),
    ] {
        let m = FuseMount::start(&node, &dir.path().join(name), flags);
        fs::write(m.path("f"), &data).unwrap();
        assert!(fs::read(m.path("f")).unwrap() == data);
        let mut w = OpenOptions::new().append(true).open(m.path("f")).unwrap();
        w.write_all(b"tail").unwrap();
        drop(w);
        assert_eq!(fs::read(m.path("f")).unwrap().len(), data.len() + 4);
        let log = m.log_text();
        assert!(log.contains(why), "{log}");
        assert!(!log.contains("passthrough on"), "{log}");
        assert_eq!(passthrough_opens(&m, "passthrough"), 0);
    }
}

/// A TCP proxy in front of the S3 server that can be told to hold what it
/// forwards: requests through it then hang, as against a stuck store.
struct StallProxy {
    addr: String,
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn stall_proxy(target: &str) -> StallProxy {
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stalled = Arc::new(AtomicBool::new(false));
    let (target, flag) = (target.to_string(), stalled.clone());
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else {
                continue;
            };
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server, client),
            ] {
                let flag = flag.clone();
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        while flag.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    StallProxy { addr, stalled }
}

#[test]
fn a_hung_ufs_read_does_not_hold_other_requests() {
    use std::sync::atomic::Ordering;
    let Some(s3) = curvine_integration::TestS3::get() else {
        return;
    };
    let endpoint = s3
        .endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let proxy = stall_proxy(&endpoint);
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n0"), &[]);
    let loc = s3.location("stall");
    let ufs = s3.ufs(&loc);
    let big = random_bytes(2 * 1024 * 1024, 31);
    runtime().block_on(async {
        ufs.write_all("slow/big", big.clone()).await.unwrap();
        ufs.write_all("fast/small", b"cached".to_vec())
            .await
            .unwrap();
    });
    // The mount reaches S3 through the proxy.
    let mut args: Vec<String> = vec!["mount".into(), loc.clone(), "/s3".into()];
    for p in s3.props() {
        args.push(match p.strip_prefix("s3.endpoint_url=") {
            Some(_) => format!("s3.endpoint_url=http://{}", proxy.addr),
            None => p,
        });
    }
    node.cli_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let m = FuseMount::start(&node, &dir.path().join("mnt"), &[]);
    assert_eq!(fs::read(m.path("s3/fast/small")).unwrap(), b"cached");
    assert_eq!(
        fs::metadata(m.path("s3/slow/big")).unwrap().len(),
        big.len() as u64
    );
    fs::write(m.path("local.txt"), b"local").unwrap();

    // S3 stops answering; a read of an object not cached hangs on it.
    proxy.stalled.store(true, Ordering::SeqCst);
    let slow_path = m.path("s3/slow/big");
    let slow = std::thread::spawn(move || fs::read(slow_path));
    std::thread::sleep(Duration::from_millis(500));
    assert!(!slow.is_finished(), "the read should wait for S3");

    // Meanwhile everything else through the mount answers.
    let (tx, rx) = std::sync::mpsc::channel();
    let (m_dir, started) = (m.dir.clone(), std::time::Instant::now());
    std::thread::spawn(move || {
        let p = |r: &str| m_dir.join(r);
        let result = (|| -> std::io::Result<()> {
            assert_eq!(fs::read(p("local.txt"))?, b"local");
            assert_eq!(fs::read(p("s3/fast/small"))?, b"cached");
            fs::write(p("new.txt"), b"written while S3 hangs")?;
            assert_eq!(fs::read(p("new.txt"))?, b"written while S3 hangs");
            fs::create_dir(p("d"))?;
            assert!(fs::read_dir(&m_dir)?.count() >= 4);
            Ok(())
        })();
        let _ = tx.send(result);
    });
    let done = rx.recv_timeout(Duration::from_secs(10));
    assert!(
        matches!(done, Ok(Ok(()))),
        "other requests were held: {done:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(!slow.is_finished(), "the S3 read is still waiting");

    // S3 answers again: the held read completes with the object.
    proxy.stalled.store(false, Ordering::SeqCst);
    let got = slow.join().unwrap().unwrap();
    assert!(got == big);
}
