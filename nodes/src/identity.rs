//! The node's data directory: identity of the cluster and the node, kept
//! across restarts, and a lock so that only one process uses it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rand::Rng;
use serde::{Deserialize, Serialize};

use curvine_conf::Config;
use curvine_wire::cookie::IDENTITY_FILE;

/// Version of the identity file's layout.
const IDENTITY_VERSION: u32 = 1;
/// Present once the node was decommissioned: it does not start again.
const LEFT_FILE: &str = "LEFT";

/// Records in `data_dir` that the node left its cluster for good.
pub fn mark_left(data_dir: &Path, cluster_id: &str) -> std::io::Result<()> {
    let text = format!(
        "left cluster {cluster_id} at {} (unix seconds) after a decommission\n",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    let tmp = data_dir.join(format!("{LEFT_FILE}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, data_dir.join(LEFT_FILE))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub version: u32,
    pub cluster_id: String,
    pub cluster_name: String,
    pub node_id: String,
    pub shard_count: u32,
    pub cookie: String,
    /// `node` or `shard` (see `meta.layout`). Directories formatted before
    /// the key existed used one environment per shard.
    #[serde(default = "per_shard_layout")]
    pub meta_layout: String,
    /// This node formatted the cluster (it wrote the first cluster map).
    /// Directories from before clusters could be joined were all founders.
    #[serde(default = "yes")]
    pub founder: bool,
}

fn yes() -> bool {
    true
}

fn per_shard_layout() -> String {
    "shard".into()
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot use data directory {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("data directory {path} is in use by another curvine-node process")]
    Locked { path: String },
    #[error("{path} is not a valid identity file: {reason}")]
    Invalid { path: String, reason: String },
    #[error(
        "this node was decommissioned and left its cluster ({reason}); remove the data directory {path} to use this machine as a new node"
    )]
    Left { path: String, reason: String },
    #[error(
        "a new node joining the cluster of {seeds:?} needs the cluster's cookie: set cluster.cookie \
         (it is in identity.toml in the data directory of any member)"
    )]
    NeedCookie { seeds: Vec<String> },
    #[error(
        "{path} was written by a newer release (layout {found}, this release reads {supported})"
    )]
    Newer {
        path: String,
        found: u32,
        supported: u32,
    },
}

fn random_hex(bytes: usize) -> String {
    let mut rng = rand::thread_rng();
    (0..bytes)
        .map(|_| format!("{:02x}", rng.gen::<u8>()))
        .collect()
}

/// An open data directory, locked for this process while the value lives.
pub struct DataDir {
    pub path: PathBuf,
    pub identity: Identity,
    pub formatted_now: bool,
    /// The directory is new and the node joins the cluster of its seeds:
    /// `identity` is provisional (node id and cookie only) until
    /// [`DataDir::adopt`] records the cluster it joined.
    pub joining: bool,
    _lock: File,
}

impl DataDir {
    /// Opens the data directory, formatting a new cluster on first use.
    pub fn open(path: &Path, config: &Config) -> Result<DataDir, IdentityError> {
        let io = |reason: std::io::Error| IdentityError::Io {
            path: path.display().to_string(),
            reason: reason.to_string(),
        };
        std::fs::create_dir_all(path).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("LOCK"))
            .map_err(io)?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(IdentityError::Locked {
                path: path.display().to_string(),
            });
        }
        if let Ok(reason) = std::fs::read_to_string(path.join(LEFT_FILE)) {
            return Err(IdentityError::Left {
                path: path.display().to_string(),
                reason: reason.trim().to_string(),
            });
        }
        let file = path.join(IDENTITY_FILE);
        let shown = file.display().to_string();
        let (identity, formatted_now) = if file.exists() {
            // Files written before it was private: make it so (best effort).
            {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600));
            }
            let text = std::fs::read_to_string(&file).map_err(io)?;
            let identity: Identity = toml::from_str(&text).map_err(|e| IdentityError::Invalid {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
            if identity.version > IDENTITY_VERSION {
                return Err(IdentityError::Newer {
                    path: shown,
                    found: identity.version,
                    supported: IDENTITY_VERSION,
                });
            }
            (identity, false)
        } else if !config.node.seeds.is_empty() {
            if config.cluster.cookie.is_empty() {
                return Err(IdentityError::NeedCookie {
                    seeds: config.node.seeds.clone(),
                });
            }
            let identity = Identity {
                version: IDENTITY_VERSION,
                cluster_id: String::new(),
                cluster_name: String::new(),
                node_id: random_hex(6),
                shard_count: 0,
                meta_layout: config.meta.layout.clone(),
                cookie: config.cluster.cookie.clone(),
                founder: false,
            };
            return Ok(DataDir {
                path: path.to_path_buf(),
                identity,
                formatted_now: false,
                joining: true,
                _lock: lock,
            });
        } else {
            let identity = Identity {
                version: IDENTITY_VERSION,
                cluster_id: random_hex(8),
                cluster_name: config.cluster.name.clone(),
                node_id: random_hex(6),
                shard_count: config.cluster.shards,
                meta_layout: config.meta.layout.clone(),
                cookie: if config.cluster.cookie.is_empty() {
                    random_hex(16)
                } else {
                    config.cluster.cookie.clone()
                },
                founder: true,
            };
            write_identity(path, &identity)?;
            (identity, true)
        };
        Ok(DataDir {
            path: path.to_path_buf(),
            identity,
            formatted_now,
            joining: false,
            _lock: lock,
        })
    }

    /// Records the cluster a joining node was admitted to.
    pub fn adopt(
        &mut self,
        info: &curvine_messages::cluster::JoinInfo,
    ) -> Result<(), IdentityError> {
        self.identity.cluster_id = info.cluster_id.clone();
        self.identity.cluster_name = info.cluster_name.clone();
        self.identity.shard_count = info.shard_count;
        self.identity.meta_layout = info.meta_layout.clone();
        write_identity(&self.path, &self.identity)?;
        self.joining = false;
        self.formatted_now = true;
        Ok(())
    }

    /// Where [`curvine_actors::membership`] keeps the known nodes and map.
    pub fn members_file(&self) -> PathBuf {
        self.path.join("members.toml")
    }

    /// Directory of the LMDB environment that holds a shard's databases.
    pub fn shard_env_path(&self, shard: u16) -> PathBuf {
        if self.identity.meta_layout == "shard" {
            self.path.join("shards").join(format!("{shard:03}"))
        } else {
            self.path.join("meta")
        }
    }
}

/// Writes the identity file by rename, so a crash never leaves half of it.
fn write_identity(path: &Path, identity: &Identity) -> Result<(), IdentityError> {
    let io = |reason: std::io::Error| IdentityError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    };
    let file = path.join(IDENTITY_FILE);
    let text = toml::to_string(identity).map_err(|e| IdentityError::Invalid {
        path: file.display().to_string(),
        reason: e.to_string(),
    })?;
    let tmp = path.join(format!("{IDENTITY_FILE}.tmp"));
    // It holds the cluster cookie: only its owner may read it.
    let mut f = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io)?
    };
    f.write_all(text.as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, &file).map_err(io)?;
    File::open(path).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}
