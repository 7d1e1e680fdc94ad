//! Names and attributes: lookup, getattr, setattr (with the writes a file
//! has not committed yet), readlink, statfs.

use std::ffi::OsStr;
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{
    Generation, INodeNo, ReplyAttr, ReplyData, ReplyEntry, ReplyStatfs, Request, TimeOrNow,
};

use curvine_messages::rpc;
use curvine_messages::{names, Attr, FileKind, FsError, FsResult, SetAttr, TimeSet};

use crate::inodes::empty_attr;

use super::perms::Caller;
use super::replies::{errno, name_str};
use super::write;
use super::CurvineFs;
use super::Fs;

pub(super) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => TimeSet::Ns(d.as_nanos().min(i64::MAX as u128) as i64),
            Err(e) => TimeSet::Ns(-(e.duration().as_nanos().min(i64::MAX as u128) as i64)),
        },
    }
}

impl Fs {
    /// Attributes of a known inode: cached within the TTL, else fetched.
    pub(super) async fn getattr(&self, ino: u64) -> FsResult<Attr> {
        if let Some(attr) = self.inodes.fresh_attr(ino) {
            return Ok(self.with_writes(ino, attr));
        }
        let path = self.inodes.path(ino)?;
        let attr = self.client.call(rpc::Stat { path: path.clone() }).await?;
        if self.inodes.fuse_ino(attr.ino) != ino {
            if self.inodes.is_hidden(ino) || self.open_count(ino) > 0 {
                // Renamed or removed by another client while open here.
                if let Some(a) = self.inodes.attr(ino) {
                    return Ok(self.with_writes(ino, a));
                }
            }
            return Err(FsError::Stale(format!("{path} now names another file")));
        }
        self.inodes.set_attr(ino, attr.clone());
        Ok(self.with_writes(ino, attr))
    }

    /// Looks a name up: the name cache, else the cluster.
    async fn lookup(&self, parent: u64, name: &str) -> FsResult<(u64, Attr)> {
        if let Some((ino, attr)) = self.inodes.fresh_name(parent, name) {
            return Ok((ino, self.with_writes(ino, attr)));
        }
        if self.delegations.absent(parent, name) {
            return Err(FsError::NotFound(String::new()));
        }
        let path = self.inodes.child_path(parent, name)?;
        let attr = self.client.call(rpc::Stat { path }).await?;
        let ino = self.inodes.fuse_ino(attr.ino);
        Ok((ino, self.with_writes(ino, attr)))
    }

    pub(super) async fn setattr(
        &self,
        ino: u64,
        caller: Caller,
        mut set: SetAttr,
    ) -> FsResult<Attr> {
        // A directory's attributes are not something a delegation covers.
        self.delegations.give_back(ino).await;
        let attr = self.getattr(ino).await?;
        self.check_setattr(caller, &attr, &mut set)?;
        // A truncation by anyone but root takes away set-user-ID and
        // set-group-ID (see `killed_suid_sgid`; a chown's are taken above).
        if set.mode.is_none() && set.size.is_some() && caller.uid != 0 {
            set.mode = super::perms::killed_suid_sgid(&attr);
        }
        if let Some(w) = self.writer(ino).filter(|w| w.fresh()) {
            if set.size.is_none() && set != SetAttr::default() {
                // A file this mount is creating: its creation becomes
                // durable with its commit, and so do these.
                match w.set_times(set.clone()).await {
                    Err(e) if write::ended(&e) => {}
                    done => return done,
                }
            }
        }
        if let Some(w) = self.writer(ino).filter(|w| w.dirty()) {
            let times_only = SetAttr {
                atime: None,
                mtime: None,
                ..set.clone()
            } == SetAttr::default();
            if times_only && set != SetAttr::default() && self.conf.writeback_cache {
                // The kernel's writeback cache sends the file's mtime while
                // its writes are still arriving: the times go with the
                // writes' commit, after them.
                match w.set_times(set.clone()).await {
                    Err(e) if write::ended(&e) => {}
                    done => return done,
                }
            } else {
                // Writes first: their commit would otherwise overwrite
                // times set now (cp -a sets them before it closes the file).
                match w.commit().await {
                    Err(e) if write::ended(&e) => {}
                    done => done?,
                }
            }
        }
        if let Some(size) = set.size.take() {
            if attr.kind == FileKind::Dir {
                return Err(FsError::IsADirectory("cannot truncate a directory".into()));
            }
            let by_writer = match self.writer(ino) {
                Some(w) => match w.truncate(size).await {
                    Err(e) if write::ended(&e) => false,
                    done => done.map(|_| true)?,
                },
                None => false,
            };
            match by_writer {
                true => {}
                false => {
                    let path = self.inodes.path(ino)?;
                    let done = self
                        .client
                        .call(rpc::SetAttrs {
                            path,
                            set: SetAttr {
                                size: Some(size),
                                ..Default::default()
                            },
                            follow: false,
                        })
                        .await?;
                    self.committed(ino, Some(done));
                }
            }
            self.inodes.drop_cached(ino);
        }
        if set == SetAttr::default() {
            let attr = self.getattr_fresh(ino).await?;
            return Ok(attr);
        }
        let path = self.inodes.path(ino)?;
        let chmod = set.mode;
        let attr = self
            .client
            .call(rpc::SetAttrs {
                path: path.clone(),
                set,
                follow: false,
            })
            .await?;
        if let Some(mode) = chmod {
            self.chmod_acl(ino, &path, mode).await?;
        }
        self.inodes.set_attr(ino, attr.clone());
        Ok(self.with_writes(ino, attr))
    }

    /// What a write by a caller without CAP_FSETID (the kernel marks it)
    /// does to a file with set-user-ID or set-group-ID: takes them away
    /// before the write is answered. Cheap when the cached attributes show
    /// neither; waits on the node otherwise (called on a fuser thread).
    pub(super) fn kill_suid_sgid_for_write(self: &std::sync::Arc<Self>, ino: u64) {
        if let Some(attr) = self.inodes.attr(ino) {
            if super::perms::killed_suid_sgid(&attr).is_none() {
                return;
            }
        }
        let fs = self.clone();
        let done = self.rt.block_on(async move {
            let attr = fs.getattr(ino).await?;
            fs.take_suid_sgid(ino, attr).await
        });
        if let Err(e) = done {
            tracing::warn!(ino, error = %e, "taking away set-user-ID and set-group-ID for a write failed");
        }
    }

    /// Takes set-user-ID and set-group-ID away from file `ino` (whose
    /// attributes are `attr`) on the kernel's behalf, when it has them;
    /// its attributes after.
    pub(super) async fn take_suid_sgid(&self, ino: u64, attr: Attr) -> FsResult<Attr> {
        match super::perms::killed_suid_sgid(&attr) {
            Some(mode) => {
                let set = SetAttr {
                    mode: Some(mode),
                    ..Default::default()
                };
                self.setattr(ino, Caller::MOUNT, set).await
            }
            None => Ok(attr),
        }
    }

    async fn getattr_fresh(&self, ino: u64) -> FsResult<Attr> {
        self.inodes.expire(ino);
        self.getattr(ino).await
    }

    /// Capacity and free bytes of the cluster (cached for a second).
    async fn capacity(&self) -> FsResult<(u64, u64)> {
        if let Some((at, v)) = *self.statfs.lock() {
            if at.elapsed() < Duration::from_secs(1) {
                return Ok(v);
            }
        }
        let report = self.client.report().await?;
        let (mut cap, mut used) = (0u64, 0u64);
        for node in &report.nodes {
            for tier in &node.tiers {
                cap += tier.capacity;
                used += tier.used + tier.reserved;
            }
        }
        let v = (cap, cap.saturating_sub(used));
        *self.statfs.lock() = Some((Instant::now(), v));
        Ok(v)
    }
}

pub(super) fn lookup(cfs: &CurvineFs, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
    let fs = cfs.0.clone();
    let parent = parent.0;
    // A name the mount knows, fetched within the TTL: answered here.
    if let Ok(n) = name_str(name) {
        let n = &*n;
        if let Some((ino, attr)) = fs.inodes.fresh_name(parent, n) {
            let attr = fs.with_writes(ino, attr);
            fs.reply_entry(reply, parent, n, attr);
            return;
        }
        // A name absent from a directory this mount holds.
        if fs.negative_ttl.is_zero() && fs.delegations.absent(parent, n) {
            reply.error(fuser::Errno::ENOENT);
            return;
        }
    }
    let name = name.to_os_string();
    cfs.spawn("lookup", async move {
        let name = try_reply!(reply, name_str(&name));
        let name = &*name;
        match fs.lookup(parent, name).await {
            Ok((_, attr)) => fs.reply_entry(reply, parent, name, attr),
            Err(FsError::NotFound(_)) if !fs.negative_ttl.is_zero() => {
                // A negative entry: the kernel remembers the name is absent.
                let none = fs.file_attr(0, &empty_attr());
                reply.entry_with_ttls(&fs.negative_ttl, &fs.negative_ttl, &none, Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    });
}

pub(super) fn getattr(cfs: &CurvineFs, ino: INodeNo, reply: ReplyAttr) {
    let fs = cfs.0.clone();
    if let Some(attr) = fs.inodes.fresh_attr(ino.0) {
        let attr = fs.with_writes(ino.0, attr);
        reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
        return;
    }
    cfs.spawn("getattr", async move {
        let attr = try_reply!(reply, fs.getattr(ino.0).await);
        reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
    });
}

pub(super) fn setattr(
    cfs: &CurvineFs,
    req: &Request,
    ino: INodeNo,
    set: SetAttr,
    reply: ReplyAttr,
) {
    let fs = cfs.0.clone();
    let caller = Caller::of(req);
    cfs.spawn("setattr", async move {
        let attr = try_reply!(reply, fs.setattr(ino.0, caller, set).await);
        reply.attr(&fs.attr_ttl, &fs.file_attr(ino.0, &attr));
    });
}

pub(super) fn readlink(cfs: &CurvineFs, ino: INodeNo, reply: ReplyData) {
    let fs = cfs.0.clone();
    cfs.spawn("readlink", async move {
        if let Some(target) = fs.inodes.attr(ino.0).and_then(|a| a.symlink) {
            reply.data(&names::to_bytes(&target));
            return;
        }
        let path = try_reply!(reply, fs.inodes.path(ino.0));
        let target = try_reply!(reply, fs.client.readlink(&path).await);
        reply.data(&names::to_bytes(&target));
    });
}

pub(super) fn statfs(cfs: &CurvineFs, reply: ReplyStatfs) {
    let fs = cfs.0.clone();
    cfs.spawn("statfs", async move {
        let (cap, free) = try_reply!(reply, fs.capacity().await);
        const BS: u64 = 4096;
        reply.statfs(
            cap / BS,
            free / BS,
            free / BS,
            u32::MAX as u64,
            u32::MAX as u64 - fs.inodes.len() as u64,
            BS as u32,
            255,
            BS as u32,
        );
    });
}
