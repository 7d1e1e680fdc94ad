//! The node's metrics over the last hour: a sample of a few cumulative
//! series every `http.history_interval`, kept in memory (an hour's worth),
//! for the dashboard's charts (`/api/history`). The page turns counters
//! into rates from consecutive samples, so a sample missed (a slow scrape)
//! widens one interval instead of losing what happened in it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::reports::Reports;

/// How long the history reaches back.
const WINDOW: Duration = Duration::from_secs(3600);

/// The series kept: the name in the history, the Prometheus series, and a
/// label its lines must carry (summed over the rest).
const SERIES: &[(&str, &str, &str)] = &[
    ("bytes_in", "curvine_block_bytes_written_total", ""),
    ("bytes_out", "curvine_data_bytes_sent_total", ""),
    ("bytes_local", "curvine_data_bytes_local_total", ""),
    ("cache_hits", "curvine_cache_hits_total", ""),
    ("cache_misses", "curvine_cache_misses_total", ""),
    ("evictions", "curvine_evictions_total", "outcome=\"moved\""),
    ("evicted_bytes", "curvine_evicted_bytes_total", ""),
    (
        "ufs_requests",
        "curvine_ufs_request_duration_seconds_count",
        "",
    ),
    (
        "ufs_seconds",
        "curvine_ufs_request_duration_seconds_sum",
        "",
    ),
    (
        "load_bytes_done",
        "curvine_load_job_bytes",
        "progress=\"done\"",
    ),
    (
        "load_bytes_total",
        "curvine_load_job_bytes",
        "progress=\"total\"",
    ),
    ("tier_used", "curvine_tier_used_bytes", ""),
    ("persist_bytes", "curvine_persist_waiting_bytes", ""),
    ("tier_capacity", "curvine_tier_capacity_bytes", ""),
];

/// One sample: when (ms since the epoch), and each series' value.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub t_ms: i64,
    pub v: BTreeMap<&'static str, f64>,
}

/// What `/api/history` answers.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryView {
    pub interval_ms: u64,
    pub points: Vec<Point>,
}

pub struct History {
    interval: Duration,
    points: parking_lot::Mutex<VecDeque<Point>>,
}

impl History {
    pub fn new(interval: Duration) -> History {
        History {
            interval: interval.max(Duration::from_millis(100)),
            points: parking_lot::Mutex::new(VecDeque::new()),
        }
    }

    fn keep(&self) -> usize {
        (WINDOW.as_millis() / self.interval.as_millis()).max(2) as usize
    }

    /// Adds a sample of the metrics `text` (Prometheus format) taken now.
    pub fn record(&self, t_ms: i64, text: &str) {
        let point = Point {
            t_ms,
            v: parse(text),
        };
        let mut points = self.points.lock();
        points.push_back(point);
        while points.len() > self.keep() {
            points.pop_front();
        }
    }

    pub fn view(&self) -> HistoryView {
        HistoryView {
            interval_ms: self.interval.as_millis() as u64,
            points: self.points.lock().iter().cloned().collect(),
        }
    }
}

/// Each kept series' sum over its lines in `text`.
fn parse(text: &str) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = SERIES.iter().map(|(k, _, _)| (*k, 0.0)).collect();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        for (key, series, label) in SERIES {
            if name == *series && line[name_end..].contains(label) {
                *out.entry(key).or_default() += value;
            }
        }
    }
    out
}

/// Samples the node's metrics into `history` for as long as it runs (a
/// supervised task of the node).
pub async fn run(history: Arc<History>, reports: Arc<Reports>) {
    let mut tick = tokio::time::interval(history.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let text = reports.metrics_text().await;
        history.record(curvine_messages::now_ns() / 1_000_000, &text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_sum_their_lines_and_history_keeps_an_hour() {
        let text = "# HELP curvine_cache_hits_total x\n\
            curvine_cache_hits_total 7\n\
            curvine_evictions_total{tier=\"mem\",outcome=\"moved\"} 3\n\
            curvine_evictions_total{tier=\"mem\",outcome=\"failed\"} 9\n\
            curvine_evictions_total{tier=\"ssd\",outcome=\"moved\"} 2\n\
            curvine_load_job_bytes{job=\"a\",progress=\"done\"} 10\n\
            curvine_load_job_bytes{job=\"a\",progress=\"total\"} 40\n\
            curvine_ufs_request_duration_seconds_sum{scheme=\"s3\",op=\"read\"} 0.5\n\
            curvine_ufs_request_duration_seconds_count{scheme=\"s3\",op=\"read\"} 4\n";
        let v = parse(text);
        assert_eq!(v["cache_hits"], 7.0);
        assert_eq!(v["evictions"], 5.0);
        assert_eq!(v["load_bytes_done"], 10.0);
        assert_eq!(v["load_bytes_total"], 40.0);
        assert_eq!(v["ufs_seconds"], 0.5);
        assert_eq!(v["ufs_requests"], 4.0);
        assert_eq!(v["bytes_in"], 0.0);

        let h = History::new(Duration::from_secs(5));
        for i in 0..1000 {
            h.record(i, text);
        }
        let view = h.view();
        assert_eq!(view.points.len(), 720);
        assert_eq!(view.points[0].t_ms, 280);
        assert_eq!(view.interval_ms, 5000);
    }
}
