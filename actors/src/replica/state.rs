//! What a group keeps outside raft-rs: its [`GroupState`] in LMDB, the part
//! of its log recovery could not apply, member ids and raft-rs's logger.

use heed::{RoTxn, RwTxn, WithoutTls};

use curvine_messages::codec::{decode_versioned, encode_versioned};
use curvine_messages::wal::{Change, GroupId, GroupState, GroupWrite, HardState, LogEntry};
use curvine_messages::{FsError, FsResult};

use crate::txn::{lmdb_err, Db};

/// The key of a group's [`GroupState`] in the `meta` table. It is the
/// node's own record: a shard's export leaves it out.
pub fn group_state_key(group: GroupId) -> Vec<u8> {
    format!("raft{group:03}").into_bytes()
}

const STATE_PREFIX: &[u8] = b"raft";

/// A group's state as stored in `meta`, if it has one.
pub fn read_group_state(
    meta: Db,
    txn: &RoTxn<WithoutTls>,
    group: GroupId,
) -> FsResult<Option<GroupState>> {
    match meta.get(txn, &group_state_key(group)).map_err(lmdb_err)? {
        Some(bytes) => decode_versioned(bytes).map(Some).map_err(FsError::from),
        None => Ok(None),
    }
}

/// Every group that has a state in `meta`.
pub fn stored_groups(meta: Db, txn: &RoTxn<WithoutTls>) -> FsResult<Vec<(GroupId, GroupState)>> {
    let mut out = Vec::new();
    for item in meta.prefix_iter(txn, STATE_PREFIX).map_err(lmdb_err)? {
        let (key, value) = item.map_err(lmdb_err)?;
        let Some(group) = std::str::from_utf8(&key[STATE_PREFIX.len()..])
            .ok()
            .and_then(|n| n.parse::<GroupId>().ok())
        else {
            continue;
        };
        out.push((group, decode_versioned(value).map_err(FsError::from)?));
    }
    Ok(out)
}

/// Writes a group's state in `meta` (not a replicated change: each member
/// keeps its own).
pub fn write_group_state(
    meta: Db,
    txn: &mut RwTxn,
    group: GroupId,
    state: &GroupState,
) -> FsResult<()> {
    meta.put(txn, &group_state_key(group), &encode_versioned(state))
        .map_err(lmdb_err)
}

/// Whether a group with these members commits what it persists.
pub fn alone(state: &GroupState) -> bool {
    state.voters.len() <= 1 && state.learners.is_empty()
}

/// A group's log as recovery found it past what LMDB applied: the entries
/// raft-rs must get back, and the last hard state.
#[derive(Debug, Default, Clone)]
pub struct Tail {
    pub entries: Vec<LogEntry>,
    pub hard_state: Option<HardState>,
}

/// The key of a group's recovered [`Tail`] in the `meta` table (the
/// node's own record, like its state: a shard's export leaves it out).
///
/// Recovery writes each group's tail there, in the transaction that
/// applies the log, so the checkpoint that opening the log takes makes it
/// durable: the log starts over after that checkpoint, and a second crash
/// before the writer's own next checkpoint (which carries what the groups
/// have not applied, [`super::Groups::carry`]) must not lose the entries.
/// The writer reads it when it loads the group and deletes it in its next
/// pass; until a checkpoint flushes that pass, a crash brings it back with
/// the log records written since, which extend it.
fn tail_key(group: GroupId) -> Vec<u8> {
    format!("tail{group:03}").into_bytes()
}

/// A group's recovered tail, if recovery left one.
pub fn read_tail(meta: Db, txn: &RoTxn<WithoutTls>, group: GroupId) -> FsResult<Option<Tail>> {
    let Some(bytes) = meta.get(txn, &tail_key(group)).map_err(lmdb_err)? else {
        return Ok(None);
    };
    let write: GroupWrite = postcard::from_bytes(bytes).map_err(|e| {
        FsError::Corrupt(format!(
            "shard {group}'s recovered log tail does not decode ({e}); it was written by another release"
        ))
    })?;
    Ok(Some(Tail {
        entries: write.entries,
        hard_state: write.hard_state,
    }))
}

/// Writes a group's recovered tail (deletes it when there is none).
pub fn write_tail(meta: Db, txn: &mut RwTxn, group: GroupId, tail: &Tail) -> FsResult<()> {
    if tail.entries.is_empty() && tail.hard_state.is_none() {
        return delete_tail(meta, txn, group);
    }
    let write = GroupWrite {
        group,
        entries: tail.entries.clone(),
        hard_state: tail.hard_state,
    };
    let bytes = postcard::to_allocvec(&write)
        .map_err(|e| FsError::Io(format!("encoding shard {group}'s log tail: {e}")))?;
    meta.put(txn, &tail_key(group), &bytes).map_err(lmdb_err)
}

/// Deletes a group's recovered tail (the writer holds its entries now).
pub fn delete_tail(meta: Db, txn: &mut RwTxn, group: GroupId) -> FsResult<()> {
    meta.delete(txn, &tail_key(group)).map_err(lmdb_err)?;
    Ok(())
}

/// Adds `entries` to a log tail: an entry at an index the tail has
/// replaces it and everything after it (a new leader overwrote them).
pub fn extend_tail(tail: &mut Vec<LogEntry>, entries: &[LogEntry]) {
    if let Some(first) = entries.first() {
        tail.retain(|e| e.index < first.index);
        tail.extend_from_slice(entries);
    }
}

/// Replays one group's part of a log record at recovery. A group of one
/// member commits what it persists: its entries are applied up to its first
/// membership change (from there raft-rs decides). Other groups keep their
/// entries in `tail`, for raft-rs to apply once it knows them committed.
pub fn replay(
    dbs: &[Db],
    txn: &mut RwTxn,
    write: &GroupWrite,
    state: &mut GroupState,
    tail: &mut Tail,
) -> FsResult<usize> {
    let mut changes = 0;
    for e in &write.entries {
        if e.index <= state.applied_index {
            continue;
        }
        if !alone(state) || e.conf_change || !tail.entries.is_empty() {
            extend_tail(&mut tail.entries, std::slice::from_ref(e));
            continue;
        }
        if !e.data.is_empty() {
            let decoded = decode_changes(write.group, e.index, e.term, &e.data)?;
            crate::txn::apply(txn, dbs, &decoded).map_err(lmdb_err)?;
            changes += decoded.len();
        }
        state.applied_index = e.index;
        state.applied_term = e.term;
    }
    if let Some(hs) = write.hard_state {
        state.hard_state = hs;
        tail.hard_state = Some(hs);
    }
    state.hard_state.commit = state.hard_state.commit.max(state.applied_index);
    Ok(changes)
}

/// The changes a normal entry carries.
pub fn decode_changes(group: GroupId, index: u64, term: u64, data: &[u8]) -> FsResult<Vec<Change>> {
    postcard::from_bytes(data).map_err(|err| {
        FsError::Corrupt(format!(
            "entry {index} (term {term}) of shard {group}'s log does not decode ({err}); it was written by another release"
        ))
    })
}

pub use curvine_messages::wal::member_id;

/// raft-rs logs through slog; its lines go to `tracing` (elections and
/// membership at debug, problems at warn and error).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;
    fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{}", record.msg())
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::debug!(target: "raft", "{}", record.msg()),
            _ => tracing::trace!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}

pub fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!())
}
