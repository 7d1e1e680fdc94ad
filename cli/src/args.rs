//! The commands and their arguments as clap parses them (the global
//! options are in main.rs).

use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum Command {
    /// File system operations.
    #[command(subcommand)]
    Fs(FsCommand),
    /// Nodes, shards and inode counts of the cluster.
    Report,
    /// Configuration.
    #[command(subcommand)]
    Conf(ConfCommand),
    /// Administration.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Mount a UFS location at a path; without arguments, list the mounts.
    ///
    /// Properties of the location are given with -c, e.g.
    /// -c s3.endpoint_url=http://host:9000 -c s3.credentials.access=KEY
    /// -c s3.credentials.secret=SECRET -c s3.region_name=us-east-1
    /// -c s3.force.path.style=true. The mount is checked (bucket reachable,
    /// credentials valid) before it is made.
    Mount(MountArgs),
    /// Remove the mount at a path (the UFS keeps its objects; what was
    /// cached of them is dropped).
    Umount { path: String },
    /// Cache everything under a path of a mount (or a UFS location under a
    /// mount's, s3://bucket/prefix/...) with a job spread over the nodes.
    /// On a terminal it shows the job's progress until it ends (Ctrl-C
    /// leaves the job running); elsewhere it prints the job id.
    Load {
        path: String,
        /// Wait until the job ends (also when not on a terminal); exit 1 if
        /// any file failed, listing them.
        #[arg(long)]
        wait: bool,
        /// Skip files already cached whole and unchanged.
        #[arg(long)]
        no_overwrite: bool,
    },
    /// State and progress of a load job (all jobs without an id).
    LoadStatus {
        id: Option<String>,
        /// Follow the job with a progress bar until it ends.
        #[arg(long)]
        watch: bool,
    },
    /// Stop a load job (what it cached so far stays cached).
    CancelLoad { id: String },
    /// Mount the cluster as a POSIX file system (FUSE), or unmount it.
    #[command(subcommand)]
    Fuse(curvine_fuse::FuseCommand),
    /// How requests travelled through the actors of the nodes: recent
    /// events merged by time (filters below), a live stream (--follow), the
    /// causal tree of one request (--tree ID), Chrome trace JSON (--chrome),
    /// or one command traced end to end: `curvine-cli trace -- fs cat /x`.
    Trace(TraceArgs),
    /// Each node's supervision tree: every actor with its mailbox depth
    /// (where senders are counted), messages handled, failures, restarts
    /// and uptime.
    Actors {
        /// Only this node.
        #[arg(long)]
        node: Option<String>,
    },
}

#[derive(Args)]
pub struct MountArgs {
    /// UFS location: s3://bucket/prefix or file:///dir.
    #[arg(requires = "path")]
    pub ufs: Option<String>,
    /// Mount point in the namespace (created if missing; must be empty).
    pub path: Option<String>,
    /// cache_mode: the UFS is the authority (writes reach it at close);
    /// fs_mode: the cluster is (writes are persisted in the background).
    #[arg(long, default_value = "cache_mode", value_name = "cache_mode|fs_mode")]
    pub write_type: String,
    /// Drop cached data this long after it was read from (or last checked
    /// against) the UFS (e.g. 7d); the UFS keeps it.
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// Trust a cached file this long before checking its UFS object again
    /// (default: the node's ufs.check_interval).
    #[arg(long, value_name = "DURATION")]
    pub check_interval: Option<String>,
    /// Check the UFS object on every open (cache_mode).
    #[arg(long)]
    pub read_verify_ufs: bool,
    /// Do not keep what is read from the UFS in the cache.
    #[arg(long)]
    pub no_auto_cache: bool,
    /// Replicas of cached blocks of files under the mount.
    #[arg(long)]
    pub replicas: Option<u16>,
    /// Block size of files under the mount (e.g. 64MiB).
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<String>,
    /// Tier for cached blocks of files under the mount: MEM, SSD or HDD.
    #[arg(long, value_name = "TIER")]
    pub storage_type: Option<String>,
}

#[derive(Subcommand)]
pub enum ConfCommand {
    /// Print the effective configuration with the source of each value.
    Show,
}

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Check the namespace for dangling entries, orphans and unfinished operations.
    Fsck,
    /// Which node serves each shard (the cluster map), with node states.
    Shards,
    /// Move a shard to another node; clients keep working during the move.
    MoveShard {
        /// Shard number (see `admin shards`).
        shard: u16,
        /// Node id, or a unique prefix of it.
        node: String,
    },
    /// Spread the shards evenly over the nodes that are up.
    Rebalance,
    /// Move a node's shards and blocks to the other nodes, then let it leave.
    Decommission {
        /// Node id, or a unique prefix of it.
        node: String,
    },
    /// Verify every block of every node against its checksums; exits 1 when
    /// a problem is left.
    Scrub {
        /// Only this node (id, or a unique prefix of it).
        #[arg(long)]
        node: Option<String>,
        /// Drop bad copies whose data is whole elsewhere (another copy, which
        /// re-replication multiplies again, or the file's UFS object); the
        /// only copy of data is kept and reported.
        #[arg(long)]
        repair: bool,
    },
}

#[derive(Subcommand)]
pub enum FsCommand {
    /// Create directories.
    Mkdir {
        /// Create missing parents; no error if the directory exists.
        #[arg(short = 'p', long)]
        parents: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// List directory contents.
    Ls {
        /// Long format: type, mode, links, owner, size, time.
        #[arg(short = 'l')]
        long: bool,
        /// List subdirectories recursively.
        #[arg(short = 'R')]
        recursive: bool,
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Show a path's attributes.
    Stat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Move or rename.
    Mv { src: String, dst: String },
    /// Remove files (and with -r, directories).
    Rm {
        /// Remove directories and their contents.
        #[arg(short = 'r', short_alias = 'R', long)]
        recursive: bool,
        /// No error for missing paths.
        #[arg(short = 'f', long)]
        force: bool,
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Remove empty directories.
    Rmdir {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Create empty files or set their times to now.
    Touch {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Make a hard link (another name of the same file), or with -s a
    /// symbolic link.
    Ln {
        /// Make a symbolic link.
        #[arg(short = 's')]
        symbolic: bool,
        target: String,
        link: String,
    },
    /// Print the target of a symbolic link.
    Readlink { path: String },
    /// Extended attributes.
    #[command(subcommand)]
    Xattr(XattrCommand),
    #[command(flatten)]
    Data(DataCommand),
}

#[derive(Subcommand)]
pub enum XattrCommand {
    /// Set an attribute (text value, or hex with --hex).
    Set {
        path: String,
        name: String,
        value: String,
        /// VALUE is hexadecimal bytes.
        #[arg(long)]
        hex: bool,
        /// Fail if the attribute exists.
        #[arg(long, conflicts_with = "replace")]
        create: bool,
        /// Fail if the attribute does not exist.
        #[arg(long)]
        replace: bool,
    },
    /// Print an attribute's value (text, or 0x-prefixed hex when not UTF-8).
    Get { path: String, name: String },
    /// List attribute names.
    List { path: String },
    /// Remove an attribute.
    Rm { path: String, name: String },
}

#[derive(Subcommand)]
pub enum DataCommand {
    /// Copy a local file (or stdin with -) into the cluster.
    Put {
        local: String,
        path: String,
        /// Replace an existing file.
        #[arg(short = 'f', long)]
        force: bool,
        /// Block size of the new file (e.g. 64MiB; a multiple of 64KiB).
        #[arg(long)]
        block_size: Option<String>,
        /// Replicas of each block.
        #[arg(long)]
        replicas: Option<u16>,
        /// Tier to store the blocks in: MEM, SSD or HDD.
        #[arg(long)]
        storage: Option<String>,
    },
    /// Copy a file out of the cluster (to stdout with -).
    Get { path: String, local: String },
    /// Print files.
    Cat {
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print the first bytes of a file.
    Head {
        /// Bytes to print.
        #[arg(short = 'b', long, default_value_t = 1024)]
        bytes: u64,
        path: String,
    },
    /// Print the last bytes of a file.
    Tail {
        /// Bytes to print.
        #[arg(short = 'b', long, default_value_t = 1024)]
        bytes: u64,
        path: String,
    },
    /// Copy a file within the cluster.
    Cp {
        src: String,
        dst: String,
        /// Replace an existing file.
        #[arg(short = 'f', long)]
        force: bool,
    },
    /// Bytes used by files under each path.
    Du {
        /// Sizes like 1.5GiB.
        #[arg(short = 'H', long = "human")]
        human: bool,
        #[arg(default_value = "/")]
        paths: Vec<String>,
    },
    /// Capacity and use of every node's tiers.
    Df {
        /// Sizes like 1.5GiB.
        #[arg(short = 'H', long = "human")]
        human: bool,
    },
    /// Drop cached blocks of a file or tree that have another copy
    /// (a replica or the under-file-system); the only copy is never dropped.
    Free { path: String },
    /// Blocks of a file: ids, sizes, checksums, nodes and tiers.
    Blocks { path: String },
}

#[derive(Args)]
pub struct TraceArgs {
    /// Stream new events from all nodes until interrupted.
    #[arg(long)]
    pub follow: bool,
    /// Only events of actors whose name contains this (e.g. shard, gateway).
    #[arg(long)]
    pub actor: Option<String>,
    /// Only events of this node (its id, as `report` shows it).
    #[arg(long)]
    pub node: Option<String>,
    /// Only events of this trace.
    #[arg(long, value_name = "ID")]
    pub trace_id: Option<String>,
    /// Only messages whose kind contains this (e.g. Create, ShardMsg).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only messages that took at least this long, queueing included (e.g. 10ms).
    #[arg(long, value_name = "DURATION")]
    pub slower_than: Option<String>,
    /// Only events that ended within this long before now (e.g. 5m).
    #[arg(long, value_name = "DURATION")]
    pub since: Option<String>,
    /// Print the causal tree of one request across nodes.
    #[arg(long, value_name = "TRACE_ID")]
    pub tree: Option<String>,
    /// Write the events as Chrome trace-event JSON (opens in Perfetto).
    #[arg(long, value_name = "FILE")]
    pub chrome: Option<String>,
    /// At most this many events per node (the latest ones).
    #[arg(long, default_value_t = 1000)]
    pub limit: u32,
    /// Run this command with tracing forced and print its tree, e.g.
    /// --run "fs cat /x" (or give the command after `--`).
    #[arg(long, value_name = "COMMAND", allow_hyphen_values = true)]
    pub run: Option<String>,
    /// The command to trace, after `--`: `curvine-cli trace -- fs cat /x`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}
