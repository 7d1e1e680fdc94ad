//! Small files written through the mount into an fs_mode mount while the
//! mount, then the node, is killed with SIGKILL: after each restart every
//! file whose `close` returned is whole, no file is half written (a file
//! whose writer died shows its last closed version: empty for a new one),
//! and the fs_mode mount persists every closed file to its UFS. On three
//! nodes with three copies per shard, the node leading every shard killed
//! in the middle of each copy: no copy fails and every file is whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use curvine_integration::{
    random_bytes, wait_for, wait_for_voters, FuseMount, Lazily, NodeProcess, ProcessCluster,
    FAST_PERSIST,
};

const FILES: usize = 240;
/// `data.write_lease` of the test's node.
const WRITE_LEASE: Duration = Duration::from_secs(2);

/// Copies each listed file from SRC to DST with 8 threads, appending its
/// name to LOG once its `close` returned.
const WRITER: &str = r#"
import os, sys
from concurrent.futures import ThreadPoolExecutor
src, dst, log, listing = sys.argv[1:5]
rels = open(listing).read().split()
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def one(rel):
    data = open(os.path.join(src, rel), "rb").read()
    p = os.path.join(dst, rel)
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    except OSError:
        return
    os.write(fd, (rel + "\n").encode())
with ThreadPoolExecutor(8) as pool:
    list(pool.map(one, rels))
"#;

/// FILES files of 1-64 KiB in 8 directories, by name relative to `src`.
fn make_source(src: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for i in 0..FILES {
        let rel = format!("d{}/f{i:04}.bin", i % 8);
        let bytes = random_bytes(1024 + (i * 7919) % (63 * 1024), i as u64);
        let path = src.join(&rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        files.insert(rel, bytes);
    }
    files
}

fn start_writer(src: &Path, dst: &Path, log: &Path, listing: &Path, err: std::fs::File) -> Child {
    Command::new("python3")
        .arg("-c")
        .arg(WRITER)
        .args([src, dst, log, listing])
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .expect("python3")
}

fn closed(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until `done()` counts at least `n` files.
fn wait_progress(what: &str, within: Duration, mut done: impl FnMut() -> usize, n: usize) {
    wait_for(Lazily(|| format!("{what}: {n} files")), within, || {
        (done() >= n).then_some(())
    });
}

/// Every file under `dst` (relative names), with its bytes.
fn tree(dst: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![dst.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else {
                let rel = path
                    .strip_prefix(dst)
                    .unwrap()
                    .to_string_lossy()
                    .to_string();
                let bytes =
                    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                out.insert(rel, bytes);
            }
        }
    }
    out
}

/// Checks the files under `dst` after a kill: each is whole or empty (its
/// writer died before close), and every one in `closed` is whole. Returns
/// the whole ones.
fn check_after_kill(
    what: &str,
    dst: &Path,
    source: &BTreeMap<String, Vec<u8>>,
    closed: &[String],
) -> Vec<String> {
    let found = tree(dst);
    let mut whole = Vec::new();
    for (rel, bytes) in &found {
        let want = source
            .get(rel)
            .unwrap_or_else(|| panic!("{what}: {rel} is not a source file"));
        if bytes == want {
            whole.push(rel.clone());
        } else {
            assert!(
                bytes.is_empty(),
                "{what}: {rel} is half written: {} of {} bytes",
                bytes.len(),
                want.len()
            );
        }
    }
    eprintln!(
        "{what}: {} files, {} whole, {} whose close returned",
        found.len(),
        whole.len(),
        closed.len()
    );
    for rel in closed {
        assert_eq!(
            found.get(rel).map(Vec::len),
            Some(source[rel].len()),
            "{what}: {rel} was closed before the kill but is not whole"
        );
    }
    whole
}

fn wait_exit(child: &mut Child, within: Duration, log: &Path) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Where it waits: each thread's kernel stack (a request to the mount
    // shows as fuse_* frames), and the end of its own log.
    let mut stacks = String::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", child.id())) {
        for task in tasks.flatten() {
            let stack = std::fs::read_to_string(task.path().join("stack")).unwrap_or_default();
            let top: Vec<&str> = stack.lines().take(6).collect();
            stacks.push_str(&format!("{:?}: {}\n", task.file_name(), top.join(" < ")));
        }
    }
    // A Go program (rclone) prints where each goroutine waits on SIGQUIT.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) };
    std::thread::sleep(Duration::from_secs(2));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.contains("Copied (new)"))
        .filter(|l| !l.starts_with('\t') || l.contains("rclone/") || l.contains("os."))
        .collect();
    let tail = lines[lines.len().saturating_sub(120)..].join("\n");
    let _ = child.kill();
    let _ = child.wait();
    panic!("the copy did not finish within {within:?}\n{stacks}--- its log:\n{tail}");
}

/// What copies the files in a phase.
#[derive(Debug, Clone, Copy)]
enum Tool {
    /// 8 Python threads, logging each close that returned.
    Writer,
    /// `rclone copy --transfers=16`.
    Rclone,
    /// `tar x` of an archive of the source.
    Tar,
}

/// What is killed in the middle of the copy.
#[derive(Debug, Clone, Copy)]
enum Kill {
    Mount,
    Node,
}

/// Files under `dst` so far (any depth), by listing it.
fn count_files(dst: &Path) -> usize {
    let mut n = 0;
    let mut dirs = vec![dst.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            match entry.file_type() {
                Ok(t) if t.is_dir() => dirs.push(entry.path()),
                Ok(_) => n += 1,
                Err(_) => {}
            }
        }
    }
    n
}

struct Setup {
    dir: PathBuf,
    src: PathBuf,
    archive: PathBuf,
    listing: PathBuf,
    source: BTreeMap<String, Vec<u8>>,
}

impl Setup {
    /// The source files, their list and their archive, under `dir`.
    fn new(dir: &Path) -> Setup {
        let src = dir.join("src");
        let source = make_source(&src);
        let listing = dir.join("listing");
        std::fs::write(
            &listing,
            source.keys().cloned().collect::<Vec<_>>().join("\n"),
        )
        .unwrap();
        let archive = dir.join("src.tar");
        let status = Command::new("tar")
            .arg("cf")
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .status()
            .unwrap();
        assert!(status.success());
        Setup {
            dir: dir.to_path_buf(),
            src,
            archive,
            listing,
            source,
        }
    }

    /// Starts `tool` copying the source into `dst`; its messages go to
    /// `log` with `.err` added.
    fn start(&self, tool: Tool, dst: &Path, log: &Path) -> Child {
        std::fs::create_dir_all(dst).unwrap();
        let err = std::fs::File::options()
            .create(true)
            .append(true)
            .open(err_log(log))
            .unwrap();
        let mut command = match tool {
            Tool::Writer => return start_writer(&self.src, dst, log, &self.listing, err),
            Tool::Rclone => {
                let mut c = Command::new("rclone");
                c.args(["--config", "/dev/null", "copy", "--transfers=16", "-v"])
                    .arg(&self.src)
                    .arg(dst);
                c
            }
            Tool::Tar => {
                let mut c = Command::new("tar");
                c.arg("xf").arg(&self.archive).arg("-C").arg(dst);
                c
            }
        };
        command
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("{tool:?}: {e}"))
    }
}

/// Where a copy started for `log` writes its messages.
fn err_log(log: &Path) -> PathBuf {
    log.with_extension("err")
}

/// One phase: `tool` copies the source into `/ing/NAME` through the mount,
/// `kill` strikes once 40 files are there, the node or mount comes back,
/// and the files are checked. A copy by rclone or tar is then made again
/// to its end (what a user does after a crash), which must leave every
/// file whole. Returns the whole files, relative to `/ing`.
fn phase(
    setup: &Setup,
    node: &mut NodeProcess,
    slot: &mut Option<FuseMount>,
    name: &str,
    tool: Tool,
    kill: Kill,
) -> Vec<String> {
    let mount_dir = slot.as_ref().expect("a mount").dir.clone();
    let what = format!("{tool:?} with the {kill:?} killed");
    let dst = mount_dir.join(format!("ing/{name}"));
    let log = setup.dir.join(format!("closed-{name}"));
    let mut copy = setup.start(tool, &dst, &log);
    match tool {
        Tool::Writer => wait_progress(&what, Duration::from_secs(60), || closed(&log).len(), 40),
        _ => wait_progress(&what, Duration::from_secs(60), || count_files(&dst), 40),
    }
    match kill {
        Kill::Mount => {
            slot.as_mut().expect("a mount").kill();
            wait_exit(&mut copy, Duration::from_secs(60), &err_log(&log));
            // The dead mount's handle goes first: dropping it clears
            // whatever is mounted on its directory.
            *slot = None;
            *slot = Some(FuseMount::start(node, &mount_dir, &[]));
        }
        Kill::Node => {
            node.restart_on_same_ports();
            wait_exit(&mut copy, Duration::from_secs(180), &err_log(&log));
        }
    }
    let closed = closed(&log);
    let mut whole = check_after_kill(&what, &dst, &setup.source, &closed);
    if !matches!(tool, Tool::Writer) {
        // The files the dead writer had open stay claimed by it until
        // `data.write_lease` passes (another writer meanwhile gets EBUSY).
        std::thread::sleep(WRITE_LEASE + Duration::from_millis(500));
        let mut again = setup.start(tool, &dst, &log);
        wait_exit(&mut again, Duration::from_secs(180), &err_log(&log));
        whole = check_after_kill(&format!("{what}, copied again"), &dst, &setup.source, &[]);
        assert_eq!(
            whole.len(),
            FILES,
            "{what}: copied again, {} whole files",
            whole.len()
        );
    }
    whole.iter().map(|rel| format!("{name}/{rel}")).collect()
}

#[test]
fn closed_files_are_whole_and_persisted_after_the_mount_or_the_node_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let ufs = dir.path().join("ufs");
    std::fs::create_dir_all(&ufs).unwrap();
    let lease = format!("data.write_lease={}s", WRITE_LEASE.as_secs());
    let args: Vec<&str> = FAST_PERSIST.iter().copied().chain(["-c", &lease]).collect();
    let mut node = NodeProcess::start_pinned(&dir.path().join("n"), &args);
    node.cli_ok(&[
        "mount",
        &format!("file://{}", ufs.display()),
        "/ing",
        "--write-type",
        "fs_mode",
    ]);
    let setup = Setup::new(dir.path());
    let mut mount = Some(FuseMount::start(&node, &dir.path().join("mnt"), &[]));
    let mut persisted: Vec<String> = Vec::new();
    for (name, tool, kill) in [
        ("wm", Tool::Writer, Kill::Mount),
        ("rm", Tool::Rclone, Kill::Mount),
        ("tm", Tool::Tar, Kill::Mount),
        ("wn", Tool::Writer, Kill::Node),
        ("rn", Tool::Rclone, Kill::Node),
        ("tn", Tool::Tar, Kill::Node),
    ] {
        persisted.extend(phase(&setup, &mut node, &mut mount, name, tool, kill));
    }

    // Every whole file reaches the UFS, byte for byte.
    let source = &setup.source;
    let in_ufs = |rel: &String| {
        std::fs::read(ufs.join(rel)).ok().as_deref()
            == Some(&source[rel.split_once('/').unwrap().1][..])
    };
    wait_for(
        Lazily(|| {
            let missing: Vec<&String> = persisted.iter().filter(|r| !in_ufs(r)).take(5).collect();
            format!(
                "{} closed files to be persisted; not yet: {missing:?}",
                persisted.len()
            )
        }),
        Duration::from_secs(120),
        || persisted.iter().all(in_ufs).then_some(()),
    );
    drop(mount);
    let fsck = node.cli_ok(&["admin", "fsck"]);
    assert!(fsck.contains("namespace is consistent"), "{fsck}");
}

#[test]
fn no_copy_fails_and_every_file_is_whole_when_the_leader_of_every_shard_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = ProcessCluster::start(dir.path(), 3, &["-c", "meta.replicas=3"]);
    wait_for_voters(&cluster.nodes[1], 16, 3);
    let setup = Setup::new(dir.path());
    // The mount talks to the second node; the first, which founded the
    // cluster and leads every shard's group, is killed in each copy.
    // Blocks of 1MiB: a writer in flight holds a block's room in the
    // mount's node's MEM tier (512MiB) until it commits, and with 64MiB
    // blocks rclone's 16 transfers fill it, so that new blocks go to other
    // nodes; those on the killed node (their one copy) could not be read
    // until it returns. This test is about the metadata leader: the data
    // stays on the mount's node.
    let mount = FuseMount::start(
        &cluster.nodes[1],
        &dir.path().join("mnt"),
        &["--block-size", "1MiB"],
    );
    for (name, tool) in [("w", Tool::Writer), ("r", Tool::Rclone), ("t", Tool::Tar)] {
        let what = format!("{tool:?} with the shards' leader killed");
        let dst = mount.path(name);
        let log = setup.dir.join(format!("closed-leader-{name}"));
        let mut copy = setup.start(tool, &dst, &log);
        match tool {
            Tool::Writer => {
                wait_progress(&what, Duration::from_secs(60), || closed(&log).len(), 40)
            }
            _ => wait_progress(&what, Duration::from_secs(60), || count_files(&dst), 40),
        }
        cluster.nodes[0].kill();
        let deadline = Instant::now() + Duration::from_secs(180);
        let status = loop {
            if let Some(status) = copy.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{what}: the copy did not finish");
            std::thread::sleep(Duration::from_millis(50));
        };
        // Failover is waited for, not failed: the copy succeeds whole.
        assert!(status.success(), "{what}: {status}");
        let closed = closed(&log);
        let whole = check_after_kill(&what, &dst, &setup.source, &closed);
        assert_eq!(whole.len(), FILES, "{what}: {} whole files", whole.len());
        if matches!(tool, Tool::Writer) {
            assert_eq!(closed.len(), FILES, "{what}: every close returned");
        }
        cluster.nodes[0].start_again();
        cluster.wait_up(3);
        wait_for_voters(&cluster.nodes[1], 16, 3);
    }
    drop(mount);
    let fsck = cluster.nodes[1].cli_ok(&["admin", "fsck"]);
    assert!(fsck.contains("namespace is consistent"), "{fsck}");
}
