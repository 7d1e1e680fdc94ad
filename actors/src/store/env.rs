//! Opening a shard in its environment's engine: its databases and their
//! format, and making what was committed durable.

use std::sync::Arc;

use heed::types::Bytes;
use heed::CommitOrAbort;

use crate::txn::{Table, WriteTxn, TABLE_NAMES};

use curvine_messages::codec::encode_versioned;
use curvine_messages::shard::ShardMeta;
use curvine_messages::{now_ns, Attr, FileKind, FsError, FsResult, ROOT_INO};

use super::keys::meta_key;
use super::{decode, lmdb_err, ShardIdentity, ShardStore};
use crate::engine::Engine;

impl ShardStore {
    /// Opens (and on first use formats) the shard's databases in the
    /// environment of `engine`, which may hold other shards' databases too.
    /// A shard formatted for another cluster or shard count is refused.
    pub fn open(engine: &Arc<Engine>, identity: &ShardIdentity) -> FsResult<ShardStore> {
        let env = engine.env();
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
            replica_id: engine.options().replica_id,
            engine: engine.clone(),
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
        self.engine.checkpoint()
    }

    /// Runs `f` in a write transaction of its own and makes it durable
    /// (for writes made while the node starts, before its writers run, and
    /// for tests); a failed `f` changes nothing.
    pub fn write_now<T>(
        &self,
        f: impl FnOnce(&ShardStore, &mut WriteTxn) -> FsResult<T>,
    ) -> FsResult<T> {
        let mut wtxn = WriteTxn::new(self.env().write_txn().map_err(lmdb_err)?);
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
        let mut wtxn = WriteTxn::new(self.env().write_txn().map_err(lmdb_err)?);
        match self.meta.get(&wtxn, &self.meta_key).map_err(lmdb_err)? {
            Some(bytes) => {
                let meta: ShardMeta = decode(bytes)?;
                if meta.cluster_id != identity.cluster_id
                    || meta.shard != identity.shard
                    || meta.shard_count != identity.shard_count
                {
                    return Err(FsError::Corrupt(format!(
                        "shard store at {} belongs to cluster {} shard {}/{}, not cluster {} shard {}/{}",
                        self.env().path().display(),
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
