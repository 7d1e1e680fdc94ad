//! Raft messages of this node's groups as bytes for another node (the
//! batch framing, its parts and their reassembly are
//! `curvine_messages::raft`; this adds the Raft library's own encoding of
//! each message, whose decoding refuses what does not parse).

use protobuf::Message as _;
use raft::eraftpb::Message;

use curvine_messages::raft::{self as frame, RaftBatch, RaftPart};
use curvine_messages::{FsError, FsResult};

use super::GroupMessage;

/// The parts of one batch of `messages` from node `from`.
pub fn encode(from: &str, seq: u64, messages: &[GroupMessage]) -> FsResult<Vec<RaftPart>> {
    let mut batch: RaftBatch = Vec::with_capacity(messages.len());
    for m in messages {
        let bytes = m
            .message
            .write_to_bytes()
            .map_err(|e| FsError::Io(format!("encoding a Raft message: {e}")))?;
        batch.push((m.group, bytes));
    }
    frame::encode(from, seq, &batch)
}

/// The messages of a whole batch.
pub fn decode(batch: RaftBatch) -> FsResult<Vec<GroupMessage>> {
    batch
        .into_iter()
        .map(|(group, bytes)| {
            let message = Message::parse_from_bytes(&bytes)
                .map_err(|e| FsError::Protocol(format!("a Raft message for group {group}: {e}")))?;
            Ok(GroupMessage { group, message })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use curvine_messages::raft::Reassembly;
    use raft::eraftpb::{MessageType, Snapshot};

    #[test]
    fn messages_with_a_large_snapshot_cross_in_parts_unchanged() {
        let mut message = Message::default();
        message.set_msg_type(MessageType::MsgSnapshot);
        message.to = 5;
        message.term = 7;
        let mut snapshot = Snapshot {
            data: vec![3u8; 9 << 20].into(),
            ..Default::default()
        };
        snapshot.mut_metadata().index = 99;
        message.set_snapshot(snapshot);
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        let sent = vec![
            GroupMessage { group: 4, message },
            GroupMessage {
                group: 9,
                message: heartbeat,
            },
        ];
        let mut r = Reassembly::default();
        let mut got = None;
        for part in encode("node-a", 1, &sent).unwrap() {
            got = r.take(part).unwrap();
        }
        let got = decode(got.unwrap()).unwrap();
        assert_eq!(got.len(), 2);
        for (a, b) in sent.iter().zip(&got) {
            assert_eq!((a.group, &a.message), (b.group, &b.message));
        }
        // A message that does not parse is refused.
        assert!(decode(vec![(1, vec![0xff, 0xff, 0xff])]).is_err());
    }
}
