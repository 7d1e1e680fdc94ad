//! Write transactions that record what they change.
//!
//! Every write to a shard's tables goes through a [`WriteTxn`], which applies
//! it to LMDB and keeps it as a [`Change`]; the writer thread appends the
//! changes of a group commit to the environment's write-ahead log before
//! LMDB commits them (`wal`). Tables are [`Table`]s: their reads are plain
//! heed reads, their writes take a `WriteTxn`, and there is no way to write
//! one with a bare `RwTxn`, so no change can bypass the log.

use std::ops::{Bound, Deref, RangeBounds};

use heed::types::Bytes;
use heed::{Database, RoTxn, RwTxn, WithoutTls};

pub use curvine_messages::wal::Change;
use curvine_messages::FsError;

/// A shard table's LMDB database.
pub type Db = Database<'static, Bytes, Bytes>;

/// The named databases of a metadata environment, by table number.
pub const TABLE_NAMES: [&str; 13] = [
    "meta",
    "inodes",
    "dentries",
    "xattrs",
    "intents",
    "ops",
    "locks",
    "blocks",
    "owners",
    "pending",
    "freed",
    "answers",
    "delegations",
];

/// Converts an LMDB error into the error a caller sees.
pub fn lmdb_err(e: heed::Error) -> FsError {
    match e {
        heed::Error::Mdb(heed::MdbError::MapFull) => {
            FsError::NoSpace("shard metadata store is full (raise meta.map_size)".into())
        }
        other => FsError::Io(format!("metadata store: {other}")),
    }
}

/// A table of a metadata environment: its database and its number.
#[derive(Clone, Copy)]
pub struct Table {
    db: Db,
    number: u8,
}

impl Table {
    pub fn new(db: Db, number: u8) -> Table {
        Table { db, number }
    }

    pub fn number(&self) -> u8 {
        self.number
    }

    pub fn put(&self, w: &mut WriteTxn, key: &[u8], value: &[u8]) -> heed::Result<()> {
        w.keep_undo(self, key)?;
        self.db.put(&mut w.txn, key, value)?;
        w.changes.push(Change::Put {
            table: self.number,
            key: key.to_vec(),
            value: value.to_vec(),
        });
        Ok(())
    }

    pub fn delete(&self, w: &mut WriteTxn, key: &[u8]) -> heed::Result<bool> {
        w.keep_undo(self, key)?;
        let found = self.db.delete(&mut w.txn, key)?;
        if found {
            w.changes.push(Change::Delete {
                table: self.number,
                key: key.to_vec(),
            });
        }
        Ok(found)
    }

    pub fn delete_range<R: RangeBounds<[u8]>>(
        &self,
        w: &mut WriteTxn,
        range: &R,
    ) -> heed::Result<usize> {
        if let Some(undo) = &mut w.undo {
            for item in self.db.range(&w.txn, range)? {
                let (key, value) = item?;
                undo.push(Undo {
                    table: self.number,
                    key: key.to_vec(),
                    old: Some(value.to_vec()),
                });
            }
        }
        let deleted = self.db.delete_range(&mut w.txn, range)?;
        if deleted > 0 {
            w.changes.push(Change::DeleteRange {
                table: self.number,
                start: owned(range.start_bound()),
                end: owned(range.end_bound()),
            });
        }
        Ok(deleted)
    }
}

/// Reads go straight to the database.
impl Deref for Table {
    type Target = Db;
    fn deref(&self) -> &Db {
        &self.db
    }
}

fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(k) => Bound::Included(k.to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// What a key held before a write: put back to take the write back.
#[derive(Debug, Clone)]
pub struct Undo {
    table: u8,
    key: Vec<u8>,
    old: Option<Vec<u8>>,
}

/// A write transaction (usually one mutation's nested transaction) and the
/// changes made in it. Reads see its writes, as with any LMDB transaction.
pub struct WriteTxn<'p> {
    txn: RwTxn<'p>,
    changes: Vec<Change>,
    /// What each write replaced, when the writes may have to be taken back
    /// (a leader's changes before their entry is committed).
    undo: Option<Vec<Undo>>,
    /// The lowest id a new inode, block or operation may take here (see
    /// [`WriteTxn::set_id_floor`]).
    id_floor: u64,
}

impl<'p> WriteTxn<'p> {
    pub fn new(txn: RwTxn<'p>) -> WriteTxn<'p> {
        WriteTxn {
            txn,
            changes: Vec::new(),
            undo: None,
            id_floor: 0,
        }
    }

    /// New ids (inodes, blocks, operations) are at least `floor` (the
    /// shard's counter jumps there first): a leader's floor grows with its
    /// term, so no id it hands out can be one that a deposed leader handed
    /// out in an entry that never committed (a file's creation is answered
    /// before its commit, and its writer may have stored block data under
    /// the id).
    pub fn set_id_floor(&mut self, floor: u64) {
        self.id_floor = floor;
    }

    pub fn id_floor(&self) -> u64 {
        self.id_floor
    }

    /// A transaction that also keeps what each write replaced.
    pub fn with_undo(txn: RwTxn<'p>) -> WriteTxn<'p> {
        WriteTxn {
            undo: Some(Vec::new()),
            ..WriteTxn::new(txn)
        }
    }

    fn keep_undo(&mut self, table: &Table, key: &[u8]) -> heed::Result<()> {
        if let Some(undo) = &mut self.undo {
            let old = table.db.get(&self.txn, key)?.map(<[u8]>::to_vec);
            undo.push(Undo {
                table: table.number,
                key: key.to_vec(),
                old,
            });
        }
        Ok(())
    }

    /// Commits the transaction; returns what it changed.
    pub fn commit(self) -> heed::Result<Vec<Change>> {
        self.txn.commit()?;
        Ok(self.changes)
    }

    /// Commits the transaction; returns what it changed and how to take
    /// it back (empty without [`Self::with_undo`]).
    pub fn commit_with_undo(self) -> heed::Result<(Vec<Change>, Vec<Undo>)> {
        self.txn.commit()?;
        Ok((self.changes, self.undo.unwrap_or_default()))
    }

    /// Drops the transaction and everything it changed.
    pub fn abort(self) {
        self.txn.abort();
    }
}

impl<'p> Deref for WriteTxn<'p> {
    type Target = RoTxn<'p, WithoutTls>;
    fn deref(&self) -> &RoTxn<'p, WithoutTls> {
        &self.txn
    }
}

/// Applies logged changes in `txn` (recovery), with the environment's
/// databases by table number.
pub fn apply(txn: &mut RwTxn, dbs: &[Db], changes: &[Change]) -> heed::Result<()> {
    let db = |table: u8| {
        dbs.get(table as usize)
            .copied()
            .ok_or(heed::Error::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the metadata log names table {table}, which does not exist"),
            )))
    };
    for change in changes {
        match change {
            Change::Put { table, key, value } => db(*table)?.put(txn, key, value)?,
            Change::Delete { table, key } => {
                db(*table)?.delete(txn, key)?;
            }
            Change::DeleteRange { table, start, end } => {
                let range = (as_ref(start), as_ref(end));
                db(*table)?.delete_range(txn, &range)?;
            }
        }
    }
    Ok(())
}

/// Takes back writes in `txn`: each key gets what it held before, last
/// write first.
pub fn undo(txn: &mut RwTxn, dbs: &[Db], undo: &[Undo]) -> heed::Result<()> {
    for u in undo.iter().rev() {
        let Some(db) = dbs.get(u.table as usize) else {
            continue;
        };
        match &u.old {
            Some(value) => db.put(txn, &u.key, value)?,
            None => {
                db.delete(txn, &u.key)?;
            }
        }
    }
    Ok(())
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k),
        Bound::Excluded(k) => Bound::Excluded(k),
        Bound::Unbounded => Bound::Unbounded,
    }
}
