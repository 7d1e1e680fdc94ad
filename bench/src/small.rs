//! B2 (small files over S3), client-library part.
//!
//! Files are `small/d{i % 50}/f{i:05}.jpg` of 60-140 KB, each a picture
//! (see [`content`]); the size follows from `i`, so every action agrees on
//! the set without listing it:
//!
//! - `ufs.put`: writes the files to `--ufs` (a location with `-c s3.*`
//!   properties) with `--client-threads` requests at a time;
//! - `ufs.read`: reads every file once, whole, straight from the UFS (a GET
//!   per file), in a random order split over `--client-threads` readers:
//!   the baseline;
//! - `fs.small-read`: reads the same files through the cluster under
//!   `--dir` (a mount of that location): first every file once in a random
//!   order (`cold`: each read goes through to the UFS and fills the cache),
//!   then `--reads` files picked at random (`warm`);
//! - `local.put`: writes the same files under the local directory `--dir`
//!   (the source of the ingest benchmark, `rclone copy` into a mount);
//! - `local.small-read`: the same phases with plain file reads under the
//!   local directory `--dir` (a FUSE mount of the cluster, or any directory
//!   holding the files), like the seed's `load_img.py` without the decode.
//!
//! Each phase prints `<action> files, cost, files/s, MB/s`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use curvine_actors::ufs::{Ufs, UfsOptions, UfsUri};
use curvine_client::io::FileReader;
use curvine_client::Client;

pub struct Params {
    pub action: String,
    pub ufs: Option<String>,
    pub props: BTreeMap<String, String>,
    pub dir: String,
    pub threads: usize,
    pub files: u64,
    pub reads: u64,
    pub json: bool,
    pub label: String,
}

#[derive(Serialize)]
struct SmallResult {
    action: String,
    phase: String,
    threads: usize,
    files: u64,
    bytes: u64,
    seconds: f64,
    files_per_sec: f64,
    mb_per_sec: f64,
    #[serde(skip_serializing_if = "String::is_empty")]
    label: String,
}

pub fn is_small_action(action: &str) -> bool {
    matches!(
        action,
        "ufs.put" | "ufs.read" | "fs.small-read" | "local.put" | "local.small-read"
    )
}

fn name(i: u64) -> String {
    format!("small/d{:02}/f{i:05}.jpg", i % 50)
}

fn size(i: u64) -> usize {
    // 60-140 KB, spread by a hash of the index.
    let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    60_000 + (h % 80_001) as usize
}

/// Width and height of the picture in every file.
const PICTURE: (u16, u16) = (320, 240);

/// File `i`: a JPEG picture (a gradient with noise, different per file, so
/// readers that decode, like `bench/load_img.py --decode`, do real work),
/// padded with comment segments to exactly `size(i)` bytes.
pub fn content(i: u64) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i);
    let (w, h) = (PICTURE.0 as usize, PICTURE.1 as usize);
    let base: [u8; 3] = rng.gen();
    let mut pixels = vec![0u8; w * h * 3];
    for y in 0..h {
        for x in 0..w {
            let p = (y * w + x) * 3;
            for c in 0..3 {
                let grad = (x * (c + 1) / 3 + y * (3 - c) / 3) as u8;
                let noise = rng.gen_range(0..24u8);
                pixels[p + c] = base[c].wrapping_add(grad).wrapping_add(noise);
            }
        }
    }
    let mut jpeg = Vec::with_capacity(size(i));
    jpeg_encoder::Encoder::new(&mut jpeg, 85)
        .encode(&pixels, PICTURE.0, PICTURE.1, jpeg_encoder::ColorType::Rgb)
        .expect("encoding into memory does not fail");
    pad_jpeg(jpeg, size(i))
}

/// Inserts comment segments (FF FE, 2-byte length, bytes) after the JPEG's
/// start-of-image marker until it is `target` bytes long.
fn pad_jpeg(jpeg: Vec<u8>, target: usize) -> Vec<u8> {
    assert!(
        jpeg.len() + 4 <= target,
        "picture of {} bytes for a file of {target}",
        jpeg.len()
    );
    let mut out = Vec::with_capacity(target);
    out.extend_from_slice(&jpeg[..2]);
    let mut left = target - jpeg.len();
    while left > 0 {
        // A segment is 4 to 65,537 bytes; never leave 1-3 bytes for the last.
        let mut seg = left.min(65_537);
        if (1..4).contains(&(left - seg)) {
            seg -= 4;
        }
        out.extend_from_slice(&[0xff, 0xfe]);
        out.extend_from_slice(&((seg - 2) as u16).to_be_bytes());
        out.resize(out.len() + seg - 4, b' ');
        left -= seg;
    }
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// Runs `work(i)` for every index in `order` on `threads` tasks; returns
/// the bytes they report and the seconds taken.
async fn drive<F, Fut>(order: Vec<u64>, threads: usize, work: F) -> Result<(u64, f64), String>
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let order = Arc::new(order);
    let next = Arc::new(AtomicUsize::new(0));
    let work = Arc::new(work);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..threads.max(1) {
        let (order, next, work) = (order.clone(), next.clone(), work.clone());
        tasks.push(tokio::spawn(async move {
            let mut bytes = 0u64;
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = order.get(k) else {
                    return Ok::<u64, String>(bytes);
                };
                bytes += work(i).await?;
            }
        }));
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await.map_err(|e| e.to_string())??;
    }
    Ok((bytes, start.elapsed().as_secs_f64()))
}

fn report(p: &Params, phase: &str, files: u64, bytes: u64, seconds: f64) {
    let r = SmallResult {
        action: p.action.clone(),
        phase: phase.into(),
        threads: p.threads,
        files,
        bytes,
        seconds,
        files_per_sec: files as f64 / seconds.max(1e-9),
        mb_per_sec: bytes as f64 / 1e6 / seconds.max(1e-9),
        label: p.label.clone(),
    };
    if p.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        println!(
            "{} ({phase}) files: {files}, cost: {:.2}s, speed: {:.0} files/s, {:.1} MB/s",
            r.action, r.seconds, r.files_per_sec, r.mb_per_sec
        );
    }
}

fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    v
}

pub async fn run(p: Params, client: Option<Client>) -> Result<(), String> {
    match p.action.as_str() {
        "ufs.put" | "ufs.read" => {
            let location = p
                .ufs
                .clone()
                .ok_or("--ufs s3://bucket/prefix is needed for ufs.* actions")?;
            let ufs = Arc::new(
                Ufs::new(
                    &UfsUri::parse(&location).map_err(|e| e.to_string())?,
                    &p.props,
                    &UfsOptions::default(),
                )
                .map_err(|e| e.to_string())?,
            );
            if p.action == "ufs.put" {
                let u = ufs.clone();
                let (bytes, secs) = drive((0..p.files).collect(), p.threads, move |i| {
                    let u = u.clone();
                    async move {
                        let data = content(i);
                        let n = data.len() as u64;
                        u.write_all(&name(i), data)
                            .await
                            .map_err(|e| e.to_string())?;
                        Ok(n)
                    }
                })
                .await?;
                report(&p, "put", p.files, bytes, secs);
            } else {
                let u = ufs.clone();
                let (bytes, secs) = drive(shuffled(p.files, 1), p.threads, move |i| {
                    let u = u.clone();
                    async move {
                        let data = u.read_all(&name(i)).await.map_err(|e| e.to_string())?;
                        if data.len() != size(i) {
                            return Err(format!("{}: {} bytes", name(i), data.len()));
                        }
                        Ok(data.len() as u64)
                    }
                })
                .await?;
                report(&p, "direct", p.files, bytes, secs);
            }
            Ok(())
        }
        "local.put" => {
            let root = p.dir.trim_end_matches('/').to_string();
            let (bytes, secs) = drive((0..p.files).collect(), p.threads, move |i| {
                let path = format!("{root}/{}", name(i));
                async move {
                    tokio::task::spawn_blocking(move || {
                        let data = content(i);
                        if let Some(parent) = std::path::Path::new(&path).parent() {
                            std::fs::create_dir_all(parent)
                                .map_err(|e| format!("{}: {e}", parent.display()))?;
                        }
                        std::fs::write(&path, &data).map_err(|e| format!("{path}: {e}"))?;
                        Ok(data.len() as u64)
                    })
                    .await
                    .map_err(|e| e.to_string())?
                }
            })
            .await?;
            report(&p, "put", p.files, bytes, secs);
            Ok(())
        }
        "local.small-read" => {
            let root = p.dir.trim_end_matches('/').to_string();
            let read = move |i: u64| {
                let path = format!("{root}/{}", name(i));
                async move {
                    let p2 = path.clone();
                    let data = tokio::task::spawn_blocking(move || std::fs::read(&p2))
                        .await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| format!("{path}: {e}"))?;
                    if data.len() != size(i) {
                        return Err(format!("{path}: {} bytes", data.len()));
                    }
                    Ok(data.len() as u64)
                }
            };
            small_phases(&p, read).await
        }
        "fs.small-read" => {
            let client = Arc::new(client.ok_or("no client")?);
            let root = p.dir.trim_end_matches('/').to_string();
            let read = {
                let (client, root) = (client.clone(), root.clone());
                move |i: u64| {
                    let (client, path) = (client.clone(), format!("{root}/{}", name(i)));
                    async move {
                        let mut r = FileReader::open(&client, &path)
                            .await
                            .map_err(|e| format!("{path}: {e}"))?;
                        let mut out = Vec::with_capacity(size(i));
                        r.read_to_end(&mut out)
                            .await
                            .map_err(|e| format!("{path}: {e}"))?;
                        if out.len() != size(i) {
                            return Err(format!("{path}: {} bytes", out.len()));
                        }
                        Ok(out.len() as u64)
                    }
                }
            };
            small_phases(&p, read).await
        }
        other => Err(format!("unknown small-file action {other}")),
    }
}

/// Every file once in a random order (`cold`), then `--reads` random picks (`warm`).
async fn small_phases<F, Fut>(p: &Params, read: F) -> Result<(), String>
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<u64, String>> + Send,
{
    let (bytes, secs) = drive(shuffled(p.files, 2), p.threads, read.clone()).await?;
    report(p, "cold", p.files, bytes, secs);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let picks: Vec<u64> = (0..p.reads).map(|_| rng.gen_range(0..p.files)).collect();
    let (bytes, secs) = drive(picks, p.threads, read).await?;
    report(p, "warm", p.reads, bytes, secs);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_jpegs_of_their_size() {
        for i in [0, 1, 7, 4999, 12345] {
            let c = content(i);
            assert_eq!(c.len(), size(i));
            assert_eq!(&c[..2], &[0xff, 0xd8]);
            assert_eq!(&c[c.len() - 2..], &[0xff, 0xd9]);
            assert_ne!(c, content(i + 1));
        }
        // Padding of every awkward length stays well formed.
        for extra in 4..70_000 {
            let jpeg = vec![0xff, 0xd8, 1, 2, 0xff, 0xd9];
            let out = pad_jpeg(jpeg.clone(), jpeg.len() + extra);
            assert_eq!(out.len(), jpeg.len() + extra);
            let mut at = 2;
            while out[at] == 0xff && out[at + 1] == 0xfe {
                at += 2 + u16::from_be_bytes([out[at + 2], out[at + 3]]) as usize;
            }
            assert_eq!(&out[at..], &jpeg[2..], "padding of {extra}");
        }
    }
}
