//! `curvine-cli`: the command line of a curvine cluster.

mod data;
mod trace;

use clap::{Args, Parser, Subcommand};
use serde_json::json;

use curvine_client::Client;
use curvine_conf::{Config, Loader};
use curvine_messages::path::normalize;
use curvine_messages::rpc::ListEntry;
use curvine_messages::{Attr, FileKind, FsError, XattrMode};

#[derive(Parser)]
#[command(
    name = "curvine-cli",
    version,
    about = "Command line of a curvine cache cluster"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Config file (TOML); also CURVINE_CONF.
    #[arg(long, global = true)]
    conf: Option<String>,
    /// Node to talk to, host:port of its client port (client.cluster).
    #[arg(long, global = true)]
    cluster: Option<String>,
    /// Set any config key: -c section.key=value (repeatable).
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE", global = true)]
    overrides: Vec<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand)]
enum Command {
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
    Trace(trace::TraceArgs),
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
struct MountArgs {
    /// UFS location: s3://bucket/prefix or file:///dir.
    #[arg(requires = "path")]
    ufs: Option<String>,
    /// Mount point in the namespace (created if missing; must be empty).
    path: Option<String>,
    /// cache_mode: the UFS is the authority (writes reach it at close);
    /// fs_mode: the cluster is (writes are persisted in the background).
    #[arg(long, default_value = "cache_mode", value_name = "cache_mode|fs_mode")]
    write_type: String,
    /// Drop cached data this long after it was read from (or last checked
    /// against) the UFS (e.g. 7d); the UFS keeps it.
    #[arg(long, value_name = "DURATION")]
    ttl: Option<String>,
    /// Trust a cached file this long before checking its UFS object again
    /// (default: the node's ufs.check_interval).
    #[arg(long, value_name = "DURATION")]
    check_interval: Option<String>,
    /// Check the UFS object on every open (cache_mode).
    #[arg(long)]
    read_verify_ufs: bool,
    /// Do not keep what is read from the UFS in the cache.
    #[arg(long)]
    no_auto_cache: bool,
    /// Replicas of cached blocks of files under the mount.
    #[arg(long)]
    replicas: Option<u16>,
    /// Block size of files under the mount (e.g. 64MiB).
    #[arg(long, value_name = "SIZE")]
    block_size: Option<String>,
    /// Tier for cached blocks of files under the mount: MEM, SSD or HDD.
    #[arg(long, value_name = "TIER")]
    storage_type: Option<String>,
}

/// Whether a `-c` key names a UFS mount property rather than a config key.
fn is_mount_property(key: &str) -> bool {
    key.starts_with("s3.")
}

#[derive(Subcommand)]
enum ConfCommand {
    /// Print the effective configuration with the source of each value.
    Show,
}

#[derive(Subcommand)]
enum AdminCommand {
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
enum FsCommand {
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
    /// Make links (only symbolic links: -s).
    Ln {
        /// Make a symbolic link.
        #[arg(short = 's', required = true)]
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
    Data(data::DataCommand),
}

#[derive(Subcommand)]
enum XattrCommand {
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

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let t = text.strip_prefix("0x").unwrap_or(text);
    if !t.is_ascii() || !t.len().is_multiple_of(2) {
        return None;
    }
    (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&t[i..i + 2], 16).ok())
        .collect()
}

fn show_value(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) => text.to_string(),
        Err(_) => format!(
            "0x{}",
            value.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

fn config(global: &Global) -> Result<(Loader, Config), String> {
    let overrides: Vec<String> = global
        .overrides
        .iter()
        .filter(|kv| !is_mount_property(kv.split('=').next().unwrap_or("")))
        .cloned()
        .collect();
    let mut loader =
        Loader::standard(global.conf.as_deref(), &overrides).map_err(|e| e.to_string())?;
    if let Some(c) = &global.cluster {
        loader
            .flag("client.cluster", c, "--cluster")
            .map_err(|e| e.to_string())?;
    }
    let config = loader.build().map_err(|e| e.to_string())?;
    Ok((loader, config))
}

/// A failed command: what was being done and why.
pub(crate) struct Failure {
    what: String,
    error: String,
    code: i32,
}

pub(crate) fn fail(op: &str, path: &str, e: FsError) -> Failure {
    Failure {
        what: format!("{op} {path}").trim_end().to_string(),
        error: e.to_string(),
        code: 1,
    }
}

fn format_time(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn mode_string(attr: &Attr) -> String {
    let mut s = String::with_capacity(10);
    s.push(attr.kind.letter());
    for shift in [6, 3, 0] {
        let bits = (attr.mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn attr_json(attr: &Attr) -> serde_json::Value {
    json!({
        "ino": attr.ino, "type": attr.kind.name(), "mode": format!("{:04o}", attr.mode),
        "uid": attr.uid, "gid": attr.gid, "size": attr.size, "nlink": attr.nlink,
        "atime_ns": attr.atime_ns, "mtime_ns": attr.mtime_ns, "ctime_ns": attr.ctime_ns,
        "symlink": attr.symlink, "block_size": attr.block_size, "replicas": attr.replicas,
        "storage": attr.storage.map(|t| t.name()),
        "writing": attr.writing.as_ref().map(|l| l.client.clone()),
        "ufs": attr.ufs.as_ref().map(ufs_json),
    })
}

/// Whether a file under a mount is in its UFS: `persisted`, `pending` or `failed`.
fn ufs_state_word(u: &curvine_messages::mount::UfsState) -> &'static str {
    match u.persist {
        curvine_messages::mount::Persist::Synced => "persisted",
        curvine_messages::mount::Persist::Pending { .. } => "pending",
        curvine_messages::mount::Persist::Failed { .. } => "failed",
    }
}

fn ufs_json(u: &curvine_messages::mount::UfsState) -> serde_json::Value {
    let (attempts, error) = match &u.persist {
        curvine_messages::mount::Persist::Failed {
            attempts, error, ..
        } => (Some(*attempts), Some(error.clone())),
        _ => (None, None),
    };
    json!({
        "mount": u.mount, "state": ufs_state_word(u), "len": u.len, "mtime_ns": u.mtime_ns,
        "etag": u.etag, "checked_ns": u.checked_ns, "attempts": attempts, "error": error,
    })
}

fn long_line(name: &str, attr: &Attr) -> String {
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>12} {} {}",
        mode_string(attr),
        attr.nlink,
        attr.uid,
        attr.gid,
        attr.size,
        format_time(attr.mtime_ns),
        name
    );
    if let Some(target) = &attr.symlink {
        line.push_str(" -> ");
        line.push_str(target);
    }
    line
}

async fn run(cli: Cli) -> Result<(), Failure> {
    run_traced(cli, None).await
}

/// Runs a command; with `trace`, every request it sends joins that trace.
async fn run_traced(
    cli: Cli,
    trace: Option<curvine_messages::trace::TraceCtx>,
) -> Result<(), Failure> {
    let setup = |e: String| Failure {
        what: "config".into(),
        error: e,
        code: 2,
    };
    let (loader, config) = config(&cli.global).map_err(setup)?;
    let json_out = cli.global.json;
    let command = match cli.command {
        Command::Conf(ConfCommand::Show) => {
            let entries = loader.entries();
            if json_out {
                let list: Vec<_> = entries
                    .iter()
                    .map(
                        |e| json!({"key": e.key, "value": e.value, "source": e.source.to_string()}),
                    )
                    .collect();
                print_json(&list);
            } else {
                let width = entries
                    .iter()
                    .map(|e| e.key.len() + e.value.len() + 3)
                    .max()
                    .unwrap_or(0);
                for e in entries {
                    let kv = format!("{} = {}", e.key, e.value);
                    println!("{kv:<width$}  # {}", e.source);
                }
            }
            return Ok(());
        }
        other => other,
    };
    let client = Client::connect(&curvine_client::client::client_conf(&config))
        .await
        .map_err(|e| Failure {
            what: format!("connect {}", config.client.cluster.join(",")),
            error: e.to_string(),
            code: 1,
        })?;
    let client = match trace {
        Some(t) => client.traced(t),
        None => client,
    };
    let abs = |p: &str| normalize(p, "/").map_err(|e| fail("path", p, e));
    let props: std::collections::BTreeMap<String, String> = cli
        .global
        .overrides
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| is_mount_property(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match command {
        Command::Conf(_) | Command::Fuse(_) => unreachable!("handled above"),
        Command::Mount(args) => run_mount(&client, args, props, json_out).await?,
        Command::Load {
            path,
            wait,
            no_overwrite,
        } => {
            let job = client
                .call(curvine_messages::rpc::Load {
                    path: path.clone(),
                    no_overwrite,
                })
                .await
                .map_err(|e| fail("load", &path, e))?;
            let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
            if !wait && !terminal {
                if json_out {
                    print_json(&job_json(&job));
                } else {
                    println!("load job {} started for {}", job.id, job.path);
                }
                return Ok(());
            }
            if terminal && !json_out {
                eprintln!(
                    "load job {} for {} (Ctrl-C leaves it running; see load-status {})",
                    job.id, job.path, job.id
                );
            }
            let job = follow_job(&client, &job.id, terminal && !json_out).await?;
            finish_job(&job, json_out)?;
        }
        Command::LoadStatus { id, watch } => match id {
            None => {
                let jobs = client
                    .call(curvine_messages::rpc::ListLoads)
                    .await
                    .map_err(|e| fail("load-status", "", e))?;
                if json_out {
                    print_json(&jobs.iter().map(job_json).collect::<Vec<_>>());
                } else {
                    for j in &jobs {
                        println!("{}", job_line(j));
                    }
                }
            }
            Some(id) => {
                let job = if watch {
                    follow_job(&client, &id, !json_out).await?
                } else {
                    client
                        .call(curvine_messages::rpc::LoadStatus { id: id.clone() })
                        .await
                        .map_err(|e| fail("load-status", &id, e))?
                };
                if json_out {
                    print_json(&job_json(&job));
                } else {
                    println!("{}", job_line(&job));
                    for (path, error) in &job.failures {
                        println!("  failed: {path}: {error}");
                    }
                }
            }
        },
        Command::CancelLoad { id } => {
            let job = client
                .call(curvine_messages::rpc::CancelLoad { id: id.clone() })
                .await
                .map_err(|e| fail("cancel-load", &id, e))?;
            if json_out {
                print_json(&job_json(&job));
            } else {
                println!("{}", job_line(&job));
            }
        }
        Command::Umount { path } => {
            let path = abs(&path)?;
            let m = client
                .call(curvine_messages::rpc::Umount { path: path.clone() })
                .await
                .map_err(|e| fail("umount", &path, e))?;
            if json_out {
                print_json(&mount_json(&m));
            } else {
                println!("unmounted {} from {}", m.ufs, m.path);
            }
        }
        Command::Actors { node } => {
            let trees = client
                .actors(node)
                .await
                .map_err(|e| fail("actors", "", e))?;
            if json_out {
                print_json(&trees);
            } else {
                print!("{}", format_actor_trees(&trees));
            }
        }
        Command::Report => {
            let report = client.report().await.map_err(|e| fail("report", "", e))?;
            if json_out {
                print_json(&report);
            } else {
                println!(
                    "cluster {} ({} shards, {} nodes)",
                    report.cluster_id,
                    report.shard_count,
                    report.nodes.len()
                );
                for node in &report.nodes {
                    let inodes: u64 = node.shards.iter().map(|s| s.inodes).sum();
                    let envs: std::collections::BTreeMap<&str, u64> = node
                        .shards
                        .iter()
                        .map(|s| (s.env.as_str(), s.env_bytes))
                        .collect();
                    println!(
                        "node {} [{}{}]  client {}  cluster {}  data port {}  dir {}",
                        node.node_id,
                        node.state,
                        since(node.state_since_ns),
                        node.rpc_addr,
                        node.cluster_addr,
                        node.data_addr,
                        if node.data_dir.is_empty() {
                            "-"
                        } else {
                            &node.data_dir
                        }
                    );
                    println!(
                        "  inodes {inodes}, metadata on disk {} bytes in {} environment(s)",
                        envs.values().sum::<u64>(),
                        envs.len()
                    );
                    for t in &node.tiers {
                        println!(
                            "  tier {} {}: {} of {} used, {} blocks",
                            t.kind,
                            t.path,
                            curvine_messages::human_bytes(t.used + t.reserved),
                            curvine_messages::human_bytes(t.capacity),
                            t.blocks
                        );
                    }
                    if node.checksum_errors > 0 {
                        println!("  checksum errors detected: {}", node.checksum_errors);
                    }
                    println!(
                        "  {:>5} {:>10} {:>10} {:>8}",
                        "shard", "inodes", "entries", "pending"
                    );
                    for s in &node.shards {
                        println!(
                            "  {:>5} {:>10} {:>10} {:>8}",
                            s.shard, s.inodes, s.dentries, s.intents
                        );
                    }
                }
            }
        }
        Command::Admin(AdminCommand::Shards) => {
            let report = client.report().await.map_err(|e| fail("shards", "", e))?;
            if json_out {
                print_json(&report.map);
            } else {
                let states: std::collections::HashMap<&str, &str> = report
                    .nodes
                    .iter()
                    .map(|n| (n.node_id.as_str(), n.state.as_str()))
                    .collect();
                println!(
                    "cluster map version {} ({} shards, {} nodes)",
                    report.map.version,
                    report.shard_count,
                    report.nodes.len()
                );
                println!(
                    "{:>5}  {:<14} {:<12} {:>10}",
                    "shard", "node", "state", "inodes"
                );
                for (shard, node) in report.map.shards.iter().enumerate() {
                    let inodes = report
                        .nodes
                        .iter()
                        .filter(|n| &n.node_id == node)
                        .flat_map(|n| n.shards.iter())
                        .find(|s| s.shard as usize == shard)
                        .map(|s| s.inodes.to_string())
                        .unwrap_or_else(|| "-".into());
                    println!(
                        "{shard:>5}  {node:<14} {:<12} {inodes:>10}",
                        states.get(node.as_str()).copied().unwrap_or("unknown")
                    );
                }
            }
        }
        Command::Admin(AdminCommand::MoveShard { shard, node }) => {
            let moved = client
                .call(curvine_messages::rpc::MoveShard {
                    shard,
                    to: node.clone(),
                })
                .await
                .map_err(|e| fail("move-shard", &format!("{shard} {node}"), e))?;
            if json_out {
                print_json(&moved);
            } else if moved.from == moved.to {
                println!("shard {} is already on node {}", moved.shard, moved.to);
            } else {
                println!(
                    "moved shard {} from node {} to node {}",
                    moved.shard, moved.from, moved.to
                );
            }
        }
        Command::Admin(AdminCommand::Rebalance) => {
            let moves = client
                .call(curvine_messages::rpc::Rebalance)
                .await
                .map_err(|e| fail("rebalance", "", e))?;
            if json_out {
                print_json(&moves);
            } else if moves.is_empty() {
                println!("shards are already balanced");
            } else {
                for m in &moves {
                    println!(
                        "moved shard {} from node {} to node {}",
                        m.shard, m.from, m.to
                    );
                }
                println!("{} shard(s) moved", moves.len());
            }
        }
        Command::Admin(AdminCommand::Decommission { node }) => {
            let report = client
                .call(curvine_messages::rpc::Decommission { node: node.clone() })
                .await
                .map_err(|e| fail("decommission", &node, e))?;
            if json_out {
                print_json(&report);
            } else {
                for m in &report.shards {
                    println!("moved shard {} to node {}", m.shard, m.to);
                }
                println!(
                    "{} block(s) copied to other nodes, {} could not be",
                    report.blocks_moved, report.blocks_failed
                );
            }
            if report.blocks_failed > 0 {
                return Err(Failure {
                    what: format!("decommission {node}"),
                    error: format!(
                        "{} block(s) still have their only copy there; the node stays (draining)",
                        report.blocks_failed
                    ),
                    code: 1,
                });
            }
            if !json_out {
                println!("node {node} has left the cluster; it can be stopped");
            }
        }
        Command::Admin(AdminCommand::Scrub { node, repair }) => {
            let nodes = client
                .scrub(node, repair)
                .await
                .map_err(|e| fail("scrub", "", e))?;
            if json_out {
                print_json(&nodes);
            } else {
                print!("{}", format_scrub(&nodes));
            }
            let left = nodes
                .iter()
                .map(|n| {
                    n.problems
                        .iter()
                        .filter(|p| !(repair && p.recoverable))
                        .count()
                        + usize::from(n.error.is_some())
                })
                .sum::<usize>();
            if left > 0 {
                return Err(Failure {
                    what: "scrub".into(),
                    error: format!("{left} problem(s) left"),
                    code: 1,
                });
            }
        }
        Command::Admin(AdminCommand::Fsck) => {
            let report = client.fsck().await.map_err(|e| fail("fsck", "", e))?;
            if json_out {
                print_json(&report);
            } else {
                println!(
                    "{} inodes, {} directories, {} entries, {} pending operations, {} name locks",
                    report.inodes,
                    report.directories,
                    report.dentries,
                    report.pending_intents,
                    report.locks
                );
                for p in &report.problems {
                    println!("problem: {p}");
                }
                println!(
                    "{}",
                    if report.problems.is_empty() {
                        "namespace is consistent"
                    } else {
                        "namespace has problems"
                    }
                );
            }
            if !report.problems.is_empty() {
                return Err(Failure {
                    what: "fsck".into(),
                    error: format!("{} problems found", report.problems.len()),
                    code: 1,
                });
            }
        }
        Command::Fs(fs) => run_fs(&client, fs, json_out, &abs).await?,
        Command::Trace(args) => run_trace(&client, cli.global, args, json_out).await?,
    }
    Ok(())
}

async fn run_trace(
    client: &Client,
    global: Global,
    args: trace::TraceArgs,
    json_out: bool,
) -> Result<(), Failure> {
    let err = |e: FsError| fail("trace", "", e);
    let mut query = args.query().map_err(err)?;
    if let Some(words) = args.command_words().map_err(err)? {
        // The command runs with the same global options, traced.
        let inner = Cli::try_parse_from(std::iter::once("curvine-cli".to_string()).chain(words))
            .map_err(|e| Failure {
                what: "trace --run".into(),
                error: e.to_string().trim().to_string(),
                code: 2,
            })?;
        if matches!(
            inner.command,
            Command::Trace(_) | Command::Fuse(_) | Command::Conf(_)
        ) {
            return Err(fail(
                "trace",
                "",
                FsError::InvalidArgument(
                    "only commands that talk to the cluster can be traced".into(),
                ),
            ));
        }
        // Options given inside the command win over the outer ones; `-c`
        // settings add to them.
        let mut overrides = global.overrides;
        overrides.extend(inner.global.overrides);
        let inner = Cli {
            global: Global {
                conf: inner.global.conf.or(global.conf),
                cluster: inner.global.cluster.or(global.cluster),
                overrides,
                json: false,
            },
            command: inner.command,
        };
        let ctx = curvine_messages::trace::TraceCtx::root();
        // The task-local context makes the data port's requests join too.
        let outcome =
            curvine_client::trace_scope(Some(ctx), Box::pin(run_traced(inner, Some(ctx)))).await;
        // Casts sent by the command may still be on their way.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        query.trace = Some(ctx.trace);
        let nodes = client.trace_events(query, Vec::new()).await.map_err(err)?;
        let events = trace::merge(&nodes);
        if let Some(file) = &args.chrome {
            write_chrome(file, &events)?;
        }
        eprintln!("trace {}", curvine_messages::trace::format_id(ctx.trace));
        if json_out {
            print_json(&events.iter().map(trace::event_json).collect::<Vec<_>>());
        } else {
            for line in trace::tree_lines(&events) {
                eprintln!("{line}");
            }
        }
        return outcome;
    }
    if args.follow {
        return trace::follow(client, query, json_out).await.map_err(err);
    }
    let nodes = client.trace_events(query, Vec::new()).await.map_err(err)?;
    let events = trace::merge(&nodes);
    if let Some(file) = &args.chrome {
        write_chrome(file, &events)?;
        eprintln!("wrote {} events to {file}", events.len());
    }
    if json_out {
        print_json(&events.iter().map(trace::event_json).collect::<Vec<_>>());
    } else if args.tree.is_some() {
        if events.is_empty() {
            return Err(fail(
                "trace",
                args.tree.as_deref().unwrap_or_default(),
                FsError::NotFound(
                    "no events of this trace on any node (the rings keep only recent events)"
                        .into(),
                ),
            ));
        }
        for line in trace::tree_lines(&events) {
            println!("{line}");
        }
    } else if args.chrome.is_none() {
        for e in &events {
            trace::print_line(e);
        }
    }
    Ok(())
}

/// The supervision trees as `actors` prints them: one table per node.
/// `admin scrub` as text: a line per node, a line per problem.
fn format_scrub(nodes: &[curvine_messages::rpc::NodeScrub]) -> String {
    let mut out = String::new();
    for n in nodes {
        match &n.error {
            Some(e) => out.push_str(&format!("node {}: could not scrub: {e}\n", n.node)),
            None => out.push_str(&format!(
                "node {}: {} blocks, {} verified in {:.1}s, {} problem(s)\n",
                n.node,
                n.blocks,
                curvine_messages::human_bytes(n.bytes),
                n.seconds,
                n.problems.len()
            )),
        }
        for p in &n.problems {
            out.push_str(&format!(
                "  block {:#x} ({} tier, {}): {}; {}\n",
                p.block, p.tier, p.path, p.problem, p.action
            ));
        }
    }
    out
}

fn format_actor_trees(trees: &[curvine_messages::stats::NodeActors]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for t in trees {
        let _ = writeln!(out, "node {}", t.node);
        let Some(root) = &t.root else {
            let _ = writeln!(
                out,
                "  (no answer: {})",
                t.error.as_deref().unwrap_or("unknown")
            );
            continue;
        };
        let rows: Vec<(String, &curvine_messages::stats::ActorInfo)> = root
            .walk()
            .into_iter()
            .map(|(depth, a)| (format!("{}{}", "  ".repeat(depth + 1), a.name), a))
            .collect();
        let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(5).max(5);
        let _ = writeln!(
            out,
            "{:width$}  {:>8}  {:>8}  {:>7}  {:>11}  {:>6}  {:>8}  {:>10}",
            "ACTOR", "ID", "STATUS", "MAILBOX", "HANDLED", "ERRORS", "RESTARTS", "UPTIME"
        );
        for (name, a) in rows {
            let _ = writeln!(
                out,
                "{name:width$}  {:>8}  {:>8}  {:>7}  {:>11}  {:>6}  {:>8}  {:>10}",
                a.id,
                a.status,
                a.mailbox.map_or("-".to_string(), |m| m.to_string()),
                a.handled,
                a.errors,
                a.restarts,
                uptime(a.uptime_ms),
            );
        }
    }
    out
}

fn uptime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn write_chrome(file: &str, events: &[curvine_messages::trace::TraceEvent]) -> Result<(), Failure> {
    let text = serde_json::to_string(&trace::chrome_json(events)).unwrap_or_default();
    std::fs::write(file, text).map_err(|e| fail("trace --chrome", file, FsError::Io(e.to_string())))
}

async fn run_fs(
    client: &Client,
    command: FsCommand,
    json_out: bool,
    abs: &dyn Fn(&str) -> Result<String, Failure>,
) -> Result<(), Failure> {
    match command {
        FsCommand::Mkdir { parents, paths } => {
            for p in paths {
                let path = abs(&p)?;
                client
                    .mkdir(&path, parents)
                    .await
                    .map_err(|e| fail("mkdir", &p, e))?;
            }
        }
        FsCommand::Touch { paths } => {
            for p in paths {
                let path = abs(&p)?;
                client
                    .touch(&path)
                    .await
                    .map_err(|e| fail("touch", &p, e))?;
            }
        }
        FsCommand::Stat { paths } => {
            for p in paths {
                let path = abs(&p)?;
                let attr = client.stat(&path).await.map_err(|e| fail("stat", &p, e))?;
                if json_out {
                    let mut v = attr_json(&attr);
                    v["path"] = json!(path);
                    println!("{v}");
                } else {
                    println!(
                        "  File: {path}{}",
                        attr.symlink
                            .as_ref()
                            .map(|t| format!(" -> {t}"))
                            .unwrap_or_default()
                    );
                    println!("  Size: {:<12} Type: {}", attr.size, attr.kind.name());
                    if attr.kind == FileKind::File && attr.block_size > 0 {
                        println!(
                            "Block size: {}  Replicas: {}{}",
                            curvine_messages::human_bytes(attr.block_size),
                            attr.replicas,
                            attr.storage
                                .map(|t| format!("  Storage: {t}"))
                                .unwrap_or_default()
                        );
                    }
                    if let Some(lease) = &attr.writing {
                        println!(
                            " State: being written by {} (the size is that of the last close)",
                            lease.client
                        );
                    }
                    if let (Some(u), FileKind::File) = (&attr.ufs, attr.kind) {
                        let etag = if u.etag.is_empty() {
                            String::new()
                        } else {
                            format!(", etag {}", u.etag)
                        };
                        println!("   UFS: {}{etag}", u.describe());
                    }
                    println!("Inode: {:<#18x} Links: {}", attr.ino, attr.nlink);
                    println!(
                        "Access: ({:04o}/{})  Uid: {}  Gid: {}",
                        attr.mode,
                        mode_string(&attr),
                        attr.uid,
                        attr.gid
                    );
                    println!("Access: {}", format_time(attr.atime_ns));
                    println!("Modify: {}", format_time(attr.mtime_ns));
                    println!("Change: {}", format_time(attr.ctime_ns));
                }
            }
        }
        FsCommand::Ls {
            long,
            recursive,
            paths,
        } => {
            let several = paths.len() > 1 || recursive;
            let mut queue: std::collections::VecDeque<String> =
                paths.iter().map(|p| abs(p)).collect::<Result<_, _>>()?;
            let mut all = Vec::new();
            while let Some(path) = queue.pop_front() {
                let entries = client
                    .list_all(&path)
                    .await
                    .map_err(|e| fail("ls", &path, e))?;
                if json_out {
                    for e in &entries {
                        let mut v = attr_json(&e.attr);
                        v["name"] = json!(e.name);
                        v["dir"] = json!(path);
                        all.push(v);
                    }
                } else {
                    if several {
                        println!("{path}:");
                    }
                    print_entries(&entries, long);
                    if several {
                        println!();
                    }
                }
                if recursive {
                    for e in entries
                        .iter()
                        .rev()
                        .filter(|e| e.attr.kind == FileKind::Dir)
                    {
                        let child = if path == "/" {
                            format!("/{}", e.name)
                        } else {
                            format!("{path}/{}", e.name)
                        };
                        queue.push_front(child);
                    }
                }
            }
            if json_out {
                println!("{}", serde_json::Value::Array(all));
            }
        }
        FsCommand::Mv { src, dst } => {
            let (s, mut d) = (abs(&src)?, abs(&dst)?);
            // Like mv: moving into an existing directory keeps the name.
            if let Ok(attr) = client.stat(&d).await {
                if attr.kind == FileKind::Dir && s != d {
                    let name = s.rsplit('/').next().unwrap_or_default();
                    d = if d == "/" {
                        format!("/{name}")
                    } else {
                        format!("{d}/{name}")
                    };
                }
            }
            client
                .rename(&s, &d)
                .await
                .map_err(|e| fail("mv", &src, e))?;
        }
        FsCommand::Rm {
            recursive,
            force,
            paths,
        } => {
            for p in paths {
                let path = abs(&p)?;
                match client.remove(&path, recursive).await {
                    Ok(_) => {}
                    Err(FsError::NotFound(_)) if force => {}
                    Err(e) => return Err(fail("rm", &p, e)),
                }
            }
        }
        FsCommand::Rmdir { paths } => {
            for p in paths {
                let path = abs(&p)?;
                client
                    .rmdir(&path)
                    .await
                    .map_err(|e| fail("rmdir", &p, e))?;
            }
        }
        FsCommand::Ln {
            symbolic: _,
            target,
            link,
        } => {
            let path = abs(&link)?;
            client
                .symlink(&target, &path)
                .await
                .map_err(|e| fail("ln", &link, e))?;
        }
        FsCommand::Xattr(command) => run_xattr(client, command, json_out, abs).await?,
        FsCommand::Data(command) => data::run(client, command, json_out, abs).await?,
        FsCommand::Readlink { path } => {
            let p = abs(&path)?;
            let target = client
                .readlink(&p)
                .await
                .map_err(|e| fail("readlink", &path, e))?;
            if json_out {
                println!("{}", json!({"path": p, "target": target}));
            } else {
                println!("{target}");
            }
        }
    }
    Ok(())
}

async fn run_xattr(
    client: &Client,
    command: XattrCommand,
    json_out: bool,
    abs: &dyn Fn(&str) -> Result<String, Failure>,
) -> Result<(), Failure> {
    match command {
        XattrCommand::Set {
            path,
            name,
            value,
            hex,
            create,
            replace,
        } => {
            let p = abs(&path)?;
            let bytes = if hex {
                parse_hex(&value).ok_or_else(|| Failure {
                    what: format!("xattr set {path}"),
                    error: format!("'{value}' is not hexadecimal bytes"),
                    code: 1,
                })?
            } else {
                value.into_bytes()
            };
            let mode = match (create, replace) {
                (true, _) => XattrMode::Create,
                (_, true) => XattrMode::Replace,
                _ => XattrMode::Any,
            };
            client
                .set_xattr(&p, &name, &bytes, mode)
                .await
                .map_err(|e| fail("xattr set", &path, e))?;
        }
        XattrCommand::Get { path, name } => {
            let p = abs(&path)?;
            let value = client
                .get_xattr(&p, &name)
                .await
                .map_err(|e| fail("xattr get", &path, e))?;
            if json_out {
                println!(
                    "{}",
                    json!({"path": p, "name": name, "value": show_value(&value)})
                );
            } else {
                println!("{}", show_value(&value));
            }
        }
        XattrCommand::List { path } => {
            let p = abs(&path)?;
            let names = client
                .list_xattr(&p)
                .await
                .map_err(|e| fail("xattr list", &path, e))?;
            if json_out {
                println!("{}", json!(names));
            } else {
                for n in names {
                    println!("{n}");
                }
            }
        }
        XattrCommand::Rm { path, name } => {
            let p = abs(&path)?;
            client
                .remove_xattr(&p, &name)
                .await
                .map_err(|e| fail("xattr rm", &path, e))?;
        }
    }
    Ok(())
}

/// " for 12s" after a state.
fn since(ns: i64) -> String {
    if ns <= 0 {
        return String::new();
    }
    let secs = (curvine_messages::now_ns() - ns).max(0) / 1_000_000_000;
    match secs {
        s if s < 120 => format!(" for {s}s"),
        s if s < 7200 => format!(" for {}m", s / 60),
        s => format!(" for {}h", s / 3600),
    }
}

fn print_json<T: serde::Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

fn job_json(j: &curvine_messages::mount::LoadJob) -> serde_json::Value {
    json!({
        "id": j.id, "path": j.path, "state": j.state.to_string(),
        "files_total": j.files_total, "files_done": j.files_done,
        "files_skipped": j.files_skipped, "files_failed": j.files_failed,
        "bytes_total": j.bytes_total, "bytes_done": j.bytes_done,
        "created_ns": j.created_ns, "updated_ns": j.updated_ns, "finished_ns": j.finished_ns,
        "failures": j.failures.iter().map(|(p, e)| json!({"path": p, "error": e})).collect::<Vec<_>>(),
        "error": j.error, "no_overwrite": j.no_overwrite,
    })
}

fn job_line(j: &curvine_messages::mount::LoadJob) -> String {
    let end = if j.finished_ns > 0 {
        j.finished_ns
    } else {
        j.updated_ns
    };
    let secs = ((end - j.created_ns) as f64 / 1e9).max(0.001);
    let mut line = format!(
        "job {} {} {}: {}/{} files ({} skipped, {} failed), {} of {} in {:.1}s ({}/s)",
        j.id,
        j.path,
        j.state,
        j.files_done + j.files_skipped,
        j.files_total,
        j.files_skipped,
        j.files_failed,
        curvine_messages::human_bytes(j.bytes_done),
        curvine_messages::human_bytes(j.bytes_total),
        secs,
        curvine_messages::human_bytes((j.bytes_done as f64 / secs) as u64),
    );
    if !j.error.is_empty() {
        line.push_str(&format!("; {}", j.error));
    }
    line
}

/// Polls a job until it ends, with a progress bar when `bar` is set.
async fn follow_job(
    client: &Client,
    id: &str,
    bar: bool,
) -> Result<curvine_messages::mount::LoadJob, Failure> {
    let progress = bar.then(|| {
        let p = indicatif::ProgressBar::new(0);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        ) {
            p.set_style(style.progress_chars("=> "));
        }
        p
    });
    loop {
        let job = client
            .call(curvine_messages::rpc::LoadStatus { id: id.to_string() })
            .await
            .map_err(|e| fail("load-status", id, e))?;
        if let Some(p) = &progress {
            p.set_length(job.bytes_total.max(1));
            p.set_position(job.bytes_done.min(job.bytes_total));
            p.set_message(format!(
                "{} {}/{} files{}",
                job.state,
                job.files_done + job.files_skipped,
                job.files_total,
                if job.files_failed > 0 {
                    format!(", {} failed", job.files_failed)
                } else {
                    String::new()
                }
            ));
        }
        if job.state.finished() {
            if let Some(p) = &progress {
                p.finish_and_clear();
            }
            return Ok(job);
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
}

/// Prints a finished job; a job with failed files (or failed as a whole)
/// is an error.
fn finish_job(job: &curvine_messages::mount::LoadJob, json_out: bool) -> Result<(), Failure> {
    use curvine_messages::mount::JobState;
    if json_out {
        print_json(&job_json(job));
    } else {
        println!("{}", job_line(job));
        for (path, error) in &job.failures {
            println!("  failed: {path}: {error}");
        }
        if job.files_failed as usize > job.failures.len() {
            println!(
                "  ... and {} more failed files",
                job.files_failed as usize - job.failures.len()
            );
        }
    }
    let failure = |error: String| Failure {
        what: format!("load {}", job.path),
        error,
        code: 1,
    };
    match job.state {
        JobState::Done if job.files_failed == 0 => Ok(()),
        JobState::Done => Err(failure(format!(
            "{} of {} files failed",
            job.files_failed, job.files_total
        ))),
        JobState::Cancelled => Err(failure("the job was cancelled".into())),
        _ => Err(failure(job.error.clone())),
    }
}

fn mount_json(m: &curvine_messages::mount::MountInfo) -> serde_json::Value {
    json!({
        "id": m.id, "path": m.path, "ufs": m.ufs, "write_type": m.write_type.to_string(),
        "properties": m.redacted().props, "ttl_ms": m.ttl_ms,
        "check_interval_ms": m.check_interval_ms, "read_verify_ufs": m.read_verify_ufs,
        "auto_cache": m.auto_cache, "replicas": m.replicas, "block_size": m.block_size,
        "storage_type": m.storage.map(|t| t.name()), "created_ns": m.created_ns,
    })
}

fn mount_line(m: &curvine_messages::mount::MountInfo) -> String {
    let shown = m.redacted();
    let mut line = format!("{} on {} ({}", shown.ufs, shown.path, shown.write_type);
    for (k, v) in &shown.props {
        line.push_str(&format!(", {k}={v}"));
    }
    if m.ttl_ms > 0 {
        line.push_str(&format!(", ttl={}ms", m.ttl_ms));
    }
    if let Some(ms) = m.check_interval_ms {
        line.push_str(&format!(", check_interval={ms}ms"));
    }
    if m.read_verify_ufs {
        line.push_str(", read_verify_ufs");
    }
    if !m.auto_cache {
        line.push_str(", no_auto_cache");
    }
    if let Some(r) = m.replicas {
        line.push_str(&format!(", replicas={r}"));
    }
    if let Some(bs) = m.block_size {
        line.push_str(&format!(
            ", block_size={}",
            curvine_messages::human_bytes(bs)
        ));
    }
    if let Some(t) = m.storage {
        line.push_str(&format!(", storage_type={}", t.name()));
    }
    line.push(')');
    line
}

async fn run_mount(
    client: &Client,
    args: MountArgs,
    props: std::collections::BTreeMap<String, String>,
    json_out: bool,
) -> Result<(), Failure> {
    let (Some(ufs), Some(path)) = (args.ufs, args.path) else {
        if !props.is_empty() {
            return Err(fail(
                "mount",
                "",
                FsError::InvalidArgument("properties (-c) need a UFS location and a path".into()),
            ));
        }
        let mounts = client
            .call(curvine_messages::rpc::ListMounts)
            .await
            .map_err(|e| fail("mount", "", e))?;
        if json_out {
            print_json(&mounts.iter().map(mount_json).collect::<Vec<_>>());
        } else {
            for m in &mounts {
                println!("{}", mount_line(m));
            }
        }
        return Ok(());
    };
    let path = normalize(&path, "/").map_err(|e| fail("mount", &path, e))?;
    let bad = |what: &str, e: String| {
        fail(
            "mount",
            &path,
            FsError::InvalidArgument(format!("{what}: {e}")),
        )
    };
    let dur = |flag: &str, v: &Option<String>| -> Result<Option<u64>, Failure> {
        v.as_deref()
            .map(|t| {
                curvine_conf::Dur::parse(t)
                    .map(|d| d.0.as_millis() as u64)
                    .map_err(|e| bad(flag, e))
            })
            .transpose()
    };
    let write_type = curvine_messages::mount::WriteType::parse(&args.write_type)
        .map_err(|e| fail("mount", &path, e))?;
    let block_size = args
        .block_size
        .as_deref()
        .map(|t| {
            curvine_conf::ByteSize::parse(t)
                .map(|b| b.0)
                .map_err(|e| bad("--block-size", e))
        })
        .transpose()?;
    let storage = args
        .storage_type
        .as_deref()
        .map(curvine_messages::block::TierKind::parse)
        .transpose()
        .map_err(|e| fail("mount", &path, e))?;
    let (uid, gid) = curvine_client::client::current_owner();
    let request = curvine_messages::rpc::Mount {
        info: curvine_messages::mount::MountInfo {
            id: 0,
            path: path.clone(),
            ufs: ufs.clone(),
            write_type,
            props,
            ttl_ms: dur("--ttl", &args.ttl)?.unwrap_or(0),
            check_interval_ms: dur("--check-interval", &args.check_interval)?,
            read_verify_ufs: args.read_verify_ufs,
            auto_cache: !args.no_auto_cache,
            replicas: args.replicas,
            block_size,
            storage,
            created_ns: 0,
        },
        uid,
        gid,
    };
    let m = client
        .call(request)
        .await
        .map_err(|e| fail("mount", &format!("{ufs} {path}"), e))?;
    if json_out {
        print_json(&mount_json(&m));
    } else {
        println!("mounted {}", mount_line(&m));
    }
    Ok(())
}

fn print_entries(entries: &[ListEntry], long: bool) {
    for e in entries {
        if long {
            println!("{}", long_line(&e.name, &e.attr));
        } else {
            println!("{}", e.name);
        }
    }
}

fn main() {
    // `curvine-cli ... | head` ends quietly, as other tools do.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if let Command::Fuse(command) = cli.command {
        // The mount runs its own runtime (and may daemonize first).
        let g = &cli.global;
        let code = curvine_fuse::run(
            curvine_fuse::ConfArgs {
                conf: g.conf.as_deref(),
                cluster: g.cluster.as_deref(),
                overrides: &g.overrides,
            },
            command,
        );
        std::process::exit(code);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("curvine-cli: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(f) = runtime.block_on(run(cli)) {
        if f.code == 0 {
            return;
        }
        eprintln!("curvine-cli: {}: {}", f.what, f.error);
        std::process::exit(f.code);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
