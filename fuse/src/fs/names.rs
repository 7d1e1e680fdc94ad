//! Callbacks that remove or move names: unlink, rmdir, rename. A file
//! unlinked (or replaced by a rename) while open here is renamed to a
//! hidden name and removed at its last release, unless the mount knows
//! another of its names (hard links).

use std::ffi::OsStr;

use fuser::{INodeNo, RenameFlags, ReplyEmpty};

use curvine_messages::rpc;
use curvine_messages::{FileKind, FsError, FsResult};

use crate::inodes::HIDDEN_PREFIX;

use super::replies::name_str;
use super::CurvineFs;
use super::Fs;

/// How long an unlink waits for the releases of a file whose descriptors
/// were all closed, before it hides the file as open.
const CLOSING_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

impl Fs {
    /// Removes a file, or hides it while it is open here.
    pub(super) async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        // Removing a name is not something a delegation covers.
        self.delegations.give_back(parent).await;
        let path = self.inodes.child_path(parent, name)?;
        let known = self.inodes.known_child(parent, name);
        // An open file keeps a name while open: a hidden one, unless the
        // mount knows another of its names (hard links) or hid it already.
        let keeps_a_name =
            |ino: u64| self.inodes.is_hidden(ino) || self.inodes.has_other_name(ino, parent, name);
        let open = match known {
            Some(ino) if self.open_count(ino) > 0 => {
                self.open_count_after_closes(ino, CLOSING_WAIT).await
            }
            _ => 0,
        };
        if let Some(ino) = known.filter(|i| open > 0 && !keeps_a_name(*i)) {
            self.hide_open_file(ino, parent, &path).await?;
            self.inodes.drop_name(parent, name);
            return Ok(());
        }
        self.client
            .call(rpc::Remove {
                path,
                recursive: false,
                dir: false,
            })
            .await?;
        self.inodes.drop_name(parent, name);
        if let Some(ino) = known {
            self.inodes.unlinked(ino, parent, name);
        }
        Ok(())
    }

    pub(super) async fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: RenameFlags,
    ) -> FsResult<()> {
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            return self.exchange(parent, name, newparent, newname).await;
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            let rest = flags.difference(RenameFlags::RENAME_WHITEOUT);
            return self
                .rename_whiteout(parent, name, newparent, newname, rest)
                .await;
        }
        // A file renamed to a new name in a directory this mount holds
        // goes with the directory's creates.
        if parent == newparent && flags.is_empty() {
            if let Some(ino) = self.inodes.known_child(parent, name) {
                if let Some(done) = self.delegations.rename(parent, name, newname, ino).await {
                    done?;
                    self.inodes.renamed(parent, name, newparent, newname);
                    return Ok(());
                }
            }
        }
        self.delegations.give_back(parent).await;
        self.delegations.give_back(newparent).await;
        let src = self.inodes.child_path(parent, name)?;
        let dst = self.inodes.child_path(newparent, newname)?;
        if flags.contains(RenameFlags::RENAME_NOREPLACE) {
            match self.client.stat(&dst).await {
                Ok(_) => return Err(FsError::AlreadyExists(dst)),
                Err(FsError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // A file open here that the rename replaces stays readable.
        let replaced = self.inodes.known_child(newparent, newname);
        let source = self.inodes.known_child(parent, name);
        if replaced.is_some() && replaced == source {
            // Two names of one file: POSIX renames nothing.
            return self.client.rename(&src, &dst).await;
        }
        if let Some(ino) = replaced {
            let hide = self.open_count(ino) > 0
                && self.inodes.kind(ino) == Some(FileKind::File)
                && !self.inodes.is_hidden(ino)
                && !self.inodes.has_other_name(ino, newparent, newname);
            if hide {
                self.hide_open_file(ino, newparent, &dst).await?;
            } else {
                self.inodes.unlinked(ino, newparent, newname);
            }
        }
        self.client.rename(&src, &dst).await?;
        self.inodes.renamed(parent, name, newparent, newname);
        Ok(())
    }

    /// Moves open file `ino` from `path` (in directory `dir`) to its hidden
    /// name there, removed at its last release.
    async fn hide_open_file(&self, ino: u64, dir: u64, path: &str) -> FsResult<()> {
        let hidden = format!("{HIDDEN_PREFIX}{ino:x}");
        let to = self.inodes.child_path(dir, &hidden)?;
        self.client.rename(path, &to).await?;
        self.inodes.hide(ino, dir, &hidden);
        if self.open_count(ino) == 0 {
            // Its last release came while it was being hidden.
            self.released(ino).await;
        }
        Ok(())
    }

    /// RENAME_EXCHANGE: the two names swap inodes.
    async fn exchange(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
    ) -> FsResult<()> {
        self.delegations.give_back(parent).await;
        self.delegations.give_back(newparent).await;
        let a = self.inodes.child_path(parent, name)?;
        let b = self.inodes.child_path(newparent, newname)?;
        self.client.exchange(&a, &b).await?;
        self.inodes.exchanged(parent, name, newparent, newname);
        Ok(())
    }

    /// RENAME_WHITEOUT (overlayfs in an upper directory here): the rename,
    /// then a whiteout (a character device 0/0) where the name was. A
    /// whiteout that cannot be made puts the rename back.
    async fn rename_whiteout(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: RenameFlags,
    ) -> FsResult<()> {
        let plain = self.rename(parent, name, newparent, newname, flags);
        Box::pin(plain).await?;
        let src = self.inodes.child_path(parent, name)?;
        let whiteout = self.client.mknod(&src, FileKind::CharDevice(0), 0).await;
        if let Err(e) = whiteout {
            let dst = self.inodes.child_path(newparent, newname)?;
            if let Err(back) = self.client.rename(&dst, &src).await {
                tracing::warn!(src, dst, error = %back, "a rename whose whiteout failed was not put back");
            } else {
                self.inodes.renamed(newparent, newname, parent, name);
            }
            return Err(e);
        }
        Ok(())
    }

    /// The last handle of a file was released.
    pub(super) async fn released(&self, ino: u64) {
        if !self.inodes.take_hidden(ino) {
            return;
        }
        let Ok(path) = self.inodes.path(ino) else {
            return;
        };
        if let Err(e) = self
            .client
            .call(rpc::Remove {
                path: path.clone(),
                recursive: false,
                dir: false,
            })
            .await
        {
            tracing::warn!(path, error = %e, "cannot remove a file unlinked while open");
        }
    }
}

pub(super) fn unlink(cfs: &CurvineFs, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
    let fs = cfs.0.clone();
    let name = name.to_os_string();
    cfs.spawn("unlink", async move {
        let name = try_reply!(reply, name_str(&name));
        let name = &*name;
        try_reply!(reply, fs.unlink(parent.0, name).await);
        fs.inodes.expire(parent.0);
        reply.ok();
    });
}

pub(super) fn rmdir(cfs: &CurvineFs, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
    let fs = cfs.0.clone();
    let name = name.to_os_string();
    cfs.spawn("rmdir", async move {
        let name = try_reply!(reply, name_str(&name));
        let name = &*name;
        fs.delegations.give_back(parent.0).await;
        let path = try_reply!(reply, fs.inodes.child_path(parent.0, name));
        try_reply!(
            reply,
            fs.client
                .call(rpc::Remove {
                    path,
                    recursive: false,
                    dir: true,
                })
                .await
        );
        if let Some(ino) = fs.inodes.known_child(parent.0, name) {
            fs.inodes.unlinked(ino, parent.0, name);
        }
        fs.inodes.drop_name(parent.0, name);
        fs.inodes.expire(parent.0);
        reply.ok();
    });
}

pub(super) fn rename(
    cfs: &CurvineFs,
    parent: INodeNo,
    name: &OsStr,
    newparent: INodeNo,
    newname: &OsStr,
    flags: RenameFlags,
    reply: ReplyEmpty,
) {
    let fs = cfs.0.clone();
    let name = name.to_os_string();
    let newname = newname.to_os_string();
    cfs.spawn("rename", async move {
        let name = try_reply!(reply, name_str(&name));
        let name = &*name;
        let newname = try_reply!(reply, name_str(&newname));
        let newname = &*newname;
        try_reply!(
            reply,
            fs.rename(parent.0, name, newparent.0, newname, flags).await
        );
        fs.inodes.expire(parent.0);
        fs.inodes.expire(newparent.0);
        reply.ok();
    });
}
