//! What readers still need of freed blocks, so that freed space comes back
//! as soon as nobody reads the old version, and not a fixed time later.
//!
//! Two kinds of reader keep a freed block:
//!
//! - An open reader of this node's clients ([`ReadHolds`]): from the open
//!   (which hands it the file's block list) to its close, or to the end of
//!   the connection it opened on, at most `data.read_hold_max`. The node
//!   that serves a shard asks every node which freed blocks their readers
//!   hold before removing any (`PeerMsg::HeldBlocks`).
//! - A process on this host holding a block file open (a short-circuit
//!   reader, a mount passing the file through, the data port streaming it):
//!   a removed file is unlinked at once (no new open finds it) and its bytes
//!   stay counted, as "held", while any descriptor of it lives: the kernel
//!   keeps the pages of an unlinked file that is open ([`HeldFiles`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use curvine_messages::block::BlockId;

/// The blocks this node's open readers hold.
pub struct ReadHolds {
    inner: Mutex<Holds>,
    /// Holds older than this (ns) are not counted: a reader that never
    /// closes (`data.read_hold_max`).
    max_ns: AtomicU64,
    next: AtomicU64,
}

#[derive(Default)]
struct Holds {
    by_id: HashMap<u64, (Vec<BlockId>, Instant)>,
    count: HashMap<BlockId, u32>,
}

impl Holds {
    fn drop_hold(&mut self, hold: u64) {
        let Some((blocks, _)) = self.by_id.remove(&hold) else {
            return;
        };
        for id in blocks {
            if let Some(n) = self.count.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.count.remove(&id);
                }
            }
        }
    }
}

impl ReadHolds {
    pub fn new(max: Duration) -> ReadHolds {
        ReadHolds {
            inner: Mutex::new(Holds::default()),
            max_ns: AtomicU64::new(max.as_nanos().min(u64::MAX as u128) as u64),
            next: AtomicU64::new(1),
        }
    }

    /// Sets `data.read_hold_max`.
    pub fn set_max(&self, max: Duration) {
        self.max_ns.store(
            max.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// Holds `blocks` for a reader; the hold's id (0: nothing to hold).
    pub fn hold(&self, blocks: Vec<BlockId>) -> u64 {
        if blocks.is_empty() {
            return 0;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock();
        for &b in &blocks {
            *inner.count.entry(b).or_default() += 1;
        }
        inner.by_id.insert(id, (blocks, Instant::now()));
        id
    }

    /// Ends a hold (an unknown or ended one is ignored).
    pub fn release(&self, hold: u64) {
        self.inner.lock().drop_hold(hold);
    }

    /// The blocks of `ids` an open reader holds. Holds older than
    /// `data.read_hold_max` end here.
    pub fn held(&self, ids: &[BlockId]) -> Vec<BlockId> {
        let max = Duration::from_nanos(self.max_ns.load(Ordering::Relaxed));
        let mut inner = self.inner.lock();
        let stale: Vec<u64> = inner
            .by_id
            .iter()
            .filter(|(_, (_, since))| since.elapsed() >= max)
            .map(|(id, _)| *id)
            .collect();
        for hold in stale {
            tracing::debug!(
                hold,
                "a reader held freed blocks for data.read_hold_max: no longer"
            );
            inner.drop_hold(hold);
        }
        ids.iter()
            .copied()
            .filter(|id| inner.count.contains_key(id))
            .collect()
    }

    /// Open holds (readers).
    pub fn open(&self) -> usize {
        self.inner.lock().by_id.len()
    }
}

/// The holds taken on one client connection: ended with it.
pub struct ConnHolds {
    holds: Arc<ReadHolds>,
    mine: Mutex<std::collections::HashSet<u64>>,
}

impl ConnHolds {
    pub fn new(holds: Arc<ReadHolds>) -> ConnHolds {
        ConnHolds {
            holds,
            mine: Default::default(),
        }
    }

    pub fn hold(&self, blocks: Vec<BlockId>) -> u64 {
        let id = self.holds.hold(blocks);
        if id != 0 {
            self.mine.lock().insert(id);
        }
        id
    }

    pub fn release(&self, hold: u64) {
        self.mine.lock().remove(&hold);
        self.holds.release(hold);
    }
}

impl Drop for ConnHolds {
    fn drop(&mut self) {
        for hold in self.mine.get_mut().drain() {
            self.holds.release(hold);
        }
    }
}

/// Block and extent files removed while a process still had them open:
/// their bytes stay in use (counted as held) until the last descriptor
/// closes.
#[derive(Default)]
pub(super) struct HeldFiles {
    files: Mutex<Vec<HeldFile>>,
}

struct HeldFile {
    /// Our own descriptor of the unlinked file, to learn when the others
    /// are gone.
    file: File,
    tier: usize,
    size: u64,
}

impl HeldFiles {
    /// Keeps `file` (already unlinked) when another descriptor of it is
    /// open; `false` when none is (its bytes are free once it is dropped).
    pub(super) fn keep_if_open(&self, file: File, tier: usize, size: u64) -> bool {
        if !open_elsewhere(&file) {
            return false;
        }
        self.files.lock().push(HeldFile { file, tier, size });
        true
    }

    /// Drops the files nobody holds any more; their tiers and sizes.
    pub(super) fn released(&self) -> Vec<(usize, u64)> {
        let mut out = Vec::new();
        self.files.lock().retain(|f| {
            let held = open_elsewhere(&f.file);
            if !held {
                out.push((f.tier, f.size));
            }
            held
        });
        out
    }

    pub(super) fn is_empty(&self) -> bool {
        self.files.lock().is_empty()
    }
}

/// Whether any descriptor of `file`'s inode other than `file` is open (in
/// any process, the kernel's own passthrough files included): a write
/// lease is granted only to the sole opener. A file system without leases
/// answers as if nobody held it (as before leases were looked at).
fn open_elsewhere(file: &File) -> bool {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function borrows; no memory is passed.
    let taken = unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) };
    if taken == 0 {
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
        return false;
    }
    let e = std::io::Error::last_os_error().raw_os_error();
    e == Some(libc::EAGAIN) || e == Some(libc::EBUSY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_keeps_its_blocks_until_released_or_too_old() {
        let holds = Arc::new(ReadHolds::new(Duration::from_secs(3600)));
        let a = holds.hold(vec![1, 2]);
        let b = holds.hold(vec![2, 3]);
        assert_eq!(holds.hold(Vec::new()), 0);
        assert_eq!(holds.held(&[1, 2, 3, 4]), [1, 2, 3]);
        holds.release(a);
        assert_eq!(holds.held(&[1, 2, 3, 4]), [2, 3]);
        holds.release(a);
        holds.release(b);
        assert!(holds.held(&[1, 2, 3]).is_empty());

        let short = ReadHolds::new(Duration::ZERO);
        short.hold(vec![7]);
        assert!(short.held(&[7]).is_empty());
        assert_eq!(short.open(), 0);
    }

    #[test]
    fn a_connection_that_ends_releases_its_holds() {
        let holds = Arc::new(ReadHolds::new(Duration::from_secs(3600)));
        let conn = ConnHolds::new(holds.clone());
        let kept = conn.hold(vec![5]);
        conn.hold(vec![6]);
        let other = ConnHolds::new(holds.clone());
        other.hold(vec![6]);
        conn.release(kept);
        assert_eq!(holds.held(&[5, 6]), [6]);
        drop(conn);
        assert_eq!(holds.open(), 1);
        drop(other);
        assert!(holds.held(&[5, 6]).is_empty());
    }

    #[test]
    fn an_unlinked_file_is_held_while_another_descriptor_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let reader = File::open(&path).unwrap();
        let ours = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let held = HeldFiles::default();
        assert!(held.keep_if_open(ours, 0, 4096));
        assert!(held.released().is_empty());
        drop(reader);
        assert_eq!(held.released(), [(0, 4096)]);
        assert!(held.is_empty());

        // Nobody else: not kept.
        std::fs::write(&path, b"x").unwrap();
        let ours = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(!held.keep_if_open(ours, 0, 1));
    }
}
