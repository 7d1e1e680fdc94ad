//! The clock of a storage engine: what its write thread, its log and its
//! Raft groups read for ticks, leases, deferrals, checkpoint intervals and
//! timeouts.
//!
//! A node runs on the monotonic clock of its machine ([`Clock::system`]).
//! A test or the simulation (`curvine-sim`) gives each engine a
//! [`Clock::manual`] that moves only when told to, so a run over minutes
//! of Raft timeouts takes no real time and is the same run every time.
//! Its readings are real [`Instant`]s (a fixed origin plus the simulated
//! time), so the code that reads it keeps the standard type.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where an engine reads the time. Cloning shares it.
#[derive(Clone, Default)]
pub struct Clock(Option<Arc<Manual>>);

struct Manual {
    origin: Instant,
    /// Nanoseconds since `origin`.
    elapsed: AtomicU64,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Clock::system"),
            Some(m) => write!(f, "Clock::manual({:?})", self.elapsed_of(m)),
        }
    }
}

impl Clock {
    /// The machine's monotonic clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that stands still until [`Self::advance`] moves it.
    pub fn manual() -> Clock {
        Clock(Some(Arc::new(Manual {
            origin: Instant::now(),
            elapsed: AtomicU64::new(0),
        })))
    }

    pub fn is_manual(&self) -> bool {
        self.0.is_some()
    }

    pub fn now(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(m) => m.origin + self.elapsed_of(m),
        }
    }

    /// Time since the clock was made (system: since the call's own
    /// reading, always zero).
    pub fn elapsed(&self) -> Duration {
        self.0
            .as_ref()
            .map_or(Duration::ZERO, |m| self.elapsed_of(m))
    }

    fn elapsed_of(&self, m: &Manual) -> Duration {
        Duration::from_nanos(m.elapsed.load(Ordering::Acquire))
    }

    /// Moves a manual clock forward by `by`; a system clock cannot be
    /// moved (the call is a programming error).
    pub fn advance(&self, by: Duration) {
        let m = self
            .0
            .as_ref()
            .expect("only a manual clock is advanced by hand");
        m.elapsed
            .fetch_add(by.as_nanos().min(u64::MAX as u128) as u64, Ordering::AcqRel);
    }

    /// Moves a manual clock to `to` since its origin, if that is later.
    pub fn advance_to(&self, to: Duration) {
        let m = self
            .0
            .as_ref()
            .expect("only a manual clock is advanced by hand");
        m.elapsed
            .fetch_max(to.as_nanos().min(u64::MAX as u128) as u64, Ordering::AcqRel);
    }

    /// Time from `earlier` to now, zero when `earlier` is later.
    pub fn since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = Clock::manual();
        let other = clock.clone();
        let t0 = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(clock.now(), t0);
        other.advance(Duration::from_secs(90));
        assert_eq!(clock.since(t0), Duration::from_secs(90));
        clock.advance_to(Duration::from_secs(10));
        assert_eq!(clock.elapsed(), Duration::from_secs(90));
        clock.advance_to(Duration::from_secs(100));
        assert_eq!(clock.now() - t0, Duration::from_secs(100));
        let system = Clock::system();
        assert!(!system.is_manual());
        let a = system.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(system.now() > a);
    }
}
