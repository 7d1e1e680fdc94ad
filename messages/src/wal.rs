//! What the metadata write-ahead log stores: the writes of a group commit,
//! one [`Change`] each (a record's payload is a postcard `Vec<Change>`).

use std::ops::Bound;

use serde::{Deserialize, Serialize};

/// One write to a table of a metadata environment (tables by number).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Put {
        table: u8,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        table: u8,
        key: Vec<u8>,
    },
    DeleteRange {
        table: u8,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
    },
}

/// A shard's Raft group: its number is the shard's.
pub type GroupId = u16;

/// One entry of a group's Raft log as the metadata log stores it: a normal
/// entry's `data` is a postcard `Vec<Change>` (empty for the entry a new
/// leader appends); a membership change's `data` is the encoded change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub index: u64,
    pub term: u64,
    pub conf_change: bool,
    pub data: Vec<u8>,
}

/// The part of a group's Raft state that must be durable before the group
/// sends a vote or an acknowledgement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardState {
    pub term: u64,
    pub vote: u64,
    pub commit: u64,
}

/// What one group wrote in one record of the metadata log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupWrite {
    pub group: GroupId,
    /// New entries; an entry at an index the log already has replaces it
    /// and every entry after it.
    pub entries: Vec<LogEntry>,
    pub hard_state: Option<HardState>,
}

/// One record of the metadata log (format 2): what every group of the
/// environment wrote in one group commit, made durable by one sync.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    pub groups: Vec<GroupWrite>,
}

/// A group's state kept in LMDB with what it describes (written in the
/// transaction that applies its entries): the last applied entry, the
/// members, and the hard state at that commit. With the log's records
/// after the last checkpoint it restores the group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupState {
    pub applied_index: u64,
    pub applied_term: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub hard_state: HardState,
}

impl crate::codec::Versioned for GroupState {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "shard group state";
}

/// A node's member id in every Raft group it is part of: a hash of its
/// node id (never 0, which Raft reserves).
pub fn member_id(node_id: &str) -> u64 {
    // FNV-1a: stable across releases and platforms.
    let h = node_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

/// What a Raft snapshot of a shard carries: every record of the shard's
/// key range at the snapshot's index (its metadata says which index, term
/// and members).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotData {
    pub shard: GroupId,
    pub records: Vec<crate::shard::ShardRecord>,
}

impl crate::codec::Versioned for SnapshotData {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "shard snapshot";
}
