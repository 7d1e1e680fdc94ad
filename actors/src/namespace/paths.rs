//! Operations on paths that are not file data or renames: directories
//! (mkdir, list), files and symlinks created empty, attributes and
//! extended attributes, and removal (unlink, rmdir, recursive remove).

use curvine_messages::names;
use curvine_messages::path::{check_name, components, join};
use curvine_messages::rpc::{ListEntry, Listing, RemoveSummary};
use curvine_messages::shard::{IntentOp, ShardMsg, UnlinkOutcome};
use curvine_messages::{
    check_xattr, dir_shard, now_ns, shard_of, Attr, FileKind, FsError, FsResult, Ino, NewInode,
    SetAttr, TimeSet, XattrMode, MAX_SYMLINK_LEN, ROOT_INO,
};

use super::{Follow, Namespace, PAGE};

impl Namespace {
    pub async fn mkdir(
        &self,
        path: &str,
        parents: bool,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let parts = components(path, "/")?;
        let attrs = |now| NewInode {
            kind: FileKind::Dir,
            mode,
            uid,
            gid,
            symlink: None,
            now_ns: now,
        };
        if parts.is_empty() {
            return if parents {
                self.getattr(ROOT_INO).await
            } else {
                Err(FsError::AlreadyExists(String::new()))
            };
        }
        if !parents {
            let (parent, name) = self.resolve_parent(path).await?;
            return self.mkdir_at(parent.ino, &name, attrs(now_ns())).await;
        }
        let mut current = self.getattr(ROOT_INO).await?;
        for (i, name) in parts.iter().enumerate() {
            let existing = match self.lookup(current.ino, name).await {
                Ok(entry) => Some(entry),
                Err(FsError::NotFound(_)) => None,
                Err(e) => return Err(e),
            };
            current = match existing {
                Some(entry) if entry.kind != FileKind::Symlink => self.getattr(entry.ino).await?,
                Some(_) => self.resolve_parts(&parts[..=i], Follow::All).await?,
                None => match self.mkdir_at(current.ino, name, attrs(now_ns())).await {
                    Ok(attr) => attr,
                    // Someone else made it meanwhile: fine for -p.
                    Err(FsError::AlreadyExists(_)) => {
                        self.resolve_parts(&parts[..=i], Follow::All).await?
                    }
                    Err(e) => return Err(e),
                },
            };
            if current.kind != FileKind::Dir {
                return Err(if i + 1 == parts.len() {
                    FsError::AlreadyExists(String::new())
                } else {
                    FsError::NotADirectory(join(&parts[..=i]))
                });
            }
        }
        Ok(current)
    }

    /// Creates directory `name` in `parent`; its inode goes to the shard its
    /// name hashes to.
    pub async fn mkdir_at(&self, parent: Ino, name: &str, attrs: NewInode) -> FsResult<Attr> {
        check_name(name)?;
        let home = shard_of(parent);
        let child = dir_shard(parent, name, self.shard_count);
        let name = name.to_string();
        if child == home {
            return self
                .call(home, move |reply| ShardMsg::MkdirLocal {
                    parent,
                    name: name.clone(),
                    attrs: attrs.clone(),
                    reply,
                })
                .await;
        }
        let action = IntentOp::Mkdir {
            parent,
            name,
            attrs,
            child_shard: child,
        };
        self.begin_and_drive(home, action)
            .await
            .map(|attr| attr.expect("mkdir returns the new directory"))
    }

    /// Lists a directory (or names a single file), with attributes.
    pub async fn list(&self, path: &str, after: Option<String>, limit: u32) -> FsResult<Listing> {
        let parts = components(path, "/")?;
        let attr = self.resolve_parts(&parts, Follow::All).await?;
        if attr.kind != FileKind::Dir {
            let name = parts.last().cloned().unwrap_or_else(|| "/".into());
            return Ok(Listing {
                entries: vec![ListEntry { name, attr }],
                more: false,
            });
        }
        let limit = limit.clamp(1, 100_000);
        let ino = attr.ino;
        let entries = self
            .call(shard_of(ino), move |reply| ShardMsg::ReadDirPlus {
                ino,
                after: after.clone(),
                limit: limit + 1,
                reply,
            })
            .await?;
        let more = entries.len() > limit as usize;
        let mut out = Vec::with_capacity(entries.len().min(limit as usize));
        for (entry, attr) in entries.into_iter().take(limit as usize) {
            let attr = match attr {
                Some(attr) => attr,
                // Held by another shard (a subdirectory, a moved file).
                None => match self.getattr(entry.ino).await {
                    Ok(attr) => attr,
                    // Removed between readdir and getattr: skip it, as ls does.
                    Err(FsError::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                },
            };
            out.push(ListEntry {
                name: entry.name,
                attr,
            });
        }
        Ok(Listing { entries: out, more })
    }

    pub async fn touch(
        &self,
        path: &str,
        mode: u32,
        exclusive: bool,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let (parent, name) = self.resolve_parent(path).await?;
        let attrs = NewInode {
            kind: FileKind::File,
            mode,
            uid,
            gid,
            symlink: None,
            now_ns: now_ns(),
        };
        match self.create_at(parent.ino, &name, attrs).await {
            Err(FsError::AlreadyExists(_)) if !exclusive => {
                let existing = self.resolve(path).await?;
                let set = SetAttr {
                    atime: Some(TimeSet::Now),
                    mtime: Some(TimeSet::Now),
                    ..Default::default()
                };
                self.setattr_ino(existing.ino, set).await
            }
            other => other,
        }
    }

    pub async fn create_at(&self, parent: Ino, name: &str, attrs: NewInode) -> FsResult<Attr> {
        check_name(name)?;
        let name = name.to_string();
        self.call(shard_of(parent), move |reply| ShardMsg::Create {
            parent,
            name: name.clone(),
            attrs: attrs.clone(),
            file: None,
            reply,
        })
        .await
    }

    pub async fn symlink(&self, target: &str, link: &str, uid: u32, gid: u32) -> FsResult<Attr> {
        if target.is_empty() {
            return Err(FsError::NotFound("empty symlink target".into()));
        }
        if names::byte_len(target) > MAX_SYMLINK_LEN || target.contains('\0') {
            return Err(FsError::NameTooLong(format!(
                "symlink target longer than {MAX_SYMLINK_LEN} bytes or with NUL"
            )));
        }
        names::check(target)?;
        let (parent, name) = self.resolve_parent(link).await?;
        let attrs = NewInode {
            kind: FileKind::Symlink,
            mode: 0o777,
            uid,
            gid,
            symlink: Some(target.into()),
            now_ns: now_ns(),
        };
        self.create_at(parent.ino, &name, attrs).await
    }

    /// Makes `link` a new name of the file (or symlink, FIFO, ...) at
    /// `target` (not followed, as `link(2)` does not follow it).
    pub async fn link(&self, target: &str, link: &str) -> FsResult<Attr> {
        let attr = self.stat(target, false).await?;
        if attr.kind == FileKind::Dir {
            return Err(FsError::NotPermitted(format!(
                "{target} is a directory, which cannot have another name"
            )));
        }
        let (parent, name) = self.resolve_parent(link).await?;
        check_name(&name)?;
        let (ino, dir) = (attr.ino, parent.ino);
        let home = shard_of(dir);
        if home == shard_of(ino) {
            let linked = self
                .call(home, {
                    let name = name.clone();
                    move |reply| ShardMsg::LinkLocal {
                        ino,
                        parent: dir,
                        name: name.clone(),
                        reply,
                    }
                })
                .await?;
            if let Some(attr) = linked {
                return Ok(attr);
            }
        }
        let action = IntentOp::Link {
            parent: dir,
            name,
            ino,
        };
        self.begin_and_drive(home, action)
            .await?
            .ok_or_else(|| FsError::Corrupt("a link returned no attributes".into()))
    }

    /// Makes a FIFO, socket or device node at `path`.
    pub async fn mknod(
        &self,
        path: &str,
        kind: FileKind,
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        if !kind.is_special() {
            return Err(FsError::InvalidArgument(format!(
                "mknod makes FIFOs, sockets and device nodes, not a {}",
                kind.name()
            )));
        }
        let (parent, name) = self.resolve_parent(path).await?;
        let attrs = NewInode {
            kind,
            mode,
            uid,
            gid,
            symlink: None,
            now_ns: now_ns(),
        };
        self.create_at(parent.ino, &name, attrs).await
    }

    pub async fn readlink(&self, path: &str) -> FsResult<String> {
        let attr = self.stat(path, false).await?;
        attr.symlink
            .ok_or_else(|| FsError::InvalidArgument("not a symbolic link".into()))
    }

    pub async fn setattr(&self, path: &str, set: SetAttr, follow: bool) -> FsResult<Attr> {
        let attr = self.stat(path, follow).await?;
        self.setattr_ino(attr.ino, set).await
    }

    pub async fn setattr_ino(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        self.call(shard_of(ino), move |reply| ShardMsg::SetAttr {
            ino,
            set: set.clone(),
            reply,
        })
        .await
    }

    pub async fn set_xattr(
        &self,
        path: &str,
        name: &str,
        value: Vec<u8>,
        mode: XattrMode,
    ) -> FsResult<()> {
        check_xattr(name, Some(&value))?;
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::SetXattr {
            ino,
            name: name.clone(),
            value: value.clone(),
            mode,
            reply,
        })
        .await
    }

    pub async fn get_xattr(&self, path: &str, name: &str) -> FsResult<Vec<u8>> {
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::GetXattr {
            ino,
            name: name.clone(),
            reply,
        })
        .await
    }

    pub async fn list_xattr(&self, path: &str) -> FsResult<Vec<String>> {
        let ino = self.resolve(path).await?.ino;
        self.call(shard_of(ino), move |reply| ShardMsg::ListXattr {
            ino,
            reply,
        })
        .await
    }

    pub async fn remove_xattr(&self, path: &str, name: &str) -> FsResult<()> {
        let ino = self.resolve(path).await?.ino;
        let name = name.to_string();
        self.call(shard_of(ino), move |reply| ShardMsg::RemoveXattr {
            ino,
            name: name.clone(),
            reply,
        })
        .await
    }

    /// Removes a path: files and symlinks; a directory when `dir` (must be
    /// empty) or `recursive` (with everything below it).
    pub async fn remove(&self, path: &str, recursive: bool, dir: bool) -> FsResult<RemoveSummary> {
        let (parent, name) = self.resolve_parent(path).await?;
        let entry = self.lookup(parent.ino, &name).await?;
        let mut summary = RemoveSummary { files: 0, dirs: 0 };
        if entry.kind == FileKind::Dir {
            if recursive {
                Box::pin(self.remove_tree(entry.ino, &mut summary)).await?;
            } else if !dir {
                return Err(FsError::IsADirectory(String::new()));
            }
            self.rmdir_at(parent.ino, &name, entry.ino).await?;
            summary.dirs += 1;
        } else {
            if dir {
                return Err(FsError::NotADirectory(String::new()));
            }
            self.unlink_at(parent.ino, &name).await?;
            summary.files += 1;
        }
        Ok(summary)
    }

    async fn remove_tree(&self, dir: Ino, summary: &mut RemoveSummary) -> FsResult<()> {
        loop {
            let entries = self.readdir(dir, None, PAGE).await?;
            if entries.is_empty() {
                return Ok(());
            }
            for entry in entries {
                if entry.kind == FileKind::Dir {
                    Box::pin(self.remove_tree(entry.ino, summary)).await?;
                    self.rmdir_at(dir, &entry.name, entry.ino).await?;
                    summary.dirs += 1;
                } else {
                    match self.unlink_at(dir, &entry.name).await {
                        Ok(()) | Err(FsError::NotFound(_)) => summary.files += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    pub async fn unlink_at(&self, parent: Ino, name: &str) -> FsResult<()> {
        let name = name.to_string();
        let outcome = self
            .call(shard_of(parent), move |reply| ShardMsg::Unlink {
                parent,
                name: name.clone(),
                reply,
            })
            .await?;
        match outcome {
            UnlinkOutcome::Done(_) => Ok(()),
            UnlinkOutcome::Pending(_, intent) => self.drive_in_task(intent).await.map(|_| ()),
        }
    }

    /// Removes directory `parent/name`, looked up as `ino`: in one message
    /// when its inode lives in the parent's shard, else through an intent.
    pub async fn rmdir_at(&self, parent: Ino, name: &str, ino: Ino) -> FsResult<()> {
        let home = shard_of(parent);
        let name = name.to_string();
        if shard_of(ino) == home {
            let n = name.clone();
            match self
                .call(home, move |reply| ShardMsg::RmdirLocal {
                    parent,
                    name: n.clone(),
                    reply,
                })
                .await
            {
                // Since it was looked up, the name may have been renamed
                // over by a directory whose inode another shard holds,
                // which the parent's shard cannot remove on its own.
                Err(e @ FsError::Io(_)) => match self.lookup(parent, &name).await {
                    Ok(now) if now.kind == FileKind::Dir && shard_of(now.ino) != home => {}
                    _ => return Err(e),
                },
                other => return other.map(|_| ()),
            }
        }
        let action = IntentOp::Rmdir {
            parent,
            name,
            ino: 0,
        };
        self.begin_and_drive(home, action).await.map(|_| ())
    }
}
