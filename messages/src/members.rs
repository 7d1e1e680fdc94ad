//! The members of a cluster and the cluster map: what a node tells the
//! others about itself, how it sees them, and which node serves each shard.

use serde::{Deserialize, Serialize};

use crate::block::{DataNode, TierStats};
use crate::codec::Versioned;
use crate::types::ShardId;

/// Which nodes hold each shard. Held by shard 0 (in its `meta` table) and
/// cached by every node; a higher version replaces a lower one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub version: u64,
    /// Node id per shard: the node that serves it, or, for a shard with
    /// followers (a replicated shard), its preferred leader.
    pub shards: Vec<String>,
    /// The other members of each shard's Raft group (`meta.replicas` - 1
    /// nodes once the cluster has them); empty for a shard that has one
    /// member. Requests go to whichever member leads.
    pub followers: Vec<Vec<String>>,
}

impl Versioned for ClusterMap {
    const VERSION: u8 = 2;
    const WHAT: &'static str = "cluster map";

    /// Version 1 named one node per shard.
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, crate::codec::CodecError> {
        #[derive(Deserialize)]
        struct V1 {
            version: u64,
            shards: Vec<String>,
        }
        if version != 1 {
            return Err(crate::codec::CodecError::UnknownVersion {
                what: Self::WHAT,
                found: version,
            });
        }
        let v1: V1 = crate::codec::from_bytes(Self::WHAT, payload)?;
        Ok(ClusterMap {
            version: v1.version,
            shards: v1.shards,
            followers: Vec::new(),
        })
    }
}

impl ClusterMap {
    /// Every shard on one node (a cluster being formatted).
    pub fn single(node_id: &str, shard_count: u32) -> ClusterMap {
        ClusterMap {
            version: 1,
            shards: vec![node_id.to_string(); shard_count as usize],
            followers: Vec::new(),
        }
    }

    pub fn owner(&self, shard: ShardId) -> Option<&str> {
        self.shards.get(shard as usize).map(String::as_str)
    }

    /// The followers of `shard` (none for a shard with one member).
    pub fn followers_of(&self, shard: ShardId) -> &[String] {
        self.followers
            .get(shard as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Every member of `shard`'s group: its owner first, then its followers.
    pub fn members(&self, shard: ShardId) -> Vec<&str> {
        self.owner(shard)
            .into_iter()
            .chain(self.followers_of(shard).iter().map(String::as_str))
            .collect()
    }

    /// Whether `shard`'s group has members on several nodes.
    pub fn replicated(&self, shard: ShardId) -> bool {
        !self.followers_of(shard).is_empty()
    }

    /// Whether `node` holds a copy of `shard` (owner or follower).
    pub fn holds(&self, shard: ShardId, node: &str) -> bool {
        self.members(shard).contains(&node)
    }

    /// The shards `node` serves.
    pub fn shards_of(&self, node: &str) -> Vec<ShardId> {
        self.shards
            .iter()
            .enumerate()
            .filter(|(_, n)| n.as_str() == node)
            .map(|(i, _)| i as ShardId)
            .collect()
    }

    /// The same map with `shard` on `node`, one version later.
    pub fn with_owner(&self, shard: ShardId, node: &str) -> ClusterMap {
        let mut next = self.clone();
        next.version += 1;
        if let Some(slot) = next.shards.get_mut(shard as usize) {
            *slot = node.to_string();
        }
        next
    }

    /// How many shards `node` holds a copy of (owner or follower).
    pub fn places(&self, node: &str) -> usize {
        (0..self.shards.len())
            .filter(|s| self.holds(*s as ShardId, node))
            .count()
    }

    /// The same map with `to` in `from`'s place among `shard`'s members
    /// (when `to` is a member already, the two swap places: moving the
    /// owner's place to a follower makes that follower the preferred
    /// leader), one version later.
    pub fn with_member_moved(&self, shard: ShardId, from: &str, to: &str) -> ClusterMap {
        let mut next = self.clone();
        next.version += 1;
        let s = shard as usize;
        next.followers.resize(next.shards.len(), Vec::new());
        let (Some(owner), Some(followers)) = (next.shards.get_mut(s), next.followers.get_mut(s))
        else {
            return next;
        };
        let was_member = *owner == to || followers.iter().any(|f| f == to);
        for place in std::iter::once(owner).chain(followers.iter_mut()) {
            if place == from {
                *place = to.to_string();
            } else if place == to && was_member {
                *place = from.to_string();
            }
        }
        if next.followers.iter().all(Vec::is_empty) {
            next.followers.clear();
        }
        next
    }

    /// A map of the same members spread evenly over `nodes` (those that
    /// can take shards), and the moves that make it: first each node holds
    /// as many copies as any other, give or take one; then each leads
    /// (owns) as many shards, give or take one, by making a follower the
    /// owner. Shard 0, which holds the map, moves last. Places on nodes not
    /// in `nodes` stay where they are.
    pub fn balanced(&self, nodes: &[String]) -> (ClusterMap, Vec<(ShardId, String, String)>) {
        let mut next = self.clone();
        let mut moves = Vec::new();
        if nodes.is_empty() {
            return (next, moves);
        }
        let spread = |m: &ClusterMap, count: &dyn Fn(&ClusterMap, &str) -> usize| {
            let most = nodes
                .iter()
                .max_by_key(|n| (count(m, n), std::cmp::Reverse(*n)));
            let fewest = nodes.iter().min_by_key(|n| (count(m, n), *n));
            most.zip(fewest).map(|(a, b)| (a.clone(), b.clone()))
        };
        let owned = |m: &ClusterMap, n: &str| m.shards_of(n).len();
        let held = |m: &ClusterMap, n: &str| m.places(n);
        for (count, owner_only) in [
            (&held as &dyn Fn(&ClusterMap, &str) -> usize, false),
            (&owned, true),
        ] {
            // Each step moves one place from the fullest node to the
            // emptiest; it ends when no step can narrow the gap.
            for _ in 0..self.shards.len() * (nodes.len() + 1) {
                let Some((most, fewest)) = spread(&next, count) else {
                    break;
                };
                if count(&next, &most) <= count(&next, &fewest) + 1 {
                    break;
                }
                let fits = |s: ShardId| {
                    if owner_only {
                        next.owner(s) == Some(most.as_str())
                            && next.followers_of(s).contains(&fewest)
                    } else {
                        next.holds(s, &most) && !next.holds(s, &fewest)
                    }
                };
                let shards = (1..self.shards.len() as ShardId).rev().chain([0]);
                let Some(shard) = shards.into_iter().find(|s| fits(*s)) else {
                    break;
                };
                next = next.with_member_moved(shard, &most, &fewest);
                moves.push((shard, most, fewest));
            }
        }
        next.version = self.version + 1;
        (next, moves)
    }
}

/// What a node tells the others about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    pub node_id: String,
    /// The cluster port (ractor_cluster).
    pub cluster_addr: String,
    /// The client port.
    pub rpc_addr: String,
    pub data_addr: String,
    /// The HTTP port; empty while the node serves none.
    pub http_addr: String,
    /// Host name and boot id: clients on the same host use short-circuit I/O.
    pub host_key: String,
    pub tiers: Vec<TierStats>,
    pub started_ns: i64,
    /// The node is being emptied and takes no new shards or blocks.
    pub draining: bool,
}

impl MemberInfo {
    /// Its data port, as readers and writers reach it.
    pub fn data_node(&self) -> DataNode {
        DataNode {
            node_id: self.node_id.clone(),
            data_addr: self.data_addr.clone(),
            host_key: self.host_key.clone(),
        }
    }

    /// Free bytes over all tiers (capacity minus used and reserved).
    pub fn free_bytes(&self) -> u64 {
        self.tiers
            .iter()
            .map(|t| t.capacity.saturating_sub(t.used + t.reserved))
            .sum()
    }
}

/// What a node knows about another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Heard from within the node timeout.
    Up,
    /// Silent for longer than the node timeout.
    Down,
    /// Decommissioned: it left and is not expected back.
    Left,
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberState::Up => "up",
            MemberState::Down => "down",
            MemberState::Left => "left",
        })
    }
}

/// A member as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub info: MemberInfo,
    pub state: MemberState,
    /// When the last heartbeat arrived (this node's clock), 0 for itself.
    pub last_seen_ns: i64,
    /// Since when the node is in `state`.
    pub since_ns: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_versioned, encode_versioned};

    #[test]
    fn a_map_of_the_previous_release_reads_as_one_member_per_shard() {
        #[derive(Serialize)]
        struct V1 {
            version: u64,
            shards: Vec<String>,
        }
        let mut bytes = vec![1u8];
        bytes.extend(
            postcard::to_allocvec(&V1 {
                version: 7,
                shards: vec!["a".into(), "b".into()],
            })
            .unwrap(),
        );
        let map: ClusterMap = decode_versioned(&bytes).unwrap();
        assert_eq!(map.version, 7);
        assert_eq!(map.members(1), vec!["b"]);
        assert!(!map.replicated(0));
        // And the current version round-trips with its followers.
        let mut next = map.clone();
        next.followers = vec![vec!["b".into()], vec![]];
        let back: ClusterMap = decode_versioned(&encode_versioned(&next)).unwrap();
        assert_eq!(back, next);
        assert!(back.replicated(0) && !back.replicated(1));
        assert_eq!(back.members(0), vec!["a", "b"]);
        assert!(back.holds(0, "b") && !back.holds(1, "a"));
    }

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn moving_a_member_replaces_it_or_swaps_it_with_a_follower() {
        let map = ClusterMap {
            version: 3,
            shards: nodes(&["a", "b"]),
            followers: vec![nodes(&["b", "c"]), nodes(&["c"])],
        };
        let moved = map.with_member_moved(0, "a", "d");
        assert_eq!(moved.version, 4);
        assert_eq!(moved.members(0), vec!["d", "b", "c"]);
        let swapped = map.with_member_moved(0, "a", "c");
        assert_eq!(swapped.members(0), vec!["c", "b", "a"]);
        let follower = map.with_member_moved(1, "c", "a");
        assert_eq!(follower.members(1), vec!["b", "a"]);
        assert_eq!(follower.members(0), map.members(0));
    }

    #[test]
    fn a_balanced_map_spreads_copies_then_leaders_and_keeps_each_shards_members_distinct() {
        // Three nodes hold every shard, all led by "a"; a fourth node joins.
        let map = ClusterMap {
            version: 9,
            shards: vec!["a".into(); 8],
            followers: vec![nodes(&["b", "c"]); 8],
        };
        let all = nodes(&["a", "b", "c", "d"]);
        let (next, moves) = map.balanced(&all);
        assert_eq!(next.version, 10);
        let places: Vec<usize> = all.iter().map(|n| next.places(n)).collect();
        assert_eq!(places.iter().sum::<usize>(), 24, "no copy lost or added");
        assert!(places.iter().all(|p| *p == 6), "copies spread: {places:?}");
        let led: Vec<usize> = all.iter().map(|n| next.shards_of(n).len()).collect();
        assert!(led.iter().all(|l| *l == 2), "leaders spread: {led:?}");
        for s in 0..8 {
            let mut m = next.members(s);
            m.sort();
            m.dedup();
            assert_eq!(m.len(), 3, "shard {s} has three distinct members");
        }
        // Replaying the moves on the old map gives the new one.
        let mut replay = map.clone();
        for (s, from, to) in &moves {
            replay = replay.with_member_moved(*s, from, to);
        }
        assert_eq!(replay.shards, next.shards);
        assert_eq!(replay.followers, next.followers);
        // A balanced map stays as it is.
        let (again, none) = next.balanced(&all);
        assert!(none.is_empty(), "{none:?}");
        assert_eq!(again.shards, next.shards);
        // Shards of one member move as owners.
        let single = ClusterMap::single("a", 4);
        let (spread, moves) = single.balanced(&nodes(&["a", "b"]));
        assert_eq!(moves.len(), 2);
        assert_eq!(spread.shards_of("b").len(), 2);
        assert!(spread.followers.is_empty());
        assert!(
            moves.iter().all(|(s, _, _)| *s != 0),
            "shard 0 stays: {moves:?}"
        );
    }
}
