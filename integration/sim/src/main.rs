//! `curvine-sim`: runs seeds of the deterministic simulation
//! (`curvine_sim`), in parallel threads, and prints seeds per second.
//!
//! ```text
//! curvine-sim [--seeds N] [--from S] [--threads T] [--members M] [--seconds S] [--json]
//! curvine-sim --seed N        # one seed again, with its report
//! ```
//!
//! `--json` prints the summary as one JSON object (for
//! `bench/run-simulation.sh`).
//!
//! Exits 1 naming every failing seed (at most the first 20 are printed).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use curvine_sim::{run_seed, Report, Settings};

/// What the seeds that held did together.
#[derive(Default)]
struct Total {
    ops: usize,
    acknowledged: usize,
    crashes: usize,
    machine_crashes: usize,
    partitions: usize,
    pauses: usize,
    clock_jumps: usize,
    disk_faults: usize,
    failed_passes: usize,
    served_after_max: Duration,
    simulated: Duration,
}

impl Total {
    fn add(&mut self, r: &Report) {
        self.ops += r.ops;
        self.acknowledged += r.acknowledged;
        self.crashes += r.crashes;
        self.machine_crashes += r.machine_crashes;
        self.partitions += r.partitions;
        self.pauses += r.pauses;
        self.clock_jumps += r.clock_jumps;
        self.disk_faults += r.disk_faults;
        self.failed_passes += r.failed_passes;
        self.served_after_max = self.served_after_max.max(r.served_after);
        self.simulated += r.simulated;
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: curvine-sim [--seeds N] [--from S] [--threads T] [--members M] [--seconds S] [--json] | --seed N"
    );
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut seeds = 1000u64;
    let mut from = 0u64;
    let mut one: Option<u64> = None;
    let mut threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut settings = Settings::default();
    let mut json = false;
    while let Some(arg) = args.next() {
        if arg == "--json" {
            json = true;
            continue;
        }
        let mut value = || -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match arg.as_str() {
            "--seeds" => seeds = value(),
            "--from" => from = value(),
            "--seed" => one = Some(value()),
            "--threads" => threads = value().max(1) as usize,
            "--members" => settings.members = value() as usize,
            "--seconds" => settings.active = Duration::from_secs(value()),
            _ => usage(),
        }
    }
    if let Some(seed) = one {
        // One seed replayed: the engines' logs on stderr (RUST_LOG, e.g.
        // `RUST_LOG=curvine_actors=debug,raft=debug`).
        if std::env::var_os("RUST_LOG").is_some() {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_writer(std::io::stderr)
                .init();
        }
        match run_seed(seed, &settings) {
            Ok(report) => println!("seed {seed} held: {report:?}"),
            Err(e) => {
                println!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let next = Arc::new(AtomicU64::new(from));
    let done = Arc::new(AtomicUsize::new(0));
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let total: Arc<Mutex<Total>> = Arc::default();
    let started = Instant::now();
    let end = from + seeds;
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, done, failed, total, settings) = (
                next.clone(),
                done.clone(),
                failed.clone(),
                total.clone(),
                settings.clone(),
            );
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                match run_seed(seed, &settings) {
                    Ok(r) => total.lock().unwrap().add(&r),
                    Err(e) => {
                        eprintln!("{e}");
                        failed.lock().unwrap().push(e);
                    }
                }
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 1000 == 0 {
                    let secs = started.elapsed().as_secs_f64();
                    eprintln!("{n} seeds in {secs:.0} s ({:.1} seeds/s)", n as f64 / secs);
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let secs = started.elapsed().as_secs_f64();
    let failed = failed.lock().unwrap();
    let t = total.lock().unwrap();
    if json {
        println!(
            "{{\"seeds\": {seeds}, \"from\": {from}, \"members\": {}, \"seconds\": {secs:.1}, \"seeds_per_s\": {:.1}, \"failed\": {}, \"ops\": {}, \"acknowledged\": {}, \"crashes\": {}, \"machine_crashes\": {}, \"partitions\": {}, \"pauses\": {}, \"clock_jumps\": {}, \"disk_faults\": {}, \"failed_passes\": {}, \"served_after_max_s\": {:.3}, \"simulated_s\": {:.0}}}",
            settings.members,
            seeds as f64 / secs,
            failed.len(),
            t.ops,
            t.acknowledged,
            t.crashes,
            t.machine_crashes,
            t.partitions,
            t.pauses,
            t.clock_jumps,
            t.disk_faults,
            t.failed_passes,
            t.served_after_max.as_secs_f64(),
            t.simulated.as_secs_f64(),
        );
    } else {
        println!(
            "{seeds} seeds from {from} in {secs:.1} s ({:.1} seeds/s), {} failed; {} operations ({} acknowledged), {} crashes ({} of the machine), {} partitions, {} pauses, {} clock jumps, {} disk faults ({} failed passes), {:.0} s simulated; served again within {:?} of the faults healing at most",
            seeds as f64 / secs,
            failed.len(),
            t.ops,
            t.acknowledged,
            t.crashes,
            t.machine_crashes,
            t.partitions,
            t.pauses,
            t.clock_jumps,
            t.disk_faults,
            t.failed_passes,
            t.simulated.as_secs_f64(),
            t.served_after_max,
        );
    }
    if !failed.is_empty() {
        for e in failed.iter().take(20) {
            eprintln!("failed: {e}");
        }
        eprintln!("replay one with: curvine-sim --seed N");
        std::process::exit(1);
    }
}
