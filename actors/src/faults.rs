//! Disk faults injected into an engine (tests and the simulation): its
//! log and its checkpoint ask here before each write, sync and flush.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Disk faults a test or the simulation injects into an engine: the next
/// write of its log fails half written, the next sync of its log fails, or
/// the next flush of LMDB's data file fails, as a disk that is full or
/// failing would fail them. A node never sets any.
#[derive(Debug, Clone, Default)]
pub struct DiskFaults(Arc<AtomicU8>);

impl DiskFaults {
    /// The next write of the log: half of it reaches the file, then ENOSPC.
    pub const LOG_WRITE: u8 = 1;
    /// The next fdatasync of the log: EIO.
    pub const LOG_SYNC: u8 = 2;
    /// The next flush of LMDB's data file at a checkpoint: EIO.
    pub const DATA_FLUSH: u8 = 4;

    /// Arms `fault` (one of the constants).
    pub fn arm(&self, fault: u8) {
        self.0.fetch_or(fault, Ordering::AcqRel);
    }

    /// Whether `fault` was armed; disarms it.
    pub(crate) fn take(&self, fault: u8) -> bool {
        let all = &self.0;
        all.load(Ordering::Acquire) & fault != 0
            && all.fetch_and(!fault, Ordering::AcqRel) & fault != 0
    }
}
