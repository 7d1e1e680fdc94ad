//! The metadata write-ahead log on real LMDB environments: every change
//! acknowledged by the writer survives the process being killed, and a
//! machine crash simulated on the files (any subset of the pages LMDB wrote
//! since its checkpoint lost, meta pages included); a torn record at the
//! end of the log is ignored; a node started without the log applies and
//! removes it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use curvine_actors::engine::Engine;
use curvine_actors::replica::read_group_state;
use curvine_actors::store::{ShardIdentity, ShardStore, StoreOptions};
use curvine_actors::writer::Writer;
use curvine_messages::{now_ns, FileKind, NewInode, ROOT_INO};

const CHILD_DIR: &str = "CURVINE_WAL_TEST_DIR";

fn options(wal: bool) -> StoreOptions {
    StoreOptions {
        map_size: 256 << 20,
        max_readers: 32,
        sync_commit: true,
        wal,
        wal_size: 1 << 20,
        // No checkpoint after the ones opening makes: every change of the
        // test lives in the log and in pages written without sync.
        checkpoint_interval: Duration::from_secs(3600),
        replica_id: 1,
    }
}

fn identity(shard: u16) -> ShardIdentity {
    ShardIdentity {
        cluster_id: "wal".into(),
        shard,
        shard_count: 2,
    }
}

fn file() -> NewInode {
    NewInode {
        kind: FileKind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        symlink: None,
        now_ns: now_ns(),
    }
}

fn open(dir: &Path, wal: bool) -> Vec<Arc<ShardStore>> {
    let engine = Engine::open(&dir.join("meta"), &options(wal)).unwrap();
    (0..2)
        .map(|s| Arc::new(ShardStore::open(&engine, &identity(s)).unwrap()))
        .collect()
}

/// The writing process: opens the stores, says `ready`, waits for a line,
/// then creates files through the writer from many callers at once and
/// prints each name once its creation is acknowledged.
#[test]
#[ignore = "run by the tests below as a child process"]
fn wal_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let stores = open(Path::new(&dir), true);
    println!("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // Waves of 16 concurrent creates (so commits carry groups), until
    // killed.
    create_in_waves(&stores[0], |wave, i| format!("f{wave:05}-{i:02}"));
}

/// Creates files named `name(wave, i)` through a writer of `store`, in
/// waves of 16 concurrent callers, printing `acked NAME` or `refused
/// ERROR` for each, for as long as the process lives.
fn create_in_waves(store: &Arc<ShardStore>, name: impl Fn(u32, u32) -> String) -> ! {
    let writer = Writer::for_store(store, 512, Duration::from_micros(200));
    let (tx, rx) = std::sync::mpsc::channel::<Result<String, String>>();
    for wave in 0u32.. {
        for i in 0..16 {
            let name = name(wave, i);
            let store = store.clone();
            let tx = tx.clone();
            let n = name.clone();
            writer.submit(
                move |w| store.create(w, ROOT_INO, &n, &file(), None),
                move |r| {
                    let _ = tx.send(r.map(|_| name).map_err(|e| e.to_string()));
                },
            );
        }
        for _ in 0..16 {
            match rx.recv().unwrap() {
                Ok(name) => println!("acked {name}"),
                Err(e) => println!("refused {e}"),
            }
        }
        std::io::stdout().flush().unwrap();
    }
    unreachable!("the waves go on until the process is killed")
}

/// Starts the child, copies the data file once it is open (what the disk
/// holds at its checkpoint), lets it write until `acked` creations were
/// acknowledged, then kills it. Returns the names and the copy.
fn write_and_kill(dir: &Path, acked: usize) -> (Vec<String>, Vec<u8>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "wal_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if line.trim().ends_with("ready") {
            break;
        }
    }
    let base = std::fs::read(dir.join("meta/data.mdb")).unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
    let mut names = Vec::new();
    while names.len() < acked {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child ended");
        if let Some(name) = line.trim().strip_prefix("acked ") {
            names.push(name.to_string());
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    (names, base)
}

/// Every acknowledged name is there, and the root counts them all.
fn assert_all_there(stores: &[Arc<ShardStore>], names: &[String]) {
    let txn = stores[0].read_txn().unwrap();
    for name in names {
        let e = stores[0]
            .lookup(&txn, ROOT_INO, name)
            .unwrap_or_else(|e| panic!("acknowledged {name} is gone: {e}"));
        assert_eq!(e.kind, FileKind::File);
    }
    let listed = stores[0]
        .readdir(&txn, ROOT_INO, None, u32::MAX)
        .unwrap()
        .len();
    assert!(
        listed >= names.len(),
        "{listed} entries, {} acknowledged",
        names.len()
    );
    // No entry without its inode, no inode without its entry.
    let stats = stores[0].stats(&txn).unwrap();
    assert_eq!(stats.inodes, 1 + listed as u64, "{stats:?}");
    assert_eq!(stats.dentries, listed as u64, "{stats:?}");
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// A machine crash as the disk may have it: each page LMDB wrote since the
/// checkpoint either reached the disk or did not (the copy's version).
fn lose_unsynced_pages(data: &PathBuf, base: &[u8], seed: u64) {
    let now = std::fs::read(data).unwrap();
    let ps = page_size();
    let mut torn = now.clone();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut lost = 0;
    for (i, page) in torn.chunks_mut(ps).enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(2) {
            let at = i * ps;
            let old = base.get(at..at + page.len());
            match old {
                Some(old) => page.copy_from_slice(old),
                None => page.fill(0),
            }
            lost += 1;
        }
    }
    assert!(lost > 0);
    std::fs::write(data, torn).unwrap();
}

/// Where the log's records start: after its two header slots.
const RECORDS_AT: usize = (64 + 2 * 65536usize).div_ceil(4096) * 4096 * 2;

/// Where the records of a log's epoch (its newest header's) end: each is
/// `len u32 | crc | epoch u64 | seq u64` then `len` bytes, the first with
/// seq 1; a zero length, another epoch or a seq out of turn ends them
/// (records of an earlier epoch may follow: the log starts over at a
/// checkpoint).
fn records_end(log: &[u8]) -> usize {
    let field = |at: usize, n: usize| -> Option<u64> {
        let b = log.get(at..at + n)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        Some(u64::from_le_bytes(v))
    };
    // The newest of the two header slots' epochs (magic, then epoch).
    let epoch = [0, RECORDS_AT / 2]
        .into_iter()
        .filter(|&at| log.get(at..at + 7) == Some(&b"CRVNWAL"[..]))
        .filter_map(|at| field(at + 8, 8))
        .max();
    let mut end = RECORDS_AT;
    let mut seq = 1;
    loop {
        let (Some(len), Some(e), Some(s)) = (field(end, 4), field(end + 8, 8), field(end + 16, 8))
        else {
            return end;
        };
        if len == 0 || Some(e) != epoch || s != seq || end + 24 + len as usize > log.len() {
            return end;
        }
        end += 24 + len as usize;
        seq += 1;
    }
}

/// An engine dropped without a clean stop (nothing ends its log with a
/// checkpoint: a crash of the process) opens again in the same process and
/// recovers from its log, round after round; in one round the unsynced
/// pages of LMDB are lost as well (a machine crash). Each reopen finds
/// every create acknowledged before.
#[test]
fn an_engine_dropped_without_a_clean_stop_reopens_in_the_same_process() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta/data.mdb");
    let mut names: Vec<String> = Vec::new();
    for round in 0..4u64 {
        let stores = open(dir.path(), true);
        assert_all_there(&stores, &names);
        // What the disk holds at the checkpoint opening took.
        let base = std::fs::read(&data).unwrap();
        let writer = Writer::for_store(&stores[0], 64, Duration::ZERO);
        for i in 0..40 {
            let name = format!("r{round}-{i}");
            let (store, n) = (stores[0].clone(), name.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            writer.submit(
                move |w| store.create(w, ROOT_INO, &n, &file(), None),
                move |r| {
                    let _ = tx.send(r);
                },
            );
            rx.recv().unwrap().unwrap();
            names.push(name);
        }
        let closing = stores[0].engine().closing();
        drop((writer, stores));
        assert!(
            closing.wait_timeout(Duration::from_secs(10)),
            "round {round}: the environment is still open after its last handle went"
        );
        let log = std::fs::read(dir.path().join("meta/wal")).unwrap();
        assert!(
            records_end(&log) > RECORDS_AT,
            "round {round}: the log holds no records, so reopening recovers nothing"
        );
        if round == 2 {
            lose_unsynced_pages(&data, &base, round);
        }
    }
    // Opened while still open: refused, naming the environment.
    let stores = open(dir.path(), true);
    let err = Engine::open(&dir.path().join("meta"), &options(true)).unwrap_err();
    assert!(err.to_string().contains("already open"), "{err}");
    assert_all_there(&stores, &names);
}

#[test]
fn acknowledged_changes_survive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let (names, _) = write_and_kill(dir.path(), 400);
    let stores = open(dir.path(), true);
    assert_all_there(&stores, &names);
    // The shard's Raft group resumes where its log ended: recovery recorded
    // the last entry it applied, and the group elects itself again in a
    // later term before it takes more.
    let group = |s: &ShardStore| {
        let txn = s.read_txn().unwrap();
        read_group_state(s.tables()[0], &txn, s.shard)
            .unwrap()
            .expect("shard 0's group state")
    };
    let recovered = group(&stores[0]);
    assert!(
        recovered.applied_index > names.len() as u64 / 16,
        "{recovered:?} after {} acknowledged creates",
        names.len()
    );
    let writer = Writer::for_store(&stores[0], 512, Duration::from_micros(200));
    let (tx, rx) = std::sync::mpsc::channel();
    let store = stores[0].clone();
    writer.submit(
        move |w| store.create(w, ROOT_INO, "after-restart", &file(), None),
        move |r| tx.send(r.is_ok()).unwrap(),
    );
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
    let resumed = group(&stores[0]);
    assert!(
        resumed.hard_state.term > recovered.hard_state.term,
        "{resumed:?}"
    );
    assert!(
        resumed.applied_index >= recovered.applied_index + 2,
        "{resumed:?}"
    );
    assert_all_there(&stores, &["after-restart".to_string()]);
}

#[test]
fn acknowledged_changes_survive_a_simulated_machine_crash() {
    for seed in 1..=3u64 {
        let dir = tempfile::tempdir().unwrap();
        let (names, base) = write_and_kill(dir.path(), 300 * seed as usize);
        lose_unsynced_pages(&dir.path().join("meta/data.mdb"), &base, seed);
        let stores = open(dir.path(), true);
        assert_all_there(&stores, &names);
        // And the environment is whole: more changes commit and read back.
        let name = "after".to_string();
        stores[0]
            .write_now(|s, w| s.create(w, ROOT_INO, &name, &file(), None))
            .unwrap();
        assert_all_there(&stores, &[name]);
    }
}

#[test]
fn a_torn_record_at_the_end_is_ignored_and_no_log_applies_and_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (names, _) = write_and_kill(dir.path(), 200);
    // Bytes of a record that was being written when the process died (its
    // callers were never answered) follow the last whole record.
    let log = dir.path().join("meta/wal");
    let bytes = std::fs::read(&log).unwrap();
    let end = records_end(&bytes);
    assert!(end > RECORDS_AT, "no records in the log");
    let mut torn = bytes.clone();
    let garbage = [0x40, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 7, 7, 7];
    torn[end..end + garbage.len()].copy_from_slice(&garbage);
    std::fs::write(&log, torn).unwrap();
    // Opened without the log: it is applied, then removed.
    let stores = open(dir.path(), false);
    assert_all_there(&stores, &names);
    assert!(!log.exists(), "the log is still there");
}

const V1_DIR: &str = "CURVINE_WAL_V1_DIR";

/// Opens the stores at `CURVINE_WAL_V1_DIR` (recovering whatever log is
/// there) and prints whether `from-v1` exists.
#[test]
#[ignore = "run by the test below as a child process"]
fn wal_v1_child() {
    let Ok(dir) = std::env::var(V1_DIR) else {
        return;
    };
    let stores = open(Path::new(&dir), true);
    let txn = stores[0].read_txn().unwrap();
    let found = stores[0].lookup(&txn, ROOT_INO, "from-v1").is_ok();
    println!("found={found}");
}

fn run_v1_child(dir: &Path) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "wal_v1_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(V1_DIR, dir)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn crc32c(parts: &[&[u8]]) -> u32 {
    let mut c = curvine_messages::block::Crc32c::default();
    for p in parts {
        c.update(p);
    }
    c.value()
}

#[test]
fn a_log_of_the_previous_format_is_recovered() {
    // The changes of one create, made on a store of the same identity.
    let source = tempfile::tempdir().unwrap();
    let stores = open(source.path(), true);
    let mut w = curvine_actors::txn::WriteTxn::new(stores[0].env().write_txn().unwrap());
    stores[0]
        .create(&mut w, ROOT_INO, "from-v1", &file(), None)
        .unwrap();
    let changes = w.commit().unwrap();
    // A store formatted (and cleanly stopped) by another process.
    let dir = tempfile::tempdir().unwrap();
    assert!(run_v1_child(dir.path()).contains("found=false"));
    // Its log rewritten in the first format: a header holding the data
    // file's meta pages, then one record of bare changes.
    let page = page_size();
    let data = std::fs::read(dir.path().join("meta/data.mdb")).unwrap();
    let metas = &data[..2 * page];
    let slot_len = (64 + 2 * 65536usize).div_ceil(4096) * 4096;
    let mut log = vec![0u8; 4 * slot_len];
    let epoch = 9u64;
    let mut fixed = [0u8; 64];
    fixed[..8].copy_from_slice(b"CRVNWAL1");
    fixed[8..16].copy_from_slice(&epoch.to_le_bytes());
    fixed[16..20].copy_from_slice(&(page as u32).to_le_bytes());
    let sum = crc32c(&[&fixed[8..20], metas]);
    fixed[20..24].copy_from_slice(&sum.to_le_bytes());
    let at = (epoch as usize % 2) * slot_len;
    log[at..at + 64].copy_from_slice(&fixed);
    log[at + 64..at + 64 + 2 * page].copy_from_slice(metas);
    let payload = postcard::to_allocvec(&changes).unwrap();
    let mut head = [0u8; 24];
    head[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    head[8..16].copy_from_slice(&epoch.to_le_bytes());
    head[16..24].copy_from_slice(&1u64.to_le_bytes());
    let sum = crc32c(&[&head[8..24], &payload]);
    head[4..8].copy_from_slice(&sum.to_le_bytes());
    let records = 2 * slot_len;
    log[records..records + 24].copy_from_slice(&head);
    log[records + 24..records + 24 + payload.len()].copy_from_slice(&payload);
    std::fs::write(dir.path().join("meta/wal"), &log).unwrap();
    // This release applies it, and goes on with a log of its own format.
    assert!(run_v1_child(dir.path()).contains("found=true"));
    assert!(run_v1_child(dir.path()).contains("found=true"));
    let after = std::fs::read(dir.path().join("meta/wal")).unwrap();
    assert!(after.windows(8).any(|w| w == b"CRVNWAL2"));
}

/// The writing process of a disk that fills: opens the stores, then lets
/// no file of this process grow past a few records of the log
/// (RLIMIT_FSIZE, SIGXFSZ ignored: such a write fails with EFBIG, as one
/// to a full disk fails with ENOSPC), and creates files until it exits,
/// printing each acknowledged name.
#[test]
#[ignore = "run by the test below as a child process"]
fn failing_disk_child() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let stores = open(Path::new(&dir), true);
    // The log's records start after its two header slots (2 x 132 KiB).
    let limit = libc::rlimit {
        rlim_cur: 270_336 + (64 << 10),
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain system calls on this process.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &limit), 0);
    }
    // Long names: the log fills sooner.
    create_in_waves(&stores[0], |wave, i| {
        format!("{}-{wave:05}-{i:02}", "n".repeat(200))
    });
}

/// A pass of the writer that fails (here a write of the log or of LMDB's
/// file) leaves raft-rs ahead of what LMDB and the log hold: the process
/// exits (crash-only) instead of staying up and refusing every change, and
/// restarted it recovers every acknowledged change from its log.
#[test]
fn a_failed_commit_stops_the_process_and_a_restart_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "failing_disk_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut names = Vec::new();
        let mut refused = 0;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(name) = line.strip_prefix("acked ") {
                names.push(name.to_string());
            } else if line.starts_with("refused ") {
                refused += 1;
            }
        }
        (names, refused)
    });
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text).unwrap();
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            child.wait().unwrap();
            panic!("the process kept running after its metadata commits failed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (names, refused) = reader.join().unwrap();
    let log = log.join().unwrap();
    assert_eq!(
        status.code(),
        Some(curvine_actors::writer::FAILED_PASS_EXIT),
        "{status:?}; log:\n{log}"
    );
    assert!(
        !names.is_empty(),
        "nothing was acknowledged before the disk filled"
    );
    // Refused calls are at most the ones of the failed pass.
    assert!(
        refused <= 16,
        "{refused} calls refused before the process stopped"
    );
    let stores = open(dir.path(), true);
    assert_all_there(&stores, &names);
    let name = "after-restart".to_string();
    stores[0]
        .write_now(|s, w| s.create(w, ROOT_INO, &name, &file(), None))
        .unwrap();
    assert_all_there(&stores, &[name]);
}
