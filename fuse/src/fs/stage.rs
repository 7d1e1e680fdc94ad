//! Random writes through the mount wait in a sparse local file
//! (`fuse.stage_dir`) with the ranges written, and a commit rewrites only
//! the blocks they touch, from the old content and the staged bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_messages::{Attr, FsError, FsResult};

use super::replies::io_error;
use super::Fs;

/// Bytes composed and written at once when a staged file is committed.
const COMMIT_CHUNK: u64 = 1 << 20;

/// A file's random writes waiting to be committed.
pub(super) struct Stage {
    file: File,
    /// Ranges written: start -> end, disjoint and not touching.
    extents: BTreeMap<u64, u64>,
    /// The file's committed content when staging began.
    base: FileReader,
    base_size: u64,
    pub(super) size: u64,
}

impl Stage {
    pub(super) async fn new(fs: &Fs, path: &str) -> FsResult<Stage> {
        let base = FileReader::open(&fs.client, path).await?;
        let dir = fs.stage_dir();
        let file = tempfile::tempfile_in(&dir).map_err(|e| {
            FsError::Io(format!(
                "cannot create a staging file in {} (fuse.stage_dir): {e}",
                dir.display()
            ))
        })?;
        let size = base.size();
        Ok(Stage {
            file,
            extents: BTreeMap::new(),
            base_size: size,
            size,
            base,
        })
    }

    pub(super) fn write(&mut self, off: u64, data: &[u8]) -> FsResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.file
            .write_all_at(data, off)
            .map_err(|e| io_error("writing the staging file", e))?;
        let end = off + data.len() as u64;
        add_extent(&mut self.extents, off, end);
        self.size = self.size.max(end);
        Ok(())
    }

    /// Fills `buf` with the file's bytes at `off` as written here.
    pub(super) async fn read(&mut self, off: u64, buf: &mut [u8]) -> FsResult<()> {
        let end = off + buf.len() as u64;
        buf.fill(0);
        if off < self.base_size {
            let n = (self.base_size - off).min(buf.len() as u64) as usize;
            self.base.read_full_at(off, &mut buf[..n]).await?;
        }
        for (&s, &e) in self.extents.range(..end) {
            if e <= off {
                continue;
            }
            let from = s.max(off);
            let to = e.min(end);
            self.file
                .read_exact_at(&mut buf[(from - off) as usize..(to - off) as usize], from)
                .map_err(|e| io_error("reading the staging file", e))?;
        }
        Ok(())
    }

    /// Rewrites the blocks the staged ranges touch and commits the file.
    /// Rewrites the blocks the staged writes touch, from the old content
    /// and the staged bytes, and closes: all of them or (an error) none.
    pub(super) async fn commit(
        &mut self,
        fs: &Fs,
        path: &str,
        owner: (u32, u32),
    ) -> FsResult<Attr> {
        let options = WriteOptions {
            owner: Some(owner),
            ..Default::default()
        };
        let mut w = FileWriter::open(&fs.client, path, &options).await?;
        let bs = w.block_size();
        let mut blocks = BTreeSet::new();
        for (&s, &e) in &self.extents {
            for b in s / bs..=(e - 1) / bs {
                blocks.insert(b);
            }
        }
        let mut buf = Vec::new();
        let result: FsResult<()> = async {
            for b in blocks {
                let start = b * bs;
                let end = (start + bs).min(self.size);
                w.seek(start).await?;
                let mut pos = start;
                while pos < end {
                    let n = COMMIT_CHUNK.min(end - pos) as usize;
                    buf.resize(n, 0);
                    self.read(pos, &mut buf).await?;
                    w.write(&buf).await?;
                    pos += n as u64;
                }
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => w.close().await,
            Err(e) => {
                let _ = w.abort().await;
                Err(e)
            }
        }
    }
}

/// Adds [start, end) to a set of disjoint ranges, merging what it touches.
fn add_extent(extents: &mut BTreeMap<u64, u64>, mut start: u64, mut end: u64) {
    // A range starting before `start` that reaches it.
    if let Some((&s, &e)) = extents.range(..=start).next_back() {
        if e >= start {
            start = s;
            end = end.max(e);
            extents.remove(&s);
        }
    }
    // Ranges starting inside [start, end].
    let inside: Vec<(u64, u64)> = extents.range(start..=end).map(|(s, e)| (*s, *e)).collect();
    for (s, e) in inside {
        end = end.max(e);
        extents.remove(&s);
    }
    extents.insert(start, end);
}

#[cfg(test)]
mod tests {
    use super::add_extent;
    use std::collections::BTreeMap;

    #[test]
    fn extents_merge() {
        let mut x = BTreeMap::new();
        add_extent(&mut x, 10, 20);
        add_extent(&mut x, 30, 40);
        assert_eq!(x.len(), 2);
        add_extent(&mut x, 20, 30);
        assert_eq!(x.into_iter().collect::<Vec<_>>(), vec![(10, 40)]);
        let mut y = BTreeMap::new();
        add_extent(&mut y, 50, 60);
        add_extent(&mut y, 0, 5);
        add_extent(&mut y, 3, 55);
        assert_eq!(y.into_iter().collect::<Vec<_>>(), vec![(0, 60)]);
        let mut z = BTreeMap::new();
        add_extent(&mut z, 0, 100);
        add_extent(&mut z, 10, 20);
        assert_eq!(z.into_iter().collect::<Vec<_>>(), vec![(0, 100)]);
    }
}
