//! The cluster: the messages nodes exchange over ractor_cluster (the
//! members and the cluster map they carry are in `members`, re-exported
//! here).
//!
//! Each node runs one remotable actor, its *gateway*, in the process group
//! [`gateway_group`]`(node_id)`. Everything another node asks of this one
//! goes through it as a [`PeerMsg`]: membership heartbeats, requests to the
//! shards this node hosts, block removals, reports. Only the gateway is
//! remotable, so every peer holds one proxy per node, not one per actor.

use ractor::message::{BoxedDowncastErr, SerializedMessage};
use ractor::RpcReplyPort;
use serde::{Deserialize, Serialize};

use crate::block::BlockId;
use crate::error::{FsError, FsResult};
use crate::remote::{bridge_in, bridge_out, decode_peer, encode_peer, fail_bytes};
use crate::rpc::NodeReport;
use crate::shard::{ShardMsg, ShardWire};
use crate::trace::{TraceBatch, TraceCtx, TraceQuery};
use crate::types::{ReqId, ShardId};

pub use crate::members::{ClusterMap, MemberInfo, MemberState, MemberView};
pub use crate::raft::RaftPart;

/// The process group of a node's gateway actor.
pub fn gateway_group(node_id: &str) -> String {
    format!("curvine.gw.{node_id}")
}

/// A node's periodic announcement to every other node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub cluster_id: String,
    pub shard_count: u32,
    pub member: MemberInfo,
    /// The sender's cluster map: receivers adopt it when it is newer.
    pub map: ClusterMap,
    /// Nodes the sender knows (id and cluster address), so a node that
    /// restarts can find the others without its seeds.
    pub known: Vec<(String, String)>,
    /// The node is leaving the cluster for good (after a decommission).
    pub leaving: bool,
    /// Version of the mount table the sender holds: a receiver with an
    /// older one fetches the table from shard 0.
    pub mounts_version: u64,
    /// The replicated shards the sender leads, with the term: where
    /// other nodes send their requests.
    pub leads: Vec<(ShardId, u64)>,
}

/// A block to copy from another node (replication).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullBlock {
    pub id: BlockId,
    pub len: u64,
    pub crc: u32,
    /// The node to read it from, and a read token for it there.
    pub from: crate::block::DataNode,
    pub token: crate::block::Token,
}

/// Part of a load job handed to a node: cache blocks `[from, to)` of the
/// UFS file at `path` (inode `ino`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadPart {
    pub path: String,
    pub ino: u64,
    pub from: u32,
    pub to: u32,
}

/// What a new node learns from the cluster it joins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinInfo {
    pub cluster_id: String,
    pub cluster_name: String,
    pub shard_count: u32,
    pub meta_layout: String,
    pub map: ClusterMap,
    /// The node that answered.
    pub node_id: String,
}

/// Messages to a node's gateway.
#[derive(Debug)]
pub enum PeerMsg {
    /// Membership (a cast).
    Heartbeat(Box<Heartbeat>),
    /// Raft messages for groups this node is a member of (a cast).
    Raft(RaftPart),
    /// Become a member of `shard`'s group, which the node whose member id
    /// is `leader` leads and is adding this node to (a cast).
    JoinGroup { shard: ShardId, leader: u64 },
    /// A new node asks what cluster this is.
    Join(RpcReplyPort<FsResult<JoinInfo>>),
    /// A request to a shard this node serves. A node that does not serve
    /// `shard` answers `Unavailable`, and the caller retries once its map
    /// has caught up. `direct` requests go to this node's copy of the shard
    /// whatever the map says (the steps of a shard move).
    Shard {
        shard: ShardId,
        direct: bool,
        msg: ShardMsg,
        /// The trace the request belongs to, and when it was sent (Unix ns).
        trace: Option<(TraceCtx, i64)>,
        /// The call the request is an attempt of.
        req: Option<ReqId>,
    },
    /// This node's trace events matching a query.
    Trace {
        query: TraceQuery,
        reply: RpcReplyPort<FsResult<TraceBatch>>,
    },
    /// Take no new shards or blocks (`draining`); with `leave`, leave the
    /// cluster (the end of a decommission).
    Drain {
        draining: bool,
        leave: bool,
        reply: RpcReplyPort<FsResult<()>>,
    },
    /// This node's part of `report`.
    Report(RpcReplyPort<FsResult<NodeReport>>),
    /// This node's supervision tree (`actors`).
    Actors(RpcReplyPort<FsResult<crate::stats::ActorInfo>>),
    /// Remove these blocks from this node (freed by a shard elsewhere).
    RemoveBlocks {
        ids: Vec<BlockId>,
        reply: RpcReplyPort<FsResult<()>>,
    },
    /// Which of these freed blocks the open readers of this node's clients
    /// still hold (they are removed once none does).
    HeldBlocks {
        ids: Vec<BlockId>,
        reply: RpcReplyPort<FsResult<Vec<BlockId>>>,
    },
    /// Copy a block from another node and keep it here.
    Pull {
        pull: PullBlock,
        reply: RpcReplyPort<FsResult<()>>,
    },
    /// Verify this node's blocks (`admin scrub`), dropping bad copies that
    /// have another when `repair`.
    Scrub {
        repair: bool,
        reply: RpcReplyPort<FsResult<crate::rpc::NodeScrub>>,
    },
    /// Cache part of a UFS file on this node (a load job's task); replies
    /// with the bytes read from the UFS.
    Load {
        part: LoadPart,
        /// The load job's trace, and when the part was sent (Unix ns).
        trace: Option<(TraceCtx, i64)>,
        reply: RpcReplyPort<FsResult<u64>>,
    },
    /// A message that did not decode. Only ever built on the receiving side;
    /// the gateway logs it and answers the port with `Protocol`.
    Invalid {
        reason: String,
        reply: Option<RpcReplyPort<Vec<u8>>>,
    },
}

impl PeerMsg {
    pub fn kind_name(&self) -> &'static str {
        match self {
            PeerMsg::Heartbeat(_) => "heartbeat",
            PeerMsg::Raft(_) => "raft",
            PeerMsg::JoinGroup { .. } => "join_group",
            PeerMsg::Join(_) => "join",
            PeerMsg::Shard { .. } => "shard",
            PeerMsg::Drain { .. } => "drain",
            PeerMsg::Scrub { .. } => "scrub",
            PeerMsg::Report(_) => "report",
            PeerMsg::Actors(_) => "actors",
            PeerMsg::RemoveBlocks { .. } => "remove_blocks",
            PeerMsg::HeldBlocks { .. } => "held_blocks",
            PeerMsg::Pull { .. } => "pull",
            PeerMsg::Load { .. } => "load",
            PeerMsg::Trace { .. } => "trace",
            PeerMsg::Invalid { .. } => "invalid",
        }
    }
}

/// A shard request as it crosses nodes: shard, direct, trace, message.
type ShardArgs = (
    ShardId,
    bool,
    Option<(TraceCtx, i64)>,
    Option<ReqId>,
    ShardWire,
);

fn cast(variant: &str, args: Vec<u8>) -> SerializedMessage {
    SerializedMessage::Cast {
        variant: variant.to_string(),
        args,
        metadata: None,
    }
}

fn call(variant: &str, args: Vec<u8>, reply: RpcReplyPort<Vec<u8>>) -> SerializedMessage {
    SerializedMessage::Call {
        variant: variant.to_string(),
        args,
        reply,
        metadata: None,
    }
}

fn invalid(reason: FsError, reply: Option<RpcReplyPort<Vec<u8>>>) -> PeerMsg {
    PeerMsg::Invalid {
        reason: reason.to_string(),
        reply,
    }
}

impl ractor::Message for PeerMsg {
    fn serializable() -> bool {
        true
    }

    fn serialize(self) -> Result<SerializedMessage, BoxedDowncastErr> {
        Ok(match self {
            PeerMsg::Heartbeat(hb) => cast("heartbeat", encode_peer("heartbeat", &*hb)),
            PeerMsg::Raft(part) => cast("raft", encode_peer("raft messages", &part)),
            PeerMsg::JoinGroup { shard, leader } => {
                cast("join_group", encode_peer("join group", &(shard, leader)))
            }
            PeerMsg::Shard {
                shard,
                direct,
                msg,
                trace,
                req,
            } => {
                let (wire, port) = msg.into_wire();
                let args = encode_peer("shard request", &(shard, direct, trace, req, wire));
                match port {
                    Some(port) => call("shard", args, port),
                    None => cast("shard", args),
                }
            }
            PeerMsg::Report(reply) => call("report", encode_peer("report", &()), bridge_out(reply)),
            PeerMsg::Actors(reply) => call("actors", encode_peer("actors", &()), bridge_out(reply)),
            PeerMsg::Join(reply) => call("join", encode_peer("join", &()), bridge_out(reply)),
            PeerMsg::RemoveBlocks { ids, reply } => call(
                "remove_blocks",
                encode_peer("remove blocks", &ids),
                bridge_out(reply),
            ),
            PeerMsg::HeldBlocks { ids, reply } => call(
                "held_blocks",
                encode_peer("held blocks", &ids),
                bridge_out(reply),
            ),
            PeerMsg::Pull { pull, reply } => {
                call("pull", encode_peer("pull", &pull), bridge_out(reply))
            }
            PeerMsg::Load { part, trace, reply } => call(
                "load",
                encode_peer("load", &(part, trace)),
                bridge_out(reply),
            ),
            PeerMsg::Trace { query, reply } => call(
                "trace",
                encode_peer("trace query", &query),
                bridge_out(reply),
            ),
            PeerMsg::Scrub { repair, reply } => {
                call("scrub", encode_peer("scrub", &repair), bridge_out(reply))
            }
            PeerMsg::Drain {
                draining,
                leave,
                reply,
            } => call(
                "drain",
                encode_peer("drain", &(draining, leave)),
                bridge_out(reply),
            ),
            PeerMsg::Invalid { .. } => return Err(BoxedDowncastErr),
        })
    }

    fn deserialize(message: SerializedMessage) -> Result<Self, BoxedDowncastErr> {
        match message {
            SerializedMessage::Cast { variant, args, .. } => Ok(match variant.as_str() {
                "heartbeat" => match decode_peer::<Heartbeat>("heartbeat", &args) {
                    Ok(hb) => PeerMsg::Heartbeat(Box::new(hb)),
                    Err(e) => invalid(e, None),
                },
                "raft" => match decode_peer::<RaftPart>("raft messages", &args) {
                    Ok(part) => PeerMsg::Raft(part),
                    Err(e) => invalid(e, None),
                },
                "join_group" => match decode_peer::<(ShardId, u64)>("join group", &args) {
                    Ok((shard, leader)) => PeerMsg::JoinGroup { shard, leader },
                    Err(e) => invalid(e, None),
                },
                "shard" => match decode_peer::<ShardArgs>("shard request", &args).and_then(
                    |(shard, direct, trace, req, wire)| {
                        Ok((shard, direct, trace, req, ShardMsg::from_wire(wire, None)?))
                    },
                ) {
                    Ok((shard, direct, trace, req, msg)) => PeerMsg::Shard {
                        shard,
                        direct,
                        msg,
                        trace,
                        req,
                    },
                    Err(e) => invalid(e, None),
                },
                other => invalid(
                    FsError::Protocol(format!("unknown peer message {other:?}")),
                    None,
                ),
            }),
            SerializedMessage::Call {
                variant,
                args,
                reply,
                ..
            } => Ok(match variant.as_str() {
                "shard" => {
                    match decode_peer::<ShardArgs>("shard request", &args) {
                        Ok((shard, direct, trace, req, wire)) => {
                            match ShardMsg::from_wire(wire, Some(reply)) {
                                Ok(msg) => PeerMsg::Shard {
                                    shard,
                                    direct,
                                    msg,
                                    trace,
                                    req,
                                },
                                // from_wire only fails for a call without a port.
                                Err(e) => invalid(e, None),
                            }
                        }
                        Err(e) => invalid(e, Some(reply)),
                    }
                }
                "report" => match decode_peer::<()>("report", &args) {
                    Ok(()) => PeerMsg::Report(bridge_in(reply)),
                    Err(e) => invalid(e, Some(reply)),
                },
                "actors" => match decode_peer::<()>("actors", &args) {
                    Ok(()) => PeerMsg::Actors(bridge_in(reply)),
                    Err(e) => invalid(e, Some(reply)),
                },
                "join" => match decode_peer::<()>("join", &args) {
                    Ok(()) => PeerMsg::Join(bridge_in(reply)),
                    Err(e) => invalid(e, Some(reply)),
                },
                "remove_blocks" => match decode_peer::<Vec<BlockId>>("remove blocks", &args) {
                    Ok(ids) => PeerMsg::RemoveBlocks {
                        ids,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "held_blocks" => match decode_peer::<Vec<BlockId>>("held blocks", &args) {
                    Ok(ids) => PeerMsg::HeldBlocks {
                        ids,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "scrub" => match decode_peer::<bool>("scrub", &args) {
                    Ok(repair) => PeerMsg::Scrub {
                        repair,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "drain" => match decode_peer::<(bool, bool)>("drain", &args) {
                    Ok((draining, leave)) => PeerMsg::Drain {
                        draining,
                        leave,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "pull" => match decode_peer::<PullBlock>("pull", &args) {
                    Ok(pull) => PeerMsg::Pull {
                        pull,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "trace" => match decode_peer::<TraceQuery>("trace query", &args) {
                    Ok(query) => PeerMsg::Trace {
                        query,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                "load" => match decode_peer::<(LoadPart, Option<(TraceCtx, i64)>)>("load", &args) {
                    Ok((part, trace)) => PeerMsg::Load {
                        part,
                        trace,
                        reply: bridge_in(reply),
                    },
                    Err(e) => invalid(e, Some(reply)),
                },
                other => invalid(
                    FsError::Protocol(format!("unknown peer request {other:?}")),
                    Some(reply),
                ),
            }),
            SerializedMessage::CallReply(..) => Err(BoxedDowncastErr),
        }
    }
}

impl PeerMsg {
    /// Answers an invalid message's port, if it has one.
    pub fn refuse(reason: &str, reply: Option<RpcReplyPort<Vec<u8>>>) {
        if let Some(port) = reply {
            fail_bytes(port, FsError::Protocol(reason.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DirEntry;
    use ractor::Message;

    #[tokio::test]
    async fn a_shard_call_survives_serialization() {
        let (tx, rx) = ractor::concurrency::oneshot::<FsResult<DirEntry>>();
        let msg = PeerMsg::Shard {
            shard: 3,
            direct: false,
            msg: ShardMsg::Lookup {
                parent: 1,
                name: "a".into(),
                reply: tx.into(),
            },
            trace: Some((TraceCtx { trace: 9, span: 4 }, 77)),
            req: Some(ReqId { at_ns: 5, nonce: 6 }),
        };
        let wire = msg.serialize().unwrap();
        let back = PeerMsg::deserialize(wire).unwrap();
        match back {
            PeerMsg::Shard {
                shard: 3,
                direct: false,
                msg:
                    ShardMsg::Lookup {
                        parent,
                        name,
                        reply,
                    },
                trace,
                req,
            } => {
                assert_eq!((parent, name.as_str()), (1, "a"));
                assert_eq!(trace, Some((TraceCtx { trace: 9, span: 4 }, 77)));
                assert_eq!(req, Some(ReqId { at_ns: 5, nonce: 6 }));
                reply.send(Err(FsError::NotFound("a".into()))).unwrap();
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(rx.await.unwrap(), Err(FsError::NotFound("a".into())));
    }

    #[tokio::test]
    async fn garbage_becomes_invalid_and_is_answered() {
        let (tx, rx) = ractor::concurrency::oneshot::<Vec<u8>>();
        let msg = PeerMsg::deserialize(SerializedMessage::Call {
            variant: "shard".into(),
            args: vec![crate::codec::PROTOCOL_VERSION as u8, 0xff, 0xff, 0xff],
            reply: tx.into(),
            metadata: None,
        })
        .unwrap();
        match msg {
            PeerMsg::Invalid { reason, reply } => PeerMsg::refuse(&reason, reply),
            other => panic!("unexpected {other:?}"),
        }
        let result: FsResult<()> = decode_peer("reply", &rx.await.unwrap()).unwrap();
        assert!(matches!(result, Err(FsError::Protocol(_))));

        let msg = PeerMsg::deserialize(SerializedMessage::Cast {
            variant: "nonsense".into(),
            args: vec![],
            metadata: None,
        })
        .unwrap();
        assert!(matches!(msg, PeerMsg::Invalid { reply: None, .. }));
    }
}
