//! Raft messages as they cross nodes: what one pass of a writer has for a
//! node is one batch of `(group, encoded Raft message)` pairs (the Raft
//! library's protobuf bytes, opaque here), encoded with postcard and sent
//! as [`RaftPart`]s of at most [`PART_BYTES`] (one cluster frame is at most
//! 16 MiB; a snapshot may be larger), put together again by the
//! receiver's [`Reassembly`]. Decoding never panics: what does not decode
//! is refused with the reason.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::error::{FsError, FsResult};
use crate::wal::GroupId;

/// Raft messages between the shard groups of two nodes: part `part` of
/// `parts` of one encoded batch (what one pass of a writer has for the
/// receiving node), sent in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftPart {
    /// The sending node.
    pub from: String,
    /// The batch's number at its sender.
    pub seq: u64,
    pub part: u32,
    pub parts: u32,
    pub bytes: Vec<u8>,
}

/// One batch: each message with its group.
pub type RaftBatch = Vec<(GroupId, Vec<u8>)>;

/// The most bytes of a batch one part carries.
pub const PART_BYTES: usize = 4 << 20;

/// The largest batch a receiver puts together (a snapshot of a shard
/// larger than this cannot be sent).
pub const MAX_BATCH: usize = 1 << 30;

/// The parts of `batch` from node `from`.
pub fn encode(from: &str, seq: u64, batch: &RaftBatch) -> FsResult<Vec<RaftPart>> {
    let bytes = postcard::to_allocvec(batch)
        .map_err(|e| FsError::Io(format!("encoding a batch of Raft messages: {e}")))?;
    if bytes.len() > MAX_BATCH {
        return Err(FsError::InvalidArgument(format!(
            "a batch of Raft messages of {} bytes is larger than the {MAX_BATCH} a node takes",
            bytes.len()
        )));
    }
    let parts = bytes.len().div_ceil(PART_BYTES).max(1);
    Ok((0..parts)
        .map(|i| RaftPart {
            from: from.to_string(),
            seq,
            part: i as u32,
            parts: parts as u32,
            bytes: bytes
                [(i * PART_BYTES).min(bytes.len())..((i + 1) * PART_BYTES).min(bytes.len())]
                .to_vec(),
        })
        .collect())
}

/// A whole batch's messages.
pub fn decode(bytes: &[u8]) -> FsResult<RaftBatch> {
    crate::codec::from_bytes("a batch of Raft messages", bytes)
        .map_err(|e| FsError::Protocol(e.to_string()))
}

/// A batch being put together.
struct Partial {
    seq: u64,
    next: u32,
    parts: u32,
    bytes: Vec<u8>,
}

/// Puts the parts of each sender's batches together. Parts come in order
/// (one connection per pair of nodes); a part that does not follow the
/// one before drops the unfinished batch (Raft sends what was lost again).
#[derive(Default)]
pub struct Reassembly {
    partial: HashMap<String, Partial>,
}

impl Reassembly {
    /// Takes a part; returns the batch's messages when it was the last.
    pub fn take(&mut self, part: RaftPart) -> FsResult<Option<RaftBatch>> {
        if part.parts == 0 || part.part >= part.parts {
            return Err(FsError::Protocol(format!(
                "Raft messages from {}: part {} of {}",
                part.from, part.part, part.parts
            )));
        }
        if part.parts == 1 {
            self.partial.remove(&part.from);
            return decode(&part.bytes).map(Some);
        }
        let follows = self
            .partial
            .get(&part.from)
            .is_some_and(|p| p.seq == part.seq && p.next == part.part && p.parts == part.parts);
        if !follows {
            self.partial.remove(&part.from);
            if part.part != 0 {
                return Err(FsError::Protocol(format!(
                    "Raft messages from {}: part {} of batch {} without the parts before it",
                    part.from, part.part, part.seq
                )));
            }
        }
        let partial = self
            .partial
            .entry(part.from.clone())
            .or_insert_with(|| Partial {
                seq: part.seq,
                next: 0,
                parts: part.parts,
                bytes: Vec::new(),
            });
        if partial.bytes.len() + part.bytes.len() > MAX_BATCH {
            self.partial.remove(&part.from);
            return Err(FsError::Protocol(format!(
                "Raft messages from {}: a batch larger than {MAX_BATCH} bytes",
                part.from
            )));
        }
        partial.bytes.extend_from_slice(&part.bytes);
        partial.next += 1;
        if partial.next < partial.parts {
            return Ok(None);
        }
        let done = self.partial.remove(&part.from).expect("present above");
        decode(&done.bytes).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sizes: &[usize]) -> RaftBatch {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as GroupId, vec![i as u8; n]))
            .collect()
    }

    #[test]
    fn a_batch_larger_than_a_part_is_put_together_again() {
        let sent = batch(&[10, 9 << 20, 0]);
        let parts = encode("node-a", 1, &sent).unwrap();
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.bytes.len() <= PART_BYTES));
        let mut r = Reassembly::default();
        let mut got = None;
        for p in parts {
            assert!(got.is_none());
            got = r.take(p).unwrap();
        }
        assert_eq!(got.expect("the last part completes the batch"), sent);
        // An empty batch is one part.
        let empty = encode("node-a", 2, &Vec::new()).unwrap();
        assert_eq!(empty.len(), 1);
        assert_eq!(r.take(empty[0].clone()).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn a_lost_part_drops_its_batch_and_the_next_batch_goes_through() {
        let big = encode("node-a", 1, &batch(&[6 << 20])).unwrap();
        let small = encode("node-a", 2, &batch(&[1])).unwrap();
        let mut r = Reassembly::default();
        assert!(r.take(big[0].clone()).unwrap().is_none());
        // The second part of batch 1 never came; batch 2 does.
        assert_eq!(r.take(small[0].clone()).unwrap().unwrap().len(), 1);
        // A stray later part of batch 1 is refused.
        assert!(matches!(r.take(big[1].clone()), Err(FsError::Protocol(_))));
    }

    #[test]
    fn garbage_is_refused_with_a_reason() {
        for bytes in [&b"\xff\xff\xff\xff"[..], b"\x05\x03\x05abc"] {
            let part = RaftPart {
                from: "x".into(),
                seq: 0,
                part: 0,
                parts: 1,
                bytes: bytes.to_vec(),
            };
            match Reassembly::default().take(part) {
                Err(FsError::Protocol(why)) => assert!(why.contains("Raft"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
        let bad = RaftPart {
            from: "x".into(),
            seq: 0,
            part: 2,
            parts: 2,
            bytes: vec![],
        };
        assert!(Reassembly::default().take(bad).is_err());
    }
}
