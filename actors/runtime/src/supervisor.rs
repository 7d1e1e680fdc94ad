//! Restart policy shared by every supervisor: restart a failed child after a
//! doubling backoff; when it fails more than `max_restarts` times within
//! `window`, give up and escalate to the parent.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use curvine_conf::SupervisorConf;

#[derive(Debug, Clone)]
pub struct RestartPolicy {
    pub backoff: Duration,
    pub max_backoff: Duration,
    pub max_restarts: u32,
    pub window: Duration,
}

impl From<&SupervisorConf> for RestartPolicy {
    fn from(c: &SupervisorConf) -> Self {
        RestartPolicy {
            backoff: c.restart_backoff.0,
            max_backoff: c.max_backoff.0,
            max_restarts: c.max_restarts,
            window: c.restart_window.0,
        }
    }
}

/// Failures of one child.
#[derive(Debug, Default, Clone)]
pub struct RestartTracker {
    recent: VecDeque<Instant>,
    /// Restarts since the node started (shown by `actors` later).
    pub total: u64,
}

impl RestartTracker {
    /// Records a failure; returns the delay before restarting, or `None` when
    /// the child failed too often and the failure must escalate.
    pub fn on_failure(&mut self, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > policy.window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= policy.max_restarts {
            return None;
        }
        self.recent.push_back(now);
        self.total += 1;
        let doublings = (self.recent.len() as u32 - 1).min(16);
        Some((policy.backoff * 2u32.pow(doublings)).min(policy.max_backoff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_then_escalates() {
        let p = RestartPolicy {
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            max_restarts: 3,
            window: Duration::from_secs(60),
        };
        let mut t = RestartTracker::default();
        let now = Instant::now();
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(100)));
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(200)));
        assert_eq!(t.on_failure(&p, now), Some(Duration::from_millis(350)));
        assert_eq!(t.on_failure(&p, now), None);
        // Failures age out of the window.
        assert!(t.on_failure(&p, now + Duration::from_secs(61)).is_some());
    }
}
