//! File data commands: put, get, cat, head, tail, cp, du, df, free, blocks.

use std::io::{IsTerminal, Read, Write};

use serde_json::json;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_messages::block::{check_block_size, FileSpec, TierKind};
use curvine_messages::path::child;
use curvine_messages::{Attr, FileKind, FsError};

use crate::args::DataCommand;
use crate::ctx::Ctx;
use crate::output::{print_json, print_json_line};
use crate::{fail, Failure};

/// Bytes moved per read or write call by the data commands.
const BUF: usize = 1 << 20;
/// Files at least this large get a progress bar on a terminal.
const PROGRESS_FROM: u64 = 8 << 20;

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
    bar.set_message(curvine_messages::names::shown(label).into_owned());
    Some(bar)
}

/// A local path from its form in the arguments: its bytes (see
/// `curvine_messages::names`).
fn local_path(s: &str) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(curvine_messages::names::to_bytes(s).into_owned()).into()
}

fn name_of(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(path)
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

pub async fn run(cx: &Ctx<'_>, command: DataCommand) -> Result<(), Failure> {
    match command {
        DataCommand::Put {
            local,
            path,
            force,
            block_size,
            replicas,
            storage,
        } => {
            let spec = put_spec(&path, block_size, replicas, storage)?;
            put(cx, &local, &path, force, spec).await
        }
        DataCommand::Get { path, local } => get(cx, &path, &local).await,
        DataCommand::Cat { paths } => cat(cx, paths).await,
        DataCommand::Head { bytes, path } => head(cx, bytes, &path).await,
        DataCommand::Tail { bytes, path } => tail(cx, bytes, &path).await,
        DataCommand::Cp { src, dst, force } => cp(cx, &src, &dst, force).await,
        DataCommand::Du { human, paths } => du(cx, human, paths).await,
        DataCommand::Df { human } => df(cx, human).await,
        DataCommand::Free { path } => free(cx, &path).await,
        DataCommand::Blocks { path } => blocks(cx, &path).await,
    }
}

/// The block size, replicas and tier `put` gives the new file.
fn put_spec(
    path: &str,
    block_size: Option<String>,
    replicas: Option<u16>,
    storage: Option<String>,
) -> Result<FileSpec, Failure> {
    let mut spec = FileSpec::default();
    if let Some(bs) = block_size {
        let bytes = curvine_conf::ByteSize::parse(&bs).map_err(|e| Failure {
            what: "put --block-size".into(),
            error: e,
            code: 1,
        })?;
        spec.block_size = check_block_size(bytes.0).map_err(|e| fail("put", path, e))?;
    }
    if let Some(r) = replicas {
        spec.replicas = r;
    }
    if let Some(s) = storage {
        spec.storage = Some(TierKind::parse(&s).map_err(|e| fail("put", path, e))?);
    }
    Ok(spec)
}

async fn put(
    cx: &Ctx<'_>,
    local: &str,
    path: &str,
    force: bool,
    spec: FileSpec,
) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let dst = cx.abs(path)?;
    let dst = if local == "-" {
        dst
    } else {
        target(client, &dst, name_of(local)).await
    };
    let (input, len): (Box<dyn Read>, u64) = if local == "-" {
        (Box::new(std::io::stdin().lock()), 0)
    } else {
        let f = std::fs::File::open(local_path(local)).map_err(|e| local_err("put", local, e))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(fail("put", local, FsError::IsADirectory(String::new())));
        }
        (Box::new(f), len)
    };
    let writer = FileWriter::open(client, &dst, &options(force, spec))
        .await
        .map_err(|e| fail("put", path, e))?;
    let bar = progress(len, name_of(&dst));
    let input = Input::Local {
        source: input,
        path: local,
    };
    let written = copy_in(client, input, writer, &dst, force, bar, ("put", path)).await?;
    if json_out {
        print_json_line(&json!({"path": dst, "size": written.size}));
    }
    Ok(())
}

async fn get(cx: &Ctx<'_>, path: &str, local: &str) -> Result<(), Failure> {
    let (src, mut reader) = open(cx, "get", path).await?;
    let mut out: Box<dyn Write> = if local == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        let mut dest = local_path(local);
        if dest.is_dir() {
            dest.push(local_path(name_of(&src)));
        }
        Box::new(
            std::fs::File::create(&dest)
                .map_err(|e| local_err("get", &dest.display().to_string(), e))?,
        )
    };
    let bar = progress(reader.size(), name_of(&src));
    copy_out(&mut reader, &mut out, bar.as_ref(), u64::MAX)
        .await
        .map_err(|e| e.named("get", path))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(())
}

async fn cat(cx: &Ctx<'_>, paths: Vec<String>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    for p in paths {
        let (_, mut reader) = open(cx, "cat", &p).await?;
        copy_out(&mut reader, &mut out, None, u64::MAX)
            .await
            .map_err(|e| e.named("cat", &p))?;
    }
    Ok(())
}

async fn head(cx: &Ctx<'_>, bytes: u64, path: &str) -> Result<(), Failure> {
    let (_, mut reader) = open(cx, "head", path).await?;
    let mut out = std::io::stdout().lock();
    copy_out(&mut reader, &mut out, None, bytes)
        .await
        .map_err(|e| e.named("head", path))
}

async fn tail(cx: &Ctx<'_>, bytes: u64, path: &str) -> Result<(), Failure> {
    let (_, mut reader) = open(cx, "tail", path).await?;
    reader.seek(reader.size().saturating_sub(bytes));
    let mut out = std::io::stdout().lock();
    copy_out(&mut reader, &mut out, None, bytes)
        .await
        .map_err(|e| e.named("tail", path))
}

async fn cp(cx: &Ctx<'_>, src: &str, dst: &str, force: bool) -> Result<(), Failure> {
    let client = cx.client;
    let s = cx.abs(src)?;
    let d = target(client, &cx.abs(dst)?, name_of(&s)).await;
    let mut reader = FileReader::open(client, &s)
        .await
        .map_err(|e| fail("cp", src, e))?;
    let spec = FileSpec {
        block_size: reader.attr.block_size,
        replicas: reader.attr.replicas,
        storage: reader.attr.storage,
    };
    let writer = FileWriter::open(client, &d, &options(force, spec))
        .await
        .map_err(|e| fail("cp", dst, e))?;
    let bar = progress(reader.size(), name_of(&d));
    let input = Input::Cluster {
        reader: &mut reader,
        path: src,
    };
    copy_in(client, input, writer, &d, force, bar, ("cp", dst)).await?;
    Ok(())
}

async fn du(cx: &Ctx<'_>, human: bool, paths: Vec<String>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let mut rows = Vec::new();
    for p in paths {
        let (path, (bytes, files)) = cx
            .on_path(
                "du",
                &p,
                |path| async move { bytes_under(client, &path).await },
            )
            .await?;
        rows.push((path, bytes, files));
    }
    if json_out {
        let v: Vec<_> = rows
            .iter()
            .map(|(p, b, f)| json!({"path": p, "bytes": b, "files": f}))
            .collect();
        print_json_line(&v);
    } else {
        for (p, b, _) in rows {
            out!("{:<12} {p}", size(b, human));
        }
    }
    Ok(())
}

async fn df(cx: &Ctx<'_>, human: bool) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let report = client.report().await.map_err(|e| fail("df", "", e))?;
    if json_out {
        let v: Vec<_> = report
            .nodes
            .iter()
            .flat_map(|n| {
                n.tiers.iter().map(move |t| {
                    json!({"node": n.node_id, "tier": t.kind.name(), "path": t.path,
                        "capacity": t.capacity, "used": t.used, "reserved": t.reserved, "held": t.held,
                        "available": t.capacity.saturating_sub(t.used + t.reserved),
                        "blocks": t.blocks})
                })
            })
            .collect();
        print_json_line(&v);
    } else {
        out!(
            "{:<14} {:<5} {:>12} {:>12} {:>12} {:>12} {:>5} {:>8}  path",
            "node",
            "tier",
            "capacity",
            "used",
            "held",
            "available",
            "use%",
            "blocks"
        );
        for n in &report.nodes {
            for t in &n.tiers {
                let used = t.used + t.reserved;
                out!(
                    "{:<14} {:<5} {:>12} {:>12} {:>12} {:>12} {:>4}% {:>8}  {}",
                    n.node_id,
                    t.kind.name(),
                    size(t.capacity, human),
                    size(used, human),
                    size(t.held, human),
                    size(t.capacity.saturating_sub(used), human),
                    (used * 100).checked_div(t.capacity).unwrap_or(0),
                    t.blocks,
                    t.path
                );
            }
        }
    }
    Ok(())
}

async fn free(cx: &Ctx<'_>, path: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let (_, s) = cx
        .on_path("free", path, |p| async move { client.free(&p).await })
        .await?;
    if json_out {
        print_json_line(&s);
    } else {
        out!(
            "freed {} blocks ({}); kept {} blocks that are the only copy of their data",
            s.freed,
            human(s.freed_bytes),
            s.kept_only_copy
        );
    }
    Ok(())
}

async fn blocks(cx: &Ctx<'_>, path: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let (p, fb) = cx
        .on_path("blocks", path, |p| async move { client.blocks(&p).await })
        .await?;
    if json_out {
        print_json(&fb);
    } else {
        out!(
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
        out!(
            "{:>6} {:>18} {:>12} {:>9}  replicas",
            "index",
            "block",
            "bytes",
            "crc32c"
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
            out!(
                "{:>6} {:>#18x} {:>12} {:>9}  {}",
                b.info.index,
                b.info.id,
                b.info.len,
                format!("{:08x}", b.info.crc),
                replicas.join(" ")
            );
        }
        if fb.blocks.len() > 1 {
            if let Some(file) = fb.backing_file() {
                out!("laid out in one extent file on {here}: {file}");
            }
        }
    }
    Ok(())
}

/// What a copy into the cluster reads: a local file or stdin (`put`) or a
/// file of the cluster (`cp`), with the path its read errors name.
enum Input<'a> {
    Local {
        source: Box<dyn Read>,
        path: &'a str,
    },
    Cluster {
        reader: &'a mut FileReader,
        path: &'a str,
    },
}

impl Input<'_> {
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, Failure> {
        match self {
            Input::Local { source, path } => tokio::task::block_in_place(|| source.read(buf))
                .map_err(|e| local_err("put", path, e)),
            Input::Cluster { reader, path } => {
                reader.read(buf).await.map_err(|e| fail("cp", path, e))
            }
        }
    }
}

/// Copies all of `input` into `writer` and closes it (the new content
/// shows from then on); a failure gives the file up (see `give_up`).
/// `(op, path)` name write and close errors.
async fn copy_in(
    client: &Client,
    mut input: Input<'_>,
    mut writer: FileWriter,
    dst: &str,
    force: bool,
    bar: Option<indicatif::ProgressBar>,
    (op, path): (&str, &str),
) -> Result<Attr, Failure> {
    let mut buf = vec![0u8; BUF];
    let copied: Result<(), Failure> = async {
        loop {
            let n = input.read(&mut buf).await?;
            if n == 0 {
                return Ok(());
            }
            writer
                .write(&buf[..n])
                .await
                .map_err(|e| fail(op, path, e))?;
            if let Some(b) = &bar {
                b.inc(n as u64);
            }
        }
    }
    .await;
    if let Err(f) = copied {
        give_up(client, writer, dst, force).await;
        return Err(f);
    }
    let attr = writer.close().await.map_err(|e| fail(op, path, e))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(attr)
}

/// Opens a file of the cluster for reading; failures are named by `op` and
/// the path as given. Returns the file's absolute path with its reader.
async fn open(cx: &Ctx<'_>, op: &str, path: &str) -> Result<(String, FileReader), Failure> {
    cx.on_path(op, path, |src| async move {
        FileReader::open(cx.client, &src).await
    })
    .await
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

/// Bytes and files under a path (files count their size; symlinks and
/// special files nothing).
async fn bytes_under(client: &Client, path: &str) -> Result<(u64, u64), FsError> {
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
                _ => total.1 += 1,
            }
        }
    }
    Ok(total)
}
