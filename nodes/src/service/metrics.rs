//! This node's Prometheus metrics beyond its actors': tiers, checksum
//! errors, what it knows of the cluster, and load jobs.

use std::collections::BTreeMap;
use std::time::Duration;

use curvine_actors::blocks::BlockStore;
use curvine_actors::cluster::ClusterView;
use curvine_messages::mount::{JobState, LoadJob};
use curvine_runtime::stats::Sample;

use super::loads::Loads;

/// This node's metrics in the Prometheus text format.
pub async fn node_metrics(
    view: &ClusterView,
    blocks: &BlockStore,
    loads: &Loads,
    lag: curvine_messages::rpc::PersistLag,
) -> String {
    let mut samples = tier_samples(blocks);
    let oldest = if lag.oldest_ns > 0 {
        (curvine_messages::now_ns() - lag.oldest_ns).max(0) as f64 / 1e9
    } else {
        0.0
    };
    for (name, help, v) in [
        (
            "curvine_persist_waiting_files",
            "fs_mode files waiting for their upload to the UFS (on the node that drives uploads).",
            lag.files as f64,
        ),
        (
            "curvine_persist_waiting_bytes",
            "Bytes of fs_mode files waiting for their upload to the UFS.",
            lag.bytes as f64,
        ),
        (
            "curvine_persist_oldest_seconds",
            "Age of the oldest change waiting for the UFS.",
            oldest,
        ),
    ] {
        samples.push(Sample::gauge(name, help, v));
    }
    let checksum_errors = blocks
        .checksum_errors
        .load(std::sync::atomic::Ordering::Relaxed)
        + curvine_wire::data::checksum_errors();
    samples.push(Sample {
        kind: "counter",
        ..Sample::gauge(
            "curvine_checksum_errors_total",
            "Checksum mismatches found in block bytes by this process.",
            checksum_errors as f64,
        )
    });
    samples.extend(cluster_samples(view));
    // Load jobs: only from the node that serves shard 0 (where they are
    // kept), so a sum over nodes counts each job once.
    if view.serves_now(0) {
        if let Ok(Ok(jobs)) = tokio::time::timeout(Duration::from_secs(5), loads.load_jobs()).await
        {
            samples.extend(job_samples(&jobs));
        }
    }
    view.metrics.render(&samples) + &curvine_runtime::stats::process().render_plain()
}

fn tier_samples(blocks: &BlockStore) -> Vec<Sample> {
    let mut samples = Vec::new();
    for t in blocks.stats() {
        let tier = t.kind.to_string().to_lowercase();
        let gauges: [(&'static str, &'static str, u64); 5] = [
            (
                "curvine_tier_capacity_bytes",
                "Capacity of a storage tier.",
                t.capacity,
            ),
            (
                "curvine_tier_used_bytes",
                "Bytes of committed blocks in a storage tier.",
                t.used,
            ),
            (
                "curvine_tier_reserved_bytes",
                "Bytes reserved for blocks being written in a storage tier.",
                t.reserved,
            ),
            (
                "curvine_tier_held_bytes",
                "Bytes of removed block files a reader on the node's host still holds open (part of used; free once closed).",
                t.held,
            ),
            (
                "curvine_tier_blocks",
                "Blocks kept in a storage tier.",
                t.blocks,
            ),
        ];
        for (name, help, v) in gauges {
            samples.push(Sample::gauge(name, help, v as f64).label("tier", tier.clone()));
        }
    }
    samples
}

fn cluster_samples(view: &ClusterView) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut states = BTreeMap::<String, u64>::new();
    for m in view.members() {
        *states
            .entry(format!("{:?}", m.state).to_lowercase())
            .or_default() += 1;
    }
    for (state, n) in states {
        samples.push(
            Sample::gauge(
                "curvine_cluster_nodes",
                "Nodes of the cluster this node knows, per state.",
                n as f64,
            )
            .label("state", state),
        );
    }
    let served = (0..view.shard_count)
        .filter(|s| view.serves_now(*s as u16))
        .count();
    samples.push(Sample::gauge(
        "curvine_shards_served",
        "Namespace shards this node serves.",
        served as f64,
    ));
    samples.push(Sample {
        kind: "counter",
        ..Sample::gauge(
            "curvine_trace_events_dropped_total",
            "Trace events dropped from this node's ring to make room.",
            view.tracer.dropped() as f64,
        )
    });
    samples
}

fn job_samples(jobs: &[LoadJob]) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut by_state = BTreeMap::<String, u64>::new();
    for j in jobs {
        let state = format!("{:?}", j.state).to_lowercase();
        *by_state.entry(state).or_default() += 1;
        if !matches!(j.state, JobState::Listing | JobState::Running) {
            continue;
        }
        let progress: [(&'static str, &'static str, u64, &'static str); 4] = [
            (
                "curvine_load_job_files",
                "Files of a running load job, by progress.",
                j.files_total,
                "total",
            ),
            (
                "curvine_load_job_files",
                "Files of a running load job, by progress.",
                j.files_done,
                "done",
            ),
            (
                "curvine_load_job_bytes",
                "Bytes of a running load job, by progress.",
                j.bytes_total,
                "total",
            ),
            (
                "curvine_load_job_bytes",
                "Bytes of a running load job, by progress.",
                j.bytes_done,
                "done",
            ),
        ];
        for (name, help, v, what) in progress {
            samples.push(
                Sample::gauge(name, help, v as f64)
                    .label("job", j.id.clone())
                    .label("progress", what),
            );
        }
    }
    for (state, n) in by_state {
        samples.push(
            Sample::gauge("curvine_load_jobs", "Load jobs, per state.", n as f64)
                .label("state", state),
        );
    }
    samples
}
