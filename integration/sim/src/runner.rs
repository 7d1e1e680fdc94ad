//! Many seeds over threads, and what they did together.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::{run_seed, Report, Settings};

/// What the seeds of a run that held did together, and those that failed.
#[derive(Debug, Default)]
pub struct Totals {
    pub ops: usize,
    pub acknowledged: usize,
    pub crashes: usize,
    pub machine_crashes: usize,
    pub partitions: usize,
    pub pauses: usize,
    pub clock_jumps: usize,
    pub disk_faults: usize,
    pub failed_passes: usize,
    pub served_after_max: Duration,
    pub simulated: Duration,
    /// Each seed that held and its history's digest.
    pub digests: BTreeMap<u64, u64>,
    /// What each failing seed said.
    pub failed: Vec<String>,
    /// Wall-clock time the seeds took.
    pub elapsed: Duration,
}

impl Totals {
    fn add(&mut self, seed: u64, r: &Report) {
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
        self.digests.insert(seed, r.digest);
    }

    /// Seeds run (held or failed).
    pub fn seeds(&self) -> usize {
        self.digests.len() + self.failed.len()
    }

    pub fn seeds_per_s(&self) -> f64 {
        self.seeds() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        format!(
            "{} seeds in {:.1} s ({:.1} seeds/s), {} failed; {} operations ({} acknowledged), {} crashes ({} of the machine), {} partitions, {} pauses, {} clock jumps, {} disk faults ({} failed passes), {:.0} s simulated; served again within {:?} of the faults healing at most",
            self.seeds(),
            self.elapsed.as_secs_f64(),
            self.seeds_per_s(),
            self.failed.len(),
            self.ops,
            self.acknowledged,
            self.crashes,
            self.machine_crashes,
            self.partitions,
            self.pauses,
            self.clock_jumps,
            self.disk_faults,
            self.failed_passes,
            self.simulated.as_secs_f64(),
            self.served_after_max,
        )
    }
}

/// Runs seeds `seeds` on `threads` threads (each seed in one thread);
/// with `progress`, a line on stderr every 1,000 seeds and each failure
/// as it comes.
pub fn run_seeds(
    seeds: std::ops::Range<u64>,
    threads: usize,
    settings: &Settings,
    progress: bool,
) -> Totals {
    let next = std::sync::atomic::AtomicU64::new(seeds.start);
    let totals = Mutex::new(Totals::default());
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= seeds.end {
                    break;
                }
                let result = run_seed(seed, settings);
                let mut t = totals.lock().unwrap_or_else(|p| p.into_inner());
                match result {
                    Ok(r) => t.add(seed, &r),
                    Err(e) => {
                        if progress {
                            eprintln!("{e}");
                        }
                        t.failed.push(e);
                    }
                }
                let n = t.seeds();
                if progress && n % 1000 == 0 {
                    let secs = started.elapsed().as_secs_f64();
                    eprintln!("{n} seeds in {secs:.0} s ({:.1} seeds/s)", n as f64 / secs);
                }
            });
        }
    });
    let mut totals = totals.into_inner().unwrap_or_else(|p| p.into_inner());
    totals.elapsed = started.elapsed();
    totals
}
