//! Callbacks that make entries: mknod (files, FIFOs, sockets, device
//! nodes), mkdir, symlink and create share one helper (name checks, owner
//! and mode, the call, the answer); link, a new name of an inode.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Arc;

use fuser::{Errno, FileHandle, FopenFlags, Generation, INodeNo, ReplyCreate, ReplyEntry, Request};

use curvine_client::io::{FileWriter, WriteOptions};
use curvine_messages::rpc;
use curvine_messages::{Attr, FileKind, FsResult};

use super::acl::Inherited;
use super::perms::Caller;
use super::replies::{name_str, target_str, ErrorReply};
use super::write;
use super::CurvineFs;
use super::Fs;

/// A request to make an entry (mknod, mkdir, symlink, create), its
/// arguments copied from the kernel's.
pub(super) struct NewRequest {
    parent: u64,
    name: OsString,
    caller: Caller,
    /// The mode asked for (with the file type bits) and the umask to apply.
    mode: u32,
    umask: u32,
}

impl NewRequest {
    pub(super) fn of(
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> NewRequest {
        NewRequest {
            parent: parent.0,
            name: name.to_os_string(),
            caller: Caller::of(req),
            mode,
            umask,
        }
    }
}

/// What a request makes; a symlink's target as the kernel sent it
/// (`OsString`), then checked (`String`).
enum NewKind<T> {
    File,
    Dir,
    Symlink(T),
    /// A FIFO, socket or device node.
    Special(FileKind),
}

/// An entry about to be made: its checked name, what it is, and its path,
/// owner and mode (`Fs::new_entry`).
struct NewEntry {
    parent: u64,
    name: String,
    kind: NewKind<String>,
    path: String,
    uid: u32,
    gid: u32,
    mode: u32,
    /// The ACLs it inherits from its directory's default ACL (`--acl`).
    acl: Option<Inherited>,
}

impl CurvineFs {
    /// Answers a request that makes an entry, from a task: checks its name
    /// (and a symlink's target), picks its path, owner and mode
    /// (`Fs::new_entry`), then `make` makes it and answers.
    fn spawn_new<R, F, Fut>(
        &self,
        op: &'static str,
        new: NewRequest,
        kind: NewKind<OsString>,
        reply: R,
        make: F,
    ) where
        R: ErrorReply,
        F: FnOnce(Arc<Fs>, NewEntry, R) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let fs = self.0.clone();
        self.spawn(op, async move {
            let name = try_reply!(reply, name_str(&new.name)).to_string();
            let kind = match kind {
                NewKind::File => NewKind::File,
                NewKind::Dir => NewKind::Dir,
                NewKind::Special(kind) => NewKind::Special(kind),
                NewKind::Symlink(target) => NewKind::Symlink(target_str(&target).into_owned()),
            };
            let dir = matches!(kind, NewKind::Dir);
            // A directory's default ACL replaces the umask (not for symlinks).
            let acl = match kind {
                NewKind::Symlink(_) => None,
                _ => try_reply!(reply, fs.default_acl(new.parent).await)
                    .map(|acl| acl.inherit(new.mode, dir)),
            };
            let mode = match &acl {
                Some(inherited) => inherited.mode,
                None => new.mode & !new.umask,
            };
            let (path, uid, gid, mode) = try_reply!(
                reply,
                fs.new_entry(new.parent, &name, new.caller, mode, dir).await
            );
            let entry = NewEntry {
                parent: new.parent,
                name,
                kind,
                path,
                uid,
                gid,
                mode,
                acl,
            };
            make(fs, entry, reply).await;
        });
    }

    /// Answers mknod, mkdir and symlink: the entry made, or why not.
    fn make_entry(
        &self,
        op: &'static str,
        new: NewRequest,
        kind: NewKind<OsString>,
        reply: ReplyEntry,
    ) {
        self.spawn_new(op, new, kind, reply, |fs, new, reply| async move {
            // Only files are made in a delegated directory.
            fs.delegations.give_back(new.parent).await;
            let made = match new.kind {
                NewKind::File => {
                    let touch = rpc::Touch {
                        path: new.path.clone(),
                        mode: new.mode,
                        exclusive: true,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(touch).await
                }
                NewKind::Dir => {
                    let mkdir = rpc::Mkdir {
                        path: new.path.clone(),
                        parents: false,
                        mode: new.mode,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(mkdir).await
                }
                NewKind::Symlink(target) => {
                    let symlink = rpc::Symlink {
                        target,
                        link: new.path.clone(),
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(symlink).await
                }
                NewKind::Special(kind) => {
                    let mknod = rpc::Mknod {
                        path: new.path.clone(),
                        kind,
                        mode: new.mode,
                        uid: new.uid,
                        gid: new.gid,
                    };
                    fs.client.call(mknod).await
                }
            };
            let attr = try_reply!(reply, made);
            try_reply!(reply, fs.set_inherited_acl(&new.path, &new.acl).await);
            if attr.kind == FileKind::File {
                fs.made_file(new.parent, &attr);
            } else {
                fs.inodes.expire(new.parent);
            }
            fs.reply_entry(reply, new.parent, &new.name, attr);
        });
    }
}

/// Answers a create: opens the new file for writing (its `FileWriter`) and
/// a handle on it. In a directory this mount holds (see `delegated`), the
/// file is made here and its writer opens once the create is back.
async fn open_created(fs: Arc<Fs>, new: NewEntry, flags: i32, reply: ReplyCreate) {
    let owner = (new.uid, new.gid);
    // A file that inherits ACLs is made by the cluster first.
    let local = match new.acl {
        Some(_) => None,
        None => {
            fs.delegations
                .create(
                    new.parent,
                    || fs.inodes.path(new.parent),
                    &new.name,
                    new.mode,
                    owner,
                )
                .await
        }
    };
    if let Some(made) = local {
        return fs.made_here(new.parent, &new.name, owner, made, (reply, flags));
    }
    let options = WriteOptions {
        create: true,
        exclusive: flags & libc::O_EXCL != 0,
        truncate: flags & libc::O_TRUNC != 0,
        mode: new.mode,
        owner: Some((new.uid, new.gid)),
        spec: fs.layout(),
        ..Default::default()
    };
    let w = try_reply!(
        reply,
        FileWriter::open(&fs.client, &new.path, &options).await
    );
    if let Err(e) = fs.set_inherited_acl(&new.path, &new.acl).await {
        // Its writer gives the file back; the create fails with the error.
        let _ = w.abort().await;
        reply.error(super::replies::errno(&e));
        return;
    }
    let attr = w.attr.clone();
    fs.made_file(new.parent, &attr);
    let ino = fs.inodes.remember(new.parent, &new.name, attr.clone());
    fs.inodes.drop_cached(ino);
    let writer = fs.join_writer(ino, owner, write::Opened::Now(Box::new(w)));
    let fh = fs.add_file_handle(ino, Some(writer), None);
    reply_created(&fs, reply, ino, attr, fh, flags);
}

/// The kernel's answer to a create: the entry, its attributes and the
/// handle.
fn reply_created(fs: &Fs, reply: ReplyCreate, ino: u64, attr: Attr, fh: u64, flags: i32) {
    let mut open_flags = fs.direct_write_flag(flags);
    if fs.conf.direct_io {
        open_flags |= FopenFlags::FOPEN_DIRECT_IO;
    }
    let fattr = fs.file_attr(ino, &fs.with_writes(ino, attr));
    reply.created(
        &fs.entry_ttl,
        &fattr,
        Generation(0),
        FileHandle(fh),
        open_flags,
    );
}

impl Fs {
    /// Answers a create on the fuser thread when the file can be made here
    /// without waiting: in a directory this mount holds, whose attributes
    /// (for the set-group-ID rule) are fresh. Gives the reply back
    /// otherwise.
    fn create_here(
        self: &Arc<Self>,
        new: &NewRequest,
        flags: i32,
        reply: ReplyCreate,
    ) -> Option<ReplyCreate> {
        let Ok(name) = name_str(&new.name) else {
            return Some(reply);
        };
        let Some(pattr) = self.inodes.fresh_attr(new.parent) else {
            return Some(reply);
        };
        if !self.no_default_acl(new.parent) {
            return Some(reply);
        }
        let mode = new.mode & !new.umask & 0o7777;
        let owner = if pattr.mode & libc::S_ISGID != 0 {
            (new.caller.uid, pattr.gid)
        } else {
            (new.caller.uid, new.caller.gid)
        };
        let _runtime = self.rt.enter();
        let Some(made) = self.delegations.create_now(
            new.parent,
            || self.inodes.path(new.parent),
            &name,
            mode,
            owner,
        ) else {
            return Some(reply);
        };
        self.made_here(new.parent, &name, owner, made, (reply, flags));
        None
    }

    /// Opens a file made here in a directory this mount holds: its inode,
    /// its writer (waiting for its create's batch) and a handle.
    fn made_here(
        self: &Arc<Self>,
        parent: u64,
        name: &str,
        owner: (u32, u32),
        (attr, created): (Attr, super::delegated::Created),
        (reply, flags): (ReplyCreate, i32),
    ) {
        self.made_file(parent, &attr);
        let ino = self.inodes.remember(parent, name, attr.clone());
        self.inodes.drop_cached(ino);
        let writer = self.join_writer(ino, owner, write::Opened::Later(created));
        let fh = self.add_file_handle(ino, Some(writer), None);
        reply_created(self, reply, ino, attr, fh, flags);
    }

    /// Owner of something a caller creates in `parent`: its gid comes from
    /// a set-group-ID directory (and a new directory inherits the bit).
    async fn new_owner(
        &self,
        parent: u64,
        caller: Caller,
        mode: u32,
        dir: bool,
    ) -> FsResult<(u32, u32, u32)> {
        let pattr = self.getattr(parent).await?;
        if pattr.mode & libc::S_ISGID != 0 {
            let mode = if dir { mode | libc::S_ISGID } else { mode };
            return Ok((caller.uid, pattr.gid, mode));
        }
        Ok((caller.uid, caller.gid, mode))
    }

    /// After this mount made file `attr` in directory `parent`: the
    /// directory's cached times move to the file's (a file's inode is
    /// made in its parent's shard, in one change that gives the directory
    /// the same mtime and ctime), and the file is known to have no
    /// security.capability (the kernel asks before its first write).
    fn made_file(&self, parent: u64, attr: &Attr) {
        self.inodes.file_made_in(parent, attr.ctime_ns);
        self.remember_absent_xattr(self.inodes.fuse_ino(attr.ino), "security.capability");
    }

    /// Gives a new inode at `path` the ACLs it inherited.
    async fn set_inherited_acl(&self, path: &str, acl: &Option<Inherited>) -> FsResult<()> {
        let Some(inherited) = acl else {
            return Ok(());
        };
        let attrs = [
            (super::acl::ACCESS, &inherited.access),
            (super::acl::DEFAULT, &inherited.default),
        ];
        for (name, value) in attrs {
            if let Some(value) = value {
                self.client
                    .set_xattr(path, name, value, curvine_messages::XattrMode::Any)
                    .await?;
            }
        }
        Ok(())
    }

    /// Path, owner and mode of something a caller creates as `name` in
    /// `parent` (a directory when `dir`).
    async fn new_entry(
        &self,
        parent: u64,
        name: &str,
        caller: Caller,
        mode: u32,
        dir: bool,
    ) -> FsResult<(String, u32, u32, u32)> {
        let path = self.inodes.child_path(parent, name)?;
        let (uid, gid, mode) = self.new_owner(parent, caller, mode & 0o7777, dir).await?;
        Ok((path, uid, gid, mode))
    }
}

pub(super) fn mknod(cfs: &CurvineFs, new: NewRequest, rdev: u32, reply: ReplyEntry) {
    let kind = match FileKind::from_mode(new.mode, rdev) {
        Some(FileKind::File) => NewKind::File,
        Some(kind) => NewKind::Special(kind),
        None => {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        }
    };
    cfs.make_entry("mknod", new, kind, reply);
}

pub(super) fn mkdir(cfs: &CurvineFs, new: NewRequest, reply: ReplyEntry) {
    cfs.make_entry("mkdir", new, NewKind::Dir, reply);
}

pub(super) fn symlink(
    cfs: &CurvineFs,
    req: &Request,
    parent: INodeNo,
    link_name: &OsStr,
    target: &Path,
    reply: ReplyEntry,
) {
    let new = NewRequest::of(req, parent, link_name, 0o777, 0);
    let target = target.as_os_str().to_os_string();
    cfs.make_entry("symlink", new, NewKind::Symlink(target), reply);
}

pub(super) fn create(cfs: &CurvineFs, new: NewRequest, flags: i32, reply: ReplyCreate) {
    let Some(reply) = cfs.0.create_here(&new, flags, reply) else {
        return;
    };
    cfs.spawn_new(
        "create",
        new,
        NewKind::File,
        reply,
        move |fs, new, reply| open_created(fs, new, flags, reply),
    );
}

/// A hard link: a new name of inode `ino` in `newparent`.
pub(super) fn link(
    cfs: &CurvineFs,
    ino: INodeNo,
    newparent: INodeNo,
    newname: &OsStr,
    reply: ReplyEntry,
) {
    let fs = cfs.0.clone();
    let newname = newname.to_os_string();
    cfs.spawn("link", async move {
        let name = try_reply!(reply, name_str(&newname)).to_string();
        // The new name, and a file this mount made in a directory it
        // holds, must be the cluster's before the link.
        fs.delegations.give_back(newparent.0).await;
        if let Some(dir) = fs.inodes.parent_of(ino.0) {
            fs.delegations.give_back(dir).await;
        }
        let target = try_reply!(reply, fs.inodes.path(ino.0));
        let path = try_reply!(reply, fs.inodes.child_path(newparent.0, &name));
        let attr = try_reply!(reply, fs.client.link(&target, &path).await);
        fs.inodes.expire(newparent.0);
        fs.reply_entry(reply, newparent.0, &name, attr);
    });
}
