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
//! | `answers`  | gen ++ at ++ shard ++ nonce | a call's answer (`requests`) |
//! | `answers`  | ff ff ff ff ++ shard | the shard's generation (u32)  |
//! | `delegations` | directory ino     | [`DelegationRecord`]          |
//!
//! Every value starts with a version byte (`curvine_messages::codec`).
//! Mutations check everything before they write, and run inside a nested
//! transaction of the group commit, so a failed mutation leaves nothing.
//! A directory's inode and its entries always live in the same shard.
//!
//! [`Attr`]: curvine_messages::Attr
//! [`Intent`]: curvine_messages::shard::Intent
//! [`NameLock`]: curvine_messages::shard::NameLock
//! [`BlockInfo`]: curvine_messages::block::BlockInfo
//! [`BlockOwner`]: curvine_messages::block::BlockOwner
//! [`FreedBlock`]: curvine_messages::block::FreedBlock
//! [`DelegationRecord`]: curvine_messages::delegation::DelegationRecord
//!
//! The code is split by record kind: `env` (opening and formatting a
//! shard in its [`Engine`](crate::engine::Engine)), `keys` (key encoding), `inodes`
//! (inodes and directory entries), `blocks` (a file's blocks and write
//! lease), `xattrs`, `intents` (cross-shard operations, name locks, step
//! records), `requests` (answers of mutations, for calls made again),
//! `cluster` (shard 0's cluster map and mount table), `journal`
//! (shard 0's UFS journal and service records), `ufs` (what inodes mirror
//! of the UFS) and `export` (moving a shard to another environment).

mod blocks;
mod cluster;
mod delegations;
mod env;
mod export;
mod inodes;
mod intents;
mod journal;
mod keys;
mod requests;
mod ufs;
mod xattrs;

pub use inodes::{check_rename_kinds, MAX_LINKS};
pub use intents::StepRecord;
pub use requests::{
    expire_answers, AnswerAge, ANSWER_AGE_EVERY, ANSWER_EXPIRY_EVERY, REQUEST_RECORD_TTL,
};

use std::ops::Bound;

use heed::types::Bytes;
use heed::{Env, RoTxn, WithoutTls};

pub use crate::txn::lmdb_err;
use crate::txn::{Table, WriteTxn};

use curvine_messages::codec::{decode_versioned, encode_versioned, Versioned};
use curvine_messages::shard::{DentryValue, ShardMeta, ShardScan};
use curvine_messages::{
    make_id, shard_of, DirEntry, FsError, FsResult, Ino, OpId, ShardId, ShardStats,
};

use keys::{ino_from, key_ino};

fn decode<T: Versioned>(bytes: &[u8]) -> FsResult<T> {
    decode_versioned(bytes).map_err(FsError::from)
}

/// Identity a shard is formatted with.
#[derive(Debug, Clone)]
pub struct ShardIdentity {
    pub cluster_id: String,
    pub shard: ShardId,
    pub shard_count: u32,
}

pub use crate::engine::StoreOptions;

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
    /// This node's member id in the shard's Raft group.
    pub replica_id: u64,
    engine: std::sync::Arc<crate::engine::Engine>,
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
    answers: Table,
    delegations: Table,
}

impl ShardStore {
    /// The environment's databases by table number (as logged changes
    /// name them).
    pub fn tables(&self) -> Vec<crate::txn::Db> {
        [
            self.meta,
            self.inodes,
            self.dentries,
            self.xattrs,
            self.intents,
            self.ops,
            self.locks,
            self.blocks,
            self.owners,
            self.pending,
            self.freed,
            self.answers,
            self.delegations,
        ]
        .iter()
        .map(|t| **t)
        .collect()
    }

    /// The store of another shard of the same environment (its tables
    /// and key range), as the groups of an environment use to snapshot
    /// and install any of its shards.
    pub fn sibling(&self, shard: ShardId) -> ShardStore {
        ShardStore {
            shard,
            frozen: std::sync::atomic::AtomicBool::new(false),
            meta_key: keys::meta_key(shard),
            shard_count: self.shard_count,
            cluster_id: self.cluster_id.clone(),
            replica_id: self.replica_id,
            engine: self.engine.clone(),
            meta: self.meta,
            inodes: self.inodes,
            dentries: self.dentries,
            xattrs: self.xattrs,
            intents: self.intents,
            ops: self.ops,
            locks: self.locks,
            blocks: self.blocks,
            owners: self.owners,
            pending: self.pending,
            freed: self.freed,
            answers: self.answers,
            delegations: self.delegations,
        }
    }

    pub fn env(&self) -> &Env<WithoutTls> {
        self.engine.env()
    }

    /// The engine of the store's environment.
    pub fn engine(&self) -> &std::sync::Arc<crate::engine::Engine> {
        &self.engine
    }

    /// Whether two stores share one environment.
    pub fn same_env(&self, other: &ShardStore) -> bool {
        std::sync::Arc::ptr_eq(&self.engine, &other.engine)
    }

    pub fn read_txn(&self) -> FsResult<RoTxn<'static, WithoutTls>> {
        self.env().clone().static_read_txn().map_err(lmdb_err)
    }

    fn is_local(&self, ino: Ino) -> bool {
        shard_of(ino) == self.shard
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
        meta.next_ino = meta.next_ino.max(wtxn.id_floor());
        let ino = make_id(self.shard, meta.next_ino);
        meta.next_ino += 1;
        self.meta
            .put(wtxn, &self.meta_key, &encode_versioned(&meta))
            .map_err(lmdb_err)?;
        Ok(ino)
    }

    fn alloc_op(&self, wtxn: &mut WriteTxn) -> FsResult<OpId> {
        let mut meta = self.meta(wtxn)?;
        meta.next_op = meta.next_op.max(wtxn.id_floor());
        let op = make_id(self.shard, meta.next_op);
        meta.next_op += 1;
        self.meta
            .put(wtxn, &self.meta_key, &encode_versioned(&meta))
            .map_err(lmdb_err)?;
        Ok(op)
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
            env: self.env().path().display().to_string(),
            env_bytes: self.env().real_disk_size().unwrap_or(0),
            group: None,
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
            let name = keys::name_of_key(key);
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
}
