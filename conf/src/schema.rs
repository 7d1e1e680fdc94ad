//! The config schema: the `Config` struct, one struct per section, and the
//! default of every key.

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Dur};

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
    pub s3: S3Conf,
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
    /// Client connections the node serves at once (the CLI, mounts, the
    /// client library, the S3 gateway's own); one more is refused at once
    /// with an error naming this key.
    pub max_connections: u32,
}

impl Default for NodeConf {
    fn default() -> Self {
        NodeConf {
            data_dir: String::new(),
            listen: "127.0.0.1:8995".into(),
            cluster_listen: String::new(),
            seeds: Vec::new(),
            max_connections: 8192,
        }
    }
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
    /// Copies of each shard's metadata, each on its own node, kept in step
    /// by Raft (capped by the number of nodes up, so one node has 1 and two
    /// nodes 2). 1: each shard lives on one node.
    pub replicas: u32,
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
            replicas: 3,
        }
    }
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
    /// Blocks a file no longer uses (overwritten, truncated or removed) are
    /// removed from their nodes as soon as no open reader holds them; when
    /// a node cannot be asked whether its readers do (it is down or does
    /// not answer), they are removed this long after instead.
    pub freed_grace: Dur,
    /// A reader holds the blocks of the version it opened at most this
    /// long (one that keeps a file open longer may find them gone).
    pub read_hold_max: Dur,
    /// A write that finds no room while blocks on the node wait for their
    /// upload to the UFS (fs_mode) waits for them (they are dropped once
    /// uploaded), until this long passes with no upload finishing: writers
    /// slow down to the upload rate instead of failing. Keep it below
    /// `client.request_timeout`.
    pub upload_wait: Dur,
    /// Fsync block files on SSD and HDD tiers before a write is acknowledged.
    pub sync_blocks: bool,
    /// How long an access token for a block stays valid.
    pub token_ttl: Dur,
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
            freed_grace: Dur(std::time::Duration::from_secs(10)),
            read_hold_max: Dur(std::time::Duration::from_secs(3600)),
            upload_wait: Dur(std::time::Duration::from_secs(45)),
            sync_blocks: true,
            token_ttl: Dur(std::time::Duration::from_secs(24 * 3600)),
        }
    }
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
    /// Memory the readers of one client (a mount, a program) keep of what they streamed last
    /// (for reads that arrive out of order, as the kernel's readahead
    /// sends them), together: past it each reader keeps only its last
    /// chunk. At most 16MiB per reader below it.
    pub read_buffer_budget: ByteSize,
    /// The cluster's cookie, which the client proves to the node it
    /// connects to. Empty: `cluster.cookie`, else the cookie of the node
    /// whose data directory is `node.data_dir`, when readable.
    pub cookie: String,
    /// The `[tls]` section, copied here by the client library's
    /// `client_conf` (not a key of its own).
    #[serde(skip)]
    pub tls: TlsConf,
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
            read_buffer_budget: ByteSize(256 << 20),
            cookie: String::new(),
            tls: TlsConf::default(),
        }
    }
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
    /// Copies, on distinct nodes, of each block of an fs_mode file not yet
    /// persisted, made before its close returns (fewer when fewer nodes are
    /// up with room).
    pub pending_replicas: u16,
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
            pending_replicas: 2,
        }
    }
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
    /// Handles opened write-only bypass the kernel's page cache: each
    /// write goes from the writer's pages to the mount, with no copy into
    /// pages of the mount's file first (Linux 6.6 and later, where the
    /// kernel drops cached pages of the range a direct write covers; off
    /// by itself on older kernels and with `writeback_cache`).
    pub direct_writes: bool,
    /// Serve reads of files whose data is one block kept on this host
    /// straight from the block file in the kernel (FUSE passthrough, Linux
    /// 6.9 and later, with CAP_SYS_ADMIN; off by itself, with one log
    /// line saying why, where those are missing, and with `direct_io` or
    /// `writeback_cache`).
    pub passthrough: bool,
    /// Files smaller than this are read through the mount even with
    /// passthrough on: their warm reads hit the kernel's page cache of the
    /// mount with no request at all, which costs less than registering a
    /// backing file at each open.
    pub passthrough_min_size: ByteSize,
    /// With passthrough: a file whose blocks are on other nodes, opened
    /// for reading a second time, has the node of the mount's host copy
    /// them (one more replica each, verified) into one extent file, when a
    /// tier there has room for the whole file; opens after that pass
    /// through. A file read once is not copied.
    pub local_copies: bool,
    /// Ask a directory's shard to delegate it to this mount when files are
    /// created in it one after another: the mount then answers lookups of
    /// new names and creates there itself, and sends the creates in
    /// batches (a close still waits for its file's). Another client's
    /// change in the directory asks the mount to give it back first.
    pub delegations: bool,
    /// Let other users than the one who mounted use the mount.
    pub allow_other: bool,
    /// Let the kernel check permissions from the mode, owner and group of
    /// each file.
    pub default_permissions: bool,
    /// POSIX ACLs (`system.posix_acl_access` and `_default`), enforced by
    /// the kernel; needs `default_permissions`.
    pub acl: bool,
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
            direct_writes: true,
            passthrough: true,
            passthrough_min_size: ByteSize(1 << 20),
            local_copies: true,
            delegations: true,
            allow_other: false,
            default_permissions: true,
            acl: false,
            stage_dir: String::new(),
            block_size: ByteSize(0),
            metrics_listen: "127.0.0.1:8999".into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// How often the node samples its metrics for the dashboard's charts
    /// (`/api/history`, kept for the last hour in memory).
    pub history_interval: Dur,
}

impl Default for HttpConf {
    fn default() -> Self {
        HttpConf {
            listen: String::new(),
            token: String::new(),
            history_interval: Dur(std::time::Duration::from_secs(5)),
        }
    }
}

/// The node's S3 gateway: the S3 API over the cluster's files, buckets
/// being the directories under `root`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Conf {
    /// Address the gateway serves S3 on (`host:port`); `off`: no gateway.
    pub listen: String,
    /// The directory whose subdirectories are the buckets.
    pub root: String,
    /// The access key clients sign requests with (AWS Signature V4).
    pub access_key: String,
    /// The secret key of `access_key`; printed as <redacted>.
    pub secret_key: String,
}

impl Default for S3Conf {
    fn default() -> Self {
        S3Conf {
            listen: "off".into(),
            root: "/".into(),
            access_key: String::new(),
            secret_key: String::new(),
        }
    }
}

impl std::fmt::Debug for S3Conf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Conf")
            .field("listen", &self.listen)
            .field("root", &self.root)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .finish()
    }
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

impl Default for TraceConf {
    fn default() -> Self {
        TraceConf {
            ring_events: 100_000,
            sample_rate: 0.001,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConf {
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace`, or a tracing
    /// directive such as `info,curvine_actors=debug`.
    pub level: String,
}

impl Default for LogConf {
    fn default() -> Self {
        LogConf {
            level: "info".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Loader, Source};

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
}
