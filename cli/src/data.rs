//! File data commands: put, get, cat, head, tail, cp, du, df, free, blocks.

use std::io::{IsTerminal, Read, Write};

use clap::Subcommand;
use serde_json::json;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_messages::block::{check_block_size, FileSpec, TierKind};
use curvine_messages::{FileKind, FsError};

use crate::{fail, Failure};

/// Bytes moved per read or write call by the data commands.
const BUF: usize = 1 << 20;
/// Files at least this large get a progress bar on a terminal.
const PROGRESS_FROM: u64 = 8 << 20;

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

fn human(bytes: u64) -> String {
    curvine_messages::human_bytes(bytes)
}

fn size(bytes: u64, human_units: bool) -> String {
    if human_units {
        human(bytes)
    } else {
        bytes.to_string()
    }
}

fn local_err(op: &str, path: &str, e: std::io::Error) -> Failure {
    Failure {
        what: format!("{op} {path}"),
        error: e.to_string(),
        code: 1,
    }
}

fn progress(len: u64, label: &str) -> Option<indicatif::ProgressBar> {
    if len < PROGRESS_FROM || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    Some(bar)
}

fn name_of(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
}

fn child(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{}/{name}", dir.trim_end_matches('/'))
    }
}

/// The destination file: `dst`, or `dst/<name>` when `dst` is a directory.
async fn target(client: &Client, dst: &str, name: &str) -> String {
    match client.stat(dst).await {
        Ok(attr) if attr.kind == FileKind::Dir && !name.is_empty() => child(dst, name),
        _ => dst.to_string(),
    }
}

/// Create the file, or with `force` replace an existing one at close (its
/// old content stays readable until then, and stays if the copy fails).
fn options(force: bool, spec: FileSpec) -> WriteOptions {
    WriteOptions {
        create: true,
        exclusive: !force,
        truncate: false,
        replace: true,
        append: false,
        mode: 0o644,
        spec,
        owner: None,
    }
}

pub async fn run(
    client: &Client,
    command: DataCommand,
    json_out: bool,
    abs: &dyn Fn(&str) -> Result<String, Failure>,
) -> Result<(), Failure> {
    match command {
        DataCommand::Put {
            local,
            path,
            force,
            block_size,
            replicas,
            storage,
        } => {
            let mut spec = FileSpec::default();
            if let Some(bs) = block_size {
                let bytes = curvine_conf::ByteSize::parse(&bs).map_err(|e| Failure {
                    what: "put --block-size".into(),
                    error: e,
                    code: 1,
                })?;
                spec.block_size = check_block_size(bytes.0).map_err(|e| fail("put", &path, e))?;
            }
            if let Some(r) = replicas {
                spec.replicas = r;
            }
            if let Some(s) = storage {
                spec.storage = Some(TierKind::parse(&s).map_err(|e| fail("put", &path, e))?);
            }
            let dst = abs(&path)?;
            let dst = if local == "-" {
                dst
            } else {
                target(client, &dst, name_of(&local)).await
            };
            let (mut input, len): (Box<dyn Read>, u64) = if local == "-" {
                (Box::new(std::io::stdin().lock()), 0)
            } else {
                let f = std::fs::File::open(&local).map_err(|e| local_err("put", &local, e))?;
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
                    return Err(fail("put", &local, FsError::IsADirectory(String::new())));
                }
                (Box::new(f), len)
            };
            let mut writer = FileWriter::open(client, &dst, &options(force, spec))
                .await
                .map_err(|e| fail("put", &path, e))?;
            let bar = progress(len, name_of(&dst));
            let mut buf = vec![0u8; BUF];
            let copied: Result<(), Failure> = async {
                loop {
                    let n = tokio::task::block_in_place(|| input.read(&mut buf))
                        .map_err(|e| local_err("put", &local, e))?;
                    if n == 0 {
                        return Ok(());
                    }
                    writer
                        .write(&buf[..n])
                        .await
                        .map_err(|e| fail("put", &path, e))?;
                    if let Some(b) = &bar {
                        b.inc(n as u64);
                    }
                }
            }
            .await;
            if let Err(f) = copied {
                give_up(client, writer, &dst, force).await;
                return Err(f);
            }
            let attr = writer.close().await.map_err(|e| fail("put", &path, e))?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            if json_out {
                println!("{}", json!({"path": dst, "size": attr.size}));
            }
        }
        DataCommand::Get { path, local } => {
            let src = abs(&path)?;
            let mut reader = FileReader::open(client, &src)
                .await
                .map_err(|e| fail("get", &path, e))?;
            let mut out: Box<dyn Write> = if local == "-" {
                Box::new(std::io::stdout().lock())
            } else {
                let mut dest = std::path::PathBuf::from(&local);
                if dest.is_dir() {
                    dest.push(name_of(&src));
                }
                Box::new(
                    std::fs::File::create(&dest)
                        .map_err(|e| local_err("get", &dest.display().to_string(), e))?,
                )
            };
            let bar = progress(reader.size(), name_of(&src));
            copy_out(&mut reader, &mut out, bar.as_ref(), u64::MAX)
                .await
                .map_err(|e| e.named("get", &path))?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
        }
        DataCommand::Cat { paths } => {
            let mut out = std::io::stdout().lock();
            for p in paths {
                let src = abs(&p)?;
                let mut reader = FileReader::open(client, &src)
                    .await
                    .map_err(|e| fail("cat", &p, e))?;
                copy_out(&mut reader, &mut out, None, u64::MAX)
                    .await
                    .map_err(|e| e.named("cat", &p))?;
            }
        }
        DataCommand::Head { bytes, path } => {
            let src = abs(&path)?;
            let mut reader = FileReader::open(client, &src)
                .await
                .map_err(|e| fail("head", &path, e))?;
            let mut out = std::io::stdout().lock();
            copy_out(&mut reader, &mut out, None, bytes)
                .await
                .map_err(|e| e.named("head", &path))?;
        }
        DataCommand::Tail { bytes, path } => {
            let src = abs(&path)?;
            let mut reader = FileReader::open(client, &src)
                .await
                .map_err(|e| fail("tail", &path, e))?;
            reader.seek(reader.size().saturating_sub(bytes));
            let mut out = std::io::stdout().lock();
            copy_out(&mut reader, &mut out, None, bytes)
                .await
                .map_err(|e| e.named("tail", &path))?;
        }
        DataCommand::Cp { src, dst, force } => {
            let s = abs(&src)?;
            let d = target(client, &abs(&dst)?, name_of(&s)).await;
            let mut reader = FileReader::open(client, &s)
                .await
                .map_err(|e| fail("cp", &src, e))?;
            let spec = FileSpec {
                block_size: reader.attr.block_size,
                replicas: reader.attr.replicas,
                storage: reader.attr.storage,
            };
            let mut writer = FileWriter::open(client, &d, &options(force, spec))
                .await
                .map_err(|e| fail("cp", &dst, e))?;
            let bar = progress(reader.size(), name_of(&d));
            let mut buf = vec![0u8; BUF];
            let copied: Result<(), Failure> = async {
                loop {
                    let n = reader
                        .read(&mut buf)
                        .await
                        .map_err(|e| fail("cp", &src, e))?;
                    if n == 0 {
                        return Ok(());
                    }
                    writer
                        .write(&buf[..n])
                        .await
                        .map_err(|e| fail("cp", &dst, e))?;
                    if let Some(b) = &bar {
                        b.inc(n as u64);
                    }
                }
            }
            .await;
            if let Err(f) = copied {
                give_up(client, writer, &d, force).await;
                return Err(f);
            }
            writer.close().await.map_err(|e| fail("cp", &dst, e))?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
        }
        DataCommand::Du { human, paths } => {
            let mut rows = Vec::new();
            for p in paths {
                let path = abs(&p)?;
                let (bytes, files) = du(client, &path).await.map_err(|e| fail("du", &p, e))?;
                rows.push((path, bytes, files));
            }
            if json_out {
                let v: Vec<_> = rows
                    .iter()
                    .map(|(p, b, f)| json!({"path": p, "bytes": b, "files": f}))
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                for (p, b, _) in rows {
                    println!("{:<12} {p}", size(b, human));
                }
            }
        }
        DataCommand::Df { human } => {
            let report = client.report().await.map_err(|e| fail("df", "", e))?;
            if json_out {
                let v: Vec<_> = report
                    .nodes
                    .iter()
                    .flat_map(|n| {
                        n.tiers.iter().map(move |t| {
                            json!({"node": n.node_id, "tier": t.kind.name(), "path": t.path,
                                "capacity": t.capacity, "used": t.used, "reserved": t.reserved,
                                "available": t.capacity.saturating_sub(t.used + t.reserved),
                                "blocks": t.blocks})
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                println!(
                    "{:<14} {:<5} {:>12} {:>12} {:>12} {:>5} {:>8}  path",
                    "node", "tier", "capacity", "used", "available", "use%", "blocks"
                );
                for n in &report.nodes {
                    for t in &n.tiers {
                        let used = t.used + t.reserved;
                        println!(
                            "{:<14} {:<5} {:>12} {:>12} {:>12} {:>4}% {:>8}  {}",
                            n.node_id,
                            t.kind.name(),
                            size(t.capacity, human),
                            size(used, human),
                            size(t.capacity.saturating_sub(used), human),
                            (used * 100).checked_div(t.capacity).unwrap_or(0),
                            t.blocks,
                            t.path
                        );
                    }
                }
            }
        }
        DataCommand::Free { path } => {
            let p = abs(&path)?;
            let s = client.free(&p).await.map_err(|e| fail("free", &path, e))?;
            if json_out {
                print!("{}", serde_json::to_string(&s).unwrap_or_default());
                println!();
            } else {
                println!(
                    "freed {} blocks ({}); kept {} blocks that are the only copy of their data",
                    s.freed,
                    human(s.freed_bytes),
                    s.kept_only_copy
                );
            }
        }
        DataCommand::Blocks { path } => {
            let p = abs(&path)?;
            let fb = client
                .blocks(&p)
                .await
                .map_err(|e| fail("blocks", &path, e))?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&fb).unwrap_or_default());
            } else {
                println!(
                    "{p}: {} bytes in {} blocks of {}{}",
                    fb.attr.size,
                    fb.blocks.len(),
                    human(fb.attr.block_size),
                    fb.attr
                        .writing
                        .as_ref()
                        .map(|l| format!(" (being written by {})", l.client))
                        .unwrap_or_default()
                );
                println!(
                    "{:>6} {:>18} {:>12} {:>9}  replicas",
                    "index", "block", "bytes", "crc32c"
                );
                // The answering node knows the tiers of its own copies only.
                let here = client.node_id();
                for b in &fb.blocks {
                    let replicas: Vec<String> = b
                        .replicas
                        .iter()
                        .map(|r| match r.tier {
                            Some(t) => format!("{}:{}", r.node_id, t.name()),
                            None if r.node_id == here => format!("{}:missing", r.node_id),
                            None => r.node_id.clone(),
                        })
                        .collect();
                    println!(
                        "{:>6} {:>#18x} {:>12} {:>9}  {}",
                        b.info.index,
                        b.info.id,
                        b.info.len,
                        format!("{:08x}", b.info.crc),
                        replicas.join(" ")
                    );
                }
            }
        }
    }
    Ok(())
}

/// After a failed copy in: release the file, and remove it when this
/// command created it (without -f the target did not exist).
async fn give_up(client: &Client, writer: FileWriter, path: &str, force: bool) {
    let _ = writer.abort().await;
    if !force {
        let _ = client.remove(path, false).await;
    }
}

/// A failure while copying out: on our side or on the local side.
enum CopyError {
    Fs(FsError),
    Local(std::io::Error),
}

impl CopyError {
    fn named(self, op: &str, path: &str) -> Failure {
        match self {
            CopyError::Fs(e) => fail(op, path, e),
            // A closed pipe (`| head`) is a normal end.
            CopyError::Local(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Failure {
                what: String::new(),
                error: String::new(),
                code: 0,
            },
            CopyError::Local(e) => local_err(op, "(output)", e),
        }
    }
}

async fn copy_out(
    reader: &mut FileReader,
    out: &mut dyn Write,
    bar: Option<&indicatif::ProgressBar>,
    limit: u64,
) -> Result<(), CopyError> {
    let mut buf = vec![0u8; BUF];
    let mut left = limit;
    while left > 0 {
        let want = (buf.len() as u64).min(left) as usize;
        let n = reader.read(&mut buf[..want]).await.map_err(CopyError::Fs)?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n]).map_err(CopyError::Local)?;
        left -= n as u64;
        if let Some(b) = bar {
            b.inc(n as u64);
        }
    }
    out.flush().map_err(CopyError::Local)
}

/// Bytes and files under a path (files count their size; symlinks nothing).
async fn du(client: &Client, path: &str) -> Result<(u64, u64), FsError> {
    let attr = client.stat(path).await?;
    if attr.kind != FileKind::Dir {
        return Ok((
            if attr.kind == FileKind::File {
                attr.size
            } else {
                0
            },
            1,
        ));
    }
    let mut total = (0, 0);
    let mut stack = vec![path.to_string()];
    while let Some(dir) = stack.pop() {
        for e in client.list_all(&dir).await? {
            match e.attr.kind {
                FileKind::Dir => stack.push(child(&dir, &e.name)),
                FileKind::File => {
                    total.0 += e.attr.size;
                    total.1 += 1;
                }
                FileKind::Symlink => total.1 += 1,
            }
        }
    }
    Ok(total)
}
