//! Load: many client connections doing metadata calls at once
//! (`load.conns`, `bench/run-load.sh`).
//!
//! First one connection alone (`idle`: the latency a call has when the node
//! is otherwise idle), then `--client-threads` connections at once, each a
//! client of its own (one TCP connection each), for `--seconds`: every
//! connection creates a file of its own, stats it and removes it, over and
//! over, `--rate` calls a second each (0: one call after another, which
//! saturates the node: latency is then the connections over throughput). Each phase prints one JSON object: calls, errors (and the first),
//! calls per second over the run and each second of it, and the latency
//! percentiles of every call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use curvine_client::Client;

pub struct Params {
    pub dir: String,
    pub connections: usize,
    pub seconds: u64,
    /// Calls per second of each connection (0: one after another, as fast
    /// as the node answers).
    pub rate: f64,
    pub label: String,
}

#[derive(Serialize)]
struct PhaseResult {
    action: &'static str,
    phase: &'static str,
    connections: usize,
    /// Calls per second of each connection (0: as fast as answered).
    rate: f64,
    seconds: f64,
    calls: u64,
    errors: u64,
    first_error: Option<String>,
    calls_per_sec: f64,
    /// Calls finished in each second of the phase.
    per_second: Vec<u64>,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// p50 and p99 of each kind of call: create, stat, remove.
    by_call: Vec<CallPercentiles>,
    /// Seconds to open every connection.
    connect_seconds: f64,
    label: String,
}

#[derive(Serialize)]
struct CallPercentiles {
    call: &'static str,
    p50_ms: f64,
    p99_ms: f64,
}

const CALLS: [&str; 3] = ["create", "stat", "remove"];

/// What the connections of a phase share.
struct Shared {
    stop: AtomicBool,
    started: Instant,
    per_second: Vec<AtomicU64>,
    errors: AtomicU64,
    first_error: parking_lot::Mutex<Option<String>>,
}

/// One connection's loop: create, stat, remove its file, `rate` calls a
/// second (or one after another); latencies in µs, by kind of call.
async fn calls(
    client: Client,
    path: String,
    shared: Arc<Shared>,
    rate: f64,
    phase: f64,
) -> [Vec<u32>; 3] {
    let mut lat: [Vec<u32>; 3] = Default::default();
    let mut step = 0u64;
    let every = (rate > 0.0).then(|| Duration::from_secs_f64(1.0 / rate));
    let mut next =
        tokio::time::Instant::now() + every.map(|e| e.mul_f64(phase)).unwrap_or_default();
    while !shared.stop.load(Ordering::Relaxed) {
        if let Some(every) = every {
            // Paced: a call each period, never a burst to catch up.
            tokio::time::sleep_until(next).await;
            next = (next + every).max(tokio::time::Instant::now());
            if shared.stop.load(Ordering::Relaxed) {
                break;
            }
        }
        let t = Instant::now();
        let kind = (step % 3) as usize;
        let result = match kind {
            0 => client.create(&path).await.map(drop),
            1 => client.stat(&path).await.map(drop),
            _ => client.remove(&path, false).await.map(drop),
        };
        step += 1;
        lat[kind].push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
        let sec = shared.started.elapsed().as_secs() as usize;
        if let Some(c) = shared.per_second.get(sec) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = result {
            shared.errors.fetch_add(1, Ordering::Relaxed);
            shared
                .first_error
                .lock()
                .get_or_insert_with(|| format!("{path}: {e}"));
            // Start the file's cycle over.
            let _ = client.remove(&path, false).await;
            step = 0;
        }
    }
    lat
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i] as f64 / 1000.0
}

async fn phase(
    connect: &(impl Fn() -> futures::future::BoxFuture<'static, Result<Client, String>> + Sync),
    p: &Params,
    name: &'static str,
    connections: usize,
    seconds: u64,
    rate: f64,
) -> Result<PhaseResult, String> {
    let t = Instant::now();
    let mut clients = Vec::with_capacity(connections);
    // Connections open 64 at a time (a burst of a thousand handshakes is
    // not what this measures).
    for chunk in (0..connections).collect::<Vec<_>>().chunks(64) {
        let opened = futures::future::join_all(chunk.iter().map(|_| connect())).await;
        for c in opened {
            clients.push(c?);
        }
    }
    let connect_seconds = t.elapsed().as_secs_f64();
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        started: Instant::now(),
        per_second: (0..seconds + 2).map(|_| AtomicU64::new(0)).collect(),
        errors: AtomicU64::new(0),
        first_error: Default::default(),
    });
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let path = format!("{}/{name}-c{i}", p.dir.trim_end_matches('/'));
            // Connections spread their calls over the period.
            let phase = i as f64 / connections as f64;
            tokio::spawn(calls(c, path, shared.clone(), rate, phase))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    shared.stop.store(true, Ordering::Relaxed);
    let mut by_kind: [Vec<u32>; 3] = Default::default();
    for t in tasks {
        let done = t
            .await
            .map_err(|e| format!("a connection's task failed: {e}"))?;
        for (all, one) in by_kind.iter_mut().zip(done) {
            all.extend(one);
        }
    }
    let by_call = by_kind
        .iter_mut()
        .zip(CALLS)
        .map(|(l, call)| {
            l.sort_unstable();
            CallPercentiles {
                call,
                p50_ms: pct(l, 0.50),
                p99_ms: pct(l, 0.99),
            }
        })
        .collect();
    let mut lat = by_kind.concat();
    let elapsed = shared.started.elapsed().as_secs_f64();
    let first_error = shared.first_error.lock().clone();
    lat.sort_unstable();
    Ok(PhaseResult {
        action: "load.conns",
        phase: name,
        connections,
        rate,
        seconds: elapsed,
        calls: lat.len() as u64,
        errors: shared.errors.load(Ordering::Relaxed),
        first_error,
        calls_per_sec: lat.len() as f64 / elapsed,
        per_second: shared
            .per_second
            .iter()
            .take(seconds as usize)
            .map(|c| c.load(Ordering::Relaxed))
            .collect(),
        p50_ms: pct(&lat, 0.50),
        p99_ms: pct(&lat, 0.99),
        p999_ms: pct(&lat, 0.999),
        max_ms: lat.last().map(|m| *m as f64 / 1000.0).unwrap_or(0.0),
        by_call,
        connect_seconds,
        label: p.label.clone(),
    })
}

/// Runs the idle phase, then the loaded one; one JSON line each.
pub async fn run(
    p: Params,
    setup: Client,
    connect: impl Fn() -> futures::future::BoxFuture<'static, Result<Client, String>> + Sync,
) -> Result<(), String> {
    if p.connections == 0 || p.seconds == 0 {
        return Err("--client-threads and --seconds must be at least 1".into());
    }
    setup
        .mkdir(&p.dir, true)
        .await
        .map_err(|e| format!("mkdir {}: {e}", p.dir))?;
    let idle_seconds = (p.seconds / 6).clamp(3, 30);
    for (name, n, secs, rate) in [
        ("idle", 1, idle_seconds, 0.0),
        ("loaded", p.connections, p.seconds, p.rate),
    ] {
        let r = phase(&connect, &p, name, n, secs, rate).await?;
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::pct;

    #[test]
    fn percentiles_of_sorted_latencies() {
        let lat: Vec<u32> = (1..=1000).collect();
        assert_eq!(pct(&lat, 0.5), 0.5);
        assert_eq!(pct(&lat, 0.99), 0.99);
        assert_eq!(pct(&[], 0.99), 0.0);
    }
}
