//! The deterministic simulation in CI: at least 1,000 seeds of a
//! three-member shard under crashes, machine crashes, pauses, partitions,
//! lossy links and clock jumps, every one checked (see `curvine_sim`); the
//! same seed twice is the same run. `bench/run-simulation.sh` runs more.

use curvine_sim::{run_seed, run_seeds, Settings};

/// Seeds CI runs (`CURVINE_SIM_SEEDS` sets another count).
const SEEDS: u64 = 1000;

#[test]
fn a_thousand_seeded_runs_lose_nothing_acknowledged_and_serve_again() {
    let seeds = std::env::var("CURVINE_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SEEDS);
    let settings = Settings::default();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    let t = run_seeds(0..seeds, threads, &settings, false);
    println!("{}", t.summary());
    assert!(
        t.failed.is_empty(),
        "{} of {seeds} seeds failed (replay one with `curvine-sim --seed N`):\n{}",
        t.failed.len(),
        t.failed.join("\n")
    );
    // The faults were there to find something.
    assert!(t.machine_crashes > seeds as usize / 4);
    assert!(t.failed_passes > seeds as usize / 4);
    assert!(t.acknowledged > seeds as usize * 20);
    // The same seed is the same run.
    for (&seed, &digest) in t.digests.iter().take(8) {
        let again = run_seed(seed, &settings).unwrap();
        assert_eq!(again.digest, digest, "seed {seed} ran differently twice");
    }
}
