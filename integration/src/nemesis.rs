//! Faults for nemesis schedules on real node processes: a whole cluster
//! killed and started again on the ports it had (crash loops), and the
//! probes a schedule checks after the faults healed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use curvine_client::Client;

use crate::linear::{Call, Outcome};
use crate::model::{self, Op};

use crate::{pinned_ports, NodeProcess, ProcessCluster, FAST_CLUSTER};

impl ProcessCluster {
    /// [`ProcessCluster::start`], with each node's client and cluster ports
    /// below the ephemeral range, so the whole cluster can be killed and
    /// started again on them ([`Self::restart_all`]): every node's seed
    /// and known addresses still hold.
    pub fn start_pinned(dir: &Path, n: usize, extra: &[&str]) -> ProcessCluster {
        Self::start_pinned_wrapped(dir, n, extra, |_| Vec::new())
    }

    /// [`Self::start_pinned`], node `i` under the command `wrapper(i)`
    /// (`env LD_PRELOAD=...` for a node on a faked clock), if not empty.
    pub fn start_pinned_wrapped(
        dir: &Path,
        n: usize,
        extra: &[&str],
        wrapper: impl Fn(usize) -> Vec<String>,
    ) -> ProcessCluster {
        let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
        args.extend_from_slice(extra);
        let hosts: Vec<String> = (0..n).map(|i| format!("127.0.0.{}", i + 1)).collect();
        let ports: Vec<(String, String)> = hosts.iter().map(|h| pinned_ports(h)).collect();
        let seeds = ports[0].1.clone();
        let mut nodes = Vec::new();
        for (i, host) in hosts.iter().enumerate() {
            let mut node_args = args.clone();
            if i > 0 {
                node_args.extend_from_slice(&["--seeds", &seeds]);
            }
            let wrap = wrapper(i);
            let wrap: Vec<&str> = wrap.iter().map(String::as_str).collect();
            let mut node =
                NodeProcess::unstarted(&dir.join(format!("n{i}")), host, &node_args, &wrap);
            node.pinned = Some(ports[i].clone());
            node.launch_on(&node_args, Some(ports[i].clone()));
            if i == 0 {
                // The founder formats the cluster before the others join.
                node.wait_started();
            }
            nodes.push(node);
        }
        for node in &mut nodes[1..] {
            node.wait_started();
        }
        let cluster = ProcessCluster { nodes };
        cluster.wait_up(n);
        cluster
    }

    /// SIGKILL of every node at once.
    pub fn kill_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// Starts every node again at once, on its pinned ports, and waits
    /// until each is ready (its ports serve).
    pub fn restart_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
            let args = node.args.clone();
            let extra: Vec<&str> = args.iter().map(String::as_str).collect();
            let ports = node.pinned.clone();
            node.launch_on(&extra, ports);
        }
        for node in &mut self.nodes {
            node.wait_started();
        }
    }
}

/// A directory on each shard of the cluster (a new directory's inode goes
/// to a shard by its name; the shard is the inode id's top byte): a file
/// created in it is a change of that shard.
pub async fn shard_probes(c: &Client, root: &str, shards: usize) -> BTreeMap<u64, String> {
    c.mkdir(root, false).await.expect("the probes' directory");
    let mut probes = BTreeMap::new();
    for k in 0.. {
        if probes.len() == shards {
            break;
        }
        assert!(k < 100 * shards, "no directory landed on some shard");
        let path = format!("{root}/p{k}");
        let attr = c.mkdir(&path, false).await.expect("a probe directory");
        probes.entry(attr.ino >> 56).or_insert(path);
    }
    probes
}

/// Waits until every shard takes a change again (a file created in each
/// probe directory), up to `within`; returns how long that took, or the
/// shards that did not, with their last error.
pub async fn every_shard_serving(
    c: &Client,
    probes: &BTreeMap<u64, String>,
    within: Duration,
) -> Result<Duration, Vec<String>> {
    let started = Instant::now();
    let mut left: BTreeMap<u64, String> = probes.clone();
    let mut errors: BTreeMap<u64, String> = BTreeMap::new();
    let mut n = 0u64;
    while !left.is_empty() {
        if started.elapsed() > within {
            return Err(left
                .keys()
                .map(|s| format!("shard {s}: {}", errors.get(s).map_or("", String::as_str)))
                .collect());
        }
        n += 1;
        let mut done = Vec::new();
        for (shard, dir) in &left {
            match tokio::time::timeout(
                Duration::from_secs(2),
                c.create(&format!("{dir}/serving-{}-{n}", std::process::id())),
            )
            .await
            {
                Ok(Ok(_)) => done.push(*shard),
                Ok(Err(e)) => {
                    errors.insert(*shard, e.to_string());
                }
                Err(_) => {
                    errors.insert(*shard, "no answer in 2s".into());
                }
            }
        }
        for s in done {
            left.remove(&s);
        }
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(started.elapsed())
}

/// Runs `op` for `client`, recording it. Errors a correct cluster never
/// gives while a majority lives (unavailable, timed out) are recorded as
/// unknown outcomes and counted.
pub async fn record(
    c: &curvine_client::Client,
    client: usize,
    op: Op,
    history: &Mutex<Vec<Call>>,
    failed: &Mutex<Vec<String>>,
) {
    let called = Instant::now();
    let full = model::run_full(c, &op).await;
    let returned = Instant::now();
    let r = full
        .as_ref()
        .map_err(|e| e.kind_name().to_string())
        .copied();
    let model_kinds = [
        "not_found",
        "already_exists",
        "not_a_directory",
        "is_a_directory",
        "not_empty",
        "invalid_argument",
    ];
    let outcome = match &r {
        Err(kind) if !model_kinds.contains(&kind.as_str()) => {
            failed.lock().unwrap().push(format!(
                "client {client} {op:?} after {:?}: {}",
                returned - called,
                full.as_ref().unwrap_err()
            ));
            Outcome::Unknown
        }
        _ => Outcome::Done(r),
    };
    let unknown = outcome == Outcome::Unknown;
    let returned = (!unknown).then_some(returned);
    history.lock().unwrap().push(Call {
        client,
        op,
        outcome,
        called,
        returned,
    });
    if unknown {
        // A node down answers at once: a client that tried again at once
        // would fill the history with calls of unknown outcome, each of
        // which the checker may place anywhere after its call.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Stops the clients recording a history: sets `stop`, waits for every
/// task, and returns the history with how many calls have a known outcome.
pub fn stop_clients(
    rt: &tokio::runtime::Runtime,
    stop: &std::sync::atomic::AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    history: &Mutex<Vec<Call>>,
) -> (Vec<Call>, usize) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rt.block_on(async {
        for t in tasks {
            t.await.expect("a client task panicked");
        }
    });
    let history = history.lock().unwrap().clone();
    let known = history
        .iter()
        .filter(|c| c.outcome != Outcome::Unknown)
        .count();
    (history, known)
}
