//! Extended attributes: setxattr, getxattr, listxattr, removexattr. An
//! attribute found absent is remembered for the metadata TTL (the kernel
//! asks for security.capability before every write).

use std::ffi::OsStr;
use std::time::Instant;

use fuser::{Errno, INodeNo, ReplyEmpty, ReplyXattr};

use curvine_messages::{FsError, FsResult, XattrMode};

use super::replies::{errno, xattr_name};
use super::CurvineFs;
use super::Fs;

impl Fs {
    /// Whether an extended attribute was found absent within the TTL.
    fn xattr_absent(&self, ino: u64, name: &str) -> bool {
        let ttl = self.conf.meta_cache_ttl.0;
        self.absent_xattrs
            .lock()
            .get(&(ino, name.to_string()))
            .is_some_and(|at| at.elapsed() < ttl)
    }

    pub(super) fn remember_absent_xattr(&self, ino: u64, name: &str) {
        if self.conf.meta_cache_ttl.0.is_zero() {
            return;
        }
        let mut absent = self.absent_xattrs.lock();
        if absent.len() > 100_000 {
            absent.clear();
        }
        absent.insert((ino, name.to_string()), Instant::now());
    }

    /// Whether `name` is an ACL attribute this mount keeps (`fuse.acl`).
    fn acl_attr(&self, name: &str) -> bool {
        self.acl.load(std::sync::atomic::Ordering::Relaxed)
            && (name == super::acl::ACCESS || name == super::acl::DEFAULT)
    }

    /// The default ACL of directory `parent` that a new inode inherits
    /// (`None` without ACLs, or when it has none; its absence is
    /// remembered for the metadata TTL).
    pub(super) async fn default_acl(&self, parent: u64) -> FsResult<Option<super::acl::Acl>> {
        use super::acl::{Acl, DEFAULT};
        if !self.acl.load(std::sync::atomic::Ordering::Relaxed)
            || self.xattr_absent(parent, DEFAULT)
        {
            return Ok(None);
        }
        let path = self.inodes.path(parent)?;
        match self.client.get_xattr(&path, DEFAULT).await {
            Ok(bytes) => Ok(Acl::parse(&bytes)),
            Err(FsError::NoData(_)) => {
                self.remember_absent_xattr(parent, DEFAULT);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets the access ACL of `ino` (at `path`): the mode takes the
    /// ACL's owner, group-class and other bits, and an ACL a mode says
    /// whole is not kept (the kernel leaves both to the mount).
    async fn set_access_acl(
        &self,
        ino: u64,
        path: &str,
        value: &[u8],
        mode: XattrMode,
    ) -> FsResult<()> {
        use super::acl::{Acl, ACCESS};
        let acl =
            Acl::parse(value).ok_or_else(|| FsError::InvalidArgument("not a POSIX ACL".into()))?;
        if acl.is_mode() {
            match self.client.remove_xattr(path, ACCESS).await {
                Ok(()) | Err(FsError::NoData(_)) => {}
                Err(e) => return Err(e),
            }
        } else {
            self.client.set_xattr(path, ACCESS, value, mode).await?;
        }
        let attr = self.getattr(ino).await?;
        let set = curvine_messages::SetAttr {
            mode: Some((attr.mode & !0o777) | acl.mode_bits()),
            ..Default::default()
        };
        let attr = self
            .client
            .call(curvine_messages::rpc::SetAttrs {
                path: path.to_string(),
                set,
                follow: false,
            })
            .await?;
        self.inodes.set_attr(ino, attr);
        Ok(())
    }

    /// After a chmod of `ino` (at `path`) to `mode`: its access ACL, if it
    /// has one, follows the mode (the kernel leaves this to the mount).
    pub(super) async fn chmod_acl(&self, ino: u64, path: &str, mode: u32) -> FsResult<()> {
        use super::acl::{Acl, ACCESS};
        if !self.acl.load(std::sync::atomic::Ordering::Relaxed) || self.xattr_absent(ino, ACCESS) {
            return Ok(());
        }
        let bytes = match self.client.get_xattr(path, ACCESS).await {
            Ok(bytes) => bytes,
            Err(FsError::NoData(_)) => {
                self.remember_absent_xattr(ino, ACCESS);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let Some(acl) = Acl::parse(&bytes) else {
            return Ok(());
        };
        let updated = acl.chmod(mode).encode();
        if updated != bytes {
            self.client
                .set_xattr(path, ACCESS, &updated, XattrMode::Any)
                .await?;
        }
        Ok(())
    }

    /// Whether a new inode in `parent` may be made without asking for its
    /// default ACL: ACLs are off, or the directory is known to have none.
    pub(super) fn no_default_acl(&self, parent: u64) -> bool {
        !self.acl.load(std::sync::atomic::Ordering::Relaxed)
            || self.xattr_absent(parent, super::acl::DEFAULT)
    }

    fn forget_absent_xattrs(&self, ino: u64) {
        self.absent_xattrs.lock().retain(|(i, _), _| *i != ino);
    }
}

pub(super) fn setxattr(
    cfs: &CurvineFs,
    ino: INodeNo,
    name: &OsStr,
    value: &[u8],
    flags: i32,
    reply: ReplyEmpty,
) {
    let fs = cfs.0.clone();
    let name = name.to_os_string();
    let value = value.to_vec();
    cfs.spawn("setxattr", async move {
        let name = try_reply!(reply, xattr_name(&name));
        if name.starts_with("system.") && !fs.acl_attr(name) {
            reply.error(Errno::from_i32(libc::ENOTSUP));
            return;
        }
        let mode = if flags & libc::XATTR_CREATE != 0 {
            XattrMode::Create
        } else if flags & libc::XATTR_REPLACE != 0 {
            XattrMode::Replace
        } else {
            XattrMode::Any
        };
        let path = try_reply!(reply, fs.inodes.path(ino.0));
        fs.forget_absent_xattrs(ino.0);
        let result = match fs.acl_attr(name) && name == super::acl::ACCESS {
            true => fs.set_access_acl(ino.0, &path, &value, mode).await,
            false => fs.client.set_xattr(&path, name, &value, mode).await,
        };
        fs.forget_absent_xattrs(ino.0);
        try_reply!(reply, result);
        fs.inodes.expire(ino.0);
        reply.ok();
    });
}

pub(super) fn getxattr(cfs: &CurvineFs, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
    let fs = cfs.0.clone();
    // The kernel asks for security.capability before every write: a
    // known absence is answered here, without a task.
    if name.to_str().is_some_and(|n| fs.xattr_absent(ino.0, n)) {
        super::count_operation("getxattr");
        reply.error(Errno::from_i32(libc::ENODATA));
        return;
    }
    let name = name.to_os_string();
    cfs.spawn("getxattr", async move {
        let name = try_reply!(reply, xattr_name(&name));
        if name.starts_with("system.posix_acl") && !fs.acl_attr(name) {
            reply.error(Errno::from_i32(libc::ENODATA));
            return;
        }
        let path = try_reply!(reply, fs.inodes.path(ino.0));
        match fs.client.get_xattr(&path, name).await {
            Ok(value) => xattr_reply(reply, size, &value),
            Err(e) => {
                if matches!(e, FsError::NoData(_)) {
                    fs.remember_absent_xattr(ino.0, name);
                }
                reply.error(errno(&e));
            }
        }
    });
}

pub(super) fn listxattr(cfs: &CurvineFs, ino: INodeNo, size: u32, reply: ReplyXattr) {
    let fs = cfs.0.clone();
    cfs.spawn("listxattr", async move {
        let path = try_reply!(reply, fs.inodes.path(ino.0));
        let names = try_reply!(reply, fs.client.list_xattr(&path).await);
        let mut out = Vec::new();
        for n in names {
            out.extend_from_slice(n.as_bytes());
            out.push(0);
        }
        xattr_reply(reply, size, &out);
    });
}

pub(super) fn removexattr(cfs: &CurvineFs, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
    let fs = cfs.0.clone();
    let name = name.to_os_string();
    cfs.spawn("removexattr", async move {
        let name = try_reply!(reply, xattr_name(&name));
        let path = try_reply!(reply, fs.inodes.path(ino.0));
        let result = fs.client.remove_xattr(&path, name).await;
        fs.forget_absent_xattrs(ino.0);
        try_reply!(reply, result);
        fs.inodes.expire(ino.0);
        reply.ok();
    });
}

fn xattr_reply(reply: ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}
