//! Large-file throughput (the seed's `curvine-bench` data actions).
//!
//! `fs.write` / `fs.read` go through the client library to a cluster;
//! `local.write` / `local.read` do plain file I/O on a local directory (the
//! baseline, e.g. on tmpfs); `fuse.write` / `fuse.read` do the same plain
//! file I/O on a directory inside a FUSE mount of the cluster. `--client-threads` workers share `--file-num`
//! files of `--file-size` bytes, moving `--buf-size` bytes per call.
//! Throughput is total bytes / wall time. With `--checksum true` every buffer
//! is checksummed (crc32c, the same SIMD implementation for every action) when written, and every buffer read is
//! checksummed and compared with what was written.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rand::RngCore;

use curvine_messages::block::{crc32c, Crc32c};
use serde::Serialize;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    FsWrite,
    FsRead,
    LocalWrite,
    LocalRead,
    /// Plain file I/O on `--dir` inside a FUSE mount of the cluster.
    FuseWrite,
    FuseRead,
}

impl Action {
    pub fn parse(text: &str) -> Option<Action> {
        Some(match text {
            "fs.write" => Action::FsWrite,
            "fs.read" => Action::FsRead,
            "local.write" => Action::LocalWrite,
            "local.read" => Action::LocalRead,
            "fuse.write" => Action::FuseWrite,
            "fuse.read" => Action::FuseRead,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::FsWrite => "fs.write",
            Action::FsRead => "fs.read",
            Action::LocalWrite => "local.write",
            Action::LocalRead => "local.read",
            Action::FuseWrite => "fuse.write",
            Action::FuseRead => "fuse.read",
        }
    }

    fn writes(self) -> bool {
        matches!(
            self,
            Action::FsWrite | Action::LocalWrite | Action::FuseWrite
        )
    }
}

pub struct Params {
    pub action: Action,
    pub dir: String,
    pub threads: usize,
    pub files: u64,
    pub file_size: u64,
    pub buf_size: usize,
    pub checksum: bool,
    pub replicas: u16,
    pub delete: bool,
    pub json: bool,
    pub label: String,
}

#[derive(Serialize)]
struct DataResult {
    action: String,
    label: String,
    threads: usize,
    files: u64,
    file_size: u64,
    buf_size: usize,
    checksum: bool,
    bytes: u64,
    seconds: f64,
    gib_per_sec: f64,
}

/// The content of buffer `k` of file `f`: a random base buffer with the
/// file and buffer numbers in its last 16 bytes, so every buffer differs and
/// its expected crc costs 16 bytes of work.
struct Content {
    base: Vec<u8>,
    /// crc32c state after the base without its last 16 bytes.
    head: Crc32c,
}

impl Content {
    fn new(len: usize) -> Content {
        let mut base = vec![0u8; len.max(16)];
        rand::rngs::StdRng::seed_from_u64(0x5eed).fill_bytes(&mut base);
        let mut head = Crc32c::default();
        head.update(&base[..base.len() - 16]);
        Content { base, head }
    }

    fn stamp(f: u64, k: u64) -> [u8; 16] {
        let mut s = [0u8; 16];
        s[..8].copy_from_slice(&f.to_le_bytes());
        s[8..].copy_from_slice(&k.to_le_bytes());
        s
    }

    fn fill(&self, buf: &mut [u8], f: u64, k: u64) {
        buf.copy_from_slice(&self.base[..buf.len()]);
        let at = buf.len().saturating_sub(16);
        let n = buf.len() - at;
        buf[at..].copy_from_slice(&Self::stamp(f, k)[..n]);
    }

    /// crc32c of buffer `k` of file `f` (full-size buffers only).
    fn crc(&self, f: u64, k: u64) -> u32 {
        let mut c = self.head;
        c.update(&Self::stamp(f, k));
        c.value()
    }
}

use rand::SeedableRng;

fn path(dir: &str, f: u64) -> String {
    format!("{}/file-{f:05}", dir.trim_end_matches('/'))
}

/// Checks one buffer read back: its crc against the expected one, or (for
/// the short last buffer) its bytes.
fn verify(content: &Content, buf: &[u8], f: u64, k: u64, what: &str) -> Result<(), String> {
    let ok = if buf.len() == content.base.len() {
        crc32c(buf) == content.crc(f, k)
    } else {
        let mut want = vec![0u8; buf.len()];
        content.fill(&mut want, f, k);
        want == buf
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: buffer {k} does not hold what was written"))
    }
}

pub async fn run(p: Params, client: Option<Client>) -> Result<(), String> {
    if p.buf_size < 16 || p.file_size == 0 || p.files == 0 || p.threads == 0 {
        return Err(
            "--buf-size must be at least 16 bytes and --file-size, --file-num, --client-threads at least 1"
                .into(),
        );
    }
    let p = Arc::new(p);
    let content = Arc::new(Content::new(p.buf_size));
    match (&client, p.action.writes()) {
        (Some(c), true) => {
            c.mkdir(&p.dir, true)
                .await
                .map_err(|e| format!("mkdir {}: {e}", p.dir))?;
        }
        (None, true) => {
            std::fs::create_dir_all(&p.dir).map_err(|e| format!("mkdir {}: {e}", p.dir))?
        }
        _ => {}
    }
    let next = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..p.threads {
        let (p, content, next, bytes, client) = (
            p.clone(),
            content.clone(),
            next.clone(),
            bytes.clone(),
            client.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let f = next.fetch_add(1, Ordering::Relaxed);
                if f >= p.files {
                    return Ok::<(), String>(());
                }
                let n = match &client {
                    Some(c) => cluster_file(c, &p, &content, f).await?,
                    None => {
                        let (p, content) = (p.clone(), content.clone());
                        tokio::task::spawn_blocking(move || local_file(&p, &content, f))
                            .await
                            .map_err(|e| e.to_string())??
                    }
                };
                bytes.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let seconds = start.elapsed().as_secs_f64().max(1e-9);
    let total = bytes.load(Ordering::Relaxed);
    let result = DataResult {
        action: p.action.name().into(),
        label: p.label.clone(),
        threads: p.threads,
        files: p.files,
        file_size: p.file_size,
        buf_size: p.buf_size,
        checksum: p.checksum,
        bytes: total,
        seconds,
        gib_per_sec: total as f64 / seconds / (1u64 << 30) as f64,
    };
    if p.json {
        println!("{}", serde_json::to_string(&result).unwrap_or_default());
    } else {
        println!(
            "{} size {}, cost {:.3}s, speed {:.2}GiB/s (threads {}, buffer {}, checksum {})",
            result.action,
            curvine_messages::human_bytes(total),
            seconds,
            result.gib_per_sec,
            p.threads,
            curvine_messages::human_bytes(p.buf_size as u64),
            p.checksum
        );
    }
    if p.delete {
        match &client {
            Some(c) => {
                c.remove(&p.dir, true)
                    .await
                    .map_err(|e| format!("cleanup: {e}"))?;
            }
            None => std::fs::remove_dir_all(&p.dir).map_err(|e| format!("cleanup: {e}"))?,
        }
    }
    Ok(())
}

async fn cluster_file(c: &Client, p: &Params, content: &Content, f: u64) -> Result<u64, String> {
    let file = path(&p.dir, f);
    let mut buf = vec![0u8; p.buf_size];
    let mut done = 0u64;
    let mut k = 0;
    if p.action.writes() {
        let options = WriteOptions {
            spec: curvine_messages::block::FileSpec {
                replicas: p.replicas,
                ..Default::default()
            },
            ..WriteOptions::create()
        };
        let mut w = FileWriter::open(c, &file, &options)
            .await
            .map_err(|e| format!("{file}: {e}"))?;
        while done < p.file_size {
            let n = (p.file_size - done).min(p.buf_size as u64) as usize;
            content.fill(&mut buf[..n], f, k);
            if p.checksum {
                std::hint::black_box(crc32c(&buf[..n]));
            }
            w.write(&buf[..n])
                .await
                .map_err(|e| format!("{file}: {e}"))?;
            done += n as u64;
            k += 1;
        }
        w.close().await.map_err(|e| format!("{file}: {e}"))?;
    } else {
        let mut r = FileReader::open(c, &file)
            .await
            .map_err(|e| format!("{file}: {e}"))?;
        loop {
            let n = r
                .read_full(&mut buf)
                .await
                .map_err(|e| format!("{file}: {e}"))?;
            if n == 0 {
                break;
            }
            if p.checksum {
                verify(content, &buf[..n], f, k, &file)?;
            }
            done += n as u64;
            k += 1;
        }
        if done != p.file_size {
            return Err(format!(
                "{file}: read {done} bytes, expected {} (write the files with the same --file-size first)",
                p.file_size
            ));
        }
    }
    Ok(done)
}

fn local_file(p: &Params, content: &Content, f: u64) -> Result<u64, String> {
    let file = path(&p.dir, f);
    let err = |e: std::io::Error| format!("{file}: {e}");
    let mut buf = vec![0u8; p.buf_size];
    let mut done = 0u64;
    let mut k = 0;
    if p.action.writes() {
        let mut out = std::fs::File::create(&file).map_err(err)?;
        while done < p.file_size {
            let n = (p.file_size - done).min(p.buf_size as u64) as usize;
            content.fill(&mut buf[..n], f, k);
            if p.checksum {
                std::hint::black_box(crc32c(&buf[..n]));
            }
            out.write_all(&buf[..n]).map_err(err)?;
            done += n as u64;
            k += 1;
        }
    } else {
        let mut input = std::fs::File::open(&file).map_err(err)?;
        loop {
            let mut n = 0;
            while n < buf.len() {
                let m = input.read(&mut buf[n..]).map_err(err)?;
                if m == 0 {
                    break;
                }
                n += m;
            }
            if n == 0 {
                break;
            }
            if p.checksum {
                verify(content, &buf[..n], f, k, &file)?;
            }
            done += n as u64;
            k += 1;
        }
        if done != p.file_size {
            return Err(format!(
                "{file}: read {done} bytes, expected {}",
                p.file_size
            ));
        }
    }
    Ok(done)
}
