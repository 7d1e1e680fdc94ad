//! `fs` commands on the namespace: mkdir, ls, stat, touch, mv, rm, rmdir,
//! ln, readlink and xattr (the data commands are in data.rs).

use std::future::Future;

use serde_json::json;

use curvine_messages::{FileKind, FsError, XattrMode};

use crate::args::{FsCommand, XattrCommand};
use crate::ctx::Ctx;
use crate::data;
use crate::output::{
    attr_json, format_time, mode_string, print_entries, print_json_line, show_value,
};
use crate::{fail, Failure};

pub async fn run(cx: &Ctx<'_>, command: FsCommand) -> Result<(), Failure> {
    match command {
        FsCommand::Mkdir { parents, paths } => mkdir(cx, parents, paths).await,
        FsCommand::Touch { paths } => touch(cx, paths).await,
        FsCommand::Stat { paths } => stat(cx, paths).await,
        FsCommand::Ls {
            long,
            recursive,
            paths,
        } => ls(cx, long, recursive, paths).await,
        FsCommand::Mv { src, dst } => mv(cx, &src, &dst).await,
        FsCommand::Rm {
            recursive,
            force,
            paths,
        } => rm(cx, recursive, force, paths).await,
        FsCommand::Rmdir { paths } => rmdir(cx, paths).await,
        FsCommand::Ln {
            symbolic,
            target,
            link,
        } => ln(cx, symbolic, &target, &link).await,
        FsCommand::Xattr(command) => xattr(cx, command).await,
        FsCommand::Data(command) => data::run(cx, command).await,
        FsCommand::Readlink { path } => readlink(cx, &path).await,
    }
}

/// Runs `request` on each path in turn (made absolute); the first failure
/// stops, named by `op` and the path as given.
async fn each_path<T, F: Future<Output = Result<T, FsError>>>(
    cx: &Ctx<'_>,
    op: &str,
    paths: Vec<String>,
    request: impl Fn(String) -> F,
) -> Result<(), Failure> {
    for p in paths {
        cx.on_path(op, &p, &request).await?;
    }
    Ok(())
}

async fn mkdir(cx: &Ctx<'_>, parents: bool, paths: Vec<String>) -> Result<(), Failure> {
    each_path(cx, "mkdir", paths, |path| async move {
        cx.client.mkdir(&path, parents).await
    })
    .await
}

async fn touch(cx: &Ctx<'_>, paths: Vec<String>) -> Result<(), Failure> {
    each_path(cx, "touch", paths, |path| async move {
        cx.client.touch(&path).await
    })
    .await
}

async fn stat(cx: &Ctx<'_>, paths: Vec<String>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    for p in paths {
        let (path, attr) = cx
            .on_path("stat", &p, |path| async move { client.stat(&path).await })
            .await?;
        if json_out {
            let mut v = attr_json(&attr);
            v["path"] = json!(path);
            print_json_line(&v);
        } else {
            out!(
                "  File: {path}{}",
                attr.symlink
                    .as_ref()
                    .map(|t| format!(" -> {t}"))
                    .unwrap_or_default()
            );
            out!("  Size: {:<12} Type: {}", attr.size, attr.kind.name());
            if let Some(dev) = crate::output::device_numbers(&attr) {
                out!("Device: {dev}");
            }
            if attr.kind == FileKind::File && attr.block_size > 0 {
                out!(
                    "Block size: {}  Replicas: {}{}",
                    curvine_messages::human_bytes(attr.block_size),
                    attr.replicas,
                    attr.storage
                        .map(|t| format!("  Storage: {t}"))
                        .unwrap_or_default()
                );
            }
            if let Some(lease) = &attr.writing {
                out!(
                    " State: being written by {} (the size is that of the last close)",
                    lease.client
                );
            }
            if let (Some(u), FileKind::File) = (&attr.ufs, attr.kind) {
                let etag = if u.etag.is_empty() {
                    String::new()
                } else {
                    format!(", etag {}", u.etag)
                };
                out!("   UFS: {}{etag}", u.describe());
            }
            out!("Inode: {:<#18x} Links: {}", attr.ino, attr.nlink);
            out!(
                "Access: ({:04o}/{})  Uid: {}  Gid: {}",
                attr.mode,
                mode_string(&attr),
                attr.uid,
                attr.gid
            );
            out!("Access: {}", format_time(attr.atime_ns));
            out!("Modify: {}", format_time(attr.mtime_ns));
            out!("Change: {}", format_time(attr.ctime_ns));
        }
    }
    Ok(())
}

async fn ls(cx: &Ctx<'_>, long: bool, recursive: bool, paths: Vec<String>) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let several = paths.len() > 1 || recursive;
    let mut queue: std::collections::VecDeque<String> =
        paths.iter().map(|p| cx.abs(p)).collect::<Result<_, _>>()?;
    let mut all = Vec::new();
    while let Some(path) = queue.pop_front() {
        let entries = client
            .list_all(&path)
            .await
            .map_err(|e| fail("ls", &path, e))?;
        if json_out {
            for e in &entries {
                let mut v = attr_json(&e.attr);
                v["name"] = json!(e.name);
                v["dir"] = json!(path);
                all.push(v);
            }
        } else {
            if several {
                out!("{path}:");
            }
            print_entries(&entries, long);
            if several {
                out!();
            }
        }
        if recursive {
            for e in entries
                .iter()
                .rev()
                .filter(|e| e.attr.kind == FileKind::Dir)
            {
                let child = if path == "/" {
                    format!("/{}", e.name)
                } else {
                    format!("{path}/{}", e.name)
                };
                queue.push_front(child);
            }
        }
    }
    if json_out {
        print_json_line(&all);
    }
    Ok(())
}

async fn mv(cx: &Ctx<'_>, src: &str, dst: &str) -> Result<(), Failure> {
    let client = cx.client;
    let (s, mut d) = (cx.abs(src)?, cx.abs(dst)?);
    // Like mv: moving into an existing directory keeps the name.
    if let Ok(attr) = client.stat(&d).await {
        if attr.kind == FileKind::Dir && s != d {
            let name = s.rsplit('/').next().unwrap_or_default();
            d = if d == "/" {
                format!("/{name}")
            } else {
                format!("{d}/{name}")
            };
        }
    }
    client.rename(&s, &d).await.map_err(|e| fail("mv", src, e))
}

async fn rm(cx: &Ctx<'_>, recursive: bool, force: bool, paths: Vec<String>) -> Result<(), Failure> {
    each_path(cx, "rm", paths, |path| async move {
        match cx.client.remove(&path, recursive).await {
            Ok(_) => Ok(()),
            Err(FsError::NotFound(_)) if force => Ok(()),
            Err(e) => Err(e),
        }
    })
    .await
}

async fn rmdir(cx: &Ctx<'_>, paths: Vec<String>) -> Result<(), Failure> {
    each_path(cx, "rmdir", paths, |path| async move {
        cx.client.rmdir(&path).await
    })
    .await
}

/// A symbolic link keeps its target as given; a hard link's target is a
/// path like any other (made absolute).
async fn ln(cx: &Ctx<'_>, symbolic: bool, target: &str, link: &str) -> Result<(), Failure> {
    if symbolic {
        cx.on_path("ln", link, |path| async move {
            cx.client.symlink(target, &path).await
        })
        .await?;
        return Ok(());
    }
    let target = cx.abs(target)?;
    cx.on_path("ln", link, |path| {
        let target = target.clone();
        async move { cx.client.link(&target, &path).await }
    })
    .await?;
    Ok(())
}

async fn readlink(cx: &Ctx<'_>, path: &str) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    let (p, target) = cx
        .on_path(
            "readlink",
            path,
            |p| async move { client.readlink(&p).await },
        )
        .await?;
    if json_out {
        print_json_line(&json!({"path": p, "target": target}));
    } else {
        out!("{target}");
    }
    Ok(())
}

async fn xattr(cx: &Ctx<'_>, command: XattrCommand) -> Result<(), Failure> {
    let Ctx { client, json_out } = *cx;
    match command {
        XattrCommand::Set {
            path,
            name,
            value,
            hex,
            create,
            replace,
        } => {
            let p = cx.abs(&path)?;
            let bytes = if hex {
                parse_hex(&value).ok_or_else(|| Failure {
                    what: format!("xattr set {path}"),
                    error: format!("'{value}' is not hexadecimal bytes"),
                    code: 1,
                })?
            } else {
                value.into_bytes()
            };
            let mode = match (create, replace) {
                (true, _) => XattrMode::Create,
                (_, true) => XattrMode::Replace,
                _ => XattrMode::Any,
            };
            client
                .set_xattr(&p, &name, &bytes, mode)
                .await
                .map_err(|e| fail("xattr set", &path, e))?;
        }
        XattrCommand::Get { path, ref name } => {
            let (p, value) = cx
                .on_path("xattr get", &path, |p| async move {
                    client.get_xattr(&p, name).await
                })
                .await?;
            if json_out {
                print_json_line(&json!({"path": p, "name": name, "value": show_value(&value)}));
            } else {
                out!("{}", show_value(&value));
            }
        }
        XattrCommand::List { path } => {
            let (_, names) = cx
                .on_path("xattr list", &path, |p| async move {
                    client.list_xattr(&p).await
                })
                .await?;
            if json_out {
                print_json_line(&names);
            } else {
                for n in names {
                    out!("{n}");
                }
            }
        }
        XattrCommand::Rm { path, name } => {
            cx.on_path("xattr rm", &path, |p| async move {
                client.remove_xattr(&p, &name).await
            })
            .await?;
        }
    }
    Ok(())
}

fn parse_hex(text: &str) -> Option<Vec<u8>> {
    let t = text.strip_prefix("0x").unwrap_or(text);
    if !t.is_ascii() || !t.len().is_multiple_of(2) {
        return None;
    }
    (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&t[i..i + 2], 16).ok())
        .collect()
}
