//! Key encoding of the shard tables: big-endian ids, which carry their
//! shard in the top byte, so that LMDB's order is numeric order and each
//! shard's keys are one range.

use std::ops::Bound;

use crate::txn::{Table, WriteTxn};

use curvine_messages::block::BlockId;
use curvine_messages::{names, FsError, FsResult, Ino, OpId, ShardId};

use super::lmdb_err;

pub(super) fn key_ino(ino: Ino) -> [u8; 8] {
    ino.to_be_bytes()
}

/// `parent` ++ the name's bytes (see `curvine_messages::names`: a byte
/// that is not UTF-8 is one byte here, not its four-byte string form, so
/// a 255-byte name fits LMDB's 511-byte keys).
pub(super) fn key_name(parent: Ino, name: &str) -> Vec<u8> {
    let bytes = names::to_bytes(name);
    let mut k = Vec::with_capacity(8 + bytes.len());
    k.extend_from_slice(&parent.to_be_bytes());
    k.extend_from_slice(&bytes);
    k
}

/// The name in a key made by [`key_name`].
pub(super) fn name_of_key(key: &[u8]) -> String {
    names::from_bytes(key.get(8..).unwrap_or_default()).into_owned()
}

pub(super) fn key_block(ino: Ino, index: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&index.to_be_bytes());
    k
}

pub(super) fn key_pending(ino: Ino, id: BlockId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&ino.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(super) fn key_step(op: OpId, step_no: u8) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..8].copy_from_slice(&op.to_be_bytes());
    k[8] = step_no;
    k
}

pub(super) fn ino_from(bytes: &[u8]) -> FsResult<Ino> {
    bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| FsError::Corrupt("short key in metadata store".into()))
}

/// The key of a shard's [`ShardMeta`] record.
pub(super) fn meta_key(shard: ShardId) -> Vec<u8> {
    format!("shard{shard:03}").into_bytes()
}

/// Deletes every key that starts with the big-endian `id` (an inode's
/// xattrs, an operation's step records).
pub(super) fn delete_id_prefix(db: Table, wtxn: &mut WriteTxn, id: u64) -> FsResult<()> {
    let start = key_ino(id);
    let end = key_ino(id + 1);
    let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
    db.delete_range(wtxn, &range).map_err(lmdb_err).map(|_| ())
}
