//! One shard's LMDB environment: layout, reads and mutations.
//!
//! Databases (keys big-endian so that LMDB's order is numeric order):
//!
//! | database   | key                  | value                         |
//! |------------|----------------------|-------------------------------|
//! | `meta`     | `"shard"`            | [`ShardMeta`]                 |
//! | `inodes`   | ino                  | [`Attr`]                      |
//! | `dentries` | parent ++ name       | [`DentryValue`]               |
//! | `xattrs`   | ino ++ name          | raw bytes (reserved)          |
//! | `intents`  | op                   | [`Intent`]                    |
//! | `ops`      | op ++ step_no        | [`StepRecord`]                |
//! | `locks`    | parent ++ name       | [`NameLock`]                  |
//! | `blocks`   | ino ++ index (u32)   | [`BlockInfo`] (committed)     |
//! | `owners`   | block id             | [`BlockOwner`]                |
//! | `pending`  | ino ++ block id      | empty: allocated, not closed  |
//! | `freed`    | block id             | [`FreedBlock`]: to remove     |
//!
//! Every value starts with a version byte (`curvine_messages::codec`).
//! Mutations check everything before they write, and run inside a nested
//! transaction of the group commit, so a failed mutation leaves nothing.
//! A directory's inode and its entries always live in the same shard.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use heed::types::Bytes;
use heed::{CommitOrAbort, Env, EnvOpenOptions, RoTxn, WithoutTls};

use crate::txn::{Table, WriteTxn, TABLE_NAMES};
use serde::{Deserialize, Serialize};

use curvine_messages::block::{
    BlockId, BlockInfo, BlockOwner, BlockUse, CopyDrop, FileSpec, FreedBlock,
};
use curvine_messages::cluster::ClusterMap;
use curvine_messages::codec::{decode_versioned, encode_versioned, Versioned};
use curvine_messages::mount::{JournalEntry, MountTable, Persist, UfsFile, UfsOp, UfsState};
use curvine_messages::shard::{
    DentryValue, ExportChunk, Intent, IntentOp, NameLock, NewFile, OpenForWrite, RenameOutcome,
    ShardMeta, ShardRecord, ShardScan, Step, StepResult, UnlinkOutcome, XattrValue,
};
use curvine_messages::{
    check_xattr, make_id, now_ns, shard_of, Attr, DirEntry, FileKind, FsError, FsResult, Ino,
    NewInode, OpId, SetAttr, ShardId, ShardStats, TimeSet, XattrMode, ROOT_INO,
};

/// Converts an LMDB error into the error a caller sees.
pub fn lmdb_err(e: heed::Error) -> FsError {
    match e {
        heed::Error::Mdb(heed::MdbError::MapFull) => {
            FsError::NoSpace("shard metadata store is full (raise meta.map_size)".into())
        }
        other => FsError::Io(format!("metadata store: {other}")),
    }
}

fn decode<T: Versioned>(bytes: &[u8]) -> FsResult<T> {
    decode_versioned(bytes).map_err(FsError::from)
}

fn key_ino(ino: Ino) -> [u8; 8] {
    ino.to_be_bytes()
}

fn key_name(parent: Ino, name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + name.len());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(name.as_bytes());
    k
}

fn key_block(ino: Ino, index: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&index.to_be_bytes());
    k
}

fn key_pending(ino: Ino, id: BlockId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

fn key_step(op: OpId, step_no: u8) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&op.to_be_bytes());
    k[8] = step_no;
    k
}

fn ino_from(bytes: &[u8]) -> FsResult<Ino> {
    bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| FsError::Corrupt("short key in metadata store".into()))
}

/// The recorded result of one step, with when it was applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub at_ns: i64,
    pub result: StepResult,
}

impl Versioned for StepRecord {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "step record";
}

/// Identity a shard is formatted with.
#[derive(Debug, Clone)]
pub struct ShardIdentity {
    pub cluster_id: String,
    pub shard: ShardId,
    pub shard_count: u32,
}

/// Options for opening an environment.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub map_size: u64,
    pub max_readers: u32,
    pub sync_commit: bool,
    /// Make changes durable with a write-ahead log (`meta.wal`) instead of
    /// LMDB's synced commits.
    pub wal: bool,
    pub wal_size: u64,
    pub checkpoint_interval: std::time::Duration,
}

/// Environments opened by this process, by path. LMDB allows one per path per
/// process, and a restarted shard actor must find the one it had.
fn opened() -> &'static Mutex<HashMap<PathBuf, &'static Env<WithoutTls>>> {
    static OPENED: OnceLock<Mutex<HashMap<PathBuf, &'static Env<WithoutTls>>>> = OnceLock::new();
    OPENED.get_or_init(Default::default)
}

pub(crate) fn open_env(path: &Path, options: &StoreOptions) -> FsResult<&'static Env<WithoutTls>> {
    let mut map = opened()
        .lock()
        .map_err(|_| FsError::Io("environment registry poisoned".into()))?;
    if let Some(env) = map.get(path) {
        return Ok(env);
    }
    std::fs::create_dir_all(path)
        .map_err(|e| FsError::Io(format!("create {}: {e}", path.display())))?;
    // A log left by the last run puts LMDB back on its last checkpoint
    // first; its records are applied once the environment is open.
    let recovery = crate::wal::restore_base(path)?;
    let mut opts = EnvOpenOptions::new().read_txn_without_tls();
    opts.map_size(options.map_size as usize)
        // One more reader: the log's hold on its checkpoint.
        .max_dbs(16)
        .max_readers(options.max_readers + 1);
    if options.wal || !options.sync_commit {
        // With the log, LMDB commits without sync and is flushed at
        // checkpoints (see `wal`). Without it, NO_SYNC alone keeps the
        // database intact only until a machine crash. WRITE_MAP is never
        // used.
        unsafe {
            opts.flags(heed::EnvFlags::NO_SYNC);
        }
    }
    // SAFETY: the path is opened once per process (the map above), and no other
    // process opens a node's data directory (the node holds a lock file).
    let env = unsafe { opts.open(path) }.map_err(lmdb_err)?;
    let env: &'static Env<WithoutTls> = Box::leak(Box::new(env));
    let wal = options.wal.then_some(crate::wal::WalOptions {
        sync: options.sync_commit,
        size: options.wal_size,
        checkpoint_interval: options.checkpoint_interval,
    });
    crate::wal::Wal::open(env, recovery, wal)?;
    map.insert(path.to_path_buf(), env);
    Ok(env)
}

/// One shard's store. Cheap to share: reads run on any thread, writes on the
/// shard's writer thread.
pub struct ShardStore {
    pub shard: ShardId,
    /// Set while the shard is being moved away (see `ShardMsg::Freeze`);
    /// shared by every incarnation of the shard's actor.
    pub frozen: std::sync::atomic::AtomicBool,
    meta_key: Vec<u8>,
    pub shard_count: u32,
    pub cluster_id: String,
    env: &'static Env<WithoutTls>,
    meta: Table,
    inodes: Table,
    dentries: Table,
    xattrs: Table,
    intents: Table,
    ops: Table,
    locks: Table,
    blocks: Table,
    owners: Table,
    pending: Table,
    freed: Table,
}

/// The key of a shard's [`ShardMeta`] record.
fn meta_key(shard: ShardId) -> Vec<u8> {
    format!("shard{shard:03}").into_bytes()
}

impl ShardStore {
    /// Opens (and on first use formats) the shard's databases in the
    /// environment at `path`, which may hold other shards' databases too. A
    /// shard formatted for another cluster or shard count is refused.
    pub fn open(
        path: &Path,
        identity: &ShardIdentity,
        options: &StoreOptions,
    ) -> FsResult<ShardStore> {
        let env = open_env(path, options)?;
        let wtxn = env.write_txn().map_err(lmdb_err)?;
        let dbs = env
            .create_databases_and_commit(wtxn, |opener, wtxn| -> Result<_, heed::Error> {
                let mut create =
                    |n: usize| opener.create_database::<Bytes, Bytes>(wtxn, Some(TABLE_NAMES[n]));
                Ok(CommitOrAbort::<_, ()>::Commit([
                    create(0)?,
                    create(1)?,
                    create(2)?,
                    create(3)?,
                    create(4)?,
                    create(5)?,
                    create(6)?,
                    create(7)?,
                    create(8)?,
                    create(9)?,
                    create(10)?,
                ]))
            })
            .map_err(lmdb_err)?;
        let dbs = match dbs {
            CommitOrAbort::Commit(d) => d,
            CommitOrAbort::Abort(()) => {
                return Err(FsError::Io("cannot create shard databases".into()))
            }
        };
        let store = ShardStore {
            shard: identity.shard,
            frozen: std::sync::atomic::AtomicBool::new(false),
            meta_key: meta_key(identity.shard),
            shard_count: identity.shard_count,
            cluster_id: identity.cluster_id.clone(),
            env,
            meta: Table::new(dbs[0], 0),
            inodes: Table::new(dbs[1], 1),
            dentries: Table::new(dbs[2], 2),
            xattrs: Table::new(dbs[3], 3),
            intents: Table::new(dbs[4], 4),
            ops: Table::new(dbs[5], 5),
            locks: Table::new(dbs[6], 6),
            blocks: Table::new(dbs[7], 7),
            owners: Table::new(dbs[8], 8),
            pending: Table::new(dbs[9], 9),
            freed: Table::new(dbs[10], 10),
        };
        store.format_or_check(identity)?;
        // What opening wrote (new databases, a format) is not in the log.
        store.checkpoint()?;
        Ok(store)
    }

    /// Makes everything committed so far durable: a checkpoint of the
    /// environment's log (without one, LMDB synced its commits itself).
    pub fn checkpoint(&self) -> FsResult<()> {
        match crate::wal::of(self.env) {
            Some(wal) => wal.lock().unwrap_or_else(|p| p.into_inner()).checkpoint(),
            None => Ok(()),
        }
    }

    /// Runs `f` in a write transaction of its own and makes it durable
    /// (for writes made while the node starts, before its writers run, and
    /// for tests); a failed `f` changes nothing.
    pub fn write_now<T>(
        &self,
        f: impl FnOnce(&ShardStore, &mut WriteTxn) -> FsResult<T>,
    ) -> FsResult<T> {
        let mut wtxn = WriteTxn::new(self.env.write_txn().map_err(lmdb_err)?);
        match f(self, &mut wtxn) {
            Ok(v) => {
                wtxn.commit().map_err(lmdb_err)?;
                self.checkpoint()?;
                Ok(v)
            }
            Err(e) => {
                wtxn.abort();
                Err(e)
            }
        }
    }

    fn format_or_check(&self, identity: &ShardIdentity) -> FsResult<()> {
        let mut wtxn = WriteTxn::new(self.env.write_txn().map_err(lmdb_err)?);
        match self.meta.get(&wtxn, &self.meta_key).map_err(lmdb_err)? {
            Some(bytes) => {
                let meta: ShardMeta = decode(bytes)?;
                if meta.cluster_id != identity.cluster_id
                    || meta.shard != identity.shard
                    || meta.shard_count != identity.shard_count
                {
                    return Err(FsError::Corrupt(format!(
                        "shard store at {} belongs to cluster {} shard {}/{}, not cluster {} shard {}/{}",
                        self.env.path().display(),
                        meta.cluster_id,
                        meta.shard,
                        meta.shard_count,
                        identity.cluster_id,
                        identity.shard,
                        identity.shard_count
                    )));
                }
                wtxn.abort();
            }
            None => {
                let meta = ShardMeta {
                    cluster_id: identity.cluster_id.clone(),
                    shard: identity.shard,
                    shard_count: identity.shard_count,
                    next_ino: if identity.shard == 0 { ROOT_INO + 1 } else { 1 },
                    next_op: 1,
                };
                self.meta
                    .put(&mut wtxn, &self.meta_key, &encode_versioned(&meta))
                    .map_err(lmdb_err)?;
                if identity.shard == 0 {
                    let now = now_ns();
                    let root = Attr {
                        ino: ROOT_INO,
                        kind: FileKind::Dir,
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        size: 0,
                        atime_ns: now,
                        mtime_ns: now,
                        ctime_ns: now,
                        nlink: 2,
                        symlink: None,
                        block_size: 0,
                        replicas: 0,
                        parent: ROOT_INO,
                        storage: None,
                        writing: None,
                        ufs: None,
                    };
                    self.put_inode(&mut wtxn, &root)?;
                }
                wtxn.commit().map_err(lmdb_err)?;
            }
        }
        Ok(())
    }

    pub fn env(&self) -> &'static Env<WithoutTls> {
        self.env
    }

    /// Whether two stores share one environment.
    pub fn same_env(&self, other: &ShardStore) -> bool {
        std::ptr::eq(self.env, other.env)
    }

    pub fn read_txn(&self) -> FsResult<RoTxn<'static, WithoutTls>> {
        self.env.read_txn().map_err(lmdb_err)
    }

    fn is_local(&self, ino: Ino) -> bool {
        shard_of(ino) == self.shard
    }

    // ---- reads -------------------------------------------------------------

    /// An inode this shard owns. Inodes of other shards are never visible,
    /// even when they share the environment.
    pub fn inode(&self, txn: &RoTxn, ino: Ino) -> FsResult<Option<Attr>> {
        if !self.is_local(ino) {
            return Ok(None);
        }
        match self.inodes.get(txn, &key_ino(ino)).map_err(lmdb_err)? {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    pub fn getattr(&self, txn: &RoTxn, ino: Ino) -> FsResult<Attr> {
        self.inode(txn, ino)?
            .ok_or_else(|| FsError::NotFound(format!("inode {ino:#x}")))
    }

    /// A directory of this shard, or ENOENT/ENOTDIR.
    fn dir(&self, txn: &RoTxn, ino: Ino) -> FsResult<Attr> {
        if !self.is_local(ino) {
            return Err(FsError::Io(format!(
                "directory {ino:#x} is not held by shard {}",
                self.shard
            )));
        }
        let attr = self.getattr(txn, ino)?;
        if attr.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        Ok(attr)
    }

    pub fn dentry(&self, txn: &RoTxn, parent: Ino, name: &str) -> FsResult<Option<DentryValue>> {
        match self
            .dentries
            .get(txn, &key_name(parent, name))
            .map_err(lmdb_err)?
        {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    pub fn lookup(&self, txn: &RoTxn, parent: Ino, name: &str) -> FsResult<DirEntry> {
        self.dir(txn, parent)?;
        match self.dentry(txn, parent, name)? {
            Some(v) => Ok(DirEntry {
                name: name.to_string(),
                ino: v.ino,
                kind: v.kind,
            }),
            None => Err(FsError::NotFound(String::new())),
        }
    }

    /// [`Self::lookup`] plus the inode's attributes when it is held here.
    pub fn lookup_attr(
        &self,
        txn: &RoTxn,
        parent: Ino,
        name: &str,
    ) -> FsResult<(DirEntry, Option<Attr>)> {
        let entry = self.lookup(txn, parent, name)?;
        let attr = if self.is_local(entry.ino) {
            self.inode(txn, entry.ino)?
        } else {
            None
        };
        Ok((entry, attr))
    }

    pub fn readdir(
        &self,
        txn: &RoTxn,
        ino: Ino,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<Vec<DirEntry>> {
        self.dir(txn, ino)?;
        let start = key_name(ino, after.unwrap_or(""));
        let end = key_name(ino + 1, "");
        let lower = if after.is_some() {
            Bound::Excluded(start.as_slice())
        } else {
            Bound::Included(start.as_slice())
        };
        let range = (lower, Bound::Excluded(end.as_slice()));
        let mut out = Vec::new();
        for item in self.dentries.range(txn, &range).map_err(lmdb_err)? {
            if out.len() >= limit as usize {
                break;
            }
            let (key, value) = item.map_err(lmdb_err)?;
            let v: DentryValue = decode(value)?;
            let name = std::str::from_utf8(&key[8..]).map_err(|_| {
                FsError::Corrupt(format!("entry name in directory {ino:#x} is not UTF-8"))
            })?;
            out.push(DirEntry {
                name: name.to_string(),
                ino: v.ino,
                kind: v.kind,
            });
        }
        Ok(out)
    }

    /// [`Self::readdir`] with the attributes of entries whose inode is held here.
    pub fn readdir_plus(
        &self,
        txn: &RoTxn,
        ino: Ino,
        after: Option<&str>,
        limit: u32,
    ) -> FsResult<Vec<(DirEntry, Option<Attr>)>> {
        self.readdir(txn, ino, after, limit)?
            .into_iter()
            .map(|entry| {
                let attr = self.inode(txn, entry.ino)?;
                Ok((entry, attr))
            })
            .collect()
    }

    fn has_children(&self, txn: &RoTxn, ino: Ino) -> FsResult<bool> {
        let mut iter = self
            .dentries
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?;
        Ok(iter.next().transpose().map_err(lmdb_err)?.is_some())
    }

    pub fn intents(&self, txn: &RoTxn) -> FsResult<Vec<Intent>> {
        let mut out = Vec::new();
        for item in self.own(self.intents, txn)? {
            let (_, v) = item.map_err(lmdb_err)?;
            out.push(decode(v)?);
        }
        Ok(out)
    }

    fn intent(&self, txn: &RoTxn, op: OpId) -> FsResult<Intent> {
        match self.intents.get(txn, &key_ino(op)).map_err(lmdb_err)? {
            Some(v) => decode(v),
            None => Err(FsError::NotFound(format!("operation {op:#x}"))),
        }
    }

    /// Keys of this shard in tables keyed by an id that carries the shard
    /// (inodes, entries by parent, intents and locks).
    fn own_keys(&self) -> ([u8; 8], Option<[u8; 8]>) {
        let start = key_ino(make_id(self.shard, 0));
        let end = (u32::from(self.shard) + 1 < curvine_messages::MAX_SHARDS)
            .then(|| key_ino(make_id(self.shard + 1, 0)));
        (start, end)
    }

    /// Entries of `db` that belong to this shard.
    fn own<'t>(&self, db: Table, txn: &'t RoTxn) -> FsResult<heed::RoRange<'t, Bytes, Bytes>> {
        let (start, end) = self.own_keys();
        let upper = match &end {
            Some(end) => Bound::Excluded(&end[..]),
            None => Bound::Unbounded,
        };
        db.range(txn, &(Bound::Included(&start[..]), upper))
            .map_err(lmdb_err)
    }

    fn count_own(&self, db: Table, txn: &RoTxn) -> FsResult<u64> {
        let mut n = 0;
        for item in self.own(db, txn)? {
            item.map_err(lmdb_err)?;
            n += 1;
        }
        Ok(n)
    }

    pub fn stats(&self, txn: &RoTxn) -> FsResult<ShardStats> {
        Ok(ShardStats {
            shard: self.shard,
            inodes: self.count_own(self.inodes, txn)?,
            dentries: self.count_own(self.dentries, txn)?,
            intents: self.count_own(self.intents, txn)?,
            locks: self.count_own(self.locks, txn)?,
            env: self.env.path().display().to_string(),
            env_bytes: self.env.real_disk_size().unwrap_or(0),
        })
    }

    pub fn scan(&self, txn: &RoTxn) -> FsResult<ShardScan> {
        let mut scan = ShardScan {
            shard: self.shard,
            ..Default::default()
        };
        for item in self.own(self.inodes, txn)? {
            scan.inodes.push(decode(item.map_err(lmdb_err)?.1)?);
        }
        for item in self.own(self.dentries, txn)? {
            let (key, value) = item.map_err(lmdb_err)?;
            let v: DentryValue = decode(value)?;
            let name = String::from_utf8_lossy(&key[8..]).into_owned();
            scan.dentries.push((
                ino_from(key)?,
                DirEntry {
                    name,
                    ino: v.ino,
                    kind: v.kind,
                },
            ));
        }
        scan.intents = self.intents(txn)?;
        scan.locks = self.count_own(self.locks, txn)?;
        scan.op_records = self.count_own(self.ops, txn)?;
        Ok(scan)
    }

    // ---- write helpers -----------------------------------------------------

    fn put_inode(&self, wtxn: &mut WriteTxn, attr: &Attr) -> FsResult<()> {
        self.inodes
            .put(wtxn, &key_ino(attr.ino), &encode_versioned(attr))
            .map_err(lmdb_err)
    }

    fn delete_inode(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<()> {
        self.inodes.delete(wtxn, &key_ino(ino)).map_err(lmdb_err)?;
        self.free_blocks_from(wtxn, ino, 0)?;
        self.free_pending(wtxn, ino)?;
        delete_id_prefix(self.xattrs, wtxn, ino)
    }

    fn put_dentry(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        ino: Ino,
        kind: FileKind,
    ) -> FsResult<()> {
        self.dentries
            .put(
                wtxn,
                &key_name(parent, name),
                &encode_versioned(&DentryValue { ino, kind }),
            )
            .map_err(lmdb_err)
    }

    fn delete_dentry(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str) -> FsResult<()> {
        self.dentries
            .delete(wtxn, &key_name(parent, name))
            .map_err(lmdb_err)
            .map(|_| ())
    }

    fn meta(&self, txn: &RoTxn) -> FsResult<ShardMeta> {
        match self.meta.get(txn, &self.meta_key).map_err(lmdb_err)? {
            Some(v) => decode(v),
            None => Err(FsError::Corrupt(format!(
                "shard {} has no meta record",
                self.shard
            ))),
        }
    }

    fn alloc_ino(&self, wtxn: &mut WriteTxn) -> FsResult<Ino> {
        let mut meta = self.meta(wtxn)?;
        let ino = make_id(self.shard, meta.next_ino);
        meta.next_ino += 1;
        self.meta
            .put(wtxn, &self.meta_key, &encode_versioned(&meta))
            .map_err(lmdb_err)?;
        Ok(ino)
    }

    fn alloc_op(&self, wtxn: &mut WriteTxn) -> FsResult<OpId> {
        let mut meta = self.meta(wtxn)?;
        let op = make_id(self.shard, meta.next_op);
        meta.next_op += 1;
        self.meta
            .put(wtxn, &self.meta_key, &encode_versioned(&meta))
            .map_err(lmdb_err)?;
        Ok(op)
    }

    fn lock_holder(&self, txn: &RoTxn, parent: Ino, name: &str) -> FsResult<Option<OpId>> {
        match self
            .locks
            .get(txn, &key_name(parent, name))
            .map_err(lmdb_err)?
        {
            Some(v) => Ok(Some(decode::<NameLock>(v)?.op)),
            None => Ok(None),
        }
    }

    /// Fails with `Busy` when another operation holds `parent/name`.
    fn check_unlocked(
        &self,
        txn: &RoTxn,
        parent: Ino,
        name: &str,
        by: Option<OpId>,
    ) -> FsResult<()> {
        match self.lock_holder(txn, parent, name)? {
            Some(holder) if Some(holder) != by => Err(FsError::Busy(format!(
                "'{name}' is being changed by operation {holder:#x}"
            ))),
            _ => Ok(()),
        }
    }

    fn lock_name(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str, op: OpId) -> FsResult<()> {
        self.locks
            .put(
                wtxn,
                &key_name(parent, name),
                &encode_versioned(&NameLock { op }),
            )
            .map_err(lmdb_err)
    }

    fn unlock_name(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str, op: OpId) -> FsResult<()> {
        if self.lock_holder(wtxn, parent, name)? == Some(op) {
            self.locks
                .delete(wtxn, &key_name(parent, name))
                .map_err(lmdb_err)?;
        }
        Ok(())
    }

    /// Updates a directory after its entries changed: times, and link count
    /// by `nlink_delta` (subdirectories added or removed).
    fn touch_dir(&self, wtxn: &mut WriteTxn, ino: Ino, nlink_delta: i32, now: i64) -> FsResult<()> {
        let mut dir = self.getattr(wtxn, ino)?;
        dir.nlink = (dir.nlink as i64 + nlink_delta as i64).max(2) as u32;
        dir.mtime_ns = now;
        dir.ctime_ns = now;
        self.put_inode(wtxn, &dir)
    }

    fn new_attr(ino: Ino, attrs: &NewInode, parent: Ino) -> Attr {
        let is_dir = attrs.kind == FileKind::Dir;
        Attr {
            ino,
            kind: attrs.kind,
            mode: attrs.mode & 0o7777,
            uid: attrs.uid,
            gid: attrs.gid,
            size: attrs.symlink.as_ref().map(|t| t.len() as u64).unwrap_or(0),
            atime_ns: attrs.now_ns,
            mtime_ns: attrs.now_ns,
            ctime_ns: attrs.now_ns,
            nlink: if is_dir { 2 } else { 1 },
            symlink: attrs.symlink.clone(),
            block_size: 0,
            replicas: 0,
            parent: if is_dir { parent } else { 0 },
            storage: None,
            writing: None,
            ufs: None,
        }
    }

    /// Decrements a local inode's link count, deleting it at zero.
    fn drop_link_local(&self, wtxn: &mut WriteTxn, ino: Ino, now: i64) -> FsResult<()> {
        let Some(mut attr) = self.inode(wtxn, ino)? else {
            return Ok(());
        };
        if attr.nlink <= 1 || attr.kind == FileKind::Dir {
            self.delete_inode(wtxn, ino)
        } else {
            attr.nlink -= 1;
            attr.ctime_ns = now;
            self.put_inode(wtxn, &attr)
        }
    }

    // ---- single-shard mutations --------------------------------------------

    /// Creates a file or symlink with its inode in this shard.
    pub fn create(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
        file: Option<&NewFile>,
    ) -> FsResult<Attr> {
        if attrs.kind == FileKind::Dir {
            return Err(FsError::InvalidArgument(
                "create makes files and symlinks; use mkdir".into(),
            ));
        }
        self.dir(wtxn, parent)?;
        self.check_unlocked(wtxn, parent, name, None)?;
        if self.dentry(wtxn, parent, name)?.is_some() {
            return Err(FsError::AlreadyExists(String::new()));
        }
        let ino = self.alloc_ino(wtxn)?;
        let mut attr = Self::new_attr(ino, attrs, parent);
        if let (Some(file), FileKind::File) = (file, attrs.kind) {
            attr.block_size = file.spec.block_size;
            attr.replicas = file.spec.replicas;
            attr.storage = file.spec.storage;
            attr.writing = file.lease.clone();
        }
        self.put_inode(wtxn, &attr)?;
        self.put_dentry(wtxn, parent, name, ino, attr.kind)?;
        self.touch_dir(wtxn, parent, 0, attrs.now_ns)?;
        Ok(attr)
    }

    /// Creates a directory whose inode lives in this shard, like its parent.
    pub fn mkdir_local(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
    ) -> FsResult<Attr> {
        self.dir(wtxn, parent)?;
        self.check_unlocked(wtxn, parent, name, None)?;
        if self.dentry(wtxn, parent, name)?.is_some() {
            return Err(FsError::AlreadyExists(String::new()));
        }
        let ino = self.alloc_ino(wtxn)?;
        let attr = Self::new_attr(
            ino,
            &NewInode {
                kind: FileKind::Dir,
                ..attrs.clone()
            },
            parent,
        );
        self.put_inode(wtxn, &attr)?;
        self.put_dentry(wtxn, parent, name, ino, FileKind::Dir)?;
        self.touch_dir(wtxn, parent, 1, attrs.now_ns)?;
        Ok(attr)
    }

    pub fn setattr(&self, wtxn: &mut WriteTxn, ino: Ino, set: &SetAttr) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        let now = now_ns();
        if let Some(size) = set.size {
            match attr.kind {
                FileKind::Dir => return Err(FsError::IsADirectory(String::new())),
                FileKind::Symlink => {
                    return Err(FsError::InvalidArgument("cannot truncate a symlink".into()))
                }
                FileKind::File => {}
            }
            if size < attr.size {
                self.truncate_blocks(wtxn, &attr, size)?;
            }
            attr.size = size;
            attr.mtime_ns = now;
        }
        if let Some(mode) = set.mode {
            attr.mode = mode & 0o7777;
        }
        if let Some(uid) = set.uid {
            attr.uid = uid;
        }
        if let Some(gid) = set.gid {
            attr.gid = gid;
        }
        let time = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::Ns(ns) => ns,
        };
        if let Some(t) = set.atime {
            attr.atime_ns = time(t);
        }
        if let Some(t) = set.mtime {
            attr.mtime_ns = time(t);
        }
        attr.ctime_ns = now;
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    // ---- file data ---------------------------------------------------------

    /// Committed blocks of a file, in index order.
    pub fn file_blocks(&self, txn: &RoTxn, ino: Ino) -> FsResult<Vec<BlockInfo>> {
        let mut out = Vec::new();
        for item in self
            .blocks
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            out.push(decode(item.map_err(lmdb_err)?.1)?);
        }
        Ok(out)
    }

    /// A file's attributes and committed blocks.
    pub fn file_with_blocks(&self, txn: &RoTxn, ino: Ino) -> FsResult<(Attr, Vec<BlockInfo>)> {
        let attr = self.getattr(txn, ino)?;
        match attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(FsError::IsADirectory(String::new())),
            FileKind::Symlink => {
                return Err(FsError::InvalidArgument("a symlink has no data".into()))
            }
        }
        let blocks = self.file_blocks(txn, ino)?;
        Ok((attr, blocks))
    }

    fn free_block(&self, wtxn: &mut WriteTxn, id: BlockId, locs: Vec<String>) -> FsResult<()> {
        self.owners.delete(wtxn, &key_ino(id)).map_err(lmdb_err)?;
        self.freed
            .put(
                wtxn,
                &key_ino(id),
                &encode_versioned(&FreedBlock { id, locs }),
            )
            .map_err(lmdb_err)
    }

    /// Frees the committed blocks of `ino` from index `first` on.
    fn free_blocks_from(&self, wtxn: &mut WriteTxn, ino: Ino, first: u32) -> FsResult<()> {
        let start = key_block(ino, first);
        let end = key_ino(ino + 1);
        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
        let mut dropped = Vec::new();
        for item in self.blocks.range(wtxn, &range).map_err(lmdb_err)? {
            let info: BlockInfo = decode(item.map_err(lmdb_err)?.1)?;
            dropped.push(info);
        }
        for info in dropped {
            self.blocks
                .delete(wtxn, &key_block(ino, info.index))
                .map_err(lmdb_err)?;
            self.free_block(wtxn, info.id, info.locs)?;
        }
        Ok(())
    }

    /// Frees blocks allocated to writers of `ino` and never committed.
    fn free_pending(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<()> {
        let mut ids = Vec::new();
        for item in self
            .pending
            .prefix_iter(wtxn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            let (key, _) = item.map_err(lmdb_err)?;
            ids.push(ino_from(&key[8..])?);
        }
        for id in ids {
            self.pending
                .delete(wtxn, &key_pending(ino, id))
                .map_err(lmdb_err)?;
            // Where a pending block was written is not recorded: every node is asked.
            self.free_block(wtxn, id, Vec::new())?;
        }
        Ok(())
    }

    /// Drops the blocks past a new, smaller size and shortens the last one.
    fn truncate_blocks(&self, wtxn: &mut WriteTxn, attr: &Attr, size: u64) -> FsResult<()> {
        let bs = attr.block_size;
        if bs == 0 {
            return Ok(());
        }
        let keep = size.div_ceil(bs);
        self.free_blocks_from(wtxn, attr.ino, keep.min(u32::MAX as u64) as u32)?;
        if !size.is_multiple_of(bs) {
            let index = (size / bs) as u32;
            let key = key_block(attr.ino, index);
            let current = self.blocks.get(wtxn, &key).map_err(lmdb_err)?;
            if let Some(bytes) = current {
                let mut info: BlockInfo = decode(bytes)?;
                if info.len > size % bs {
                    info.len = size % bs;
                    self.blocks
                        .put(wtxn, &key, &encode_versioned(&info))
                        .map_err(lmdb_err)?;
                }
            }
        }
        Ok(())
    }

    /// The file `ino`, checking that `handle` holds its write lease.
    fn leased_file(&self, txn: &RoTxn, ino: Ino, handle: u64) -> FsResult<Attr> {
        let attr = self.getattr(txn, ino)?;
        match &attr.writing {
            Some(lease) if lease.handle == handle => Ok(attr),
            Some(lease) => Err(FsError::InUse(format!(
                "the file was taken over by writer {} (this writer's lease expired)",
                lease.client
            ))),
            None => Err(FsError::InvalidArgument(
                "the file is not open for writing by this writer".into(),
            )),
        }
    }

    /// Takes the write lease of an existing file.
    pub fn open_write(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        open: &OpenForWrite,
    ) -> FsResult<(Attr, Vec<BlockInfo>, Option<BlockId>)> {
        let OpenForWrite {
            lease,
            spec,
            truncate,
            lease_timeout_ns,
            first_block,
        } = open;
        let (truncate, lease_timeout_ns, first_block) =
            (*truncate, *lease_timeout_ns, *first_block);
        let (mut attr, _) = self.file_with_blocks(wtxn, ino)?;
        let now = now_ns();
        if let Some(held) = &attr.writing {
            if held.handle != lease.handle && now - held.renewed_ns < lease_timeout_ns {
                return Err(FsError::InUse(format!(
                    "the file is being written by {}",
                    held.client
                )));
            }
            // An expired writer: its uncommitted blocks go.
            self.free_pending(wtxn, ino)?;
        }
        if truncate && attr.size > 0 {
            self.free_blocks_from(wtxn, ino, 0)?;
            attr.size = 0;
            attr.mtime_ns = now;
        }
        if attr.block_size == 0 || (attr.size == 0 && truncate) {
            attr.block_size = spec.block_size;
            attr.replicas = spec.replicas;
            if spec.storage.is_some() {
                attr.storage = spec.storage;
            }
        }
        attr.ctime_ns = now;
        attr.writing = Some(lease.clone());
        self.put_inode(wtxn, &attr)?;
        let first = match first_block {
            Some(at_end) => {
                let index = if at_end {
                    attr.size / attr.block_size.max(1)
                } else {
                    0
                };
                Some(self.add_block(wtxn, ino, lease.handle, index.min(u32::MAX as u64) as u32)?)
            }
            None => None,
        };
        let blocks = self.file_blocks(wtxn, ino)?;
        Ok((attr, blocks, first))
    }

    /// Creates a file for a writer (with its lease) and allocates its first
    /// block, in one transaction.
    pub fn create_file(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        name: &str,
        attrs: &NewInode,
        file: &NewFile,
    ) -> FsResult<(Attr, BlockId)> {
        let lease = file.lease.clone().ok_or_else(|| {
            FsError::InvalidArgument("creating a file for a writer needs its lease".into())
        })?;
        let attr = self.create(wtxn, parent, name, attrs, Some(file))?;
        let block = self.add_block(wtxn, attr.ino, lease.handle, 0)?;
        let attr = self.getattr(wtxn, attr.ino)?;
        Ok((attr, block))
    }

    /// A new block id for block `index` of `ino`, recorded as pending (freed
    /// by the file's next completion unless committed).
    fn alloc_pending_block(&self, wtxn: &mut WriteTxn, ino: Ino, index: u32) -> FsResult<BlockId> {
        let id = self.alloc_ino(wtxn)?;
        let owner = BlockOwner {
            ino,
            index,
            pending: true,
        };
        self.owners
            .put(wtxn, &key_ino(id), &encode_versioned(&owner))
            .map_err(lmdb_err)?;
        // When it was handed out (see `reclaim_pending`).
        self.pending
            .put(wtxn, &key_pending(ino, id), &now_ns().to_be_bytes())
            .map_err(lmdb_err)?;
        Ok(id)
    }

    /// Frees blocks handed out but never committed whose writer is gone: the
    /// file's lease was last renewed before `lease_before_ns` (a writer that
    /// died; the lease is cleared too), or, for blocks of a file nobody
    /// writes (UFS fills), handed out before `fill_before_ns`. Returns the
    /// files concerned.
    pub fn reclaim_pending(
        &self,
        wtxn: &mut WriteTxn,
        lease_before_ns: i64,
        fill_before_ns: i64,
    ) -> FsResult<u32> {
        let mut by_file: BTreeMap<Ino, Vec<(BlockId, i64)>> = BTreeMap::new();
        for item in self.own(self.pending, wtxn)? {
            let (k, v) = item.map_err(lmdb_err)?;
            let at = v.try_into().map(i64::from_be_bytes).unwrap_or(0);
            by_file
                .entry(ino_from(k)?)
                .or_default()
                .push((ino_from(&k[8..])?, at));
        }
        let mut files = 0;
        for (ino, blocks) in by_file {
            let attr = self.inode(wtxn, ino)?;
            let stale: Vec<BlockId> = match attr.as_ref().and_then(|a| a.writing.as_ref()) {
                Some(lease) if lease.renewed_ns >= lease_before_ns => continue,
                Some(_) => blocks.iter().map(|(id, _)| *id).collect(),
                None => blocks
                    .iter()
                    .filter(|(_, at)| *at < fill_before_ns)
                    .map(|(id, _)| *id)
                    .collect(),
            };
            if stale.is_empty() {
                continue;
            }
            for id in stale {
                self.pending
                    .delete(wtxn, &key_pending(ino, id))
                    .map_err(lmdb_err)?;
                self.free_block(wtxn, id, Vec::new())?;
            }
            if let Some(mut attr) = attr.filter(|a| a.writing.is_some()) {
                attr.writing = None;
                self.put_inode(wtxn, &attr)?;
            }
            files += 1;
        }
        Ok(files)
    }

    /// Allocates block `index` of a file being written, renewing the lease.
    pub fn add_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        index: u32,
    ) -> FsResult<BlockId> {
        let mut attr = self.leased_file(wtxn, ino, handle)?;
        let id = self.alloc_pending_block(wtxn, ino, index)?;
        if let Some(lease) = attr.writing.as_mut() {
            lease.renewed_ns = now_ns();
        }
        self.put_inode(wtxn, &attr)?;
        Ok(id)
    }

    /// Closes a written file: switches in its new blocks, sets its size and
    /// releases the lease. Checks every block was allocated to this file at
    /// that index, so a confused writer cannot graft another file's data.
    pub fn complete_file(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: &[BlockInfo],
    ) -> FsResult<Attr> {
        self.complete_file_with(wtxn, ino, handle, size, blocks, None)
    }

    /// `complete_file` that also sets the file's UFS state (when `Some`).
    pub fn complete_file_with(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        handle: u64,
        size: u64,
        blocks: &[BlockInfo],
        ufs: Option<UfsState>,
    ) -> FsResult<Attr> {
        let mut attr = self.leased_file(wtxn, ino, handle)?;
        let bs = attr.block_size.max(1);
        for b in blocks {
            let owner: Option<BlockOwner> =
                match self.owners.get(wtxn, &key_ino(b.id)).map_err(lmdb_err)? {
                    Some(v) => Some(decode(v)?),
                    None => None,
                };
            match owner {
                Some(o) if o.ino == ino && o.index == b.index && o.pending => {}
                _ => {
                    return Err(FsError::InvalidArgument(format!(
                        "block {:#x} was not allocated to this file at index {}",
                        b.id, b.index
                    )))
                }
            }
            if b.len > bs || b.stored < b.len || (b.index as u64) * bs >= size.max(1) && b.len > 0 {
                return Err(FsError::InvalidArgument(format!(
                    "block {:#x} at index {} claims {} bytes, which does not fit a file of {size} bytes in blocks of {bs}",
                    b.id, b.index, b.len
                )));
            }
            let key = key_block(ino, b.index);
            let old = self.blocks.get(wtxn, &key).map_err(lmdb_err)?;
            if let Some(old) = old {
                let old: BlockInfo = decode(old)?;
                if old.id != b.id {
                    self.free_block(wtxn, old.id, old.locs)?;
                }
            }
            self.record_block(wtxn, ino, b)?;
        }
        self.free_pending(wtxn, ino)?;
        if size < attr.size {
            self.truncate_blocks(wtxn, &attr, size)?;
        }
        // A writer that wrote nothing (no blocks, same size) leaves the
        // times alone, as closing an unwritten file does on Linux.
        if !blocks.is_empty() || size != attr.size {
            let now = now_ns();
            attr.mtime_ns = now;
            attr.ctime_ns = now;
        }
        attr.size = size;
        attr.writing = None;
        if ufs.is_some() {
            attr.ufs = ufs;
        }
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// What each block id is used for.
    /// What each block is used for, as seen from `node`: a committed block
    /// whose nodes do not include `node` is unknown there (a stale copy).
    pub fn check_blocks(
        &self,
        txn: &RoTxn,
        ids: &[BlockId],
        node: &str,
    ) -> FsResult<Vec<BlockUse>> {
        ids.iter()
            .map(|&id| {
                let owner = match self.owners.get(txn, &key_ino(id)).map_err(lmdb_err)? {
                    Some(v) => decode::<BlockOwner>(v)?,
                    None => return Ok(BlockUse::Unknown),
                };
                if owner.pending {
                    return Ok(BlockUse::Pending);
                }
                let here = match self
                    .blocks
                    .get(txn, &key_block(owner.ino, owner.index))
                    .map_err(lmdb_err)?
                {
                    Some(v) => {
                        let info: BlockInfo = decode(v)?;
                        info.id == id && (node.is_empty() || info.locs.iter().any(|l| l == node))
                    }
                    None => false,
                };
                Ok(if here {
                    BlockUse::Live
                } else {
                    BlockUse::Unknown
                })
            })
            .collect()
    }

    /// Up to `limit` committed blocks after `(ino, index)`, with their file's
    /// replica count.
    pub fn scan_blocks(
        &self,
        txn: &RoTxn,
        after: Option<(Ino, u32)>,
        limit: u32,
    ) -> FsResult<Vec<(Ino, u16, BlockInfo)>> {
        let start: Vec<u8> = match after {
            Some((ino, index)) => match index.checked_add(1) {
                Some(next) => key_block(ino, next).to_vec(),
                None => key_block(ino + 1, 0).to_vec(),
            },
            None => vec![self.shard as u8],
        };
        let range = (Bound::Included(start.as_slice()), Bound::Unbounded);
        let mut out = Vec::new();
        let mut replicas: Option<(Ino, u16)> = None;
        for item in self.blocks.range(txn, &range).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            if k.first() != Some(&(self.shard as u8)) || out.len() >= limit as usize {
                break;
            }
            let ino = ino_from(k)?;
            let info: BlockInfo = decode(v)?;
            let wanted = match replicas {
                Some((i, r)) if i == ino => r,
                _ => {
                    let r = self.inode(txn, ino)?.map(|a| a.replicas).unwrap_or(1);
                    replicas = Some((ino, r));
                    r
                }
            };
            out.push((ino, wanted, info));
        }
        Ok(out)
    }

    /// Sets the nodes of a committed block that is still `id`.
    pub fn set_locs(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        index: u32,
        id: BlockId,
        locs: &[String],
    ) -> FsResult<bool> {
        let key = key_block(ino, index);
        let Some(v) = self.blocks.get(wtxn, &key).map_err(lmdb_err)? else {
            return Ok(false);
        };
        let mut info: BlockInfo = decode(v)?;
        if info.id != id {
            return Ok(false);
        }
        info.locs = locs.to_vec();
        self.blocks
            .put(wtxn, &key, &encode_versioned(&info))
            .map_err(lmdb_err)?;
        Ok(true)
    }

    /// A bad copy of block `id` on `node`: forgets it when the data is whole
    /// elsewhere (see `ShardMsg::DropCopy`); without `apply` only says what
    /// it would do.
    pub fn drop_copy(
        &self,
        wtxn: &mut WriteTxn,
        id: BlockId,
        node: &str,
        apply: bool,
    ) -> FsResult<CopyDrop> {
        let Some(v) = self.owners.get(wtxn, &key_ino(id)).map_err(lmdb_err)? else {
            return Ok(CopyDrop::Unused);
        };
        let owner: BlockOwner = decode(v)?;
        if owner.pending {
            // Its writer has not closed the file: the block is not data yet
            // that anyone relies on, and the writer owns it.
            return Ok(CopyDrop::OnlyCopy);
        }
        let key = key_block(owner.ino, owner.index);
        let Some(v) = self.blocks.get(wtxn, &key).map_err(lmdb_err)? else {
            return Ok(CopyDrop::Unused);
        };
        let mut info: BlockInfo = decode(v)?;
        if info.id != id || !info.locs.iter().any(|n| n == node) {
            return Ok(CopyDrop::Unused);
        }
        if info.locs.len() > 1 {
            info.locs.retain(|n| n != node);
            if apply {
                self.blocks
                    .put(wtxn, &key, &encode_versioned(&info))
                    .map_err(lmdb_err)?;
            }
            return Ok(CopyDrop::Dropped {
                left: info.locs.len() as u32,
            });
        }
        let mirrors = self.inode(wtxn, owner.ino)?.is_some_and(|a| {
            a.writing.is_none() && a.ufs.as_ref().is_some_and(|u| u.persist == Persist::Synced)
        });
        if !mirrors {
            return Ok(CopyDrop::OnlyCopy);
        }
        if apply {
            self.blocks.delete(wtxn, &key).map_err(lmdb_err)?;
            self.free_block(wtxn, id, vec![node.to_string()])?;
        }
        Ok(CopyDrop::Refetch)
    }

    /// Up to `limit` freed blocks still to remove from their nodes.
    pub fn take_freed(&self, txn: &RoTxn, limit: u32) -> FsResult<Vec<FreedBlock>> {
        let mut out = Vec::new();
        for item in self.own(self.freed, txn)? {
            if out.len() >= limit as usize {
                break;
            }
            out.push(decode(item.map_err(lmdb_err)?.1)?);
        }
        Ok(out)
    }

    pub fn forget_freed(&self, wtxn: &mut WriteTxn, ids: &[BlockId]) -> FsResult<()> {
        for id in ids {
            self.freed.delete(wtxn, &key_ino(*id)).map_err(lmdb_err)?;
        }
        Ok(())
    }

    // ---- extended attributes -----------------------------------------------

    fn xattr_key(ino: Ino, name: &str) -> Vec<u8> {
        key_name(ino, name)
    }

    pub fn set_xattr(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        name: &str,
        value: &[u8],
        mode: XattrMode,
    ) -> FsResult<()> {
        check_xattr(name, Some(value))?;
        let mut attr = self.getattr(wtxn, ino)?;
        let key = Self::xattr_key(ino, name);
        let exists = self.xattrs.get(wtxn, &key).map_err(lmdb_err)?.is_some();
        match (mode, exists) {
            (XattrMode::Create, true) => {
                return Err(FsError::AlreadyExists(format!("attribute {name}")))
            }
            (XattrMode::Replace, false) => {
                return Err(FsError::NoData(format!("attribute {name}")))
            }
            _ => {}
        }
        self.xattrs
            .put(wtxn, &key, &encode_versioned(&XattrValue(value.to_vec())))
            .map_err(lmdb_err)?;
        attr.ctime_ns = now_ns();
        self.put_inode(wtxn, &attr)
    }

    pub fn get_xattr(&self, txn: &RoTxn, ino: Ino, name: &str) -> FsResult<Vec<u8>> {
        check_xattr(name, None)?;
        self.getattr(txn, ino)?;
        match self
            .xattrs
            .get(txn, &Self::xattr_key(ino, name))
            .map_err(lmdb_err)?
        {
            Some(bytes) => Ok(decode::<XattrValue>(bytes)?.0),
            None => Err(FsError::NoData(format!("attribute {name}"))),
        }
    }

    pub fn list_xattr(&self, txn: &RoTxn, ino: Ino) -> FsResult<Vec<String>> {
        self.getattr(txn, ino)?;
        let mut names = Vec::new();
        for item in self
            .xattrs
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            let (key, _) = item.map_err(lmdb_err)?;
            names.push(String::from_utf8_lossy(&key[8..]).into_owned());
        }
        Ok(names)
    }

    pub fn remove_xattr(&self, wtxn: &mut WriteTxn, ino: Ino, name: &str) -> FsResult<()> {
        check_xattr(name, None)?;
        let mut attr = self.getattr(wtxn, ino)?;
        if !self
            .xattrs
            .delete(wtxn, &Self::xattr_key(ino, name))
            .map_err(lmdb_err)?
        {
            return Err(FsError::NoData(format!("attribute {name}")));
        }
        attr.ctime_ns = now_ns();
        self.put_inode(wtxn, &attr)
    }

    /// Removes a file or symlink entry. Its inode goes with it when it is
    /// local; otherwise an intent to drop the remote link is recorded.
    pub fn unlink(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str) -> FsResult<UnlinkOutcome> {
        self.dir(wtxn, parent)?;
        let entry = self
            .dentry(wtxn, parent, name)?
            .ok_or_else(|| FsError::NotFound(String::new()))?;
        if entry.kind == FileKind::Dir {
            return Err(FsError::IsADirectory(String::new()));
        }
        self.check_unlocked(wtxn, parent, name, None)?;
        let now = now_ns();
        self.delete_dentry(wtxn, parent, name)?;
        self.touch_dir(wtxn, parent, 0, now)?;
        let removed = DirEntry {
            name: name.to_string(),
            ino: entry.ino,
            kind: entry.kind,
        };
        if self.is_local(entry.ino) {
            self.drop_link_local(wtxn, entry.ino, now)?;
            Ok(UnlinkOutcome::Done(removed))
        } else {
            let op = self.alloc_op(wtxn)?;
            let intent = Intent {
                op,
                action: IntentOp::DropLink { ino: entry.ino },
                created_ns: now,
                aborting: false,
            };
            self.intents
                .put(wtxn, &key_ino(op), &encode_versioned(&intent))
                .map_err(lmdb_err)?;
            Ok(UnlinkOutcome::Pending(removed, intent))
        }
    }

    /// Removes an empty directory whose inode lives here.
    pub fn rmdir_local(&self, wtxn: &mut WriteTxn, parent: Ino, name: &str) -> FsResult<DirEntry> {
        self.dir(wtxn, parent)?;
        let entry = self
            .dentry(wtxn, parent, name)?
            .ok_or_else(|| FsError::NotFound(String::new()))?;
        if entry.kind != FileKind::Dir {
            return Err(FsError::NotADirectory(String::new()));
        }
        if !self.is_local(entry.ino) {
            return Err(FsError::Io(format!(
                "directory {:#x} is not held by shard {}",
                entry.ino, self.shard
            )));
        }
        self.check_unlocked(wtxn, parent, name, None)?;
        if self.has_children(wtxn, entry.ino)? {
            return Err(FsError::NotEmpty(String::new()));
        }
        self.delete_inode(wtxn, entry.ino)?;
        self.delete_dentry(wtxn, parent, name)?;
        self.touch_dir(wtxn, parent, -1, now_ns())?;
        Ok(DirEntry {
            name: name.to_string(),
            ino: entry.ino,
            kind: entry.kind,
        })
    }

    /// Renames between two directories of this shard when every inode the
    /// rename changes is here too; otherwise answers `NeedsIntent` and changes nothing.
    pub fn rename_local(
        &self,
        wtxn: &mut WriteTxn,
        src_parent: Ino,
        src_name: &str,
        dst_parent: Ino,
        dst_name: &str,
    ) -> FsResult<RenameOutcome> {
        self.dir(wtxn, src_parent)?;
        let src = self
            .dentry(wtxn, src_parent, src_name)?
            .ok_or_else(|| FsError::NotFound(String::new()))?;
        self.dir(wtxn, dst_parent)?;
        self.check_unlocked(wtxn, src_parent, src_name, None)?;
        self.check_unlocked(wtxn, dst_parent, dst_name, None)?;
        if src_parent == dst_parent && src_name == dst_name {
            return Ok(RenameOutcome::Done);
        }
        let dst = self.dentry(wtxn, dst_parent, dst_name)?;
        let moves_dir = src.kind == FileKind::Dir && src_parent != dst_parent;
        if moves_dir && !self.is_local(src.ino) {
            return Ok(RenameOutcome::NeedsIntent);
        }
        if let Some(d) = dst {
            if d.ino == src.ino {
                return Ok(RenameOutcome::Done);
            }
            check_rename_kinds(src.kind, d.kind)?;
            if !self.is_local(d.ino) {
                return Ok(RenameOutcome::NeedsIntent);
            }
            if d.kind == FileKind::Dir && self.has_children(wtxn, d.ino)? {
                return Err(FsError::NotEmpty(String::new()));
            }
        }
        let now = now_ns();
        let mut dst_delta = 0;
        if let Some(d) = dst {
            if d.kind == FileKind::Dir {
                self.delete_inode(wtxn, d.ino)?;
                dst_delta -= 1;
            } else {
                self.drop_link_local(wtxn, d.ino, now)?;
            }
        }
        self.delete_dentry(wtxn, src_parent, src_name)?;
        self.put_dentry(wtxn, dst_parent, dst_name, src.ino, src.kind)?;
        if moves_dir {
            let mut attr = self.getattr(wtxn, src.ino)?;
            attr.parent = dst_parent;
            attr.ctime_ns = now;
            self.put_inode(wtxn, &attr)?;
            self.touch_dir(wtxn, src_parent, -1, now)?;
            dst_delta += 1;
        } else {
            if self.is_local(src.ino) {
                // A rename changes the inode's ctime, as Linux file systems do.
                let mut attr = self.getattr(wtxn, src.ino)?;
                attr.ctime_ns = now;
                self.put_inode(wtxn, &attr)?;
            }
            if src_parent != dst_parent {
                self.touch_dir(wtxn, src_parent, 0, now)?;
            }
        }
        self.touch_dir(wtxn, dst_parent, dst_delta, now)?;
        Ok(RenameOutcome::Done)
    }

    // ---- cross-shard operations --------------------------------------------

    /// Validates a cross-shard operation, reserves its name and records it.
    pub fn begin_intent(&self, wtxn: &mut WriteTxn, action: &IntentOp) -> FsResult<Intent> {
        let action = match action.clone() {
            IntentOp::Mkdir {
                parent,
                name,
                attrs,
                child_shard,
            } => {
                self.dir(wtxn, parent)?;
                self.check_unlocked(wtxn, parent, &name, None)?;
                if self.dentry(wtxn, parent, &name)?.is_some() {
                    return Err(FsError::AlreadyExists(String::new()));
                }
                IntentOp::Mkdir {
                    parent,
                    name,
                    attrs,
                    child_shard,
                }
            }
            IntentOp::Rmdir { parent, name, .. } => {
                self.dir(wtxn, parent)?;
                let entry = self
                    .dentry(wtxn, parent, &name)?
                    .ok_or_else(|| FsError::NotFound(String::new()))?;
                if entry.kind != FileKind::Dir {
                    return Err(FsError::NotADirectory(String::new()));
                }
                self.check_unlocked(wtxn, parent, &name, None)?;
                IntentOp::Rmdir {
                    parent,
                    name,
                    ino: entry.ino,
                }
            }
            IntentOp::Rename {
                src_parent,
                src_name,
                dst_parent,
                dst_name,
                ..
            } => {
                self.dir(wtxn, src_parent)?;
                let entry = self
                    .dentry(wtxn, src_parent, &src_name)?
                    .ok_or_else(|| FsError::NotFound(String::new()))?;
                self.check_unlocked(wtxn, src_parent, &src_name, None)?;
                IntentOp::Rename {
                    src_parent,
                    src_name,
                    dst_parent,
                    dst_name,
                    ino: entry.ino,
                    kind: entry.kind,
                }
            }
            IntentOp::DropLink { .. } => {
                return Err(FsError::InvalidArgument(
                    "drop-link intents are recorded by unlink".into(),
                ))
            }
        };
        let op = self.alloc_op(wtxn)?;
        match &action {
            IntentOp::Mkdir { parent, name, .. } | IntentOp::Rmdir { parent, name, .. } => {
                self.lock_name(wtxn, *parent, name, op)?
            }
            IntentOp::Rename {
                src_parent,
                src_name,
                ..
            } => self.lock_name(wtxn, *src_parent, src_name, op)?,
            IntentOp::DropLink { .. } => {}
        }
        let intent = Intent {
            op,
            action,
            created_ns: now_ns(),
            aborting: false,
        };
        self.intents
            .put(wtxn, &key_ino(op), &encode_versioned(&intent))
            .map_err(lmdb_err)?;
        Ok(intent)
    }

    pub fn abort_intent(&self, wtxn: &mut WriteTxn, op: OpId) -> FsResult<()> {
        let mut intent = self.intent(wtxn, op)?;
        intent.aborting = true;
        self.intents
            .put(wtxn, &key_ino(op), &encode_versioned(&intent))
            .map_err(lmdb_err)
    }

    /// Deletes a finished intent and the locks it still holds here.
    pub fn end_intent(&self, wtxn: &mut WriteTxn, op: OpId) -> FsResult<()> {
        if let Ok(intent) = self.intent(wtxn, op) {
            match &intent.action {
                IntentOp::Mkdir { parent, name, .. } | IntentOp::Rmdir { parent, name, .. } => {
                    self.unlock_name(wtxn, *parent, name, op)?
                }
                IntentOp::Rename {
                    src_parent,
                    src_name,
                    dst_parent,
                    dst_name,
                    ..
                } => {
                    self.unlock_name(wtxn, *src_parent, src_name, op)?;
                    if shard_of(*dst_parent) == self.shard {
                        self.unlock_name(wtxn, *dst_parent, dst_name, op)?;
                    }
                }
                IntentOp::DropLink { .. } => {}
            }
        }
        // The step records stay (until swept by age): a step of this
        // operation that arrives late, from a second driver (the node that
        // started it retrying while this shard's node re-drove it after a
        // restart), returns its recorded result instead of applying again.
        self.intents.delete(wtxn, &key_ino(op)).map_err(lmdb_err)?;
        Ok(())
    }

    /// Deletes step records older than `before_ns` whose operation is no
    /// longer recorded as an intent here. Returns how many went.
    pub fn sweep_op_records(&self, wtxn: &mut WriteTxn, before_ns: i64) -> FsResult<u64> {
        let mut stale = Vec::new();
        for item in self.ops.iter(wtxn).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            let record: StepRecord = decode(v)?;
            if record.at_ns < before_ns {
                stale.push(k.to_vec());
            }
        }
        let mut removed = 0;
        for k in stale {
            let op = ino_from(&k)?;
            if self
                .intents
                .get(wtxn, &key_ino(op))
                .map_err(lmdb_err)?
                .is_none()
            {
                self.ops.delete(wtxn, &k).map_err(lmdb_err)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Applies one step of a cross-shard operation, or returns the result it
    /// had when it was applied before.
    pub fn apply_step(
        &self,
        wtxn: &mut WriteTxn,
        op: OpId,
        step_no: u8,
        step: &Step,
    ) -> FsResult<StepResult> {
        let key = key_step(op, step_no);
        if let Some(bytes) = self.ops.get(wtxn, &key).map_err(lmdb_err)? {
            return Ok(decode::<StepRecord>(bytes)?.result);
        }
        let now = now_ns();
        let result = match step {
            Step::CreateDirInode { attrs, parent } => {
                let ino = self.alloc_ino(wtxn)?;
                let attr = Self::new_attr(
                    ino,
                    &NewInode {
                        kind: FileKind::Dir,
                        ..attrs.clone()
                    },
                    *parent,
                );
                self.put_inode(wtxn, &attr)?;
                StepResult::Created(Box::new(attr))
            }
            Step::RemoveDirIfEmpty { ino } => {
                if self.inode(wtxn, *ino)?.is_some() {
                    if self.has_children(wtxn, *ino)? {
                        return Err(FsError::NotEmpty(String::new()));
                    }
                    self.delete_inode(wtxn, *ino)?;
                }
                StepResult::Done
            }
            Step::DropLink { ino } => {
                self.drop_link_local(wtxn, *ino, now)?;
                StepResult::Done
            }
            Step::SetDirParent { ino, parent } => {
                if let Some(mut attr) = self.inode(wtxn, *ino)? {
                    attr.parent = *parent;
                    attr.ctime_ns = now;
                    self.put_inode(wtxn, &attr)?;
                }
                StepResult::Done
            }
            Step::LockName { parent, name } => {
                self.dir(wtxn, *parent)?;
                self.check_unlocked(wtxn, *parent, name, Some(op))?;
                let existing = self.dentry(wtxn, *parent, name)?.map(|v| DirEntry {
                    name: name.clone(),
                    ino: v.ino,
                    kind: v.kind,
                });
                self.lock_name(wtxn, *parent, name, op)?;
                StepResult::Existing(existing)
            }
            Step::LinkName {
                parent,
                name,
                ino,
                kind,
            } => {
                self.check_unlocked(wtxn, *parent, name, Some(op))?;
                let replaced = self.dentry(wtxn, *parent, name)?;
                let mut delta = 0;
                if *kind == FileKind::Dir {
                    delta += 1;
                }
                if replaced.is_some_and(|r| r.kind == FileKind::Dir) {
                    delta -= 1;
                }
                self.put_dentry(wtxn, *parent, name, *ino, *kind)?;
                self.touch_dir(wtxn, *parent, delta, now)?;
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
            Step::UnlinkName { parent, name, ino } => {
                if let Some(current) = self.dentry(wtxn, *parent, name)? {
                    if current.ino == *ino {
                        self.delete_dentry(wtxn, *parent, name)?;
                        let delta = if current.kind == FileKind::Dir { -1 } else { 0 };
                        self.touch_dir(wtxn, *parent, delta, now)?;
                    }
                }
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
            Step::UnlockName { parent, name } => {
                self.unlock_name(wtxn, *parent, name, op)?;
                StepResult::Done
            }
        };
        let record = StepRecord {
            at_ns: now,
            result: result.clone(),
        };
        self.ops
            .put(wtxn, &key, &encode_versioned(&record))
            .map_err(lmdb_err)?;
        Ok(result)
    }
}

/// Deletes every key that starts with the big-endian `id` (an inode's
/// xattrs, an operation's step records).
/// The key of the cluster map in shard 0's `meta` table.
const MAP_KEY: &[u8] = b"cluster_map";
const MOUNTS_KEY: &[u8] = b"mount_table";
/// Journal entries of fs_mode mounts: this prefix ++ sequence (big-endian).
const JOURNAL_PREFIX: &[u8] = b"ufsj/";
const JOURNAL_SEQ_KEY: &[u8] = b"ufsj_seq";
/// Records of node services (load jobs) kept in shard 0.
const RECORD_PREFIX: &[u8] = b"rec/";

/// Tables in export order; their number is the table byte of a [`ShardRecord`].
const TABLE_COUNT: u8 = 11;
const OPS_TABLE: u8 = 5;

impl ShardStore {
    fn table(&self, n: u8) -> Option<Table> {
        Some(match n {
            0 => self.meta,
            1 => self.inodes,
            2 => self.dentries,
            3 => self.xattrs,
            4 => self.intents,
            5 => self.ops,
            6 => self.locks,
            7 => self.blocks,
            8 => self.owners,
            9 => self.pending,
            10 => self.freed,
            _ => return None,
        })
    }

    /// Whether a record of table `n` belongs to this shard. Keys of the
    /// data tables begin with an id whose top byte is the shard; `meta`
    /// holds the shard's record (and the cluster map on shard 0). Step
    /// records are keyed by operation, not shard, and all go along: a record
    /// is only ever read by the shard that applied its step, so extra ones
    /// are inert.
    fn owns_record(&self, n: u8, key: &[u8]) -> bool {
        match n {
            0 => {
                key == self.meta_key.as_slice()
                    || (self.shard == 0
                        && (key == MAP_KEY
                            || key == MOUNTS_KEY
                            || key == JOURNAL_SEQ_KEY
                            || key.starts_with(JOURNAL_PREFIX)
                            || key.starts_with(RECORD_PREFIX)))
            }
            OPS_TABLE => true,
            _ => key.first() == Some(&(self.shard as u8)),
        }
    }

    /// The cluster map stored here (shard 0).
    pub fn cluster_map(&self, txn: &RoTxn) -> FsResult<Option<ClusterMap>> {
        match self.meta.get(txn, MAP_KEY).map_err(lmdb_err)? {
            Some(bytes) => Ok(Some(decode(bytes)?)),
            None => Ok(None),
        }
    }

    /// At node start, before any writer runs: the stored cluster map, or
    /// `first` written as the first one when there is none.
    pub fn init_cluster_map(&self, first: Option<&ClusterMap>) -> FsResult<Option<ClusterMap>> {
        let txn = self.read_txn()?;
        if let Some(map) = self.cluster_map(&txn)? {
            return Ok(Some(map));
        }
        drop(txn);
        let Some(first) = first else {
            return Ok(None);
        };
        let stored = self.write_now(|s, wtxn| s.set_cluster_map(wtxn, 0, first))?;
        Ok(Some(stored))
    }

    /// Stores `map` when the stored version is `expect`; returns what is stored after.
    pub fn set_cluster_map(
        &self,
        wtxn: &mut WriteTxn,
        expect: u64,
        map: &ClusterMap,
    ) -> FsResult<ClusterMap> {
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "the cluster map lives in shard 0, not shard {}",
                self.shard
            )));
        }
        if map.shards.len() != self.shard_count as usize {
            return Err(FsError::InvalidArgument(format!(
                "a cluster map names {} shards; the cluster has {}",
                map.shards.len(),
                self.shard_count
            )));
        }
        let current = self.cluster_map(wtxn)?;
        let version = current.as_ref().map(|m| m.version).unwrap_or(0);
        if version != expect || map.version <= version {
            return current.ok_or_else(|| {
                FsError::Busy(format!(
                    "the cluster map changed (version {version}, expected {expect})"
                ))
            });
        }
        self.meta
            .put(wtxn, MAP_KEY, &encode_versioned(map))
            .map_err(lmdb_err)?;
        Ok(map.clone())
    }

    /// The mount table stored here (shard 0); empty before the first mount.
    pub fn mounts(&self, txn: &RoTxn) -> FsResult<MountTable> {
        match self.meta.get(txn, MOUNTS_KEY).map_err(lmdb_err)? {
            Some(bytes) => decode(bytes),
            None => Ok(MountTable::default()),
        }
    }

    /// Stores `table` when the stored version is `expect`; returns what is
    /// stored after (the winner, for a caller that lost a race).
    pub fn set_mounts(
        &self,
        wtxn: &mut WriteTxn,
        expect: u64,
        table: &MountTable,
    ) -> FsResult<MountTable> {
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "the mount table lives in shard 0, not shard {}",
                self.shard
            )));
        }
        let current = self.mounts(wtxn)?;
        if current.version != expect || table.version <= current.version {
            return Err(FsError::Busy(format!(
                "the mount table changed (version {}, expected {expect}); try again",
                current.version
            )));
        }
        self.meta
            .put(wtxn, MOUNTS_KEY, &encode_versioned(table))
            .map_err(lmdb_err)?;
        Ok(table.clone())
    }

    /// Sets (or clears) what inode `ino` mirrors of its UFS object.
    pub fn set_ufs(&self, wtxn: &mut WriteTxn, ino: Ino, ufs: Option<UfsState>) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        attr.ufs = ufs;
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Brings the files named in `files` under directory `parent` in line
    /// with their UFS objects: a missing name becomes a file of the
    /// object's length (no blocks: its bytes are read from the UFS), a file
    /// whose object changed gets the new length and time and loses its
    /// cached blocks, an unchanged one is marked checked. Files open for
    /// writing, files not from the UFS (being written in cache_mode, not yet
    /// persisted in fs_mode) and names that are directories here are left
    /// alone. Returns each file as it is afterwards.
    pub fn ufs_sync(
        &self,
        wtxn: &mut WriteTxn,
        parent: Ino,
        mount: u32,
        files: &[UfsFile],
        owner: &NewInode,
        spec: &FileSpec,
    ) -> FsResult<Vec<(String, Attr)>> {
        self.dir(wtxn, parent)?;
        let now = owner.now_ns;
        let mut out = Vec::with_capacity(files.len());
        let mut added = false;
        for f in files {
            curvine_messages::path::check_name(&f.name)?;
            let state = UfsState::synced(mount, f.len, f.mtime_ns, f.etag.clone(), now);
            match self.dentry(wtxn, parent, &f.name)? {
                None => {
                    if self.lock_holder(wtxn, parent, &f.name)?.is_some() {
                        continue;
                    }
                    let ino = self.alloc_ino(wtxn)?;
                    let mut attr = Self::new_attr(ino, owner, parent);
                    attr.size = f.len;
                    attr.block_size = spec.block_size;
                    attr.replicas = spec.replicas;
                    attr.storage = spec.storage;
                    if f.mtime_ns > 0 {
                        attr.mtime_ns = f.mtime_ns;
                        attr.ctime_ns = f.mtime_ns;
                    }
                    attr.ufs = Some(state);
                    self.put_inode(wtxn, &attr)?;
                    self.put_dentry(wtxn, parent, &f.name, ino, FileKind::File)?;
                    added = true;
                    out.push((f.name.clone(), attr));
                }
                Some(d) if d.kind == FileKind::File && self.is_local(d.ino) => {
                    let attr = self.ufs_refresh(wtxn, d.ino, mount, f, now)?;
                    out.push((f.name.clone(), attr));
                }
                Some(_) => {}
            }
        }
        if added {
            self.touch_dir(wtxn, parent, 0, now)?;
        }
        Ok(out)
    }

    /// Compares UFS file `ino` with the UFS object `f` as it is now: a
    /// changed object gives the file its length and time and drops its
    /// cached blocks; either way the file is marked checked at `now`.
    /// Files open for writing and files whose content is not (yet) the
    /// UFS object's are left as they are.
    pub fn ufs_refresh(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        mount: u32,
        f: &UfsFile,
        now: i64,
    ) -> FsResult<Attr> {
        let mut attr = self.getattr(wtxn, ino)?;
        let mirrored = matches!(
            &attr.ufs,
            Some(u) if u.mount == mount && u.persist == Persist::Synced
        );
        if attr.kind != FileKind::File || attr.writing.is_some() || !mirrored {
            return Ok(attr);
        }
        let unchanged = attr
            .ufs
            .as_ref()
            .is_some_and(|u| u.matches(f.len, f.mtime_ns, &f.etag));
        if !unchanged {
            self.free_blocks_from(wtxn, ino, 0)?;
            attr.size = f.len;
            if f.mtime_ns > 0 {
                attr.mtime_ns = f.mtime_ns;
            }
            attr.ctime_ns = now;
        }
        attr.ufs = Some(UfsState::synced(
            mount,
            f.len,
            f.mtime_ns,
            f.etag.clone(),
            now,
        ));
        self.put_inode(wtxn, &attr)?;
        Ok(attr)
    }

    /// Allocates a block for the cached copy of block `index` of UFS file
    /// `ino`, when the file still mirrors the UFS object `expect` and has no
    /// such block yet (`None` otherwise: the caller reads the UFS without
    /// caching).
    pub fn ufs_add_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        index: u32,
        expect: &UfsFile,
    ) -> FsResult<Option<BlockId>> {
        let attr = self.getattr(wtxn, ino)?;
        if !ufs_current(&attr, expect) {
            return Ok(None);
        }
        if self
            .blocks
            .get(wtxn, &key_block(ino, index))
            .map_err(lmdb_err)?
            .is_some()
        {
            return Ok(None);
        }
        Ok(Some(self.alloc_pending_block(wtxn, ino, index)?))
    }

    /// Records a cached block of a UFS file filled by `ufs_add_block`'s
    /// grant. `false` (and the block freed) when the file no longer mirrors
    /// `expect` or another copy got there first.
    pub fn ufs_commit_block(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        info: &BlockInfo,
        expect: &UfsFile,
    ) -> FsResult<bool> {
        let pending_key = key_pending(ino, info.id);
        let was_pending = self
            .pending
            .get(wtxn, &pending_key)
            .map_err(lmdb_err)?
            .is_some();
        if !was_pending {
            return Err(FsError::InvalidArgument(format!(
                "block {:#x} was not allocated to file {ino:#x}",
                info.id
            )));
        }
        self.pending.delete(wtxn, &pending_key).map_err(lmdb_err)?;
        let key = key_block(ino, info.index);
        let attr = self.inode(wtxn, ino)?;
        let fits = attr.as_ref().is_some_and(|a| {
            let bs = a.block_size.max(1);
            ufs_current(a, expect)
                && info.len <= bs
                && (info.index as u64) * bs + info.len <= a.size
        });
        let taken = self.blocks.get(wtxn, &key).map_err(lmdb_err)?.is_some();
        if !fits || taken {
            self.free_block(wtxn, info.id, info.locs.clone())?;
            return Ok(false);
        }
        self.record_block(wtxn, ino, info)?;
        Ok(true)
    }

    /// Makes pending block `info` block `info.index` of file `ino`.
    fn record_block(&self, wtxn: &mut WriteTxn, ino: Ino, info: &BlockInfo) -> FsResult<()> {
        self.blocks
            .put(wtxn, &key_block(ino, info.index), &encode_versioned(info))
            .map_err(lmdb_err)?;
        let owner = BlockOwner {
            ino,
            index: info.index,
            pending: false,
        };
        self.owners
            .put(wtxn, &key_ino(info.id), &encode_versioned(&owner))
            .map_err(lmdb_err)?;
        self.pending
            .delete(wtxn, &key_pending(ino, info.id))
            .map(|_| ())
            .map_err(lmdb_err)
    }

    /// Stores the outcome of persisting `ino` while it still waits with
    /// content written at `since_ns`.
    pub fn ufs_persisted(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        since_ns: i64,
        state: &UfsState,
    ) -> FsResult<bool> {
        let Some(mut attr) = self.inode(wtxn, ino)? else {
            return Ok(false);
        };
        let waiting = attr
            .ufs
            .as_ref()
            .and_then(|u| u.persist.since_ns())
            .is_some_and(|s| s == since_ns);
        if !waiting || attr.writing.is_some() {
            return Ok(false);
        }
        attr.ufs = Some(state.clone());
        self.put_inode(wtxn, &attr)?;
        Ok(true)
    }

    fn journal_check(&self) -> FsResult<()> {
        if self.shard != 0 {
            return Err(FsError::InvalidArgument(format!(
                "the UFS journal lives in shard 0, not shard {}",
                self.shard
            )));
        }
        Ok(())
    }

    /// Appends `ops` to the journal; their replays join `trace`.
    pub fn journal_append(
        &self,
        wtxn: &mut WriteTxn,
        mount: u32,
        ops: &[UfsOp],
        trace: Option<curvine_messages::trace::TraceCtx>,
    ) -> FsResult<u64> {
        self.journal_check()?;
        let mut seq = match self.meta.get(wtxn, JOURNAL_SEQ_KEY).map_err(lmdb_err)? {
            Some(b) if b.len() == 8 => u64::from_be_bytes(b.try_into().expect("8 bytes")),
            _ => 0,
        };
        let now = now_ns();
        for op in ops {
            seq += 1;
            let entry = JournalEntry {
                seq,
                mount,
                op: op.clone(),
                at_ns: now,
                trace,
            };
            let mut key = JOURNAL_PREFIX.to_vec();
            key.extend_from_slice(&seq.to_be_bytes());
            self.meta
                .put(wtxn, &key, &encode_versioned(&entry))
                .map_err(lmdb_err)?;
        }
        self.meta
            .put(wtxn, JOURNAL_SEQ_KEY, &seq.to_be_bytes())
            .map_err(lmdb_err)?;
        Ok(seq)
    }

    pub fn record_put(&self, wtxn: &mut WriteTxn, entries: &[(Vec<u8>, Vec<u8>)]) -> FsResult<()> {
        self.journal_check()?;
        for (k, v) in entries {
            let mut key = RECORD_PREFIX.to_vec();
            key.extend_from_slice(k);
            if v.is_empty() {
                self.meta.delete(wtxn, &key).map_err(lmdb_err)?;
            } else {
                self.meta.put(wtxn, &key, v).map_err(lmdb_err)?;
            }
        }
        Ok(())
    }

    pub fn record_scan(
        &self,
        txn: &RoTxn,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: u32,
    ) -> FsResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.journal_check()?;
        let mut full = RECORD_PREFIX.to_vec();
        full.extend_from_slice(prefix);
        let mut out = Vec::new();
        let start: Vec<u8> = match after {
            Some(a) => [RECORD_PREFIX, a].concat(),
            None => full.clone(),
        };
        let range = if after.is_some() {
            (Bound::Excluded(&start[..]), Bound::Unbounded)
        } else {
            (Bound::Included(&start[..]), Bound::Unbounded)
        };
        for item in self.meta.range(txn, &range).map_err(lmdb_err)? {
            let (k, v) = item.map_err(lmdb_err)?;
            if !k.starts_with(&full) {
                break;
            }
            let k = &k[RECORD_PREFIX.len()..];
            out.push((k.to_vec(), v.to_vec()));
            if out.len() >= limit as usize {
                break;
            }
        }
        Ok(out)
    }

    pub fn journal_read(&self, txn: &RoTxn, limit: u32) -> FsResult<Vec<JournalEntry>> {
        self.journal_check()?;
        let mut out = Vec::new();
        for item in self
            .meta
            .prefix_iter(txn, JOURNAL_PREFIX)
            .map_err(lmdb_err)?
        {
            let (_, v) = item.map_err(lmdb_err)?;
            out.push(decode(v)?);
            if out.len() >= limit as usize {
                break;
            }
        }
        Ok(out)
    }

    pub fn journal_trim(&self, wtxn: &mut WriteTxn, upto: u64) -> FsResult<()> {
        self.journal_check()?;
        let keys: Vec<Vec<u8>> = self
            .meta
            .prefix_iter(wtxn, JOURNAL_PREFIX)
            .map_err(lmdb_err)?
            .map(|item| item.map(|(k, _)| k.to_vec()).map_err(lmdb_err))
            .collect::<FsResult<_>>()?;
        for k in keys {
            let seq = u64::from_be_bytes(k[JOURNAL_PREFIX.len()..].try_into().unwrap_or([0xff; 8]));
            if seq <= upto {
                self.meta.delete(wtxn, &k).map_err(lmdb_err)?;
            } else {
                break;
            }
        }
        Ok(())
    }

    /// Gives up block `id` allocated by `ufs_add_block` and never committed.
    pub fn ufs_abort_block(&self, wtxn: &mut WriteTxn, ino: Ino, id: BlockId) -> FsResult<()> {
        let key = key_pending(ino, id);
        if self.pending.get(wtxn, &key).map_err(lmdb_err)?.is_some() {
            self.pending.delete(wtxn, &key).map_err(lmdb_err)?;
            self.free_block(wtxn, id, Vec::new())?;
        }
        Ok(())
    }

    /// Drops the cached blocks of a UFS-backed file (its bytes stay in the
    /// UFS and are read from there again). Refused for a file whose content
    /// is not in the UFS.
    pub fn ufs_evict(&self, wtxn: &mut WriteTxn, ino: Ino) -> FsResult<u32> {
        let attr = self.getattr(wtxn, ino)?;
        match &attr.ufs {
            Some(u) if u.persist == Persist::Synced && attr.writing.is_none() => {}
            _ => {
                return Err(FsError::Busy(
                    "the file's content is not in the UFS yet".into(),
                ))
            }
        }
        let n = self.file_blocks(wtxn, ino)?.len() as u32;
        self.free_blocks_from(wtxn, ino, 0)?;
        Ok(n)
    }

    /// This shard's records from `from` on, up to about `max_bytes`.
    pub fn export(
        &self,
        txn: &RoTxn,
        from: Option<(u8, Vec<u8>)>,
        max_bytes: usize,
    ) -> FsResult<ExportChunk> {
        let (first_table, first_key) = from.unwrap_or((0, Vec::new()));
        let mut chunk = ExportChunk::default();
        let mut bytes = 0usize;
        for n in first_table..TABLE_COUNT {
            let db = self.table(n).expect("table number in range");
            let start: Vec<u8> = if n == first_table && !first_key.is_empty() {
                first_key.clone()
            } else if n == 0 || n == OPS_TABLE {
                Vec::new()
            } else {
                vec![self.shard as u8]
            };
            // LMDB refuses an empty key as a range start.
            let lower = if start.is_empty() {
                Bound::Unbounded
            } else {
                Bound::Included(start.as_slice())
            };
            for item in db
                .range(txn, &(lower, Bound::Unbounded))
                .map_err(lmdb_err)?
            {
                let (k, v) = item.map_err(lmdb_err)?;
                if n != 0 && n != OPS_TABLE && k.first() != Some(&(self.shard as u8)) {
                    break;
                }
                if !self.owns_record(n, k) {
                    continue;
                }
                if bytes > 0 && bytes + k.len() + v.len() > max_bytes {
                    chunk.next = Some((n, k.to_vec()));
                    return Ok(chunk);
                }
                bytes += k.len() + v.len() + 8;
                chunk.records.push(ShardRecord {
                    table: n,
                    key: k.to_vec(),
                    value: v.to_vec(),
                });
            }
        }
        Ok(chunk)
    }

    /// Writes exported records into this shard's tables.
    pub fn import(&self, wtxn: &mut WriteTxn, records: &[ShardRecord]) -> FsResult<()> {
        for r in records {
            let db = self.table(r.table).ok_or_else(|| {
                FsError::Protocol(format!("shard import names table {}", r.table))
            })?;
            if !self.owns_record(r.table, &r.key) {
                return Err(FsError::Protocol(format!(
                    "shard import for shard {} carries a record of another shard",
                    self.shard
                )));
            }
            db.put(wtxn, &r.key, &r.value).map_err(lmdb_err)?;
        }
        Ok(())
    }

    /// Deletes every record of this shard (step records stay: see `owns_record`).
    pub fn drop_all(&self, wtxn: &mut WriteTxn) -> FsResult<()> {
        self.meta.delete(wtxn, &self.meta_key).map_err(lmdb_err)?;
        if self.shard == 0 {
            self.meta.delete(wtxn, MAP_KEY).map_err(lmdb_err)?;
            self.meta.delete(wtxn, MOUNTS_KEY).map_err(lmdb_err)?;
            self.meta.delete(wtxn, JOURNAL_SEQ_KEY).map_err(lmdb_err)?;
            for prefix in [JOURNAL_PREFIX, RECORD_PREFIX] {
                let keys: Vec<Vec<u8>> = self
                    .meta
                    .prefix_iter(wtxn, prefix)
                    .map_err(lmdb_err)?
                    .map(|item| item.map(|(k, _)| k.to_vec()).map_err(lmdb_err))
                    .collect::<FsResult<_>>()?;
                for k in keys {
                    self.meta.delete(wtxn, &k).map_err(lmdb_err)?;
                }
            }
        }
        let start = [self.shard as u8];
        let end = (self.shard as u8).checked_add(1).map(|e| [e]);
        let range = (
            Bound::Included(&start[..]),
            match &end {
                Some(e) => Bound::Excluded(&e[..]),
                None => Bound::Unbounded,
            },
        );
        for n in 1..TABLE_COUNT {
            if n != OPS_TABLE {
                let db = self.table(n).expect("table number in range");
                db.delete_range(wtxn, &range).map_err(lmdb_err)?;
            }
        }
        Ok(())
    }
}

fn delete_id_prefix(db: Table, wtxn: &mut WriteTxn, id: u64) -> FsResult<()> {
    let start = key_ino(id);
    let end = key_ino(id + 1);
    let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
    db.delete_range(wtxn, &range).map_err(lmdb_err).map(|_| ())
}

/// POSIX rules for what a rename may replace.
pub fn check_rename_kinds(src: FileKind, dst: FileKind) -> FsResult<()> {
    match (src == FileKind::Dir, dst == FileKind::Dir) {
        (true, false) => Err(FsError::NotADirectory(String::new())),
        (false, true) => Err(FsError::IsADirectory(String::new())),
        _ => Ok(()),
    }
}

/// Whether a file still mirrors the UFS object `expect`.
fn ufs_current(attr: &Attr, expect: &UfsFile) -> bool {
    attr.kind == FileKind::File
        && attr.writing.is_none()
        && attr.size == expect.len
        && attr.ufs.as_ref().is_some_and(|u| {
            u.persist == Persist::Synced && u.matches(expect.len, expect.mtime_ns, &expect.etag)
        })
}
