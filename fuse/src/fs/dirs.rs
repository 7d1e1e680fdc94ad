//! Directory handles: opendir, readdir, readdirplus, releasedir, fsyncdir.
//! A handle fetches its listing a page at a time; hidden names (files
//! unlinked while open) are left out.

use fuser::{
    Errno, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyOpen,
};

use curvine_messages::rpc::{self, ListEntry};
use curvine_messages::FsResult;

use crate::inodes::{HIDDEN_PREFIX, ROOT};

use super::replies::os_name;
use super::CurvineFs;
use super::{Fs, Handle};

pub(super) struct DirState {
    loaded: bool,
    entries: Vec<ListEntry>,
    more: bool,
}

pub(super) struct DirHandleState {
    ino: u64,
    state: tokio::sync::Mutex<DirState>,
}

impl Fs {
    /// Fetches the next page of a directory listing.
    async fn load_dir(&self, dir: &DirHandleState, st: &mut DirState) -> FsResult<()> {
        // A listing shows the creates this mount made in a directory it
        // holds once they are in the cluster.
        self.delegations.give_back(dir.ino).await;
        let path = self.inodes.path(dir.ino)?;
        let after = st.entries.last().map(|e| e.name.clone());
        let page = self
            .client
            .call(rpc::List {
                path,
                after,
                limit: 1000,
            })
            .await?;
        st.loaded = true;
        st.more = page.more && !page.entries.is_empty();
        st.entries.extend(page.entries);
        Ok(())
    }

    /// Entry `i` of a listing (after "." and ".."), fetching pages as needed.
    async fn dir_entry(
        &self,
        dir: &DirHandleState,
        st: &mut DirState,
        i: usize,
    ) -> FsResult<Option<ListEntry>> {
        while !st.loaded || (i >= st.entries.len() && st.more) {
            self.load_dir(dir, st).await?;
        }
        Ok(st.entries.get(i).cloned())
    }
}

impl DirState {
    /// A read from the start (the first, or after `rewinddir`) lists the
    /// directory as it is now, not as the handle last saw it.
    fn rewind_at(&mut self, offset: u64) {
        if offset == 0 && self.loaded {
            self.loaded = false;
            self.entries.clear();
            self.more = true;
        }
    }
}

pub(super) fn opendir(cfs: &CurvineFs, ino: INodeNo, reply: ReplyOpen) {
    let fh = cfs.0.add_handle(Handle::Dir(DirHandleState {
        ino: ino.0,
        state: tokio::sync::Mutex::new(DirState {
            loaded: false,
            entries: Vec::new(),
            more: true,
        }),
    }));
    reply.opened(FileHandle(fh), FopenFlags::empty());
}

pub(super) fn readdir(
    cfs: &CurvineFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    mut reply: ReplyDirectory,
) {
    let fs = cfs.0.clone();
    cfs.spawn("readdir", async move {
        let handle = try_reply!(reply, fs.handle(fh.0));
        let Handle::Dir(dir) = &*handle else {
            reply.error(Errno::from_i32(libc::ENOTDIR));
            return;
        };
        let mut st = dir.state.lock().await;
        st.rewind_at(offset);
        let mut off = offset;
        loop {
            let (child, kind, name) = match off {
                0 => (ino.0, FileType::Directory, ".".to_string()),
                1 => {
                    let parent = fs
                        .inodes
                        .attr(ino.0)
                        .map(|a| fs.inodes.fuse_ino(a.parent))
                        .unwrap_or(ROOT);
                    (parent.max(1), FileType::Directory, "..".to_string())
                }
                n => match try_reply!(reply, fs.dir_entry(dir, &mut st, (n - 2) as usize).await) {
                    None => break,
                    Some(e) if e.name.starts_with(HIDDEN_PREFIX) => {
                        off += 1;
                        continue;
                    }
                    Some(e) => {
                        let kind = super::replies::file_type(e.attr.kind);
                        (fs.inodes.fuse_ino(e.attr.ino), kind, e.name)
                    }
                },
            };
            if reply.add(INodeNo(child), off + 1, kind, os_name(&name)) {
                break;
            }
            off += 1;
        }
        reply.ok();
    });
}

pub(super) fn readdirplus(
    cfs: &CurvineFs,
    ino: INodeNo,
    fh: FileHandle,
    offset: u64,
    mut reply: ReplyDirectoryPlus,
) {
    let fs = cfs.0.clone();
    cfs.spawn("readdirplus", async move {
        let handle = try_reply!(reply, fs.handle(fh.0));
        let Handle::Dir(dir) = &*handle else {
            reply.error(Errno::from_i32(libc::ENOTDIR));
            return;
        };
        let mut st = dir.state.lock().await;
        st.rewind_at(offset);
        let mut off = offset;
        loop {
            let full = match off {
                0 | 1 => {
                    let attr = try_reply!(reply, fs.getattr(ino.0).await);
                    let name = if off == 0 { "." } else { ".." };
                    reply.add(
                        INodeNo(ino.0),
                        off + 1,
                        name,
                        &fs.entry_ttl,
                        &fs.file_attr(ino.0, &attr),
                        Generation(0),
                    )
                }
                n => {
                    match try_reply!(reply, fs.dir_entry(dir, &mut st, (n - 2) as usize).await) {
                        None => break,
                        Some(e) if e.name.starts_with(HIDDEN_PREFIX) => false,
                        Some(e) => {
                            let child = fs.inodes.fuse_ino(e.attr.ino);
                            let attr = fs.with_writes(child, e.attr.clone());
                            let full = reply.add(
                                INodeNo(child),
                                off + 1,
                                os_name(&e.name),
                                &fs.entry_ttl,
                                &fs.file_attr(child, &attr),
                                Generation(0),
                            );
                            if !full {
                                // The kernel counts a lookup for each entry it gets.
                                fs.inodes.remember(ino.0, &e.name, e.attr);
                            }
                            full
                        }
                    }
                }
            };
            if full {
                break;
            }
            off += 1;
        }
        reply.ok();
    });
}

pub(super) fn releasedir(cfs: &CurvineFs, fh: FileHandle, reply: ReplyEmpty) {
    cfs.0.handles.lock().remove(&fh.0);
    reply.ok();
}

pub(super) fn fsyncdir(cfs: &CurvineFs, reply: ReplyEmpty) {
    // Namespace changes are durable when they are acknowledged, but for
    // the creation of a file by its open: that is durable with the file's
    // first commit (close or fsync). The files this mount has open for
    // writing commit, as an fsync of each would, so every name made
    // through the mount is durable when this returns.
    let fs = cfs.0.clone();
    cfs.spawn("fsyncdir", async move {
        let writers: Vec<_> = fs.writers.lock().values().cloned().collect();
        for w in writers {
            try_reply!(reply, w.commit().await);
        }
        reply.ok();
    });
}
