//! A FUSE mount of a test node: a `curvine-fuse mount` process in the
//! foreground, cleared when dropped.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::{kill_child, print_warnings, terminate_child, wait_for, NodeProcess, WithLog};

/// A `curvine-fuse mount` process in the foreground on `dir`.
pub struct FuseMount {
    pub dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
}

impl FuseMount {
    /// Mounts the node's namespace on `dir` (created if missing) and waits
    /// until the mount answers.
    pub fn start(node: &NodeProcess, dir: &Path, extra: &[&str]) -> FuseMount {
        if let Err(e) = std::fs::create_dir_all(dir) {
            // A dead mount there is the mount command's to clear.
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::AlreadyExists,
                "mount point: {e}"
            );
        }
        let log = dir.with_extension("fuse.log");
        let out = std::fs::File::create(&log).expect("fuse log");
        let err = out.try_clone().expect("fuse log");
        let child = node
            .command("curvine-fuse")
            .args(["--cluster", &node.addr, "mount"])
            .arg(dir)
            // Metrics on a free port: mounts of parallel tests never collide.
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(extra)
            .env_remove("CURVINE_CONF")
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start curvine-fuse");
        let mut m = FuseMount {
            dir: dir.to_path_buf(),
            log,
            child: Some(child),
        };
        m.wait_mounted();
        m
    }

    fn wait_mounted(&mut self) {
        let log = self.log.clone();
        let what = format!("{} to be mounted", self.dir.display());
        wait_for(WithLog(what, &log), Duration::from_secs(30), || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "curvine-fuse exited ({status}) before mounting: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            (curvine_fuse::mountpoint::is_mounted(&self.dir)
                && !curvine_fuse::mountpoint::is_dead(&self.dir))
            .then_some(())
        });
    }

    /// The mount's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The address of the mount's `/metrics` (from its log).
    pub fn metrics_addr(&self) -> Option<String> {
        self.log_text()
            .lines()
            .find_map(|l| l.split("metrics on http://").nth(1))
            .and_then(|rest| rest.split('/').next())
            .map(str::to_string)
    }

    /// The sum of the mount's Prometheus samples of metric `name` whose
    /// labels contain `label` (`call="DirOps"`).
    pub fn counter(&self, name: &str, label: &str) -> u64 {
        let addr = self.metrics_addr().expect("the mount serves metrics");
        let (status, body) = crate::http_get(&addr, "/metrics");
        assert_eq!(status, 200);
        body.lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// SIGKILL: the mount is left dead.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        terminate_child(&mut self.child)
    }

    /// Waits for the process to exit by itself (after an unmount).
    pub fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel.trim_start_matches('/'))
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if std::thread::panicking() {
            print_warnings(&self.log);
        }
        if self.child.is_some() {
            self.terminate();
        }
        if curvine_fuse::mountpoint::is_mounted(&self.dir) {
            let _ = curvine_fuse::mountpoint::clear(&self.dir);
        }
    }
}

/// A command that runs `program` in a mount namespace of its own where
/// `/sbin/mount.fuse.curvine` is a link to this build's `curvine-fuse`
/// (the link the README has an administrator make once per host), so that
/// mount(8) finds the helper without the test changing the host's `/sbin`:
/// the namespace's `/sbin` is a read-only overlay of a directory holding
/// the link over the real one. Mounts made inside stay inside; a remount
/// changes the one file system, seen everywhere.
pub fn with_mount_helper(
    dir: &Path,
    program: impl AsRef<std::ffi::OsStr>,
) -> std::process::Command {
    let links = dir.join("helper-sbin");
    std::fs::create_dir_all(&links).expect("helper directory");
    let link = links.join("mount.fuse.curvine");
    if !link.exists() {
        std::os::unix::fs::symlink(crate::bin("curvine-fuse"), &link).expect("helper link");
    }
    let sbin = std::fs::canonicalize("/sbin").expect("/sbin");
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount -t overlay curvine-helper -o "lowerdir=$0:$1" "$1" && shift && exec "$@""#)
        .arg(&links)
        .arg(sbin)
        .arg(program);
    cmd
}
