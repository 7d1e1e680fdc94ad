//! Passthrough (Linux 6.9+): a read-only open of a file that is one block
//! on this host has the kernel read the block file itself. Opens of one
//! inode decide one at a time and share one backing file.

use std::sync::Arc;

use fuser::ReplyOpen;

use super::Fs;

/// How long an open for writing waits for passthrough handles being
/// closed before it is refused with ETXTBSY.
const RELEASE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

impl Fs {
    /// The lock under which opens of an inode choose passthrough or not.
    pub(super) fn open_lock(&self, ino: u64) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.open_locks.lock();
        if locks.len() > 4096 {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry(ino).or_default().clone()
    }

    /// Passthrough handles of an inode open now.
    pub(super) fn passthrough_open(&self, ino: u64) -> u32 {
        self.passthrough_handles
            .lock()
            .get(&ino)
            .map(|(n, _)| *n)
            .unwrap_or(0)
    }

    /// Whether no passthrough handle of `ino` is open, waiting up to
    /// [`RELEASE_GRACE`] for those being closed: the kernel sends the
    /// release of a closed file without waiting for it, so an open that
    /// follows a `close` can reach the mount first.
    pub(super) async fn passthrough_closed(&self, ino: u64) -> bool {
        let until = std::time::Instant::now() + RELEASE_GRACE;
        while self.passthrough_open(ino) > 0 {
            if std::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        true
    }

    /// Opens a handle whose reads the kernel serves from the file's block
    /// file on this host (the inode's shared one, or a new one); `None` when
    /// the file is not one block on this host.
    pub(super) async fn open_passthrough(
        &self,
        ino: u64,
        reply: &ReplyOpen,
    ) -> Option<(u64, Arc<fuser::BackingId>)> {
        let shared = self
            .passthrough_handles
            .lock()
            .get(&ino)
            .map(|(_, b)| b.clone());
        let backing = match shared {
            Some(b) => b,
            None => {
                let path = self.inodes.path(ino).ok()?;
                let file = self.passthrough_file(&path).await?;
                match reply.open_backing(&file) {
                    Ok(b) => Arc::new(b),
                    Err(e) => {
                        tracing::debug!(path, error = %e, "passthrough refused by the kernel");
                        return None;
                    }
                }
            }
        };
        self.passthrough_handles
            .lock()
            .entry(ino)
            .or_insert_with(|| (0, backing.clone()))
            .0 += 1;
        let fh = self.add_file_handle(ino, None, Some(backing.clone()));
        Some((fh, backing))
    }

    /// Opens the block file of a file whose data is one block on this host
    /// for passthrough.
    async fn passthrough_file(&self, path: &str) -> Option<std::fs::File> {
        let blocks = self.client.blocks(path).await.ok()?;
        if blocks.blocks.len() != 1 || blocks.attr.size == 0 || blocks.attr.writing.is_some() {
            return None;
        }
        let block = &blocks.blocks[0];
        if block.info.len != blocks.attr.size {
            return None;
        }
        let replica = block.replicas.iter().find_map(|r| r.path.clone())?;
        std::fs::File::open(replica).ok()
    }

    /// A passthrough handle of an inode was released: the last one lets
    /// the backing file go.
    pub(super) fn passthrough_released(&self, ino: u64) {
        let mut pt = self.passthrough_handles.lock();
        if let Some((n, _)) = pt.get_mut(&ino) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pt.remove(&ino);
            }
        }
    }
}
