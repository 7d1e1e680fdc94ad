//! File I/O of the client library: [`FileWriter`] and [`FileReader`].
//!
//! Bytes go to and from block files either through a node's data port or,
//! when the block's node runs on this host and grants it, directly in the
//! block file (short-circuit). Either way every byte read is checked against
//! the crc32c of its 64KiB unit; a mismatch is EIO, never wrong bytes.
//!
//! Writes are copy-on-write at block granularity: a block that is written
//! (even one byte of it) is replaced by a new block holding the old bytes
//! around the new ones, and the file switches to the new blocks when the
//! writer closes it. Readers of the old version keep reading it until they
//! reopen (close-to-open consistency).

mod local;
mod reader;
mod writer;

/// Checksum mismatches this process detected in bytes it read.
pub use curvine_wire::data::checksum_errors;
pub use reader::FileReader;
pub use writer::{FileWriter, WriteOptions};

use curvine_conf::ClientConf;

/// Client settings for file I/O.
#[derive(Debug, Clone)]
pub struct IoConf {
    pub short_circuit: bool,
    pub read_ahead: u32,
}

impl From<&ClientConf> for IoConf {
    fn from(c: &ClientConf) -> Self {
        IoConf {
            short_circuit: c.short_circuit,
            read_ahead: c.read_ahead,
        }
    }
}

/// Short-circuit reads and writes complete without ever waiting, so a task
/// doing nothing else would keep its runtime worker (and any task queued
/// behind it there) to itself. Yield every few MiB.
const YIELD_EVERY: usize = 4 << 20;

async fn yield_sometimes(since: &mut usize, n: usize) {
    *since += n;
    if *since >= YIELD_EVERY {
        *since = 0;
        tokio::task::yield_now().await;
    }
}

/// Who this client is, for write leases.
fn client_name() -> String {
    let key = curvine_wire::host::host_key();
    let host = key.split('/').next().unwrap_or("");
    format!("{host}:{}", std::process::id())
}
