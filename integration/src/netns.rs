//! A network namespace joined to the host by a veth pair, to cut a node
//! off from the others (the namespace's end is 10.77.NET.2, the host's
//! 10.77.NET.1: tests that run at once each take their own NET). Needs
//! root and `ip netns`.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{wait_for, wait_for_voters, NodeProcess};

/// A network namespace joined to the host by a veth pair.
pub struct Netns {
    pub name: String,
    pub host_if: String,
    /// The link's end inside the namespace.
    pub ns_if: String,
    /// The host's address on the link.
    pub host: String,
    /// The namespace's address on the link.
    pub inside: String,
}

impl Netns {
    /// `None` (with a message) without root or `ip netns`.
    pub fn create(tag: &str, net: u8) -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let name = format!("cvp{tag}");
        let host_if = format!("cvh{tag}");
        let ns_if = format!("cvn{tag}");
        let host = format!("10.77.{net}.1");
        let inside = format!("10.77.{net}.2");
        let host_cidr = format!("{host}/24");
        let inside_cidr = format!("{inside}/24");
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", &name],
            vec![
                "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
            ],
            vec!["link", "set", &ns_if, "netns", &name],
            vec!["addr", "add", &host_cidr, "dev", &host_if],
            vec!["link", "set", &host_if, "up"],
            vec!["-n", &name, "addr", "add", &inside_cidr, "dev", &ns_if],
            vec!["-n", &name, "link", "set", &ns_if, "up"],
            vec!["-n", &name, "link", "set", "lo", "up"],
        ];
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            ns_if: ns_if.clone(),
            host: host.clone(),
            inside: inside.clone(),
        };
        for step in steps {
            let ok = Command::new("ip")
                .args(&step)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                eprintln!("skipping: `ip {}` failed", step.join(" "));
                return None;
            }
        }
        Some(ns)
    }

    /// Takes the link down (`false`: the namespace is cut off) or up.
    pub fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        let ok = Command::new("ip")
            .args(["link", "set", &self.host_if, state])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip link set {} {state}", self.host_if);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

impl Netns {
    /// Three nodes with replicated shards: the founder inside this
    /// namespace (it leads every shard's group), two on the host joined to
    /// it. Returns `(inside, a, b)` once all three are up and each of the
    /// 16 shards has 3 voters.
    pub fn three_nodes(
        &self,
        dir: &Path,
        args: &[&str],
    ) -> (NodeProcess, NodeProcess, NodeProcess) {
        let wrapper = ["ip", "netns", "exec", self.name.as_str()];
        let inside = NodeProcess::start_wrapped(&dir.join("c"), &self.inside, args, &wrapper);
        let mut joined = args.to_vec();
        joined.extend_from_slice(&["--seeds", &inside.cluster_addr]);
        let a = NodeProcess::start_on(&dir.join("a"), &self.host, &joined);
        let b = NodeProcess::start_on(&dir.join("b"), &self.host, &joined);
        wait_for("three nodes up", Duration::from_secs(30), || {
            (a.members_up() == 3 && inside.members_up() == 3).then_some(())
        });
        wait_for_voters(&a, 16, 3);
        (inside, a, b)
    }
}

impl Netns {
    /// Three nodes with replicated shards, the founder on the host (it
    /// leads every shard's group), a second on the host, and a third inside
    /// this namespace joined to them: a follower of every shard. Returns
    /// `(founder, other, inside)` once all three are up and each of the 16
    /// shards has 3 voters.
    pub fn three_nodes_follower_inside(
        &self,
        dir: &Path,
        args: &[&str],
    ) -> (NodeProcess, NodeProcess, NodeProcess) {
        let founder = NodeProcess::start_on(&dir.join("a"), &self.host, args);
        let mut joined = args.to_vec();
        joined.extend_from_slice(&["--seeds", &founder.cluster_addr]);
        let other = NodeProcess::start_on(&dir.join("b"), &self.host, &joined);
        let wrapper = ["ip", "netns", "exec", self.name.as_str()];
        let inside = NodeProcess::start_wrapped(&dir.join("c"), &self.inside, &joined, &wrapper);
        wait_for("three nodes up", Duration::from_secs(30), || {
            (founder.members_up() == 3 && inside.members_up() == 3).then_some(())
        });
        wait_for_voters(&founder, 16, 3);
        (founder, other, inside)
    }
}
