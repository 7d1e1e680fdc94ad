//! The write-ahead log of a metadata environment.
//!
//! An acknowledged change is durable once its group's record is in the log
//! (one sequential write and one fdatasync of a preallocated file), not once
//! LMDB has flushed every page the group touched: LMDB commits without sync
//! and is flushed at checkpoints.
//!
//! LMDB written without sync can, after a machine crash, hold a meta page
//! that points at pages that never reached the disk, or pages of an older
//! snapshot overwritten by newer ones. A checkpoint therefore:
//!
//! 1. flushes the data file (`force_sync`; most of its pages were written
//!    back during the interval by `preflush`): the last committed snapshot is
//!    on disk;
//! 2. opens a read transaction on that snapshot and holds it until the next
//!    checkpoint, so LMDB never reuses one of its pages (MVCC never writes a
//!    page a live reader can see);
//! 3. copies the two meta pages of the data file into a header slot of the
//!    log (with a new epoch) and syncs it.
//!
//! Recovery (before the environment is opened) writes the saved meta pages
//! back, which puts LMDB on that snapshot, intact whatever else reached the
//! disk, and then applies every record of the epoch, in one transaction
//! (which cannot reuse the snapshot's pages either).
//!
//! Every shard is a Raft group (`replica`) and this log is the Raft log of
//! the groups of its environment: a record holds what each group wrote in
//! one group commit (new entries, whose payload is the [`Change`]s, and its
//! hard state). Recovery applies each group's entries past the applied
//! index its [`GroupState`] in LMDB records: a group of one member applies
//! them, the others keep them as the group's recovered tail, written in
//! LMDB by the same transaction (`replica::read_tail`), so the checkpoint
//! that opens the log (and starts it over) makes them durable; the writer
//! takes them from there, and its checkpoints carry them from then on.
//!
//! File layout: two header slots (written alternately; the valid one with
//! the highest epoch counts), then records: `len u32 | crc32c u32 | epoch
//! u64 | seq u64 | payload` (crc over epoch, seq and payload). The payload
//! is a postcard [`LogRecord`] in logs whose header says `CRVNWAL2`, and a
//! postcard `Vec<Change>` in logs of the release before (`CRVNWAL1`), which
//! are still recovered. The first record that is short, fails its crc or carries
//! another epoch or sequence number ends the log. The file is preallocated
//! with zeros and synced, so an fdatasync of a record writes no file-system
//! metadata.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heed::{Env, RoTxn, WithoutTls};

use curvine_messages::block::Crc32c;
use curvine_messages::{FsError, FsResult};

use curvine_messages::wal::{GroupId, GroupState, LogRecord};

use crate::txn::{Change, Db, TABLE_NAMES};

mod preflush;

const MAGIC: &[u8; 8] = b"CRVNWAL2";
/// The header of a log whose records are bare `Vec<Change>`s.
const MAGIC_V1: &[u8; 8] = b"CRVNWAL1";
/// Fixed part of a header slot; the meta pages follow it.
const SLOT_FIXED: usize = 64;
/// Largest LMDB page size a slot holds two of.
const MAX_PAGE: usize = 65536;
/// Bytes of one header slot; records start after the two.
const SLOT_LEN: u64 = (SLOT_FIXED + 2 * MAX_PAGE).div_ceil(4096) as u64 * 4096;
const RECORDS_AT: u64 = 2 * SLOT_LEN;
const RECORD_HEAD: usize = 24;
const LOG_NAME: &str = "wal";

/// How an environment's log behaves (from `meta.*`).
#[derive(Debug, Clone)]
pub struct WalOptions {
    /// Sync each record (`meta.sync_commit`); without it a machine crash may
    /// lose the last changes, never the environment.
    pub sync: bool,
    /// Preallocated size of the log (`meta.wal_size`).
    pub size: u64,
    /// Longest time between checkpoints while changes arrive
    /// (`meta.checkpoint_interval`).
    pub checkpoint_interval: Duration,
}

/// The log of one environment, shared by its writer thread and the
/// writes made while the node starts.
pub struct Wal {
    env: Env<WithoutTls>,
    opts: WalOptions,
    log: File,
    data: File,
    page_size: usize,
    len: u64,
    epoch: u64,
    next_seq: u64,
    offset: u64,
    /// The snapshot of the last checkpoint, held so its pages stay.
    pin: Option<RoTxn<'static, WithoutTls>>,
    base_at: Instant,
    /// The engine's clock: checkpoint intervals and the writer's busy
    /// share are measured on it.
    clock: crate::clock::Clock,
    /// Faults a test armed.
    faults: crate::faults::DiskFaults,
    base_pages: usize,
    /// Set when a sync of the log failed: nothing more is acknowledged.
    broken: Option<String>,
    /// What the groups have not applied (written with each checkpoint's
    /// header), and whether a leader has uncommitted changes in LMDB (no
    /// checkpoint may flush them then); kept by the writer.
    carry: LogRecord,
    speculating: bool,
    /// A checkpoint was asked for (a group installed a snapshot, which
    /// only a checkpoint makes durable).
    wanted: bool,
    /// Flushes the data file between checkpoints (`preflush`).
    preflush: Option<preflush::PreFlush>,
    /// Time the writer spent in its passes since the last checkpoint, and
    /// the share of the interval before it they took.
    busy: Duration,
    busy_share: f64,
    syncs: Arc<crate::stats::Histogram>,
    checkpoints: Arc<crate::stats::Histogram>,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> FsError {
    FsError::Io(format!("metadata log {what} {}: {e}", path.display()))
}

fn lmdb(e: heed::Error) -> FsError {
    crate::txn::lmdb_err(e)
}

/// What recovery found in a log: the epoch whose records are to be applied.
pub struct Recovery {
    epoch: u64,
    v1: bool,
    carry: Option<LogRecord>,
}

/// A header slot: its epoch, the two meta pages, and whether its records
/// are of the first format.
struct Header {
    epoch: u64,
    metas: Vec<u8>,
    v1: bool,
    /// What the groups had not applied at the checkpoint (format 2).
    carry: Option<LogRecord>,
}

/// A record as recovery reads it.
enum Record {
    V1(Vec<Change>),
    V2(LogRecord),
}

/// crc32c over `parts` in order.
fn crc(parts: &[&[u8]]) -> u32 {
    let mut c = Crc32c::default();
    for p in parts {
        c.update(p);
    }
    c.value()
}

fn read_header(log: &File, at: u64) -> Option<Header> {
    let mut fixed = [0u8; SLOT_FIXED];
    log.read_exact_at(&mut fixed, at).ok()?;
    let v1 = match &fixed[..8] {
        m if m == MAGIC => false,
        m if m == MAGIC_V1 => true,
        _ => return None,
    };
    let epoch = u64::from_le_bytes(fixed[8..16].try_into().ok()?);
    let page_size = u32::from_le_bytes(fixed[16..20].try_into().ok()?) as usize;
    let sum = u32::from_le_bytes(fixed[20..24].try_into().ok()?);
    if !(512..=MAX_PAGE).contains(&page_size) {
        return None;
    }
    let mut metas = vec![0u8; 2 * page_size];
    log.read_exact_at(&mut metas, at + SLOT_FIXED as u64).ok()?;
    if v1 {
        return (crc(&[&fixed[8..20], &metas]) == sum).then_some(Header {
            epoch,
            metas,
            v1,
            carry: None,
        });
    }
    let carry_len = u32::from_le_bytes(fixed[24..28].try_into().ok()?) as usize;
    if SLOT_FIXED + 2 * page_size + carry_len > SLOT_LEN as usize {
        return None;
    }
    let mut carry = vec![0u8; carry_len];
    log.read_exact_at(&mut carry, at + (SLOT_FIXED + 2 * page_size) as u64)
        .ok()?;
    if crc(&[&fixed[8..20], &fixed[24..28], &metas, &carry]) != sum {
        return None;
    }
    // A header whose checksum holds but whose carry does not decode was
    // written by another release: it counts as no header (and the epoch's
    // records then do not apply either).
    let carry = postcard::from_bytes(&carry).ok()?;
    Some(Header {
        epoch,
        metas,
        v1,
        carry: Some(carry),
    })
}

/// The valid header with the highest epoch.
fn newest_header(log: &File) -> Option<Header> {
    [read_header(log, 0), read_header(log, SLOT_LEN)]
        .into_iter()
        .flatten()
        .max_by_key(|h| h.epoch)
}

/// Before the environment at `dir` is opened: when it has a log, puts LMDB
/// back on the snapshot of the log's last checkpoint (its saved meta pages),
/// so the records can be applied to it once it is open.
pub fn restore_base(dir: &Path) -> FsResult<Option<Recovery>> {
    let path = dir.join(LOG_NAME);
    let log = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open", &path, e)),
    };
    // No valid header: the log never reached its first checkpoint, and
    // nothing was committed without sync before one.
    let Some(header) = newest_header(&log) else {
        return Ok(None);
    };
    let data_path = dir.join("data.mdb");
    let data = OpenOptions::new()
        .write(true)
        .open(&data_path)
        .map_err(|e| io("open", &data_path, e))?;
    data.write_all_at(&header.metas, 0)
        .map_err(|e| io("restore", &data_path, e))?;
    data.sync_data().map_err(|e| io("sync", &data_path, e))?;
    Ok(Some(Recovery {
        epoch: header.epoch,
        v1: header.v1,
        carry: header.carry,
    }))
}

/// Reads the records of `epoch` in order.
fn read_records(log: &File, path: &Path, epoch: u64, v1: bool) -> FsResult<Vec<Record>> {
    let len = log.metadata().map_err(|e| io("stat", path, e))?.len();
    let mut at = RECORDS_AT;
    let mut seq = 1u64;
    let mut out = Vec::new();
    loop {
        if at + RECORD_HEAD as u64 > len {
            break;
        }
        let mut head = [0u8; RECORD_HEAD];
        log.read_exact_at(&mut head, at)
            .map_err(|e| io("read", path, e))?;
        let n = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as u64;
        let sum = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        let rec_epoch = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        let rec_seq = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
        if n == 0 || rec_epoch != epoch || rec_seq != seq || at + RECORD_HEAD as u64 + n > len {
            break;
        }
        let mut payload = vec![0u8; n as usize];
        log.read_exact_at(&mut payload, at + RECORD_HEAD as u64)
            .map_err(|e| io("read", path, e))?;
        if crc(&[&head[8..24], &payload]) != sum {
            break;
        }
        // A record that passed its checksum but does not decode was written
        // by another release: refusing to start beats dropping changes.
        let corrupt = |e: postcard::Error| {
            FsError::Corrupt(format!(
                "metadata log {}: record {seq} of epoch {epoch} does not decode ({e}); it was written by another release",
                path.display()
            ))
        };
        out.push(if v1 {
            Record::V1(postcard::from_bytes(&payload).map_err(corrupt)?)
        } else {
            Record::V2(postcard::from_bytes(&payload).map_err(corrupt)?)
        });
        at += RECORD_HEAD as u64 + n;
        seq += 1;
    }
    Ok(out)
}

/// The named databases of `env` by table number (a record only names
/// tables that existed at its checkpoint, so opening them writes nothing;
/// one that names a table the environment lacks is refused when applied).
fn databases(env: &Env<WithoutTls>) -> FsResult<Vec<Db>> {
    let rtxn = env.read_txn().map_err(lmdb)?;
    let opened = env
        .open_databases_and_commit(rtxn, |opener, rtxn| -> Result<_, heed::Error> {
            let mut dbs: [Option<heed::Database<heed::types::Bytes, heed::types::Bytes>>;
                TABLE_NAMES.len()] = [None; TABLE_NAMES.len()];
            for (n, name) in TABLE_NAMES.iter().enumerate() {
                dbs[n] = opener.open_database(rtxn, Some(name))?;
            }
            Ok(heed::CommitOrAbort::<_, ()>::Commit(dbs))
        })
        .map_err(lmdb)?;
    let heed::CommitOrAbort::Commit(dbs) = opened else {
        return Err(FsError::Io("cannot open the metadata databases".into()));
    };
    // Tables added by a later release (the last ones) are created when
    // the shards open, after recovery: a log written before cannot name
    // them. A gap is damage.
    let present = dbs.iter().take_while(|db| db.is_some()).count();
    if let Some(name) = TABLE_NAMES[present..]
        .iter()
        .zip(&dbs[present..])
        .find_map(|(name, db)| db.is_some().then_some(name))
    {
        return Err(FsError::Corrupt(format!(
            "the metadata environment {} has table {name} but lacks {}",
            env.path().display(),
            TABLE_NAMES[present]
        )));
    }
    Ok(dbs.iter().take(present).flatten().copied().collect())
}

impl Wal {
    /// After `env` at `dir` is opened: applies what `recovery` found, then
    /// starts the log with a checkpoint (`opts` `None`: the log is removed
    /// once applied, and LMDB syncs its own commits: no log is returned).
    pub fn open(
        env: &Env<WithoutTls>,
        recovery: Option<Recovery>,
        opts: Option<WalOptions>,
        (clock, faults): (crate::clock::Clock, crate::faults::DiskFaults),
    ) -> FsResult<Option<Wal>> {
        let dir = env.path().to_path_buf();
        let path = dir.join(LOG_NAME);
        if let Some(rec) = recovery {
            let log = File::open(&path).map_err(|e| io("open", &path, e))?;
            let mut records = read_records(&log, &path, rec.epoch, rec.v1)?;
            if let Some(carry) = rec.carry.filter(|c| !c.groups.is_empty()) {
                records.insert(0, Record::V2(carry));
            }
            if !records.is_empty() {
                let (records, count) = apply_records(env, &records)?;
                tracing::info!(env = %dir.display(), records, changes = count, "applied the metadata log");
            }
            env.force_sync().map_err(lmdb)?;
        }
        let Some(opts) = opts else {
            if path.exists() {
                std::fs::remove_file(&path).map_err(|e| io("remove", &path, e))?;
            }
            return Ok(None);
        };
        let page_size = env.unnamed_database_stat().page_size.max(512) as usize;
        if page_size > MAX_PAGE {
            return Err(FsError::InvalidArgument(format!(
                "{}: LMDB pages of {page_size} bytes are larger than the metadata log holds ({MAX_PAGE})",
                dir.display()
            )));
        }
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io("open", &path, e))?;
        let epoch = newest_header(&log).map(|h| h.epoch).unwrap_or(0);
        let want = opts.size.max(RECORDS_AT + (1 << 20));
        let mut len = log.metadata().map_err(|e| io("stat", &path, e))?.len();
        if len < want {
            preallocate(&log, len, want).map_err(|e| io("preallocate", &path, e))?;
            len = want;
        }
        let data_path = dir.join("data.mdb");
        let data = File::open(&data_path).map_err(|e| io("open", &data_path, e))?;
        // A simulated run has no thread of its own: what reached the disk
        // is what its checkpoints synced.
        let preflush = if clock.is_manual() {
            None
        } else {
            preflush::PreFlush::start(&data, &data_path.display().to_string())
        };
        let mut wal = Wal {
            env: env.clone(),
            opts,
            log,
            data,
            page_size,
            len,
            epoch,
            next_seq: 1,
            offset: RECORDS_AT,
            pin: None,
            base_at: clock.now(),
            clock,
            faults,
            base_pages: 0,
            broken: None,
            carry: LogRecord::default(),
            speculating: false,
            wanted: false,
            preflush,
            busy: Duration::ZERO,
            busy_share: 0.0,
            syncs: crate::stats::process().histogram(
                "curvine_meta_log_write_seconds",
                "Time to write and sync one record of the metadata log (one group commit).",
                &[],
            ),
            checkpoints: crate::stats::process().histogram(
                "curvine_meta_checkpoint_seconds",
                "Time a metadata checkpoint took (flushing LMDB and saving its base).",
                &[],
            ),
        };
        wal.checkpoint()?;
        Ok(Some(wal))
    }

    fn path(&self) -> PathBuf {
        self.env.path().join(LOG_NAME)
    }

    fn check(&self) -> FsResult<()> {
        match &self.broken {
            Some(why) => Err(FsError::Io(format!(
                "the metadata log of {} failed ({why}); no change is accepted until the node restarts",
                self.env.path().display()
            ))),
            None => Ok(()),
        }
    }

    /// Makes what the groups wrote durable (one record), before LMDB
    /// commits it.
    pub fn append(&mut self, record: &LogRecord) -> FsResult<()> {
        let started = Instant::now();
        if self.write(record)? {
            self.sync_written(started)?;
        }
        Ok(())
    }

    /// Syncs the records written so far (`started`: when the last one's
    /// write began, for the log's metrics).
    pub fn sync_written(&mut self, started: Instant) -> FsResult<()> {
        if self.opts.sync {
            self.sync_log()?;
        }
        self.syncs.observe(started.elapsed());
        Ok(())
    }

    /// fdatasync of the log. After a failed one the kernel may have dropped
    /// the pages: nothing written since can be trusted, and the log
    /// refuses every change from then on.
    fn sync_log(&mut self) -> FsResult<()> {
        let synced = if self.faults.take(crate::faults::DiskFaults::LOG_SYNC) {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            self.log.sync_data()
        };
        if let Err(e) = synced {
            tracing::error!(env = %self.env.path().display(), error = %e, "the metadata log cannot be synced; refusing further changes");
            self.broken = Some(format!("fdatasync: {e}"));
            return self.check();
        }
        Ok(())
    }

    /// Writes what the groups wrote as the next record, unsynced; false
    /// when there was nothing to write.
    pub fn write(&mut self, record: &LogRecord) -> FsResult<bool> {
        self.check()?;
        if record.groups.is_empty() {
            return Ok(false);
        }
        let payload = postcard::to_allocvec(record)
            .map_err(|e| FsError::Io(format!("encoding a metadata log record: {e}")))?;
        let need = (RECORD_HEAD + payload.len()) as u64;
        if self.offset + need > self.len {
            // Checkpoints come after commits (`after_commit`), when the
            // groups say what they have not applied: here the log grows.
            {
                let want = (self.offset + need) * 2;
                preallocate(&self.log, self.len, want).map_err(|e| io("grow", &self.path(), e))?;
                self.len = want;
            }
        }
        let mut record = Vec::with_capacity(need as usize);
        record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        record.extend_from_slice(&[0u8; 4]);
        record.extend_from_slice(&self.epoch.to_le_bytes());
        record.extend_from_slice(&self.next_seq.to_le_bytes());
        let crc = crc(&[&record[8..24], &payload]);
        record[4..8].copy_from_slice(&crc.to_le_bytes());
        record.extend_from_slice(&payload);
        if self.faults.take(crate::faults::DiskFaults::LOG_WRITE) {
            let _ = self
                .log
                .write_all_at(&record[..record.len() / 2], self.offset);
            let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(io("write", &self.path(), e));
        }
        self.log
            .write_all_at(&record, self.offset)
            .map_err(|e| io("write", &self.path(), e))?;
        self.offset += need;
        self.next_seq += 1;
        Ok(true)
    }

    /// What the groups have not applied, and whether a leader has
    /// uncommitted changes in LMDB (from the writer, after each pass).
    pub fn set_groups(&mut self, carry: LogRecord, speculating: bool) {
        self.carry = carry;
        self.speculating = speculating;
    }

    /// Whether a checkpoint has waited too long for a commit after which
    /// no leader has uncommitted changes (the only moment one can be
    /// taken: `after_commit`). Under a steady stream of replicated changes
    /// that moment may not come on its own, so once a checkpoint is asked
    /// for (a snapshot installed), or `OVERDUE_INTERVALS` intervals (at
    /// least 1 s) went by, or the log is 3/4 full, the writer takes no new
    /// mutation until the changes in flight are committed. Holding them at
    /// every interval instead (100 ms) emptied the groups' pipelines ten
    /// times a second.
    pub fn checkpoint_overdue(&self) -> bool {
        const OVERDUE_INTERVALS: u32 = 10;
        let overdue = (self.opts.checkpoint_interval * OVERDUE_INTERVALS)
            .max(std::time::Duration::from_secs(1));
        self.offset > RECORDS_AT
            && (self.wanted
                || self.clock.since(self.base_at) >= overdue
                || self.offset > self.len / 4 * 3)
    }

    /// Counts time the writer spent in a pass.
    pub fn add_busy(&mut self, d: Duration) {
        self.busy += d;
    }

    /// Asks for a checkpoint after the next commit (or as soon as no
    /// leader has uncommitted changes).
    pub fn request_checkpoint(&mut self) {
        self.wanted = true;
    }

    /// The epoch of the last checkpoint (it grows with each one).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// After a commit: checkpoints when one is due (a checkpoint due by
    /// time first lets a flush under way end, at most another interval);
    /// otherwise, while the writer has time to spare, keeps LMDB's pages
    /// going to disk on a thread of its own (`preflush`), so that the
    /// checkpoint, which every change waits for, finds little to flush.
    pub fn after_commit(&mut self) -> FsResult<()> {
        if self.offset <= RECORDS_AT {
            return Ok(());
        }
        let since = self.clock.since(self.base_at);
        let interval = self.opts.checkpoint_interval;
        let flushing = since < interval * 2 && self.preflush.as_ref().is_some_and(|pre| pre.busy());
        let grown = self
            .env
            .info()
            .last_page_number
            .saturating_sub(self.base_pages)
            .saturating_mul(self.page_size);
        if self.wanted
            || (since >= interval && !flushing)
            || self.offset > self.len / 4 * 3
            || grown > 128 << 20
        {
            return self.checkpoint();
        }
        if self.busy_share < preflush::BELOW_BUSY {
            if let Some(pre) = &self.preflush {
                pre.ask();
            }
        }
        Ok(())
    }

    /// Flushes LMDB, pins the snapshot and records it as the new base; the
    /// log starts over. Commits must not run meanwhile (callers hold the
    /// log's lock across their commits).
    pub fn checkpoint(&mut self) -> FsResult<()> {
        self.check()?;
        if self.speculating {
            return Ok(());
        }
        let carry = postcard::to_allocvec(&self.carry)
            .map_err(|e| FsError::Io(format!("encoding the metadata log's carry: {e}")))?;
        if SLOT_FIXED + 2 * self.page_size + carry.len() > SLOT_LEN as usize {
            // The unapplied entries do not fit in a header: the log grows
            // until they are applied.
            return Ok(());
        }
        let started = Instant::now();
        // A failed flush may have dropped LMDB's pages: the snapshot cannot
        // be the new base, and nothing more is acknowledged (a restart
        // recovers from the last base and the log).
        let flushed = match &self.preflush {
            Some(pre) => pre.settle(),
            None => Ok(()),
        };
        let settled = started.elapsed();
        let flushed = flushed.and_then(|()| {
            if self.faults.take(crate::faults::DiskFaults::DATA_FLUSH) {
                return Err("flushing LMDB: Input/output error (os error 5)".to_string());
            }
            self.env
                .force_sync()
                .map_err(|e| format!("flushing LMDB: {e}"))
        });
        if let Err(why) = flushed {
            tracing::error!(env = %self.env.path().display(), error = %why, "the metadata cannot be flushed; refusing further changes");
            self.broken = Some(why);
            return self.check();
        }
        self.busy_share =
            self.busy.as_secs_f64() / self.clock.since(self.base_at).as_secs_f64().max(1e-9);
        self.busy = Duration::ZERO;
        let synced = started.elapsed();
        let pin = self.env.clone().static_read_txn().map_err(lmdb)?;
        let mut metas = vec![0u8; 2 * self.page_size];
        let data_path = self.env.path().join("data.mdb");
        self.data
            .read_exact_at(&mut metas, 0)
            .map_err(|e| io("read", &data_path, e))?;
        let epoch = self.epoch + 1;
        let mut fixed = [0u8; SLOT_FIXED];
        fixed[..8].copy_from_slice(MAGIC);
        fixed[8..16].copy_from_slice(&epoch.to_le_bytes());
        fixed[16..20].copy_from_slice(&(self.page_size as u32).to_le_bytes());
        fixed[24..28].copy_from_slice(&(carry.len() as u32).to_le_bytes());
        let crc = crc(&[&fixed[8..20], &fixed[24..28], &metas, &carry]);
        fixed[20..24].copy_from_slice(&crc.to_le_bytes());
        let mut slot = fixed.to_vec();
        slot.extend_from_slice(&metas);
        slot.extend_from_slice(&carry);
        let at = (epoch % 2) * SLOT_LEN;
        let path = self.path();
        self.log
            .write_all_at(&slot, at)
            .map_err(|e| io("write", &path, e))?;
        self.sync_log()?;
        // The new base is durable: the old one may go.
        self.pin = Some(pin);
        self.epoch = epoch;
        self.wanted = false;
        self.next_seq = 1;
        self.offset = RECORDS_AT;
        self.base_at = self.clock.now();
        self.base_pages = self.env.info().last_page_number;
        self.checkpoints.observe(started.elapsed());
        tracing::debug!(
            env = %self.env.path().display(),
            epoch,
            sync_ms = synced.as_secs_f64() * 1e3,
            preflush_wait_ms = settled.as_secs_f64() * 1e3,
            busy_share = self.busy_share,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            pages = self.base_pages,
            "metadata checkpoint"
        );
        Ok(())
    }
}

/// Applies the records of a log to the environment restored on its
/// checkpoint, in one transaction: it cannot reuse a page of the restored
/// snapshot, so a crash before the next checkpoint finds that snapshot
/// intact again. Returns how many records and changes it applied.
fn apply_records(env: &Env<WithoutTls>, records: &[Record]) -> FsResult<(usize, usize)> {
    let dbs = databases(env)?;
    if dbs.is_empty() {
        return Err(FsError::Corrupt(format!(
            "the metadata environment {} has none of its tables: its checkpoint is damaged",
            env.path().display()
        )));
    }
    let mut wtxn = env.write_txn().map_err(lmdb)?;
    let mut count = 0;
    let mut states: HashMap<GroupId, (GroupState, crate::replica::Tail)> = HashMap::new();
    for record in records {
        match record {
            Record::V1(changes) => {
                crate::txn::apply(&mut wtxn, &dbs, changes).map_err(lmdb)?;
                count += changes.len();
            }
            Record::V2(record) => {
                for write in &record.groups {
                    let (state, tail) = match states.entry(write.group) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => v.insert((
                            crate::replica::read_group_state(dbs[0], &wtxn, write.group)?
                                .unwrap_or_default(),
                            // What an earlier recovery left (a crash came
                            // before the writer's own checkpoint): the
                            // records extend it.
                            crate::replica::read_tail(dbs[0], &wtxn, write.group)?
                                .unwrap_or_default(),
                        )),
                    };
                    count += crate::replica::replay(&dbs, &mut wtxn, write, state, tail)?;
                }
            }
        }
    }
    for (group, (state, mut tail)) in states {
        crate::replica::write_group_state(dbs[0], &mut wtxn, group, &state)?;
        // In LMDB, so the checkpoint that opens the log makes it durable
        // (the log starts over there).
        tail.entries.retain(|e| e.index > state.applied_index);
        crate::replica::write_tail(dbs[0], &mut wtxn, group, &tail)?;
    }
    wtxn.commit().map_err(lmdb)?;
    Ok((records.len(), count))
}

/// Extends `file` from `from` to `to` bytes with zeros, and syncs it.
fn preallocate(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    fill_zeros(file, from, to)?;
    file.sync_all()
}

/// Writes zeros into `file` from `from` to `to`, one 4 KiB page per call.
///
/// The page cache sizes a folio by the write that creates it: one large
/// write leaves folios of up to 2 MiB (ext4 has large folios since Linux
/// 6.16), and every later small write into one walks all of its buffers.
/// The log only ever takes small appends, each synced: measured here, 700-
/// byte appends with an fdatasync each run at 9,100/s and 29 us of CPU
/// into a file filled by 4 KiB writes, against 7,900/s and 38 us into one
/// filled by 1 MiB writes. (LMDB's data file is still extended by large
/// writes: with small folios its commits cost less CPU, but checkpoints
/// flush it in more, smaller writes, and creates measured 13% slower.)
fn fill_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    const PAGE: u64 = 4096;
    let zeros = [0u8; PAGE as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(PAGE - at % PAGE) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

impl Wal {
    /// Ends the log with a checkpoint when it holds records (a clean stop
    /// leaves nothing to apply at the next start).
    pub fn close(&mut self) {
        if self.offset > RECORDS_AT {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(env = %self.env.path().display(), error = %e, "final metadata checkpoint failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use heed::types::Bytes;

    use super::*;

    fn env_with(tables: &[&str]) -> (tempfile::TempDir, Env<WithoutTls>) {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = heed::EnvOpenOptions::new().read_txn_without_tls();
        opts.max_dbs(16);
        // SAFETY: a fresh directory, opened once.
        let env = unsafe { opts.open(dir.path()) }.unwrap();
        let wtxn = env.write_txn().unwrap();
        env.create_databases_and_commit(wtxn, |opener, wtxn| -> Result<_, heed::Error> {
            for name in tables {
                opener.create_database::<Bytes, Bytes>(wtxn, Some(name))?;
            }
            Ok(heed::CommitOrAbort::<(), ()>::Commit(()))
        })
        .unwrap();
        (dir, env)
    }

    #[test]
    fn an_environment_of_a_release_before_a_new_table_is_recovered() {
        let (_dir, env) = env_with(&TABLE_NAMES[..TABLE_NAMES.len() - 1]);
        assert_eq!(databases(&env).unwrap().len(), TABLE_NAMES.len() - 1);
        let (_dir, env) = env_with(&TABLE_NAMES);
        assert_eq!(databases(&env).unwrap().len(), TABLE_NAMES.len());
    }

    #[test]
    fn an_environment_missing_a_table_before_others_is_refused() {
        let mut names = TABLE_NAMES.to_vec();
        names.remove(2);
        let (_dir, env) = env_with(&names);
        let err = databases(&env).unwrap_err().to_string();
        assert!(err.contains("lacks dentries"), "{err}");
    }
}
