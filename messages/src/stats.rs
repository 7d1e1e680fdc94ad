//! What a node's actors have done, as `curvine-cli actors` and the
//! dashboard show it.

use serde::{Deserialize, Serialize};

/// One actor of a node's supervision tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorInfo {
    /// Its role in the node (`shard-3`, `block-manager`, `evictor-ssd`).
    pub name: String,
    /// The running actor's id (a restart gives a new one).
    pub id: String,
    /// `running`, `starting`, `stopping`, ...
    pub status: String,
    /// Messages sent to it and not yet handled; `None` for actors whose
    /// senders are not counted (timers, peers through the cluster port).
    pub mailbox: Option<u64>,
    /// Messages handled since the node started (across restarts).
    pub handled: u64,
    /// Failures (a handler error or panic) since the node started.
    pub errors: u64,
    /// Restarts by its supervisor since the node started.
    pub restarts: u64,
    /// Since the running actor started (ms).
    pub uptime_ms: u64,
    pub children: Vec<ActorInfo>,
}

impl ActorInfo {
    /// This actor and its descendants, depth first, with their depth.
    pub fn walk(&self) -> Vec<(usize, &ActorInfo)> {
        fn go<'a>(a: &'a ActorInfo, depth: usize, out: &mut Vec<(usize, &'a ActorInfo)>) {
            out.push((depth, a));
            for c in &a.children {
                go(c, depth + 1, out);
            }
        }
        let mut out = Vec::new();
        go(self, 0, &mut out);
        out
    }
}

/// One node's answer to [`crate::rpc::Actors`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeActors {
    pub node: String,
    /// The node's supervision tree (`None` when the node did not answer).
    pub root: Option<ActorInfo>,
    /// Why the node could not answer.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_is_depth_first() {
        let leaf = |n: &str| ActorInfo {
            name: n.into(),
            ..Default::default()
        };
        let tree = ActorInfo {
            name: "node".into(),
            children: vec![
                ActorInfo {
                    name: "host".into(),
                    children: vec![leaf("shard-0"), leaf("shard-1")],
                    ..Default::default()
                },
                leaf("gateway"),
            ],
            ..Default::default()
        };
        let names: Vec<(usize, &str)> = tree
            .walk()
            .into_iter()
            .map(|(d, a)| (d, a.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                (0, "node"),
                (1, "host"),
                (2, "shard-0"),
                (2, "shard-1"),
                (1, "gateway")
            ]
        );
    }
}
