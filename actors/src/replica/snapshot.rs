//! A group's log in memory and its snapshots.
//!
//! The log's durable copy is the environment's metadata log; raft-rs reads
//! the entries a member needs from [`GroupStore`] (its `MemStorage`). A
//! member that lacks entries the leader no longer has (a new member, or one
//! left behind while the leader restarted) gets a snapshot instead: every
//! record of the shard's key range at an index the leader has applied,
//! taken from LMDB by a thread of its own while the writer goes on
//! (`make`). The member that receives one replaces its copy of the
//! shard's records in the pass's transaction (`install`), and says it has
//! it only once a checkpoint made it durable (see `Groups::collect`).

use std::sync::{Arc, Mutex};

use raft::eraftpb::{ConfState, Entry, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use heed::{RoTxn, RwTxn, WithoutTls};

use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::shard::ShardRecord;
use curvine_messages::wal::{GroupId, SnapshotData};
use curvine_messages::{FsError, FsResult};

/// How the groups read and replace the records of a shard of their
/// environment (the shard store, given by the writer).
pub trait ShardCopy: Send + Sync + 'static {
    /// A read transaction of the environment.
    fn read_txn(&self) -> FsResult<RoTxn<'static, WithoutTls>>;
    /// Every record of `shard` as of `txn`.
    fn export(&self, shard: GroupId, txn: &RoTxn<WithoutTls>) -> FsResult<Vec<ShardRecord>>;
    /// Replaces every record of `shard` with `records`, in `txn`.
    fn replace(&self, shard: GroupId, txn: &mut RwTxn, records: &[ShardRecord]) -> FsResult<()>;
}

/// The snapshot a leader offers its group's members.
#[derive(Default)]
pub struct SnapCell {
    /// A member needs one that is not made yet.
    wanted: bool,
    /// A thread is making one.
    making: bool,
    ready: Option<Snapshot>,
}

/// A group's Raft storage: its log in memory, and the snapshot made for
/// members that need one.
pub struct GroupStore {
    pub mem: MemStorage,
    snap: Arc<Mutex<SnapCell>>,
    /// Entries up to here count as compacted: a member that lacks them
    /// gets a snapshot. (The memory log keeps them; emptying it would make
    /// it start again at index 1, as a new group's does.)
    floor: std::sync::atomic::AtomicU64,
}

impl GroupStore {
    pub fn new(mem: MemStorage) -> GroupStore {
        GroupStore {
            mem,
            snap: Default::default(),
            floor: Default::default(),
        }
    }

    /// From now on, a member that lacks entry `index` or an earlier one
    /// takes a snapshot instead of the log: a new member never starts from
    /// a log without the state that came before it.
    pub fn compact_to(&self, index: u64) {
        self.floor
            .fetch_max(index, std::sync::atomic::Ordering::Relaxed);
    }

    fn floor(&self) -> u64 {
        self.floor.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn cell(&self) -> std::sync::MutexGuard<'_, SnapCell> {
        self.snap.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a member waits for a snapshot that no thread is making.
    pub fn snapshot_wanted(&self) -> bool {
        let cell = self.cell();
        cell.wanted && !cell.making
    }

    /// Drops the snapshot made earlier once no member needs it.
    pub fn drop_snapshot_below(&self, matched: u64) {
        let mut cell = self.cell();
        if cell
            .ready
            .as_ref()
            .is_some_and(|s| s.get_metadata().index <= matched)
        {
            cell.ready = None;
        }
    }

    /// Makes a snapshot of `store`'s shard as LMDB holds it now, which is
    /// the state at `index` (of `term`, with members `conf`): read in a
    /// transaction opened here, exported by a thread of its own (`inline`:
    /// by this one, before it returns, as a simulated run needs).
    pub fn make(
        &self,
        copy: &std::sync::Arc<dyn ShardCopy>,
        (shard, index, term): (GroupId, u64, u64),
        conf: ConfState,
        inline: bool,
    ) -> FsResult<()> {
        let txn = copy.read_txn()?;
        self.cell().making = true;
        let snap = self.snap.clone();
        let copy = copy.clone();
        let export = move || {
            let exported = copy.export(shard, &txn);
            drop(txn);
            let mut cell = snap.lock().unwrap_or_else(|p| p.into_inner());
            cell.making = false;
            match exported {
                Ok(records) => {
                    let data = SnapshotData { shard, records };
                    let mut snapshot = Snapshot {
                        data: encode_versioned(&data).into(),
                        ..Default::default()
                    };
                    let meta = snapshot.mut_metadata();
                    meta.index = index;
                    meta.term = term;
                    meta.set_conf_state(conf);
                    tracing::info!(
                        shard,
                        index,
                        records = data.records.len(),
                        bytes = snapshot.data.len(),
                        "made a snapshot of the shard for a member that needs one"
                    );
                    cell.ready = Some(snapshot);
                    cell.wanted = false;
                }
                Err(e) => {
                    tracing::error!(shard, error = %e, "cannot make a snapshot of the shard")
                }
            }
        };
        if inline {
            export();
            return Ok(());
        }
        let made = std::thread::Builder::new()
            .name(format!("snapshot-{shard}"))
            .spawn(export);
        if let Err(e) = made {
            self.cell().making = false;
            return Err(FsError::Io(format!("starting a snapshot thread: {e}")));
        }
        Ok(())
    }
}

impl Storage for GroupStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.floor() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx < self.floor() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.mem.first_index()?.max(self.floor() + 1))
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The snapshot made for members, if it is recent enough that the log
    /// goes on from it; otherwise one is asked for, and raft-rs tries
    /// again later.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let first = self.first_index()?;
        let mut cell = self.cell();
        if let Some(s) = &cell.ready {
            let index = s.get_metadata().index;
            if index >= request_index && index + 1 >= first {
                return Ok(s.clone());
            }
            cell.ready = None;
        }
        cell.wanted = true;
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

/// Replaces `shard`'s records with those of `snapshot`, in `txn`.
pub fn install(
    copy: &dyn ShardCopy,
    shard: GroupId,
    txn: &mut RwTxn,
    snapshot: &Snapshot,
) -> FsResult<()> {
    let data: SnapshotData = decode_versioned(&snapshot.data)
        .map_err(|e| FsError::Corrupt(format!("shard {shard}: a snapshot: {e}")))?;
    if data.shard != shard {
        return Err(FsError::Corrupt(format!(
            "shard {shard}: a snapshot of shard {}",
            data.shard
        )));
    }
    copy.replace(shard, txn, &data.records)?;
    tracing::info!(
        shard,
        index = snapshot.get_metadata().index,
        records = data.records.len(),
        "installed a snapshot of the shard"
    );
    Ok(())
}

/// How long a leader waits, with a member asking for a snapshot it cannot
/// make and its commit standing still, before it steps down (see
/// [`super::Groups::make_snapshots`]): an election timeout.
pub const SNAPSHOT_STUCK: std::time::Duration = std::time::Duration::from_secs(1);

impl super::Groups {
    /// Starts making the snapshots members asked for, of groups whose
    /// LMDB state is exactly what they applied (no uncommitted change of
    /// this leader in it). Called after a commit.
    ///
    /// A leader whose LMDB holds changes of its own that are not committed
    /// makes none; if its commit stays where it is meanwhile, those changes
    /// wait for the very member that waits for the snapshot (the other
    /// members down or cut off), and neither would ever move. After
    /// [`SNAPSHOT_STUCK`] of that it steps down: taking back what it did
    /// not commit, as any deposed leader does, leaves LMDB at the commit,
    /// and in its next term it snapshots that (its earlier entries then
    /// commit and are applied from its log).
    pub fn make_snapshots(&mut self) {
        let now = self.clock.now();
        for (&shard, group) in self.groups.iter_mut() {
            if !group.raw.store().snapshot_wanted() || !group.is_leader() {
                group.snapshot_stuck = None;
                continue;
            }
            let Some((index, term)) = group.snapshot_point() else {
                let committed = group.raw.raft.raft_log.committed;
                match group.snapshot_stuck {
                    Some((since, at)) if at == committed => {
                        if now.saturating_duration_since(since) >= SNAPSHOT_STUCK {
                            group.snapshot_stuck = None;
                            tracing::warn!(
                                shard,
                                committed,
                                "a member needs a snapshot this leader cannot make while its uncommitted changes wait for that member; stepping down to take them back"
                            );
                            let term = group.raw.raft.term;
                            group.raw.raft.become_follower(term, raft::INVALID_ID);
                        }
                    }
                    _ => group.snapshot_stuck = Some((now, committed)),
                }
                continue;
            };
            group.snapshot_stuck = None;
            let conf = group.raw.raft.prs().conf().to_conf_state();
            let inline = self.clock.is_manual();
            if let Err(e) = group
                .raw
                .store()
                .make(&self.copy, (shard, index, term), conf, inline)
            {
                tracing::error!(shard, error = %e, "cannot make a snapshot of the shard");
            }
        }
    }
}
