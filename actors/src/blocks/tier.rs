//! A storage tier of a node: its configuration and its accounting (bytes
//! of committed blocks, reserved by writes in progress, held by removed
//! files still open).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use curvine_messages::block::TierKind;

use super::human;

/// A configured tier.
#[derive(Debug, Clone)]
pub struct TierInfo {
    pub kind: TierKind,
    pub root: PathBuf,
    pub capacity: u64,
}

pub(super) struct Tier {
    pub(super) info: TierInfo,
    pub(super) used: AtomicU64,
    pub(super) reserved: AtomicU64,
    pub(super) blocks: AtomicU64,
    /// Bytes of removed files a process still holds open (part of `used`).
    pub(super) held: AtomicU64,
}

impl Tier {
    pub(super) fn free(&self) -> u64 {
        self.info.capacity.saturating_sub(
            self.used.load(Ordering::Relaxed) + self.reserved.load(Ordering::Relaxed),
        )
    }

    /// The tier, its use and what part of it is not stored data: writes
    /// in progress and removed files still open somewhere.
    pub(super) fn describe(&self) -> String {
        let (reserved, held) = (
            self.reserved.load(Ordering::Relaxed),
            self.held.load(Ordering::Relaxed),
        );
        let parts: Vec<String> = [
            (reserved, "reserved by writes in progress"),
            (held, "held by removed files still open"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{} {what}", human(n)))
        .collect();
        let parts = if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        };
        let used = human(self.used.load(Ordering::Relaxed) + reserved);
        let (kind, root, cap) = (
            self.info.kind,
            self.info.root.display(),
            human(self.info.capacity),
        );
        format!("tier {kind} ({root}): {used} of {cap} in use{parts}")
    }
}
