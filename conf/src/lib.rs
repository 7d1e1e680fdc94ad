//! Configuration of nodes and clients.
//!
//! Every key has a default ([`Config::default`]); `conf/curvine.toml` documents
//! each one. Sources apply in this order, later ones winning: defaults, the
//! file (`--conf` or `CURVINE_CONF`), `CURVINE_*` environment variables
//! (`node.data_dir` is `CURVINE_NODE_DATA_DIR`), then command-line flags and
//! `-c key=value`. An unknown key or a bad value stops loading with an error
//! that names the key, the value and what is allowed.

mod units;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

pub use units::{ByteSize, Dur};

/// Environment variable naming the config file.
pub const CONF_ENV: &str = "CURVINE_CONF";
/// Prefix of environment variables that set keys.
pub const ENV_PREFIX: &str = "CURVINE_";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[derive(Default)]
pub struct Config {
    pub cluster: ClusterConf,
    pub node: NodeConf,
    pub meta: MetaConf,
    pub data: DataConf,
    pub client: ClientConf,
    pub supervisor: SupervisorConf,
    pub ufs: UfsConf,
    pub fuse: FuseConf,
    pub log: LogConf,
    pub trace: TraceConf,
    pub http: HttpConf,
    pub tls: TlsConf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConf {
    /// Human name of the cluster, recorded when it is formatted.
    pub name: String,
    /// Shared secret of the cluster's nodes. Empty: generated when the cluster
    /// is formatted and kept in the data directory.
    pub cookie: String,
    /// Number of namespace shards, fixed when the cluster is formatted (1..=256).
    pub shards: u32,
    /// How often a node tells the others it is alive.
    pub heartbeat: Dur,
    /// A node not heard from for this long is marked down: requests to its
    /// shards and blocks fail at once (EIO naming it) instead of waiting.
    pub node_timeout: Dur,
    /// How long a new node waits for its seeds before giving up.
    pub join_timeout: Dur,
    /// Blocks with a replica on a node down for this long get a new replica
    /// on a live node, copied from a surviving one.
    pub rereplicate_after: Dur,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConf {
    /// Where the node keeps its identity and shard environments. Empty: the
    /// default for the user (`$HOME/.curvine/data`, or `/var/lib/curvine` without HOME).
    pub data_dir: String,
    /// Address of the client port (`host:port`).
    pub listen: String,
    /// Address of the cluster port for node-to-node messages. Empty: the
    /// client port's host with port + 1.
    pub cluster_listen: String,
    /// Nodes of the cluster to join (`host:port` of their cluster ports).
    pub seeds: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaConf {
    /// Where a node keeps its shards' databases, fixed when the cluster is
    /// formatted: `node` (one LMDB environment for all shards of the node, so
    /// concurrent changes to any shards share one commit) or `shard` (one
    /// environment per shard).
    pub layout: String,
    /// Fsync every commit (its log record, with `wal`) before acknowledging
    /// it. Turning this off trades the last acknowledged operations on a
    /// machine crash for speed.
    pub sync_commit: bool,
    /// Make commits durable with a write-ahead log (one sequential write and
    /// fdatasync per commit) and flush LMDB at checkpoints, instead of
    /// LMDB's own synced commits (an fdatasync of every page changed).
    pub wal: bool,
    /// Preallocated size of each environment's log.
    pub wal_size: ByteSize,
    /// Longest time between checkpoints while changes arrive; a restart
    /// applies at most this much of the log.
    pub checkpoint_interval: Dur,
    /// Most mutations grouped into one write transaction.
    pub group_commit_max: u32,
    /// How long a commit waits for more mutations when the previous commit
    /// carried several (concurrent callers); 0 turns the wait off.
    pub commit_delay: Dur,
    /// Largest size of one shard's LMDB environment (address space reserved,
    /// not disk used).
    pub map_size: ByteSize,
    /// Concurrent read transactions per shard environment.
    pub max_readers: u32,
    /// Step records of finished cross-shard operations older than this are swept.
    pub op_record_ttl: Dur,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConf {
    /// Address of the data port (`host:port`). Empty: the client port's host
    /// with port + 2.
    pub listen: String,
    /// Storage tiers as `[TYPE:CAPACITY]path` with TYPE one of MEM, SSD, HDD,
    /// fastest first. Empty: one MEM tier in `/dev/shm/curvine/<node id>`
    /// sized to a quarter of the machine's memory (at most half of /dev/shm).
    pub tiers: Vec<String>,
    /// Block size of new files (a multiple of 64KiB).
    pub block_size: ByteSize,
    /// Replicas of each block of new files.
    pub replicas: u32,
    /// A writer whose lease is not renewed for this long (it adds a block or
    /// closes) loses the file to the next writer.
    pub write_lease: Dur,
    /// Tier usage above which the evictor starts demoting blocks.
    pub high_watermark: f64,
    /// Tier usage the evictor brings a tier down to.
    pub low_watermark: f64,
    /// How often each tier's evictor checks its tier.
    pub evict_interval: Dur,
    /// Blocks on disk that no file references are removed after this long.
    pub orphan_grace: Dur,
    /// Fsync block files on SSD and HDD tiers before a write is acknowledged.
    pub sync_blocks: bool,
    /// How long an access token for a block stays valid.
    pub token_ttl: Dur,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConf {
    /// Nodes the client tries, in order (`host:port` of their client ports).
    pub cluster: Vec<String>,
    /// Longest time to open a connection to a node (TCP, and TLS when on).
    pub connect_timeout: Dur,
    /// Longest time a request may take; also how long a data-port block
    /// transfer may stall before it fails.
    pub request_timeout: Dur,
    /// Connections the client library opens to a node (requests are spread over them).
    pub connections: u32,
    /// Read and write block files directly when the block's node runs on
    /// this host (after the node grants it).
    pub short_circuit: bool,
    /// Blocks a sequential reader fetches ahead of the one it reads.
    pub read_ahead: u32,
    /// The cluster's cookie, which the client proves to the node it
    /// connects to. Empty: `cluster.cookie`, else the cookie of the node
    /// whose data directory is `node.data_dir`, when readable.
    pub cookie: String,
    /// The `[tls]` section, copied here by the client library's
    /// `client_conf` (not a key of its own).
    #[serde(skip)]
    pub tls: TlsConf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisorConf {
    /// Delay before the first restart of a failed actor; doubles per restart.
    pub restart_backoff: Dur,
    /// Longest delay between restarts.
    pub max_backoff: Dur,
    /// Restarts allowed within `restart_window` before the failure escalates.
    pub max_restarts: u32,
    pub restart_window: Dur,
}

/// Under-file-systems (S3, local directories) mounted into the namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UfsConf {
    /// Longest time one UFS request may take (a whole stat, list page or
    /// part upload) before it is retried or fails.
    pub timeout: Dur,
    /// Longest wait for the next bytes of a UFS read or write.
    pub io_timeout: Dur,
    /// Retries of a UFS request that failed in a way worth retrying
    /// (throttling, 5xx, a dropped connection), with exponential backoff.
    pub retries: u32,
    /// First retry delay; doubles per retry up to `retry_max_delay`.
    pub retry_min_delay: Dur,
    pub retry_max_delay: Dur,
    /// Part size of multipart uploads (S3 needs at least 5MiB).
    pub part_size: ByteSize,
    /// Parts of one upload sent at once.
    pub upload_concurrency: u32,
    /// Entries asked for per UFS listing request.
    pub list_page: u32,
    /// How long cached metadata and data of a cache_mode file is trusted
    /// before the UFS object is checked again (a mount's `--check-interval`
    /// overrides it; 0 checks on every open).
    pub check_interval: Dur,
    /// Load or persist tasks a node's UFS loaders run at once.
    pub loaders: u32,
    /// First delay before a failed fs_mode persist is tried again; doubles
    /// per attempt up to `persist_max_delay`.
    pub persist_retry_delay: Dur,
    pub persist_max_delay: Dur,
    /// How often fs_mode mounts are walked for files still waiting to be
    /// persisted (the journal normally persists them within a second).
    pub persist_sweep: Dur,
}

/// The FUSE mount (`curvine-fuse`, `curvine-cli fuse mount`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FuseConf {
    /// Directory of the namespace the mount shows.
    pub fs_path: String,
    /// Threads reading requests from the kernel, each with its own
    /// /dev/fuse descriptor (requests are answered from async tasks).
    pub threads: u32,
    /// Largest write request the kernel sends.
    pub max_write: ByteSize,
    /// Readahead asked of the kernel for a sequential reader; it is capped
    /// at what the kernel allows (its max pages per request and the mount's
    /// read_ahead_kb, which the mount raises to this value when root).
    pub max_readahead: ByteSize,
    /// Let the kernel send several reads of one file at once.
    pub async_read: bool,
    /// Answer directory reads with attributes (one request per page of
    /// entries instead of a lookup per entry).
    pub readdirplus: bool,
    /// Let the kernel run lookups and directory reads of one directory in
    /// parallel.
    pub parallel_dirops: bool,
    /// How long the kernel trusts a name it looked up.
    pub entry_timeout: Dur,
    /// How long the kernel trusts attributes it got.
    pub attr_timeout: Dur,
    /// How long the kernel remembers that a name does not exist (0: not at all).
    pub negative_timeout: Dur,
    /// How long the mount process trusts attributes and names it fetched
    /// from the cluster before asking again (0: always ask).
    pub meta_cache_ttl: Dur,
    /// Keep the kernel's page cache of a file across opens while the file
    /// is unchanged (same size, mtime and ctime).
    pub keep_cache: bool,
    /// Let the kernel gather writes in its page cache and send them in large
    /// batches (faster small writes; data reaches the cluster at flush).
    pub writeback_cache: bool,
    /// Bypass the kernel's page cache for every file (each read and write
    /// goes to the cluster).
    pub direct_io: bool,
    /// Serve reads of files whose data is one block kept on this host
    /// straight from the block file in the kernel (FUSE passthrough, Linux
    /// 6.9 and later, root only).
    pub passthrough: bool,
    /// Let other users than the one who mounted use the mount.
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode, owner and group of
    /// each file.
    pub default_permissions: bool,
    /// Directory for the data of random writes until the file is flushed
    /// (empty: the system's temporary directory).
    pub stage_dir: String,
    /// Block size of files created through the mount (0: the cluster's
    /// `data.block_size`). A file of one block can be read by passthrough.
    pub block_size: ByteSize,
    /// Address of the mount process's Prometheus `/metrics` (`off`: none).
    /// A port already taken is logged and the mount goes on without it.
    pub metrics_listen: String,
}

impl Default for FuseConf {
    fn default() -> Self {
        FuseConf {
            fs_path: "/".into(),
            threads: 4,
            max_write: ByteSize(1 << 20),
            max_readahead: ByteSize(16 << 20),
            async_read: true,
            readdirplus: true,
            parallel_dirops: true,
            entry_timeout: Dur(std::time::Duration::from_secs(1)),
            attr_timeout: Dur(std::time::Duration::from_secs(1)),
            negative_timeout: Dur(std::time::Duration::from_secs(0)),
            meta_cache_ttl: Dur(std::time::Duration::from_secs(1)),
            keep_cache: true,
            writeback_cache: false,
            direct_io: false,
            passthrough: false,
            allow_other: false,
            default_permissions: true,
            stage_dir: String::new(),
            block_size: ByteSize(0),
            metrics_listen: "127.0.0.1:8999".into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConf {
    /// Address of the node's HTTP port (dashboard, `/api/*`, Prometheus
    /// `/metrics`). Empty: loopback on the client port + 3; `off`: no HTTP
    /// port. Bind it beyond loopback only on a trusted network.
    pub listen: String,
    /// Bearer token every request to the node's HTTP port and the FUSE
    /// mount's metrics must present (`Authorization: Bearer TOKEN`; the
    /// dashboard also takes `/?token=TOKEN` once and keeps it in a cookie).
    /// Empty: none asked.
    pub token: String,
}

/// TLS on the cluster, client and data ports. Nodes and clients of one
/// cluster must agree on `enabled` and `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConf {
    /// Encrypt the cluster port (mutual TLS between nodes), the client port
    /// and, with `data`, the data port.
    pub enabled: bool,
    /// PEM file with this node's certificate chain (a node needs one; a
    /// client may present one).
    pub cert: String,
    /// PEM file with the private key of `cert` (PKCS#8, PKCS#1 or SEC1).
    pub key: String,
    /// PEM file with the certificate authorities that sign the cluster's
    /// node certificates: nodes and clients accept only peers they sign.
    pub ca: String,
    /// The name the nodes' certificates are checked against. Empty: the
    /// host (name or IP address) of the address dialed.
    pub server_name: String,
    /// Encrypt the data port too (block reads then copy through user space
    /// instead of sendfile). Short-circuit access on a node's own host is
    /// unaffected.
    pub data: bool,
    /// Longest time a TLS handshake may take before the connection is dropped.
    pub handshake_timeout: Dur,
}

impl Default for TlsConf {
    fn default() -> Self {
        TlsConf {
            enabled: false,
            cert: String::new(),
            key: String::new(),
            ca: String::new(),
            server_name: String::new(),
            data: true,
            handshake_timeout: Dur(std::time::Duration::from_secs(10)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceConf {
    /// Trace events each node keeps in memory (the oldest go first).
    pub ring_events: u32,
    /// Share of requests traced (0 to 1); a traced command (`curvine-cli
    /// trace -- ...`) is always traced.
    pub sample_rate: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConf {
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace`, or a tracing
    /// directive such as `info,curvine_actors=debug`.
    pub level: String,
}

impl Default for ClusterConf {
    fn default() -> Self {
        ClusterConf {
            name: "curvine".into(),
            cookie: String::new(),
            shards: 16,
            heartbeat: Dur(std::time::Duration::from_secs(1)),
            node_timeout: Dur(std::time::Duration::from_secs(10)),
            join_timeout: Dur(std::time::Duration::from_secs(30)),
            rereplicate_after: Dur(std::time::Duration::from_secs(300)),
        }
    }
}

impl Default for NodeConf {
    fn default() -> Self {
        NodeConf {
            data_dir: String::new(),
            listen: "127.0.0.1:8995".into(),
            cluster_listen: String::new(),
            seeds: Vec::new(),
        }
    }
}

impl Default for MetaConf {
    fn default() -> Self {
        MetaConf {
            layout: "node".into(),
            sync_commit: true,
            wal: true,
            wal_size: ByteSize(16 << 20),
            checkpoint_interval: Dur(std::time::Duration::from_millis(100)),
            group_commit_max: 512,
            commit_delay: Dur(std::time::Duration::from_micros(200)),
            map_size: ByteSize(32 << 30),
            max_readers: 126,
            op_record_ttl: Dur(std::time::Duration::from_secs(24 * 3600)),
        }
    }
}

impl Default for ClientConf {
    fn default() -> Self {
        ClientConf {
            cluster: vec!["127.0.0.1:8995".into()],
            connect_timeout: Dur(std::time::Duration::from_secs(5)),
            request_timeout: Dur(std::time::Duration::from_secs(60)),
            connections: 2,
            short_circuit: true,
            read_ahead: 1,
            cookie: String::new(),
            tls: TlsConf::default(),
        }
    }
}

impl Default for UfsConf {
    fn default() -> Self {
        UfsConf {
            timeout: Dur(std::time::Duration::from_secs(60)),
            io_timeout: Dur(std::time::Duration::from_secs(20)),
            retries: 4,
            retry_min_delay: Dur(std::time::Duration::from_millis(200)),
            retry_max_delay: Dur(std::time::Duration::from_secs(5)),
            part_size: ByteSize(8 << 20),
            upload_concurrency: 4,
            list_page: 1000,
            check_interval: Dur(std::time::Duration::from_secs(60)),
            loaders: 8,
            persist_retry_delay: Dur(std::time::Duration::from_secs(1)),
            persist_max_delay: Dur(std::time::Duration::from_secs(300)),
            persist_sweep: Dur(std::time::Duration::from_secs(30)),
        }
    }
}

impl Default for DataConf {
    fn default() -> Self {
        DataConf {
            listen: String::new(),
            tiers: Vec::new(),
            block_size: ByteSize(64 << 20),
            replicas: 1,
            write_lease: Dur(std::time::Duration::from_secs(60)),
            high_watermark: 0.9,
            low_watermark: 0.8,
            evict_interval: Dur(std::time::Duration::from_secs(1)),
            orphan_grace: Dur(std::time::Duration::from_secs(600)),
            sync_blocks: true,
            token_ttl: Dur(std::time::Duration::from_secs(24 * 3600)),
        }
    }
}

/// A storage tier as configured: `[TYPE:CAPACITY]path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    /// `MEM`, `SSD` or `HDD`.
    pub kind: String,
    pub capacity: u64,
    pub path: PathBuf,
}

impl TierSpec {
    pub fn parse(text: &str) -> Result<TierSpec, String> {
        let bad = |why: &str| {
            format!("tier {text:?}: {why} (expected [MEM|SSD|HDD:CAPACITY]/path, e.g. [MEM:4GiB]/dev/shm/curvine)")
        };
        let rest = text
            .trim()
            .strip_prefix('[')
            .ok_or_else(|| bad("missing '['"))?;
        let (head, path) = rest.split_once(']').ok_or_else(|| bad("missing ']'"))?;
        let (kind, capacity) = head
            .split_once(':')
            .ok_or_else(|| bad("missing ':' between type and capacity"))?;
        let kind = kind.trim().to_ascii_uppercase();
        if !matches!(kind.as_str(), "MEM" | "SSD" | "HDD") {
            return Err(bad("type must be MEM, SSD or HDD"));
        }
        let capacity = ByteSize::parse(capacity).map_err(|e| bad(&e))?.0;
        if capacity < (1 << 20) {
            return Err(bad("capacity must be at least 1MiB"));
        }
        let path = path.trim();
        if !path.starts_with('/') {
            return Err(bad("path must be absolute"));
        }
        Ok(TierSpec {
            kind,
            capacity,
            path: PathBuf::from(path),
        })
    }
}

impl Default for SupervisorConf {
    fn default() -> Self {
        SupervisorConf {
            restart_backoff: Dur(std::time::Duration::from_millis(100)),
            max_backoff: Dur(std::time::Duration::from_secs(10)),
            max_restarts: 10,
            restart_window: Dur(std::time::Duration::from_secs(60)),
        }
    }
}

impl Default for TraceConf {
    fn default() -> Self {
        TraceConf {
            ring_events: 100_000,
            sample_rate: 0.001,
        }
    }
}

impl Default for LogConf {
    fn default() -> Self {
        LogConf {
            level: "info".into(),
        }
    }
}

/// A configuration error, naming the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("unknown config key '{key}' (from {origin}){hint}")]
    UnknownKey {
        key: String,
        origin: Source,
        hint: String,
    },
    #[error("invalid value {value} for config key '{key}' (from {origin}): {allowed}")]
    InvalidValue {
        key: String,
        value: String,
        origin: Source,
        allowed: String,
    },
    #[error("cannot read config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("'{arg}' is not key=value")]
    NotKeyValue { arg: String },
}

/// Where a key's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    Default,
    File(String),
    Env(String),
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {p}"),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Flag(a) => write!(f, "flag {a}"),
        }
    }
}

/// One key of the effective config with its value and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub value: String,
    pub source: Source,
}

/// Builds a [`Config`] from layered sources.
#[derive(Debug, Clone)]
pub struct Loader {
    values: BTreeMap<String, (toml::Value, Source)>,
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if v.is_table() {
                    flatten(&key, v, out);
                } else {
                    out.push((key, v.clone()));
                }
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

fn display_value(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl Default for Loader {
    fn default() -> Self {
        Self::new()
    }
}

impl Loader {
    /// Starts from the defaults.
    pub fn new() -> Loader {
        let mut values = BTreeMap::new();
        let defaults = toml::Value::try_from(Config::default())
            .unwrap_or(toml::Value::Table(Default::default()));
        let mut flat = Vec::new();
        flatten("", &defaults, &mut flat);
        for (k, v) in flat {
            values.insert(k, (v, Source::Default));
        }
        Loader { values }
    }

    /// All keys a config can set.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(|k| k.as_str())
    }

    fn unknown(&self, key: &str, source: Source) -> ConfError {
        let section = key.split('.').next().unwrap_or("");
        let similar: Vec<&str> = self
            .keys()
            .filter(|k| k.starts_with(&format!("{section}.")))
            .collect();
        let hint = if similar.is_empty() {
            format!("; sections are {}", self.sections().join(", "))
        } else {
            format!("; keys of [{section}] are {}", similar.join(", "))
        };
        ConfError::UnknownKey {
            key: key.to_string(),
            origin: source,
            hint,
        }
    }

    fn sections(&self) -> Vec<String> {
        let mut s: Vec<String> = self
            .keys()
            .filter_map(|k| k.split('.').next())
            .map(String::from)
            .collect();
        s.dedup();
        s
    }

    fn set_value(
        &mut self,
        key: &str,
        value: toml::Value,
        source: Source,
    ) -> Result<(), ConfError> {
        let Some((default, _)) = self.values.get(key) else {
            return Err(self.unknown(key, source));
        };
        // Keep the type of the default: a list key given a single string
        // becomes a list, so `--seeds a:1` and `seeds = "a:1"` both work.
        let value = match (default, value) {
            (toml::Value::Array(_), toml::Value::String(s)) => toml::Value::Array(
                s.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| toml::Value::String(p.into()))
                    .collect(),
            ),
            (_, v) => v,
        };
        self.check_one(key, &value, &source)?;
        self.values.insert(key.to_string(), (value, source));
        Ok(())
    }

    /// Parses a value given as text (environment, `-c`): typed like the key's default.
    fn parse_text(&self, key: &str, text: &str, source: &Source) -> Result<toml::Value, ConfError> {
        let Some((default, _)) = self.values.get(key) else {
            return Err(self.unknown(key, source.clone()));
        };
        let invalid = |allowed: &str| ConfError::InvalidValue {
            key: key.to_string(),
            value: format!("{text:?}"),
            origin: source.clone(),
            allowed: allowed.to_string(),
        };
        Ok(match default {
            toml::Value::Boolean(_) => match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" | "on" => toml::Value::Boolean(true),
                "false" | "0" | "no" | "off" => toml::Value::Boolean(false),
                _ => return Err(invalid("expected true or false")),
            },
            toml::Value::Integer(_) => toml::Value::Integer(
                text.trim()
                    .parse()
                    .map_err(|_| invalid("expected an integer"))?,
            ),
            toml::Value::Float(_) => toml::Value::Float(
                text.trim()
                    .parse()
                    .map_err(|_| invalid("expected a number"))?,
            ),
            toml::Value::Array(_) => toml::Value::Array(
                text.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(|p| toml::Value::String(p.into()))
                    .collect(),
            ),
            _ => toml::Value::String(text.to_string()),
        })
    }

    /// Checks that a single key's value deserializes, so the error names it.
    fn check_one(&self, key: &str, value: &toml::Value, source: &Source) -> Result<(), ConfError> {
        let mut trial = self.clone();
        trial
            .values
            .insert(key.to_string(), (value.clone(), source.clone()));
        trial
            .build_unchecked()
            .map(|_| ())
            .map_err(|reason| ConfError::InvalidValue {
                key: key.to_string(),
                value: display_value(value),
                origin: source.clone(),
                allowed: reason,
            })
    }

    /// Applies a TOML file.
    pub fn file(&mut self, path: &str) -> Result<&mut Self, ConfError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfError::File {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
        self.toml_text(&text, path)
    }

    /// Applies TOML text read from `origin`.
    pub fn toml_text(&mut self, text: &str, origin: &str) -> Result<&mut Self, ConfError> {
        let value: toml::Value = toml::from_str(text).map_err(|e| ConfError::File {
            path: origin.to_string(),
            reason: e.to_string(),
        })?;
        let mut flat = Vec::new();
        flatten("", &value, &mut flat);
        for (key, v) in flat {
            self.set_value(&key, v, Source::File(origin.to_string()))?;
        }
        Ok(self)
    }

    /// Applies `CURVINE_*` variables from the given environment (except `CURVINE_CONF`).
    pub fn env_vars<I: IntoIterator<Item = (String, String)>>(
        &mut self,
        vars: I,
    ) -> Result<&mut Self, ConfError> {
        let by_env: BTreeMap<String, String> = self
            .keys()
            .map(|k| {
                (
                    format!("{ENV_PREFIX}{}", k.replace('.', "_").to_ascii_uppercase()),
                    k.to_string(),
                )
            })
            .collect();
        for (name, text) in vars {
            if !name.starts_with(ENV_PREFIX) || name == CONF_ENV {
                continue;
            }
            let Some(key) = by_env.get(&name) else {
                return Err(ConfError::UnknownKey {
                    key: name.clone(),
                    origin: Source::Env(name),
                    hint: "; variables are CURVINE_<SECTION>_<KEY>, e.g. CURVINE_NODE_DATA_DIR"
                        .into(),
                });
            };
            let source = Source::Env(name.clone());
            let value = self.parse_text(key, &text, &source)?;
            self.set_value(key, value, source)?;
        }
        Ok(self)
    }

    /// Applies the process environment.
    pub fn env(&mut self) -> Result<&mut Self, ConfError> {
        self.env_vars(std::env::vars())
    }

    /// Applies `key=value` (from `-c`).
    pub fn key_value(&mut self, arg: &str) -> Result<&mut Self, ConfError> {
        let (key, text) = arg.split_once('=').ok_or_else(|| ConfError::NotKeyValue {
            arg: arg.to_string(),
        })?;
        let source = Source::Flag(format!("-c {}", key.trim()));
        let value = self.parse_text(key.trim(), text, &source)?;
        self.set_value(key.trim(), value, source)?;
        Ok(self)
    }

    /// Applies a value given by a dedicated flag (`--data-dir`).
    pub fn flag(&mut self, key: &str, text: &str, flag: &str) -> Result<&mut Self, ConfError> {
        let source = Source::Flag(flag.to_string());
        let value = self.parse_text(key, text, &source)?;
        self.set_value(key, value, source)?;
        Ok(self)
    }

    /// The usual layering for a program: file from `conf_path` or
    /// `CURVINE_CONF`, then the environment, then `-c` arguments. Dedicated
    /// flags are applied by the caller afterwards with [`Loader::flag`].
    pub fn standard(conf_path: Option<&str>, overrides: &[String]) -> Result<Loader, ConfError> {
        let mut loader = Loader::new();
        let from_env = std::env::var(CONF_ENV).ok().filter(|p| !p.is_empty());
        if let Some(path) = conf_path.map(String::from).or(from_env) {
            loader.file(&path)?;
        }
        loader.env()?;
        for kv in overrides {
            loader.key_value(kv)?;
        }
        Ok(loader)
    }

    fn build_unchecked(&self) -> Result<Config, String> {
        let mut root = toml::map::Map::new();
        for (key, (value, _)) in &self.values {
            let mut table = &mut root;
            let parts: Vec<&str> = key.split('.').collect();
            for part in &parts[..parts.len() - 1] {
                table = table
                    .entry(part.to_string())
                    .or_insert_with(|| toml::Value::Table(Default::default()))
                    .as_table_mut()
                    .ok_or_else(|| format!("'{part}' is both a key and a section"))?;
            }
            table.insert(parts[parts.len() - 1].to_string(), value.clone());
        }
        toml::Value::Table(root)
            .try_into::<Config>()
            .map_err(|e| e.message().to_string())
    }

    /// The config, validated.
    pub fn build(&self) -> Result<Config, ConfError> {
        let config = self
            .build_unchecked()
            .map_err(|reason| ConfError::InvalidValue {
                key: "(config)".into(),
                value: String::new(),
                origin: Source::Default,
                allowed: reason,
            })?;
        config.validate(|key| {
            self.values
                .get(key)
                .map(|(_, s)| s.clone())
                .unwrap_or(Source::Default)
        })?;
        Ok(config)
    }

    /// Every key with its effective value and source, in key order.
    pub fn entries(&self) -> Vec<Entry> {
        self.values
            .iter()
            .map(|(key, (value, source))| Entry {
                key: key.clone(),
                value: if (key.ends_with("cookie") || key == "http.token")
                    && value.as_str().is_some_and(|s| !s.is_empty())
                {
                    "\"<redacted>\"".to_string()
                } else {
                    display_value(value)
                },
                source: source.clone(),
            })
            .collect()
    }
}

fn check_addr(key: &str, addr: &str, source: Source) -> Result<(), ConfError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(ConfError::InvalidValue {
            key: key.into(),
            value: format!("{addr:?}"),
            origin: source,
            allowed: "expected host:port with a port from 0 to 65535".into(),
        })
    }
}

impl Config {
    /// Checks values that parse but make no sense. `source` names where a key came from.
    pub fn validate(&self, source: impl Fn(&str) -> Source) -> Result<(), ConfError> {
        let invalid = |key: &str, value: String, allowed: &str| ConfError::InvalidValue {
            key: key.into(),
            value,
            origin: source(key),
            allowed: allowed.into(),
        };
        if !(1..=256).contains(&self.cluster.shards) {
            return Err(invalid(
                "cluster.shards",
                self.cluster.shards.to_string(),
                "expected 1 to 256",
            ));
        }
        check_addr("node.listen", &self.node.listen, source("node.listen"))?;
        if !self.node.cluster_listen.is_empty() {
            check_addr(
                "node.cluster_listen",
                &self.node.cluster_listen,
                source("node.cluster_listen"),
            )?;
        }
        for seed in &self.node.seeds {
            check_addr("node.seeds", seed, source("node.seeds"))?;
        }
        if self.client.cluster.is_empty() {
            return Err(invalid(
                "client.cluster",
                "[]".into(),
                "expected at least one host:port",
            ));
        }
        for addr in &self.client.cluster {
            check_addr("client.cluster", addr, source("client.cluster"))?;
        }
        if self.client.connections == 0 || self.client.connections > 64 {
            return Err(invalid(
                "client.connections",
                self.client.connections.to_string(),
                "expected 1 to 64",
            ));
        }
        if !matches!(self.meta.layout.as_str(), "node" | "shard") {
            return Err(invalid(
                "meta.layout",
                format!("{:?}", self.meta.layout),
                "expected \"node\" or \"shard\"",
            ));
        }
        if !((1 << 20)..=(4 << 30)).contains(&self.meta.wal_size.0) {
            return Err(invalid(
                "meta.wal_size",
                self.meta.wal_size.to_string(),
                "expected 1MiB to 4GiB",
            ));
        }
        let interval = self.meta.checkpoint_interval.0;
        if interval < std::time::Duration::from_millis(10)
            || interval > std::time::Duration::from_secs(3600)
        {
            return Err(invalid(
                "meta.checkpoint_interval",
                self.meta.checkpoint_interval.to_string(),
                "expected 10ms to 1h",
            ));
        }
        if self.meta.commit_delay.0 > std::time::Duration::from_millis(100) {
            return Err(invalid(
                "meta.commit_delay",
                self.meta.commit_delay.to_string(),
                "expected at most 100ms",
            ));
        }
        if !(1_000..=10_000_000).contains(&self.trace.ring_events) {
            return Err(invalid(
                "trace.ring_events",
                self.trace.ring_events.to_string(),
                "expected 1000 to 10000000",
            ));
        }
        if !(0.0..=1.0).contains(&self.trace.sample_rate) {
            return Err(invalid(
                "trace.sample_rate",
                self.trace.sample_rate.to_string(),
                "expected a share from 0 to 1",
            ));
        }
        if self.meta.group_commit_max == 0 {
            return Err(invalid(
                "meta.group_commit_max",
                "0".into(),
                "expected at least 1",
            ));
        }
        if self.meta.map_size.0 < (16 << 20) {
            return Err(invalid(
                "meta.map_size",
                self.meta.map_size.to_string(),
                "expected at least 16MiB",
            ));
        }
        if self.meta.max_readers < 8 {
            return Err(invalid(
                "meta.max_readers",
                self.meta.max_readers.to_string(),
                "expected at least 8",
            ));
        }
        if self.client.request_timeout.0.is_zero() {
            return Err(invalid(
                "client.request_timeout",
                "0s".into(),
                "expected more than 0s",
            ));
        }
        if !self.data.listen.is_empty() {
            check_addr("data.listen", &self.data.listen, source("data.listen"))?;
        }
        let mut seen_paths = Vec::new();
        for tier in &self.data.tiers {
            let spec = TierSpec::parse(tier)
                .map_err(|e| invalid("data.tiers", format!("{tier:?}"), &e))?;
            if seen_paths.contains(&spec.path) {
                return Err(invalid(
                    "data.tiers",
                    format!("{tier:?}"),
                    "each tier needs a directory of its own",
                ));
            }
            seen_paths.push(spec.path);
        }
        let bs = self.data.block_size.0;
        if !(64 << 10..=2 << 30).contains(&bs) || !bs.is_multiple_of(64 << 10) {
            return Err(invalid(
                "data.block_size",
                self.data.block_size.to_string(),
                "expected a multiple of 64KiB from 64KiB to 2GiB",
            ));
        }
        if !(1..=16).contains(&self.data.replicas) {
            return Err(invalid(
                "data.replicas",
                self.data.replicas.to_string(),
                "expected 1 to 16",
            ));
        }
        let (low, high) = (self.data.low_watermark, self.data.high_watermark);
        if !(0.0 < low && low < high && high <= 1.0) {
            return Err(invalid(
                "data.low_watermark",
                format!("{low} (high_watermark {high})"),
                "expected 0 < low_watermark < high_watermark <= 1",
            ));
        }
        if self.cluster.heartbeat.0 < std::time::Duration::from_millis(50) {
            return Err(invalid(
                "cluster.heartbeat",
                self.cluster.heartbeat.to_string(),
                "expected at least 50ms",
            ));
        }
        if self.cluster.node_timeout.0 < self.cluster.heartbeat.0 * 2 {
            return Err(invalid(
                "cluster.node_timeout",
                self.cluster.node_timeout.to_string(),
                "expected at least twice cluster.heartbeat",
            ));
        }
        if self.data.write_lease.0 < std::time::Duration::from_secs(1) {
            return Err(invalid(
                "data.write_lease",
                self.data.write_lease.to_string(),
                "expected at least 1s",
            ));
        }
        if self.data.evict_interval.0.is_zero() {
            return Err(invalid(
                "data.evict_interval",
                "0s".into(),
                "expected more than 0s",
            ));
        }
        if self.ufs.part_size.0 < (5 << 20) || self.ufs.part_size.0 > (5 << 30) {
            return Err(invalid(
                "ufs.part_size",
                self.ufs.part_size.to_string(),
                "expected 5MiB to 5GiB (S3's limits for a part)",
            ));
        }
        for (key, value) in [
            ("ufs.upload_concurrency", self.ufs.upload_concurrency),
            ("ufs.list_page", self.ufs.list_page),
            ("ufs.loaders", self.ufs.loaders),
        ] {
            if !(1..=10_000).contains(&value) {
                return Err(invalid(key, value.to_string(), "expected 1 to 10000"));
            }
        }
        if self.ufs.timeout.0.is_zero() || self.ufs.io_timeout.0.is_zero() {
            return Err(invalid(
                "ufs.timeout",
                format!("{} / {}", self.ufs.timeout, self.ufs.io_timeout),
                "ufs.timeout and ufs.io_timeout must be above 0",
            ));
        }
        if self.data.token_ttl.0 < std::time::Duration::from_secs(60) {
            return Err(invalid(
                "data.token_ttl",
                self.data.token_ttl.to_string(),
                "expected at least 1m",
            ));
        }
        if self.fuse.metrics_listen != "off" {
            check_addr(
                "fuse.metrics_listen",
                &self.fuse.metrics_listen,
                source("fuse.metrics_listen"),
            )?;
        }
        if !self.http.listen.is_empty() && self.http.listen != "off" {
            check_addr("http.listen", &self.http.listen, source("http.listen"))?;
        }
        if self.tls.enabled && self.tls.ca.is_empty() {
            return Err(invalid(
                "tls.ca",
                "\"\"".into(),
                "expected the PEM file of the certificate authority that signs the nodes' \
                 certificates (tls.enabled is true)",
            ));
        }
        if self.tls.cert.is_empty() != self.tls.key.is_empty() {
            let (key, other) = if self.tls.key.is_empty() {
                ("tls.key", "tls.cert")
            } else {
                ("tls.cert", "tls.key")
            };
            return Err(invalid(
                key,
                "\"\"".into(),
                &format!("expected a PEM file, since {other} is set (a certificate needs its key)"),
            ));
        }
        if self.tls.handshake_timeout.0.is_zero() {
            return Err(invalid(
                "tls.handshake_timeout",
                self.tls.handshake_timeout.to_string(),
                "expected more than 0",
            ));
        }
        if !(1..=64).contains(&self.fuse.threads) {
            return Err(invalid(
                "fuse.threads",
                self.fuse.threads.to_string(),
                "expected 1 to 64",
            ));
        }
        let mw = self.fuse.max_write.0;
        if !(4096..=16 << 20).contains(&mw) {
            return Err(invalid(
                "fuse.max_write",
                self.fuse.max_write.to_string(),
                "expected 4KiB to 16MiB",
            ));
        }
        if self.fuse.max_readahead.0 < 4096 {
            return Err(invalid(
                "fuse.max_readahead",
                self.fuse.max_readahead.to_string(),
                "expected at least 4KiB",
            ));
        }
        let fbs = self.fuse.block_size.0;
        if fbs != 0 && (!(64 << 10..=2 << 30).contains(&fbs) || !fbs.is_multiple_of(64 << 10)) {
            return Err(invalid(
                "fuse.block_size",
                self.fuse.block_size.to_string(),
                "expected 0 (the cluster's) or a multiple of 64KiB from 64KiB to 2GiB",
            ));
        }
        if !self.fuse.fs_path.starts_with('/') {
            return Err(invalid(
                "fuse.fs_path",
                format!("{:?}", self.fuse.fs_path),
                "expected an absolute path of the namespace",
            ));
        }
        if self.supervisor.max_restarts == 0 {
            return Err(invalid(
                "supervisor.max_restarts",
                "0".into(),
                "expected at least 1",
            ));
        }
        Ok(())
    }

    /// The data directory: the configured one, or the user's default.
    pub fn data_dir(&self) -> PathBuf {
        if !self.node.data_dir.is_empty() {
            return expand_home(&self.node.data_dir);
        }
        match std::env::var("HOME") {
            Ok(home) if !home.is_empty() => PathBuf::from(home).join(".curvine").join("data"),
            _ => PathBuf::from("/var/lib/curvine"),
        }
    }

    /// The cluster port address: configured, or the client port + 1.
    pub fn cluster_listen(&self) -> String {
        if !self.node.cluster_listen.is_empty() {
            return self.node.cluster_listen.clone();
        }
        self.client_port_plus(1)
    }

    /// The HTTP port address: configured, or loopback on the client port
    /// + 3; `None` when it is `off`.
    pub fn http_listen(&self) -> Option<String> {
        match self.http.listen.as_str() {
            "off" => None,
            "" => {
                let port = self
                    .client_port_plus(3)
                    .rsplit_once(':')
                    .map(|(_, p)| p.to_string())
                    .unwrap_or_else(|| "8998".into());
                Some(format!("127.0.0.1:{port}"))
            }
            addr => Some(addr.to_string()),
        }
    }

    /// The data port address: configured, or the client port + 2.
    pub fn data_listen(&self) -> String {
        if !self.data.listen.is_empty() {
            return self.data.listen.clone();
        }
        self.client_port_plus(2)
    }

    /// The client port's host with its port + `n`; port 0 stays 0 (any port).
    fn client_port_plus(&self, n: u16) -> String {
        match self.node.listen.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port.parse().unwrap_or(8995);
                let port = if port == 0 { 0 } else { port.wrapping_add(n) };
                format!("{host}:{port}")
            }
            None => format!("127.0.0.1:{}", 8995 + n),
        }
    }

    /// The configured tiers, parsed (validated by [`Config::validate`]).
    pub fn tiers(&self) -> Vec<TierSpec> {
        self.data
            .tiers
            .iter()
            .filter_map(|t| TierSpec::parse(t).ok())
            .collect()
    }
}

fn expand_home(path: &str) -> PathBuf {
    if let Some(rest) = path.strip_prefix("~/") {
        if let Ok(home) = std::env::var("HOME") {
            return PathBuf::from(home).join(rest);
        }
    }
    PathBuf::from(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_default_file_env_flag() {
        let mut l = Loader::new();
        l.toml_text(
            "[cluster]\nshards = 8\n[node]\nlisten = \"127.0.0.1:9000\"\n",
            "t.toml",
        )
        .unwrap();
        l.env_vars([("CURVINE_CLUSTER_SHARDS".to_string(), "4".to_string())])
            .unwrap();
        l.key_value("cluster.shards=2").unwrap();
        let c = l.build().unwrap();
        assert_eq!(c.cluster.shards, 2);
        assert_eq!(c.node.listen, "127.0.0.1:9000");
        let entries = l.entries();
        let shards = entries.iter().find(|e| e.key == "cluster.shards").unwrap();
        assert_eq!(shards.source, Source::Flag("-c cluster.shards".into()));
        let listen = entries.iter().find(|e| e.key == "node.listen").unwrap();
        assert_eq!(listen.source, Source::File("t.toml".into()));
        let level = entries.iter().find(|e| e.key == "log.level").unwrap();
        assert_eq!(level.source, Source::Default);
    }

    #[test]
    fn unknown_keys_name_the_key_and_the_choices() {
        let err = Loader::new()
            .key_value("node.lisen=1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("node.lisen") && err.contains("node.listen"),
            "{err}"
        );
        let err = Loader::new()
            .toml_text("[nodes]\nx = 1\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("nodes.x") && err.contains("f.toml"), "{err}");
        let err = Loader::new()
            .env_vars([("CURVINE_NODE_DATADIR".to_string(), "x".to_string())])
            .unwrap_err()
            .to_string();
        assert!(err.contains("CURVINE_NODE_DATADIR"), "{err}");
    }

    #[test]
    fn bad_values_name_key_value_and_allowed() {
        let err = Loader::new()
            .key_value("meta.map_size=12 parsecs")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("meta.map_size") && err.contains("12 parsecs") && err.contains("size"),
            "{err}"
        );
        let err = Loader::new()
            .key_value("cluster.shards=many")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cluster.shards") && err.contains("integer"),
            "{err}"
        );
        let mut l = Loader::new();
        l.key_value("cluster.shards=1000").unwrap();
        let err = l.build().unwrap_err().to_string();
        assert!(
            err.contains("cluster.shards") && err.contains("1 to 256"),
            "{err}"
        );
        let mut l = Loader::new();
        l.key_value("node.listen=nowhere").unwrap();
        assert!(l.build().unwrap_err().to_string().contains("node.listen"));
        let err = Loader::new()
            .key_value("supervisor.restart_backoff=soon")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("supervisor.restart_backoff") && err.contains("duration"),
            "{err}"
        );
    }

    #[test]
    fn tls_settings_that_cannot_work_name_the_key() {
        let build = |kvs: &[&str]| {
            let mut l = Loader::new();
            for kv in kvs {
                l.key_value(kv).unwrap();
            }
            l.build()
        };
        let err = build(&["tls.enabled=true"]).unwrap_err().to_string();
        assert!(
            err.contains("tls.ca") && err.contains("certificate authority"),
            "{err}"
        );
        let err = build(&["tls.cert=/etc/n.pem"]).unwrap_err().to_string();
        assert!(
            err.contains("'tls.key'") && err.contains("tls.cert is set"),
            "{err}"
        );
        let err = build(&["tls.key=/etc/n.key"]).unwrap_err().to_string();
        assert!(err.contains("'tls.cert'"), "{err}");
        let err = build(&["tls.handshake_timeout=0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("tls.handshake_timeout"), "{err}");
        let c = build(&["tls.enabled=true", "tls.ca=/etc/ca.pem"]).unwrap();
        assert!(c.tls.enabled && c.tls.data && c.tls.cert.is_empty());
    }

    #[test]
    fn sizes_and_lists_from_text() {
        let mut l = Loader::new();
        l.key_value("meta.map_size=64MiB").unwrap();
        l.flag("node.seeds", "a:1,b:2", "--seeds").unwrap();
        let c = l.build().unwrap();
        assert_eq!(c.meta.map_size, ByteSize(64 << 20));
        assert_eq!(c.node.seeds, vec!["a:1".to_string(), "b:2".to_string()]);
    }

    #[test]
    fn the_documented_example_file_sets_every_key_to_its_default() {
        let text = include_str!("../curvine.toml");
        let mut from_file = Loader::new();
        from_file.toml_text(text, "curvine.toml").unwrap();
        assert_eq!(from_file.build().unwrap(), Config::default());
        let documented: std::collections::BTreeSet<String> = from_file
            .entries()
            .into_iter()
            .filter(|e| e.source != Source::Default)
            .map(|e| e.key)
            .collect();
        let all: std::collections::BTreeSet<String> =
            Loader::new().keys().map(String::from).collect();
        let missing: Vec<_> = all.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "keys missing from conf/curvine.toml: {missing:?}"
        );
    }

    #[test]
    fn tiers_parse_and_bad_ones_name_the_problem() {
        let t = TierSpec::parse("[mem:4GiB]/dev/shm/c").unwrap();
        assert_eq!((t.kind.as_str(), t.capacity), ("MEM", 4 << 30));
        assert_eq!(t.path, PathBuf::from("/dev/shm/c"));
        for (bad, why) in [
            ("MEM:4GiB/x", "missing '['"),
            ("[TAPE:1GiB]/x", "MEM, SSD or HDD"),
            ("[SSD:lots]/x", "not a size"),
            ("[SSD:1KiB]/x", "at least 1MiB"),
            ("[HDD:1GiB]relative", "absolute"),
        ] {
            let err = TierSpec::parse(bad).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let mut l = Loader::new();
        let err = l
            .key_value("data.tiers=[MEM:1GiB]/a,[SSD:1GiB]/a")
            .and_then(|l| l.build())
            .unwrap_err();
        assert!(err.to_string().contains("directory of its own"), "{err}");
    }

    #[test]
    fn cluster_port_follows_client_port() {
        let mut c = Config::default();
        c.node.listen = "10.0.0.1:7000".into();
        assert_eq!(c.cluster_listen(), "10.0.0.1:7001");
    }
}
