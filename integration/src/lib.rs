//! Test harness: real `curvine-node` processes and the real CLI, plus a
//! simple in-memory model of the namespace to compare against.

pub mod model;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use curvine_conf::ClientConf;
use curvine_node::Client;

/// Directory holding the workspace's built binaries.
pub fn bin_dir() -> PathBuf {
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

/// A node process with its own data directory.
pub struct NodeProcess {
    pub data_dir: PathBuf,
    pub addr: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl NodeProcess {
    /// Starts a node on free ports and waits until it serves clients.
    pub fn start(data_dir: &Path, extra: &[&str]) -> NodeProcess {
        let log = data_dir.with_extension("log");
        let mut node = NodeProcess {
            data_dir: data_dir.to_path_buf(),
            addr: String::new(),
            log,
            child: None,
        };
        node.spawn(extra);
        node
    }

    fn spawn(&mut self, extra: &[&str]) {
        let log_file = std::fs::File::create(&self.log).expect("node log");
        // Blocks stay inside the test's directory unless the test names tiers.
        let tiers = format!(
            "data.tiers=[MEM:512MiB]{}",
            self.data_dir.with_extension("mem").display()
        );
        let child = Command::new(bin("curvine-node"))
            .args(["start", "--data-dir"])
            .arg(&self.data_dir)
            .args([
                "--listen",
                "127.0.0.1:0",
                "-c",
                "node.cluster_listen=127.0.0.1:0",
                "-c",
                "data.listen=127.0.0.1:0",
                "-c",
                &tiers,
            ])
            .args(extra)
            .env_remove("CURVINE_CONF")
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start curvine-node");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut text = String::new();
            if let Ok(mut f) = std::fs::File::open(&self.log) {
                let _ = f.read_to_string(&mut text);
            }
            if let Some(line) = text.lines().find(|l| l.contains("serving clients on ")) {
                let rest = line.split("serving clients on ").nth(1).unwrap_or_default();
                self.addr = rest
                    .split_whitespace()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("curvine-node exited with {status} during start:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "curvine-node did not start in 30s:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Restarts the node (after a kill or a stop) on new ports.
    pub fn restart(&mut self, extra: &[&str]) {
        self.kill();
        self.spawn(extra);
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        child.wait().ok().and_then(|s| s.code())
    }

    pub fn client_conf(&self) -> ClientConf {
        ClientConf {
            cluster: vec![self.addr.clone()],
            ..ClientConf::default()
        }
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.client_conf())
            .await
            .expect("connect to node")
    }

    /// Runs `curvine-cli --cluster ADDR args...`.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin("curvine-cli"))
            .args(["--cluster", &self.addr])
            .args(args)
            .env_remove("CURVINE_CONF")
            .output()
            .expect("run curvine-cli")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until the node reports no pending cross-shard operations.
pub async fn settle(client: &Client) -> curvine_messages::rpc::FsckReport {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let report = client.fsck().await.expect("fsck");
        if (report.pending_intents == 0 && report.locks == 0) || Instant::now() > deadline {
            return report;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
