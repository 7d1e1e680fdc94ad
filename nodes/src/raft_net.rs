//! The shards' Raft groups across nodes. [`RaftNet`] carries what an
//! environment's writer sends to the members of its groups on other nodes,
//! through their gateways (one batch per node and pass, cut in parts when
//! large); [`RaftInboxes`] hands what arrives to the writer of each
//! shard's environment, and keeps those writers (started here, with the
//! net, before any shard actor asks for one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use curvine_actors::cluster::ClusterView;
use curvine_actors::replica::wire;
use curvine_actors::replica::{member_id, GroupMessage, MayFound, StatusBoard, Transport};
use curvine_actors::store::ShardStore;
use curvine_actors::writer::Writer;
use curvine_messages::cluster::PeerMsg;
use curvine_messages::raft::{RaftPart, Reassembly};
use curvine_messages::ShardId;

/// Sends Raft messages to other nodes' gateways.
pub struct RaftNet {
    view: Arc<ClusterView>,
    seq: AtomicU64,
}

impl RaftNet {
    pub fn new(view: Arc<ClusterView>) -> RaftNet {
        RaftNet {
            view,
            seq: AtomicU64::new(0),
        }
    }

    /// The node whose member id in every group is `member`.
    fn node_of(&self, member: u64) -> Option<String> {
        self.view
            .members()
            .into_iter()
            .map(|m| m.info.node_id)
            .find(|node| member_id(node) == member)
    }
}

impl Transport for RaftNet {
    fn send(&self, to: u64, messages: Vec<GroupMessage>) {
        // Raft sends again what does not arrive: a member that cannot be
        // reached now is skipped, not waited for.
        let Some(node) = self.node_of(to) else {
            tracing::debug!(
                member = to,
                "Raft messages for a member no node is known as"
            );
            return;
        };
        let gateway = match self.view.gateway(&node) {
            Ok(g) => g,
            Err(e) => {
                tracing::debug!(node, error = %e, "Raft messages not sent");
                return;
            }
        };
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        match wire::encode(&self.view.node_id, seq, &messages) {
            Ok(parts) => {
                for part in parts {
                    if gateway.cast(PeerMsg::Raft(part)).is_err() {
                        break;
                    }
                }
            }
            Err(e) => tracing::warn!(node, error = %e, "Raft messages not sent"),
        }
    }
}

/// The writers of this node's shard environments, started with the net,
/// and where Raft messages from other nodes go.
pub struct RaftInboxes {
    writers: HashMap<ShardId, Writer>,
    reassembly: Mutex<Reassembly>,
}

impl RaftInboxes {
    pub fn new(
        stores: &[Arc<ShardStore>],
        group_commit_max: usize,
        commit_delay: Duration,
        net: Arc<RaftNet>,
        may_found: Option<MayFound>,
    ) -> RaftInboxes {
        let net: Arc<dyn Transport> = net;
        let writers = stores
            .iter()
            .map(|store| {
                let writer = Writer::for_store_with(
                    store,
                    group_commit_max,
                    commit_delay,
                    Some(net.clone()),
                    may_found.clone(),
                );
                (store.shard, writer)
            })
            .collect();
        RaftInboxes {
            writers,
            reassembly: Mutex::new(Reassembly::default()),
        }
    }

    /// The writer of `shard`'s environment.
    pub fn writer(&self, shard: ShardId) -> Option<&Writer> {
        self.writers.get(&shard)
    }

    /// The status boards of this node's groups (one per environment).
    pub fn boards(&self) -> Vec<StatusBoard> {
        let mut boards: Vec<StatusBoard> = Vec::new();
        for writer in self.writers.values() {
            let board = writer.status();
            if !boards.iter().any(|b| Arc::ptr_eq(b, &board)) {
                boards.push(board);
            }
        }
        boards
    }

    /// Becomes a member of `shard`'s group, led by member `leader`, which
    /// is adding this node.
    pub fn join(&self, shard: ShardId, leader: u64) {
        match self.writers.get(&shard) {
            Some(writer) => writer.join(
                leader,
                Box::new(move |r| {
                    if let Err(e) = r {
                        tracing::warn!(shard, error = %e, "cannot join the shard's group");
                    }
                }),
            ),
            None => tracing::warn!(shard, "asked to join a shard this cluster does not have"),
        }
    }

    /// Takes a part of a batch from another node; a whole batch goes to
    /// the writers of the groups it names.
    pub fn receive(&self, part: RaftPart) {
        let from = part.from.clone();
        let taken = self
            .reassembly
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(part);
        let messages = match taken.and_then(|batch| batch.map(wire::decode).transpose()) {
            Ok(Some(messages)) => messages,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(from, error = %e, "refused Raft messages from another node");
                return;
            }
        };
        let mut by_shard: HashMap<ShardId, Vec<GroupMessage>> = HashMap::new();
        for m in messages {
            by_shard.entry(m.group).or_default().push(m);
        }
        for (shard, messages) in by_shard {
            match self.writers.get(&shard) {
                Some(writer) => writer.inbox().deliver(messages),
                None => tracing::warn!(
                    from,
                    shard,
                    "Raft messages for a shard this cluster does not have"
                ),
            }
        }
    }
}
