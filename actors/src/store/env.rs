//! Opening a shard: the process-wide registry of LMDB environments (one
//! per path), a shard's databases and their format, and making what was
//! committed durable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use heed::types::Bytes;
use heed::{CommitOrAbort, Env, EnvOpenOptions, WithoutTls};

use crate::txn::{Table, WriteTxn, TABLE_NAMES};

use curvine_messages::codec::encode_versioned;
use curvine_messages::shard::ShardMeta;
use curvine_messages::{now_ns, Attr, FileKind, FsError, FsResult, ROOT_INO};

use super::keys::meta_key;
use super::{decode, lmdb_err, ShardIdentity, ShardStore, StoreOptions};

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
                    create(11)?,
                    create(12)?,
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
            replica_id: options.replica_id,
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
            answers: Table::new(dbs[11], 11),
            delegations: Table::new(dbs[12], 12),
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
}
