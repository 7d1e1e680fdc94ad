//! Short-circuit reads: a block file on this host opened directly, after
//! its node granted it.

use std::fs::File;
use std::os::unix::fs::FileExt;

use curvine_messages::block::{DataReply, DataRequest, CHECKSUM_UNIT};
use curvine_messages::{FsError, FsResult};
use curvine_wire::data::{io_err, start_stream, verified, BlockSource};

use crate::client::Client;

/// A block file opened directly (short-circuit).
pub(crate) struct LocalBlock {
    file: File,
    /// Where the block's bytes start in `file` (an extent file).
    base: u64,
    stored: u64,
    crcs: Vec<u32>,
    what: String,
}

impl LocalBlock {
    /// Reads `buf.len()` bytes at `offset`, verified. Reads straight into
    /// `buf` when the range is whole checksum units.
    pub(crate) fn read_at(&self, offset: u64, buf: &mut [u8]) -> FsResult<()> {
        let unit = CHECKSUM_UNIT as u64;
        let end = offset + buf.len() as u64;
        if end > self.stored {
            return Err(FsError::Io(format!(
                "{}: read past the block's {} bytes",
                self.what, self.stored
            )));
        }
        let first = (offset / unit) as usize;
        if offset.is_multiple_of(unit) && (end.is_multiple_of(unit) || end == self.stored) {
            self.file
                .read_exact_at(buf, self.base + offset)
                .map_err(|e| io_err(&self.what, e))?;
            return verified(buf, &self.crcs[first..], first, &self.what);
        }
        let start = offset / unit * unit;
        let stop = end.div_ceil(unit).saturating_mul(unit).min(self.stored);
        let mut scratch = vec![0u8; (stop - start) as usize];
        self.file
            .read_exact_at(&mut scratch, self.base + start)
            .map_err(|e| io_err(&self.what, e))?;
        verified(&scratch, &self.crcs[first..], first, &self.what)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&scratch[skip..skip + buf.len()]);
        Ok(())
    }
}

/// Opens a block file directly when short-circuit is allowed for its node;
/// `None` means: read it over the data port.
pub(crate) async fn open_local_block(client: &Client, src: &BlockSource) -> Option<LocalBlock> {
    if !client.io.short_circuit || !client.data.is_local(&src.node) {
        return None;
    }
    // The block may move between the grant and the open: ask again once.
    for _ in 0..2 {
        let mut conn = client.data.get(&src.node.data_addr).await.ok()?;
        let reply = conn
            .call(&DataRequest::OpenLocal {
                token: src.token.clone(),
            })
            .await;
        let Ok(DataReply::Local {
            path,
            len,
            crcs,
            offset,
        }) = reply
        else {
            return None;
        };
        client.data.put(conn);
        if let Ok(file) = File::open(&path) {
            return Some(LocalBlock {
                file,
                base: offset,
                stored: len,
                crcs,
                what: format!("block {:#x} ({path})", src.token.block),
            });
        }
    }
    None
}

/// Reads `buf.len()` bytes of a block at `off` in one go (short-circuit
/// when allowed, else one request on the data port).
pub(crate) async fn read_once(
    client: &Client,
    src: &BlockSource,
    off: u64,
    buf: &mut [u8],
) -> FsResult<()> {
    match open_local_block(client, src).await {
        Some(block) => block.read_at(off, buf),
        None => fetch_remote(client, src, off, buf).await,
    }
}

/// Reads `buf.len()` bytes of a block at `off` with one data-port request.
pub(crate) async fn fetch_remote(
    client: &Client,
    src: &BlockSource,
    off: u64,
    buf: &mut [u8],
) -> FsResult<()> {
    let mut stream = start_stream(&client.data, src, 0, off, buf.len() as u64);
    let mut done = 0;
    while done < buf.len() {
        let Some(item) = stream.rx.recv().await else {
            return Err(FsError::Io(format!(
                "block {:#x}: stream ended early",
                src.token.block
            )));
        };
        let (start, data) = item?;
        let from = (off + done as u64).saturating_sub(start) as usize;
        if from >= data.len() {
            continue;
        }
        let n = (data.len() - from).min(buf.len() - done);
        buf[done..done + n].copy_from_slice(&data[from..from + n]);
        done += n;
        let _ = stream.recycle.send(data);
    }
    Ok(())
}

/// Short-circuit reads and writes complete without ever waiting, so a task
/// doing nothing else would keep its runtime worker (and any task queued
/// behind it there) to itself. Yield every few MiB.
const YIELD_EVERY: usize = 4 << 20;

pub(crate) async fn yield_sometimes(since: &mut usize, n: usize) {
    *since += n;
    if *since >= YIELD_EVERY {
        *since = 0;
        tokio::task::yield_now().await;
    }
}
