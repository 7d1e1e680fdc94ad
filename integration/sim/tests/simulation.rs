//! The deterministic simulation in CI: at least 1,000 seeds of a
//! three-member shard under crashes, machine crashes, pauses, partitions,
//! lossy links and clock jumps, every one checked (see `curvine_sim`); the
//! same seed twice is the same run. `bench/run-simulation.sh` runs more.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use curvine_sim::{run_seed, Settings};

/// Seeds CI runs (`CURVINE_SIM_SEEDS` sets another count).
const SEEDS: u64 = 1000;

#[test]
fn a_thousand_seeded_runs_lose_nothing_acknowledged_and_serve_again() {
    let seeds = std::env::var("CURVINE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEEDS);
    let settings = Settings::default();
    let next = Arc::new(AtomicU64::new(0));
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let reports: Arc<Mutex<Vec<(u64, curvine_sim::Report)>>> = Arc::default();
    let started = Instant::now();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failed, reports, settings) = (
                next.clone(),
                failed.clone(),
                reports.clone(),
                settings.clone(),
            );
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds {
                    break;
                }
                match run_seed(seed, &settings) {
                    Ok(r) => reports.lock().unwrap().push((seed, r)),
                    Err(e) => failed.lock().unwrap().push(e),
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    let reports = reports.lock().unwrap();
    let sum =
        |f: fn(&curvine_sim::Report) -> usize| reports.iter().map(|(_, r)| f(r)).sum::<usize>();
    println!(
        "{seeds} seeds in {secs:.1} s: {:.1} seeds/s; {} operations ({} acknowledged), {} crashes ({} of the machine), {} partitions, {} pauses, {} clock jumps, {} disk faults ({} failed passes); served again after the faults within {:?} at most",
        seeds as f64 / secs,
        sum(|r| r.ops),
        sum(|r| r.acknowledged),
        sum(|r| r.crashes),
        sum(|r| r.machine_crashes),
        sum(|r| r.partitions),
        sum(|r| r.pauses),
        sum(|r| r.clock_jumps),
        sum(|r| r.disk_faults),
        sum(|r| r.failed_passes),
        reports.iter().map(|(_, r)| r.served_after).max().unwrap_or_default(),
    );
    let failed = failed.lock().unwrap();
    assert!(
        failed.is_empty(),
        "{} of {seeds} seeds failed (replay one with `curvine-sim --seed N`):\n{}",
        failed.len(),
        failed.join("\n")
    );
    // The faults were there to find something.
    assert!(sum(|r| r.machine_crashes) > seeds as usize / 4);
    assert!(sum(|r| r.failed_passes) > seeds as usize / 4);
    assert!(sum(|r| r.acknowledged) > seeds as usize * 20);
    // The same seed is the same run.
    for (seed, first) in reports.iter().take(8) {
        let again = run_seed(*seed, &settings).unwrap();
        assert_eq!(
            again.digest, first.digest,
            "seed {seed} ran differently twice"
        );
    }
}
