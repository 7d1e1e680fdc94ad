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
mod sink;
mod writer;

/// Checksum mismatches this process detected in bytes it read.
pub use curvine_wire::data::checksum_errors;
pub use reader::FileReader;
pub use writer::{client_name, FileWriter, WriteOptions};
