//! `curvine-bench`: the benchmark tool.
//!
//! Metadata actions run the same program through the client library against
//! a cluster (`meta.*`) and through plain file-system calls on a local
//! directory (`local.meta.*`, e.g. on tmpfs as the baseline):
//! `create`, `stat`, `ls`, `rename`, `unlink` of `--file-num` entries spread
//! over `--dir-num` directories by `--client-threads` concurrent tasks.
//! `meta.all` / `local.meta.all` run the phases in that order on one tree.
//! Each phase prints `<action> ops, cost, speed` like the seed's tool.
//!
//! Data actions (`fs.write`, `fs.read`, `local.write`, `local.read`) measure
//! large-file throughput; see [`data`]. `load.conns` holds many client
//! connections doing metadata calls at once; see [`load`].

mod data;
mod load;
mod small;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use serde::Serialize;

use curvine_client::Client;
use curvine_conf::Loader;
use curvine_messages::FsError;

#[derive(Parser, Debug)]
#[command(
    name = "curvine-bench",
    version,
    about = "Benchmarks of a curvine cluster and their local baselines"
)]
struct Args {
    /// fs.write|fs.read|fuse.write|fuse.read|local.write|local.read (large files), or
    /// meta.create|meta.stat|meta.ls|meta.rename|meta.unlink|meta.all and the
    /// same with the prefix local. to run against a local directory.
    #[arg(long)]
    action: String,
    /// Directory the benchmark works in (a cluster path, or a local path
    /// for local.* and fuse.*: a directory inside the FUSE mount).
    #[arg(long, default_value = "/curvine-bench")]
    dir: String,
    /// Config file for the client.
    #[arg(long)]
    conf: Option<String>,
    /// Node to connect to (host:port).
    #[arg(long)]
    cluster: Option<String>,
    /// Set any config key: -c section.key=value.
    #[arg(short = 'c', long = "config", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Concurrent client tasks.
    #[arg(long, default_value_t = 8)]
    client_threads: usize,
    /// Files written or read (data actions, default 10), or entries created
    /// and then stated, renamed, unlinked (metadata actions, default 100000).
    #[arg(long)]
    file_num: Option<u64>,
    /// Size of each file (data actions).
    #[arg(long, default_value = "100MB")]
    file_size: String,
    /// Bytes per read or write call (data actions).
    #[arg(long, default_value = "128KB")]
    buf_size: String,
    /// Checksum every buffer written and verify every buffer read (data actions).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    checksum: bool,
    /// Copies of each block of the files written (fs.write); 0: the cluster default.
    #[arg(long, default_value_t = 0)]
    replicas: u16,
    /// Directories the entries are spread over.
    #[arg(long, default_value_t = 100)]
    dir_num: u64,
    /// Remove the benchmark directory afterwards (for single phases).
    #[arg(long, default_value_t = false)]
    delete_file: bool,
    /// local.* only: make every change durable like a careful application
    /// (fsync the new file and its directory after create, the directory
    /// after rename and unlink), the fair baseline for durable metadata.
    #[arg(long)]
    sync: bool,
    /// Print one JSON object per phase instead of text.
    #[arg(long)]
    json: bool,
    /// A label copied into the JSON output (to tell runs apart in reports).
    #[arg(long, default_value = "")]
    label: String,
    /// UFS location of the small-file actions (ufs.put, ufs.read); its
    /// properties are given with -c s3.*=...
    #[arg(long)]
    ufs: Option<String>,
    /// Random reads of the warm phase of fs.small-read and local.small-read.
    #[arg(long, default_value_t = 20_000)]
    reads: u64,
    /// How long the loaded phase of load.conns runs.
    #[arg(long, default_value_t = 180)]
    seconds: u64,
    /// Calls per second of each connection of load.conns (0: as fast as
    /// answered).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Create,
    Stat,
    Ls,
    Rename,
    Unlink,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::Ls => "ls",
            Phase::Rename => "rename",
            Phase::Unlink => "unlink",
        }
    }

    fn parse(text: &str) -> Option<Vec<Phase>> {
        Some(match text {
            "create" => vec![Phase::Create],
            "stat" => vec![Phase::Stat],
            "ls" => vec![Phase::Ls],
            "rename" => vec![Phase::Rename],
            "unlink" => vec![Phase::Unlink],
            "all" => vec![
                Phase::Create,
                Phase::Stat,
                Phase::Ls,
                Phase::Rename,
                Phase::Unlink,
            ],
            _ => return None,
        })
    }
}

#[derive(Serialize)]
struct PhaseResult {
    action: String,
    threads: usize,
    ops: u64,
    entries: u64,
    seconds: f64,
    ops_per_sec: f64,
    /// `--label`, when given.
    #[serde(skip_serializing_if = "String::is_empty")]
    label: String,
}

/// One benchmark target: the cluster through the client, or a local directory.
enum Target {
    Cluster(Arc<Client>),
    Local,
}

fn dir_of(root: &str, i: u64, dirs: u64) -> String {
    format!("{root}/d{:04}", i % dirs)
}

fn file_of(root: &str, i: u64, dirs: u64, renamed: bool) -> String {
    format!(
        "{}/{}{i}",
        dir_of(root, i, dirs),
        if renamed { "r" } else { "f" }
    )
}

fn io(e: std::io::Error, what: &str) -> FsError {
    FsError::Io(format!("{what}: {e}"))
}

impl Target {
    async fn mkdir(&self, path: &str) -> Result<(), FsError> {
        match self {
            Target::Cluster(c) => c.mkdir(path, true).await.map(|_| ()),
            Target::Local => std::fs::create_dir_all(path).map_err(|e| io(e, path)),
        }
    }

    async fn op(&self, phase: Phase, args: &Args, i: u64) -> Result<u64, FsError> {
        let (root, dirs) = (args.dir.as_str(), args.dir_num);
        match (self, phase) {
            (Target::Cluster(c), Phase::Create) => {
                c.create(&file_of(root, i, dirs, false)).await.map(|_| 1)
            }
            (Target::Cluster(c), Phase::Stat) => {
                c.stat(&file_of(root, i, dirs, false)).await.map(|_| 1)
            }
            (Target::Cluster(c), Phase::Ls) => c
                .list_all(&dir_of(root, i, dirs))
                .await
                .map(|l| l.len() as u64),
            (Target::Cluster(c), Phase::Rename) => c
                .rename(
                    &file_of(root, i, dirs, false),
                    &file_of(root, i, dirs, true),
                )
                .await
                .map(|_| 1),
            (Target::Cluster(c), Phase::Unlink) => c
                .remove(&file_of(root, i, dirs, true), false)
                .await
                .map(|_| 1),
            (Target::Local, phase) => {
                let (a, b, d) = (
                    file_of(root, i, dirs, false),
                    file_of(root, i, dirs, true),
                    dir_of(root, i, dirs),
                );
                let sync = args.sync;
                let sync_dir = move |d: &str| -> Result<(), FsError> {
                    if sync {
                        std::fs::File::open(d)
                            .and_then(|f| f.sync_all())
                            .map_err(|e| io(e, d))?;
                    }
                    Ok(())
                };
                tokio::task::spawn_blocking(move || -> Result<u64, FsError> {
                    match phase {
                        Phase::Create => {
                            let f = std::fs::OpenOptions::new()
                                .write(true)
                                .create_new(true)
                                .open(&a)
                                .map_err(|e| io(e, &a))?;
                            if sync {
                                f.sync_all().map_err(|e| io(e, &a))?;
                            }
                            sync_dir(&d).map(|_| 1)
                        }
                        Phase::Stat => std::fs::symlink_metadata(&a)
                            .map(|_| 1)
                            .map_err(|e| io(e, &a)),
                        Phase::Ls => std::fs::read_dir(&d)
                            .and_then(|r| {
                                r.map(|e| e.and_then(|e| e.metadata()))
                                    .collect::<Result<Vec<_>, _>>()
                            })
                            .map(|v| v.len() as u64)
                            .map_err(|e| io(e, &d)),
                        Phase::Rename => {
                            std::fs::rename(&a, &b).map_err(|e| io(e, &a))?;
                            sync_dir(&d).map(|_| 1)
                        }
                        Phase::Unlink => {
                            std::fs::remove_file(&b).map_err(|e| io(e, &b))?;
                            sync_dir(&d).map(|_| 1)
                        }
                    }
                })
                .await
                .map_err(|e| FsError::Io(e.to_string()))?
            }
        }
    }
}

async fn run_phase(
    target: Arc<Target>,
    args: Arc<Args>,
    phase: Phase,
    local: bool,
) -> Result<PhaseResult, FsError> {
    let count = if phase == Phase::Ls {
        args.dir_num
    } else {
        args.file_num.unwrap_or(100_000)
    };
    let next = Arc::new(AtomicU64::new(0));
    let entries = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.client_threads.max(1) {
        let (target, args, next, entries) =
            (target.clone(), args.clone(), next.clone(), entries.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, FsError>(());
                }
                let n = target.op(phase, &args, i).await?;
                entries.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.map_err(|e| FsError::Io(e.to_string()))??;
    }
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    let prefix = match (local, args.sync) {
        (false, _) => "meta",
        (true, false) => "local.meta",
        (true, true) => "local.meta.sync",
    };
    Ok(PhaseResult {
        action: format!("{prefix}.{}", phase.name()),
        threads: args.client_threads,
        ops: count,
        entries: entries.load(Ordering::Relaxed),
        seconds,
        ops_per_sec: count as f64 / seconds,
        label: args.label.clone(),
    })
}

async fn connect(args: &Args) -> Result<Client, String> {
    connect_with(
        args.conf.as_deref(),
        args.cluster.as_deref(),
        &args.overrides,
    )
    .await
}

async fn connect_with(
    conf: Option<&str>,
    cluster: Option<&str>,
    overrides: &[String],
) -> Result<Client, String> {
    let mut loader = Loader::standard(conf, overrides).map_err(|e| e.to_string())?;
    if let Some(c) = cluster {
        loader
            .flag("client.cluster", c, "--cluster")
            .map_err(|e| e.to_string())?;
    }
    let config = loader.build().map_err(|e| e.to_string())?;
    Client::connect(&curvine_client::client::client_conf(&config))
        .await
        .map_err(|e| format!("connect: {e}"))
}

/// `load.conns`: many clients of one connection each (see [`load`]).
async fn load_conns(args: &Args) -> Result<(), String> {
    let setup = connect(args).await?;
    let (conf, cluster) = (args.conf.clone(), args.cluster.clone());
    let mut overrides = args.overrides.clone();
    // A client of one connection each.
    overrides.push("client.connections=1".into());
    let connect_one = move || {
        let (conf, cluster, overrides) = (conf.clone(), cluster.clone(), overrides.clone());
        Box::pin(async move { connect_with(conf.as_deref(), cluster.as_deref(), &overrides).await })
            as futures::future::BoxFuture<'static, Result<Client, String>>
    };
    let params = load::Params {
        dir: args.dir.clone(),
        connections: args.client_threads,
        seconds: args.seconds,
        rate: args.rate,
        label: args.label.clone(),
    };
    load::run(params, setup, connect_one).await
}

async fn run(args: Args) -> Result<(), String> {
    if args.action == "load.conns" {
        return load_conns(&args).await;
    }
    if small::is_small_action(&args.action) {
        let (props, overrides): (Vec<String>, Vec<String>) = args
            .overrides
            .iter()
            .cloned()
            .partition(|kv| kv.starts_with("s3."));
        let client = if args.action == "fs.small-read" {
            Some(connect_with(args.conf.as_deref(), args.cluster.as_deref(), &overrides).await?)
        } else {
            None
        };
        let params = small::Params {
            action: args.action.clone(),
            ufs: args.ufs.clone(),
            props: props
                .iter()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            dir: args.dir.clone(),
            threads: args.client_threads,
            files: args.file_num.unwrap_or(5000),
            reads: args.reads,
            json: args.json,
            label: args.label.clone(),
        };
        return small::run(params, client).await;
    }
    if let Some(action) = data::Action::parse(&args.action) {
        let size = |flag: &str, text: &str| {
            curvine_conf::ByteSize::parse(text).map_err(|e| format!("--{flag}: {e}"))
        };
        let client = match action {
            data::Action::FsWrite | data::Action::FsRead => Some(connect(&args).await?),
            _ => None,
        };
        let params = data::Params {
            action,
            dir: args.dir.clone(),
            threads: args.client_threads,
            files: args.file_num.unwrap_or(10),
            file_size: size("file-size", &args.file_size)?.0,
            buf_size: size("buf-size", &args.buf_size)?.0 as usize,
            checksum: args.checksum,
            replicas: args.replicas,
            delete: args.delete_file,
            json: args.json,
            label: args.label.clone(),
        };
        return data::run(params, client).await;
    }
    let (local, phases) = match args.action.strip_prefix("local.meta.") {
        Some(rest) => (true, Phase::parse(rest)),
        None => (
            false,
            args.action.strip_prefix("meta.").and_then(Phase::parse),
        ),
    };
    let phases = phases.ok_or_else(|| {
        format!(
            "unknown action '{}' (use fs.write|fs.read|fuse.write|fuse.read|local.write|local.read, meta.create|meta.stat|meta.ls|meta.rename|meta.unlink|meta.all, or local.meta.*)",
            args.action
        )
    })?;
    if args.sync && !local {
        return Err(
            "--sync applies to local.meta.* actions (the cluster always commits durably)".into(),
        );
    }
    if args.dir_num == 0 || args.file_num == Some(0) {
        return Err("--dir-num and --file-num must be at least 1".into());
    }
    let target = if local {
        Target::Local
    } else {
        Target::Cluster(Arc::new(connect(&args).await?))
    };
    let target = Arc::new(target);
    let args = Args {
        file_num: Some(args.file_num.unwrap_or(100_000)),
        ..args
    };
    if phases.contains(&Phase::Create) {
        for d in 0..args.dir_num {
            target
                .mkdir(&dir_of(&args.dir, d, args.dir_num))
                .await
                .map_err(|e| format!("mkdir: {e}"))?;
        }
    }
    let args = Arc::new(args);
    for phase in phases {
        let result = run_phase(target.clone(), args.clone(), phase, local)
            .await
            .map_err(|e| {
                format!(
                    "{}.{}: {e}",
                    if local { "local.meta" } else { "meta" },
                    phase.name()
                )
            })?;
        if args.json {
            println!("{}", serde_json::to_string(&result).unwrap_or_default());
        } else {
            println!(
                "{} ops {}, entries {}, threads {}, cost {:.3}s, speed {:.0} ops/s",
                result.action,
                result.ops,
                result.entries,
                result.threads,
                result.seconds,
                result.ops_per_sec
            );
        }
    }
    if args.delete_file {
        match &*target {
            Target::Cluster(c) => {
                c.remove(&args.dir, true)
                    .await
                    .map_err(|e| format!("cleanup: {e}"))?;
            }
            Target::Local => {
                std::fs::remove_dir_all(&args.dir).map_err(|e| format!("cleanup: {e}"))?
            }
        }
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("curvine-bench: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("curvine-bench: {e}");
        std::process::exit(1);
    }
}
