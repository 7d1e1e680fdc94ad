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

use std::time::Duration;

use curvine_sim::{run_seed, run_seeds, Settings};

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
    let t = run_seeds(from..from + seeds, threads, &settings, true);
    let failed = &t.failed;
    if json {
        println!(
            "{{\"seeds\": {seeds}, \"from\": {from}, \"members\": {}, \"seconds\": {:.1}, \"seeds_per_s\": {:.1}, \"failed\": {}, \"ops\": {}, \"acknowledged\": {}, \"crashes\": {}, \"machine_crashes\": {}, \"partitions\": {}, \"pauses\": {}, \"clock_jumps\": {}, \"disk_faults\": {}, \"failed_passes\": {}, \"served_after_max_s\": {:.3}, \"simulated_s\": {:.0}}}",
            settings.members,
            t.elapsed.as_secs_f64(),
            t.seeds_per_s(),
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
        println!("from seed {from}: {}", t.summary());
    }
    if !failed.is_empty() {
        for e in failed.iter().take(20) {
            eprintln!("failed: {e}");
        }
        eprintln!("replay one with: curvine-sim --seed N");
        std::process::exit(1);
    }
}
