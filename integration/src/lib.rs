//! Test harness: real `curvine-node` processes and the real CLI, plus a
//! simple in-memory model of the namespace to compare against.

pub mod fuzzing;
mod http;
pub mod linear;
pub mod model;
mod mount;
pub mod nemesis;
pub mod netns;

pub use http::{assert_short_circuit, http_get, http_get_with, node_counter};
pub use mount::{with_mount_helper, FuseMount};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use curvine_client::Client;
use curvine_conf::ClientConf;
use curvine_node::node::ready::Ready;

/// Directory holding the workspace's built binaries: `TEST_BIN_DIR`
/// when set (the benchmark scripts run the harness on release binaries),
/// else the test binary's own profile directory.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TEST_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test> -> target/<profile>
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf()
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is not built; run `cargo build --bins` first",
        path.display()
    );
    path
}

/// Polls `check` until it gives `Some` and returns that; panics naming
/// `what` after `within` (`what` is displayed only then: see [`WithLog`]).
pub fn wait_for<T>(
    what: impl std::fmt::Display,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A description of what is awaited, followed by a process's log when shown.
pub struct WithLog<'a>(pub String, pub &'a Path);

impl std::fmt::Display for WithLog<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let log = std::fs::read_to_string(self.1).unwrap_or_default();
        write!(f, "{}; its log ({}):\n{log}", self.0, self.1.display())
    }
}

/// A description made only when shown, e.g. from what a [`wait_for`] check
/// saw last (kept in a `RefCell` that both closures borrow) or from logs.
pub struct Lazily<F>(pub F);

impl<F: Fn() -> String> std::fmt::Display for Lazily<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.0)())
    }
}

/// [`wait_for`] in an async test: `check` is polled without blocking the runtime.
pub async fn wait_for_async<T, F, Fut>(
    what: impl std::fmt::Display,
    within: Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGKILL a child process and reap it.
fn kill_child(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// SIGTERM a child process and wait; returns its exit code.
fn terminate_child(child: &mut Option<Child>) -> Option<i32> {
    let mut child = child.take()?;
    // SAFETY: sending a signal to our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    child.wait().ok().and_then(|s| s.code())
}

/// A node process with its own data directory.
pub struct NodeProcess {
    pub data_dir: PathBuf,
    /// Client port.
    pub addr: String,
    /// Cluster port (ractor_cluster).
    pub cluster_addr: String,
    pub node_id: String,
    /// HTTP port (dashboard, API, metrics).
    pub http_addr: String,
    /// The S3 gateway (with `s3.listen`).
    pub s3_addr: String,
    pub log: PathBuf,
    /// The loopback address its ports bind to (127.0.0.x).
    pub host: String,
    /// Arguments given at start, used again by a restart.
    args: Vec<String>,
    /// A command the node runs under (`ip netns exec NS`), if any.
    wrapper: Vec<String>,
    child: Option<Child>,
    /// Client and cluster addresses it keeps across restarts.
    pinned: Option<(String, String)>,
}

/// Two free ports on `host` below the kernel's ephemeral range (which no
/// `bind` to port 0 or `connect` takes), as `host:port`.
fn pinned_ports(host: &str) -> (String, String) {
    let low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    let span = u32::from((low / 2).max(1));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos()
        ^ std::process::id();
    let mut held: Vec<std::net::TcpListener> = (0..4096u32)
        .map(|i| low - (span - seed.wrapping_add(i.wrapping_mul(7919)) % span) as u16)
        .filter_map(|port| std::net::TcpListener::bind((host, port)).ok())
        .take(2)
        .collect();
    assert_eq!(held.len(), 2, "two free ports below {low} on {host}");
    let second = held.pop().unwrap().local_addr().unwrap();
    let first = held.pop().unwrap().local_addr().unwrap();
    (first.to_string(), second.to_string())
}

impl NodeProcess {
    /// Starts a node on free ports and waits until it serves clients.
    pub fn start(data_dir: &Path, extra: &[&str]) -> NodeProcess {
        Self::start_on(data_dir, "127.0.0.1", extra)
    }

    /// Starts a node whose ports bind to `host` (a loopback address).
    pub fn start_on(data_dir: &Path, host: &str, extra: &[&str]) -> NodeProcess {
        Self::start_wrapped(data_dir, host, extra, &[])
    }

    /// Starts a node under `wrapper` (for example `ip netns exec NS`).
    pub fn start_wrapped(
        data_dir: &Path,
        host: &str,
        extra: &[&str],
        wrapper: &[&str],
    ) -> NodeProcess {
        let mut node = Self::unstarted(data_dir, host, extra, wrapper);
        node.spawn(extra);
        node
    }

    /// Starts a node on 127.0.0.1 whose client and cluster ports lie below
    /// the kernel's ephemeral range, so that [`Self::restart_on_same_ports`]
    /// finds them free: a port the kernel handed out (`:0`) may go to any
    /// other process once the node is killed.
    pub fn start_pinned(data_dir: &Path, extra: &[&str]) -> NodeProcess {
        let host = "127.0.0.1";
        let mut node = Self::unstarted(data_dir, host, extra, &[]);
        let ports = pinned_ports(host);
        node.launch_on(extra, Some(ports.clone()));
        node.wait_started();
        node.pinned = Some(ports);
        node
    }

    fn unstarted(data_dir: &Path, host: &str, extra: &[&str], wrapper: &[&str]) -> NodeProcess {
        let log = data_dir.with_extension("log");
        NodeProcess {
            data_dir: data_dir.to_path_buf(),
            addr: String::new(),
            cluster_addr: String::new(),
            node_id: String::new(),
            http_addr: String::new(),
            s3_addr: String::new(),
            log,
            host: host.to_string(),
            args: extra.iter().map(|s| s.to_string()).collect(),
            wrapper: wrapper.iter().map(|s| s.to_string()).collect(),
            child: None,
            pinned: None,
        }
    }

    /// Starts the node again (after `kill` or `terminate`) with the
    /// arguments it was started with, on new ports.
    pub fn start_again(&mut self) {
        self.relaunch(None);
    }

    fn spawn(&mut self, extra: &[&str]) {
        self.launch(extra);
        self.wait_started();
    }

    /// SIGKILL, then starts the node again with the arguments it was
    /// started with, on the client and cluster ports it had (a mount or
    /// client that knows only this address finds it again). For a node of
    /// [`Self::start_pinned`].
    pub fn restart_on_same_ports(&mut self) {
        let ports = self
            .pinned
            .clone()
            .expect("restart_on_same_ports needs a node of start_pinned");
        self.relaunch(Some(ports));
    }

    /// SIGKILL, then the node again with the arguments it was started
    /// with, on `ports` (client, cluster) or new ones.
    fn relaunch(&mut self, ports: Option<(String, String)>) {
        self.kill();
        let args = self.args.clone();
        let extra: Vec<&str> = args.iter().map(String::as_str).collect();
        self.launch_on(&extra, ports);
        self.wait_started();
    }

    /// Starts the process without waiting for it to serve.
    fn launch(&mut self, extra: &[&str]) {
        self.launch_on(extra, None);
    }

    /// [`Self::launch`], on the given client and cluster addresses (free
    /// ports when `None`).
    fn launch_on(&mut self, extra: &[&str], ports: Option<(String, String)>) {
        let (listen, cluster_listen) =
            ports.unwrap_or_else(|| (format!("{}:0", self.host), format!("{}:0", self.host)));
        // The log of an earlier run of the node is kept beside (log.1, ...).
        if std::fs::metadata(&self.log).is_ok_and(|m| m.len() > 0) {
            let kept = (1..)
                .map(|n| self.log.with_extension(format!("log.{n}")))
                .find(|p| !p.exists())
                .expect("a free name");
            let _ = std::fs::rename(&self.log, kept);
        }
        let log_file = std::fs::File::create(&self.log).expect("node log");
        // A ready file left by a killed run names another process.
        Ready::remove(&self.data_dir);
        // Blocks stay inside the test's directory unless the test names tiers.
        let tiers = format!(
            "data.tiers=[MEM:512MiB]{}",
            self.data_dir.with_extension("mem").display()
        );
        let mut command = match self.wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin("curvine-node"));
                c
            }
            None => Command::new(bin("curvine-node")),
        };
        let child = command
            .args(["start", "--data-dir"])
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(&listen)
            .arg("-c")
            .arg(format!("node.cluster_listen={cluster_listen}"))
            .arg("-c")
            .arg(format!("data.listen={}:0", self.host))
            .args(["-c", &tiers])
            .args(extra)
            .env_remove("CURVINE_CONF")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start curvine-node");
        self.child = Some(child);
    }

    /// Waits until the launched process serves clients: its ports and id
    /// come from the ready file it writes in its data directory.
    fn wait_started(&mut self) {
        let pid = self.child.as_ref().map(Child::id);
        let log = self.log.clone();
        let what = format!("curvine-node {} to start", self.data_dir.display());
        let ready = wait_for(WithLog(what, &log), Duration::from_secs(30), || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "curvine-node exited with {status} during start:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            Ready::read(&self.data_dir)
                .ok()
                .filter(|r| Some(r.pid) == pid)
        });
        self.addr = ready.client_addr;
        self.node_id = ready.node_id;
        self.http_addr = ready.http_addr;
        self.s3_addr = ready.s3_addr;
        self.cluster_addr = ready.cluster_addr;
    }

    /// Restarts the node (after a kill or a stop) on new ports.
    pub fn restart(&mut self, extra: &[&str]) {
        self.kill();
        self.spawn(extra);
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        terminate_child(&mut self.child)
    }

    /// The cluster cookie, from the node's identity file (clients prove it).
    pub fn cookie(&self) -> String {
        curvine_wire::cookie::local_cookie(&self.data_dir)
            .unwrap_or_else(|| panic!("no identity in {}", self.data_dir.display()))
    }

    /// The `tls.*` settings the node was started with (`-c tls.KEY=VALUE`),
    /// which its clients share.
    fn tls_args(&self) -> Vec<(String, String)> {
        self.args
            .windows(2)
            .filter(|w| w[0] == "-c")
            .filter_map(|w| w[1].split_once('='))
            .filter(|(k, _)| k.starts_with("tls."))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A command of the project's binary `name` that reaches this node: its
    /// cookie (and TLS settings) in the environment, no config file.
    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(bin(name));
        c.env("CURVINE_CLIENT_COOKIE", self.cookie())
            .env_remove("CURVINE_CONF");
        for (key, value) in self.tls_args() {
            c.env(
                format!("CURVINE_{}", key.replace('.', "_").to_ascii_uppercase()),
                value,
            );
        }
        c
    }

    pub fn client_conf(&self) -> ClientConf {
        let mut loader = curvine_conf::Loader::new();
        for (key, value) in self.tls_args() {
            loader
                .key_value(&format!("{key}={value}"))
                .expect("the node's tls settings");
        }
        ClientConf {
            cluster: vec![self.addr.clone()],
            cookie: self.cookie(),
            tls: loader.build().expect("the node's tls settings").tls,
            ..ClientConf::default()
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.client_conf())
            .await
            .expect("connect to node")
    }

    /// A client that reads and writes blocks on this host short-circuit or
    /// (`false`) through the data port.
    pub async fn client_short_circuit(&self, short_circuit: bool) -> Client {
        Client::connect(&ClientConf {
            short_circuit,
            ..self.client_conf()
        })
        .await
        .expect("connect to node")
    }

    /// Runs `curvine-cli --cluster ADDR args...` (arguments are bytes: a
    /// path need not be UTF-8).
    pub fn cli<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Output {
        self.command("curvine-cli")
            .args(["--cluster", &self.addr])
            .args(args)
            .output()
            .expect("run curvine-cli")
    }

    /// Runs the CLI and returns its stdout; panics with its output on
    /// failure.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "curvine-cli {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            print_warnings(&self.log);
        }
    }
}

/// The warnings and errors of a node's or mount's log (its last 40), for a
/// test that failed: the log itself goes with the test's temporary directory.
pub(crate) fn print_warnings(log: &Path) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    let from = lines.len().saturating_sub(40);
    eprintln!(
        "--- {}: {} warnings and errors, the last {}:",
        log.display(),
        lines.len(),
        lines.len() - from
    );
    for line in &lines[from..] {
        eprintln!("{line}");
    }
}

/// Each shard's Raft group as the cluster reports it (from the node
/// serving each shard): shard -> (voters, leader member id).
pub fn shard_groups(node: &NodeProcess) -> std::collections::BTreeMap<u64, (usize, u64)> {
    let out = node.cli_ok(&["--json", "report"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("report --json");
    let mut groups = std::collections::BTreeMap::new();
    for n in v["nodes"].as_array().into_iter().flatten() {
        for s in n["shards"].as_array().into_iter().flatten() {
            let g = &s["group"];
            if let (Some(shard), Some(voters), Some(leader)) = (
                s["shard"].as_u64(),
                g["voters"].as_array(),
                g["leader"].as_u64(),
            ) {
                groups.insert(shard, (voters.len(), leader));
            }
        }
    }
    groups
}

/// Waits until each of the cluster's `shards` shards has `voters` voters.
pub fn wait_for_voters(node: &NodeProcess, shards: usize, voters: usize) {
    wait_for(
        format!("every shard to have {voters} voters"),
        Duration::from_secs(60),
        || {
            let g = shard_groups(node);
            (g.len() == shards && g.values().all(|(v, _)| *v == voters)).then_some(())
        },
    );
}

/// Arguments that make a node persist fs_mode files within a second and
/// try failed uploads again within one.
pub const FAST_PERSIST: &[&str] = &[
    "-c",
    "ufs.persist_retry_delay=200ms",
    "-c",
    "ufs.persist_max_delay=1s",
    "-c",
    "ufs.persist_sweep=1s",
];

/// Arguments that make a test cluster react within seconds.
pub const FAST_CLUSTER: &[&str] = &[
    "-c",
    "cluster.cookie=test-cookie",
    "-c",
    "cluster.heartbeat=200ms",
    "-c",
    "cluster.node_timeout=2s",
    "-c",
    "cluster.rereplicate_after=3s",
];

/// N real `curvine-node` processes forming one cluster: node `i` binds to
/// 127.0.0.(i+1) and keeps its data in `dir/n{i}`; the first formats the
/// cluster and is every other node's seed.
pub struct ProcessCluster {
    pub nodes: Vec<NodeProcess>,
}

impl ProcessCluster {
    pub fn start(dir: &Path, n: usize, extra: &[&str]) -> ProcessCluster {
        let mut args: Vec<&str> = FAST_CLUSTER.to_vec();
        args.extend_from_slice(extra);
        let first = NodeProcess::start_on(&dir.join("n0"), "127.0.0.1", &args);
        let seeds = first.cluster_addr.clone();
        let mut nodes = vec![first];
        let mut with_seed = args.clone();
        with_seed.extend_from_slice(&["--seeds", &seeds]);
        // The others join at the same time, as a cluster starting up does.
        for i in 1..n {
            let data_dir = dir.join(format!("n{i}"));
            let host = format!("127.0.0.{}", i + 1);
            let mut node = NodeProcess::unstarted(&data_dir, &host, &with_seed, &[]);
            node.launch(&with_seed);
            nodes.push(node);
        }
        for node in &mut nodes[1..] {
            node.wait_started();
        }
        let cluster = ProcessCluster { nodes };
        cluster.wait_up(n);
        cluster
    }

    /// Waits until every live node sees `n` nodes up.
    pub fn wait_up(&self, n: usize) {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            wait_for(
                format!("node {} to see {n} nodes up", node.node_id),
                Duration::from_secs(30),
                || (node.members_up() == n).then_some(()),
            );
        }
    }
}

impl ProcessCluster {
    /// Waits until every live node reports node `id` as down.
    pub fn wait_down(&self, id: &str) {
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            wait_for(
                format!("node {} to see {id} down", node.node_id),
                Duration::from_secs(30),
                || (node.member_state(id).as_deref() == Some("down")).then_some(()),
            );
        }
    }
}

impl NodeProcess {
    /// Node ids holding each block of `path`, as `fs blocks --json` says.
    pub fn block_nodes(&self, path: &str) -> Vec<Vec<String>> {
        let out = self.cli_ok(&["--json", "fs", "blocks", path]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                b["info"]["locs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|l| l.as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    }

    /// The state this node reports for node `id` (`up`, `down`, ...).
    pub fn member_state(&self, id: &str) -> Option<String> {
        let out = self.cli(&["--json", "report"]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        report["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["node_id"] == id)
            .and_then(|n| n["state"].as_str().map(str::to_string))
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `Some(exit code)` once the node's process has exited by itself
    /// (`Some(None)`: killed by a signal), `None` while it runs.
    pub fn exit_status(&mut self) -> Option<Option<i32>> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        Some(status.code())
    }

    /// The node's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many nodes this node sees up (from `report --json`).
    pub fn members_up(&self) -> usize {
        let out = self.cli(&["--json", "report"]);
        if !out.status.success() {
            return 0;
        }
        let report: serde_json::Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(_) => return 0,
        };
        report["nodes"]
            .as_array()
            .map(|nodes| nodes.iter().filter(|n| n["state"] == "up").count())
            .unwrap_or(0)
    }
}

/// A process's peak resident memory (`VmHWM`) in bytes, and its open file
/// descriptors.
pub fn process_usage(pid: u32) -> (u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let peak = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (peak, fds)
}

/// Waits until the node reports no pending cross-shard operations (or 30s
/// pass: callers check the report).
pub async fn settle(client: &Client) -> curvine_messages::rpc::FsckReport {
    let deadline = Instant::now() + Duration::from_secs(30);
    wait_for_async(
        "cross-shard operations to settle",
        Duration::from_secs(60),
        || async {
            let report = client.fsck().await.expect("fsck");
            ((report.pending_intents == 0 && report.locks == 0) || Instant::now() > deadline)
                .then_some(report)
        },
    )
    .await
}

/// N real nodes in this process (one tokio runtime), each with its own
/// data directory and ports on 127.0.0.1, joined through the first.
pub struct InProcessCluster {
    pub nodes: Vec<curvine_node::node::RunningNode>,
}

impl InProcessCluster {
    pub async fn start(dir: &Path, n: usize) -> InProcessCluster {
        let mut nodes: Vec<curvine_node::node::RunningNode> = Vec::new();
        for i in 0..n {
            let mut config = curvine_conf::Config::default();
            let data_dir = dir.join(format!("p{i}"));
            config.node.data_dir = data_dir.display().to_string();
            config.node.listen = "127.0.0.1:0".into();
            config.node.cluster_listen = "127.0.0.1:0".into();
            config.data.listen = "127.0.0.1:0".into();
            config.data.tiers = vec![format!(
                "[MEM:256MiB]{}",
                data_dir.with_extension("mem").display()
            )];
            config.cluster.cookie = "test-cookie".into();
            config.cluster.heartbeat = curvine_conf::Dur(Duration::from_millis(200));
            config.cluster.node_timeout = curvine_conf::Dur(Duration::from_secs(2));
            if let Some(first) = nodes.first() {
                config.node.seeds = vec![first.cluster_addr.clone()];
            }
            let node = curvine_node::node::start(&config)
                .await
                .unwrap_or_else(|e| panic!("in-process node {i}: {e}"));
            nodes.push(node);
        }
        for node in &nodes {
            wait_for_async(
                "in-process nodes to meet",
                Duration::from_secs(30),
                || async { (node.view.live().len() >= n).then_some(()) },
            )
            .await;
        }
        InProcessCluster { nodes }
    }

    pub async fn client(&self, i: usize) -> Client {
        Client::connect(&ClientConf {
            cluster: vec![self.nodes[i].rpc_addr.clone()],
            cookie: "test-cookie".into(),
            ..ClientConf::default()
        })
        .await
        .expect("connect to in-process node")
    }

    pub async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}

/// `len` reproducible random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A two-thread runtime, as the tests' clients use.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Writes `bytes` as a new file at `path` with 1 MiB blocks and `replicas`
/// copies, through the client library; panics on failure.
pub async fn write_file(c: &Client, path: &str, bytes: &[u8], replicas: u16) {
    use curvine_client::io::{FileWriter, WriteOptions};
    let options = WriteOptions {
        spec: curvine_messages::block::FileSpec {
            block_size: 1 << 20,
            replicas,
            storage: None,
        },
        ..WriteOptions::create()
    };
    let mut w = FileWriter::open(c, path, &options)
        .await
        .unwrap_or_else(|e| panic!("create {path}: {e}"));
    w.write(bytes)
        .await
        .unwrap_or_else(|e| panic!("write {path}: {e}"));
    w.close()
        .await
        .unwrap_or_else(|e| panic!("close {path}: {e}"));
}

/// A whole file through the client library.
pub async fn read_file(c: &Client, path: &str) -> curvine_messages::FsResult<Vec<u8>> {
    let mut r = curvine_client::io::FileReader::open(c, path).await?;
    let mut out = Vec::new();
    r.read_to_end(&mut out).await?;
    Ok(out)
}

/// Runs a Python `script` (with `python3`, without `AWS_CA_BUNDLE`, which
/// some S3 clients cannot build with); its standard output, or a panic
/// with both outputs. `what` names the script in the panic.
pub fn python_script(what: &str, script: &str) -> String {
    python_script_with("python3", what, script)
}

/// [`python_script`] with another interpreter. The script runs from a file,
/// so processes it spawns (multiprocessing's "spawn") can import its
/// `__main__`.
pub fn python_script_with(python: &str, what: &str, script: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("script.py");
    std::fs::write(&file, script).unwrap();
    let out = Command::new(python)
        .arg(&file)
        .env_remove("AWS_CA_BUNDLE")
        .output()
        .unwrap_or_else(|e| panic!("{python} runs: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed (line numbers count from its prelude):\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The test S3 server the test command started (`integration/s3-server.sh`):
/// its endpoint, credentials and bucket. Under `CI` it must be there;
/// elsewhere tests that need it are skipped with a message.
pub struct TestS3 {
    pub endpoint: String,
    pub access: String,
    pub secret: String,
    pub bucket: String,
}

impl TestS3 {
    pub fn get() -> Option<TestS3> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        match (
            var("UFS_TEST_S3_ENDPOINT"),
            var("UFS_TEST_S3_ACCESS"),
            var("UFS_TEST_S3_SECRET"),
            var("UFS_TEST_S3_BUCKET"),
        ) {
            (Some(endpoint), Some(access), Some(secret), Some(bucket)) => Some(TestS3 {
                endpoint,
                access,
                secret,
                bucket,
            }),
            _ => {
                assert!(
                    std::env::var("CI").is_err(),
                    "CI runs the S3 tests: start the test S3 server (integration/s3-server.sh)"
                );
                eprintln!("no test S3 server (UFS_TEST_S3_*): skipping");
                None
            }
        }
    }

    /// A fresh prefix in the test bucket: `s3://bucket/<name>-<random>`.
    pub fn location(&self, name: &str) -> String {
        format!("s3://{}/{name}-{:08x}", self.bucket, rand::random::<u32>())
    }

    /// The `-c` properties of a mount, with `secret` as the secret key.
    pub fn props_with(&self, secret: &str) -> Vec<String> {
        [
            format!("s3.endpoint_url={}", self.endpoint),
            format!("s3.credentials.access={}", self.access),
            format!("s3.credentials.secret={secret}"),
            "s3.region_name=us-east-1".to_string(),
            "s3.force.path.style=true".to_string(),
        ]
        .into_iter()
        .flat_map(|p| ["-c".to_string(), p])
        .collect()
    }

    pub fn props(&self) -> Vec<String> {
        self.props_with(&self.secret)
    }

    /// A client of the location, to change objects behind the cluster's back.
    pub fn ufs(&self, location: &str) -> curvine_actors::ufs::Ufs {
        let props: std::collections::BTreeMap<String, String> = [
            ("s3.endpoint_url", self.endpoint.as_str()),
            ("s3.credentials.access", self.access.as_str()),
            ("s3.credentials.secret", self.secret.as_str()),
            ("s3.region_name", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        curvine_actors::ufs::Ufs::new(
            &curvine_actors::ufs::UfsUri::parse(location).expect("location"),
            &props,
            &curvine_actors::ufs::UfsOptions::default(),
        )
        .expect("UFS client")
    }
}

/// Makes a certificate authority in `dir` (on first use) and a certificate
/// `dir/NAME.pem` with its key for `hosts`, with `conf/make-certs.sh`, the
/// script the README gives users.
pub fn make_certs(dir: &Path, name: &str, hosts: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/make-certs.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(dir)
        .args(["--name", name])
        .args(hosts)
        .output()
        .expect("run conf/make-certs.sh");
    assert!(
        out.status.success(),
        "make-certs.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `-c` arguments that turn TLS on with the CA of `dir` and the certificate `NAME`.
pub fn tls_args(dir: &Path, name: &str) -> Vec<String> {
    let file = |f: &str| dir.join(f).display().to_string();
    [
        "tls.enabled=true".to_string(),
        format!("tls.ca={}", file("ca.pem")),
        format!("tls.cert={}", file(&format!("{name}.pem"))),
        format!("tls.key={}", file(&format!("{name}.key"))),
    ]
    .into_iter()
    .flat_map(|kv| ["-c".to_string(), kv])
    .collect()
}
