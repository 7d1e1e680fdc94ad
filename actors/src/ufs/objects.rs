//! Objects of a UFS: reading them (streamed, as spans of a traced
//! request), writing them (multipart uploads through [`UfsWriter`]),
//! creating directories, deleting and renaming.

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use opendal::options::{DeleteOptions, ListOptions, ReaderOptions, WriteOptions};
use opendal::ErrorKind;

use curvine_messages::trace::Outcome;
use curvine_messages::{FsError, FsResult};

use super::errors::describe;
use super::{dir_key, Scheme, Ufs, UfsObject};
use crate::trace::Span;

impl Ufs {
    /// The bytes `[offset, offset + len)` of the object at `rel`, as they
    /// arrive. With `etag`, a store that supports it refuses the read once
    /// the object changed (`Stale`).
    pub async fn read(
        &self,
        rel: &str,
        offset: u64,
        len: u64,
        etag: Option<&str>,
    ) -> FsResult<impl Stream<Item = FsResult<Bytes>> + Send + 'static> {
        self.called("read");
        // The span lasts until the stream ends or its reader drops it.
        let mut span = StreamSpan {
            span: self.span("read"),
            error: None,
        };
        let if_match = etag
            .filter(|e| !e.is_empty() && self.read_if_match)
            .map(String::from);
        let opened = async {
            let reader = self
                .op
                .reader_options(
                    rel,
                    ReaderOptions {
                        if_match,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("read", rel, e))?;
            reader
                .into_stream(offset..offset + len)
                .await
                .map_err(|e| self.error("read", rel, e))
        }
        .await;
        let stream = opened.inspect_err(|e| span.fail(e))?;
        let this = self.clone();
        let rel = rel.to_string();
        Ok(stream.map_ok(|buf| buf.to_bytes()).map_err(move |e| {
            let e = this.error("read", &rel, e);
            span.fail(&e);
            e
        }))
    }

    /// The whole object at `rel` (for tests and small objects).
    pub async fn read_all(&self, rel: &str) -> FsResult<Vec<u8>> {
        self.called("read");
        self.traced("read", async {
            let buf = self
                .op
                .read(rel)
                .await
                .map_err(|e| self.error("read", rel, e))?;
            Ok(buf.to_vec())
        })
        .await
    }

    /// A writer of the object at `rel`: parts of `ufs.part_size` uploaded
    /// `ufs.upload_concurrency` at a time (a multipart upload once the
    /// object is larger than one part). Nothing is visible until `close`.
    pub async fn writer(&self, rel: &str) -> FsResult<UfsWriter> {
        self.called("write");
        let writer = self
            .op
            .writer_options(
                rel,
                WriteOptions {
                    chunk: Some(self.opts.part_size),
                    concurrent: self.opts.upload_concurrency,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.error("write", rel, e))?;
        Ok(UfsWriter {
            ufs: self.clone(),
            rel: rel.to_string(),
            writer,
            written: 0,
            span: self.span("write"),
        })
    }

    /// Writes a whole object (small objects and tests).
    pub async fn write_all(&self, rel: &str, data: Vec<u8>) -> FsResult<UfsObject> {
        let mut w = self.writer(rel).await?;
        w.write(Bytes::from(data)).await?;
        w.close().await
    }

    /// Creates directory `rel` (a `rel/` marker object on S3).
    pub async fn mkdir(&self, rel: &str) -> FsResult<()> {
        self.called("mkdir");
        self.traced("mkdir", async {
            if rel.is_empty() {
                return Ok(());
            }
            self.op
                .create_dir(&dir_key(rel))
                .await
                .map_err(|e| self.error("mkdir", rel, e))
        })
        .await
    }

    /// Deletes the object at `rel` (a missing object is not an error).
    pub async fn delete(&self, rel: &str) -> FsResult<()> {
        self.called("delete");
        self.traced("delete", async {
            match self.op.delete(rel).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.error("delete", rel, e)),
            }
        })
        .await
    }

    /// Deletes directory `rel` and everything below it.
    pub async fn delete_dir(&self, rel: &str) -> FsResult<()> {
        self.called("delete");
        self.traced("delete", async {
            if rel.is_empty() {
                return Err(FsError::InvalidArgument(format!(
                    "refusing to delete the whole of {}",
                    self.uri
                )));
            }
            match self
                .op
                .delete_options(
                    &dir_key(rel),
                    DeleteOptions {
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.error("delete", rel, e)),
            }
        })
        .await
    }

    /// Moves the object or directory `from` to `to`. Local directories
    /// rename; S3 copies each object, then deletes the sources (not atomic:
    /// a failure part way leaves both names, never neither).
    pub async fn rename(&self, from: &str, to: &str, is_dir: bool) -> FsResult<()> {
        self.called("rename");
        self.traced("rename", async {
            if self.uri.scheme == Scheme::File {
                let src = format!("{}/{from}", self.uri.root.trim_end_matches('/'));
                let dst = format!("{}/{to}", self.uri.root.trim_end_matches('/'));
                if let Some(parent) = std::path::Path::new(&dst).parent() {
                    tokio::fs::create_dir_all(parent)
                        .await
                        .map_err(|e| FsError::Ufs(format!("rename {}: {e}", self.uri.join(to))))?;
                }
                return tokio::fs::rename(&src, &dst).await.map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        FsError::NotFound(self.uri.join(from))
                    } else {
                        FsError::Ufs(format!(
                            "rename {} to {}: {e}",
                            self.uri.join(from),
                            self.uri.join(to)
                        ))
                    }
                });
            }
            if !is_dir {
                self.op
                    .copy(from, to)
                    .await
                    .map_err(|e| self.error("copy", from, e))?;
                return self.delete(from).await;
            }
            let src_dir = dir_key(from);
            let mut lister = self
                .op
                .lister_options(
                    &src_dir,
                    ListOptions {
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("list", from, e))?;
            let mut moved = Vec::new();
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", from, e))?;
                let Some(tail) = entry.path().strip_prefix(&src_dir) else {
                    continue;
                };
                let target = format!("{}/{tail}", to.trim_end_matches('/'));
                if entry.metadata().is_dir() {
                    self.op
                        .create_dir(&target)
                        .await
                        .map_err(|e| self.error("mkdir", &target, e))?;
                } else {
                    self.op
                        .copy(entry.path(), &target)
                        .await
                        .map_err(|e| self.error("copy", entry.path(), e))?;
                }
                moved.push(entry.path().to_string());
            }
            self.mkdir(to).await?;
            for path in moved {
                self.delete(&path).await?;
            }
            self.delete(&src_dir).await
        })
        .await
    }
}

/// Writes one UFS object; see [`Ufs::writer`].
pub struct UfsWriter {
    ufs: Ufs,
    rel: String,
    writer: opendal::Writer,
    written: u64,
    /// From the writer's creation to its close (a traced request's).
    span: Option<Span>,
}

impl UfsWriter {
    pub async fn write(&mut self, data: Bytes) -> FsResult<()> {
        self.written += data.len() as u64;
        self.writer
            .write(data)
            .await
            .map_err(|e| self.ufs.error("write", &self.rel, e))
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Completes the upload and returns what the store now holds.
    pub async fn close(mut self) -> FsResult<UfsObject> {
        let span = self.span.take();
        let result = async {
            self.writer
                .close()
                .await
                .map_err(|e| self.ufs.error("write", &self.rel, e))?;
            match self.ufs.stat(&self.rel).await? {
                Some(obj) if !obj.is_dir => Ok(obj),
                _ => Err(FsError::Ufs(format!(
                    "write {}: the object is missing after its upload completed",
                    self.ufs.uri.join(&self.rel)
                ))),
            }
        }
        .await;
        if let Some(span) = span {
            span.end(crate::trace::outcome_of(&result));
        }
        result
    }

    /// Abandons the upload (its parts are deleted; nothing becomes visible).
    pub async fn abort(mut self) {
        if let Some(span) = self.span.take() {
            span.end(Outcome::Error("aborted".into()));
        }
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(object = %self.ufs.uri.join(&self.rel), "aborting an upload: {}", describe(&e));
        }
    }
}

/// The span of a read stream: recorded when the stream is dropped, with the
/// first error it gave, if any.
struct StreamSpan {
    span: Option<Span>,
    error: Option<String>,
}

impl StreamSpan {
    fn fail(&mut self, e: &FsError) {
        self.error
            .get_or_insert_with(|| crate::trace::error_kind(e));
    }
}

impl Drop for StreamSpan {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            span.end(match self.error.take() {
                None => Outcome::Ok,
                Some(kind) => Outcome::Error(kind),
            });
        }
    }
}
