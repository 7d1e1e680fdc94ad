//! The S3 operations on buckets and objects.

use std::collections::HashMap;

use bytes::Bytes;
use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_messages::{Attr, FileKind, FsError, SetAttr, TimeSet};

use crate::error::{body_err, s3_err, Subject};
use crate::keys::{bucket_path, etag, is_dir_key, object_path, timestamp};
use crate::list::{list, Item, Query};
use crate::Gateway;
use curvine_messages::path::child;

/// Objects up to this size are read in one piece; larger ones stream in
/// chunks of it.
pub(crate) const CHUNK: usize = 1 << 20;

/// Most keys a listing page holds.
const MAX_KEYS: i32 = 1000;

/// The Content-Type of every file's object: S3's own for an object
/// stored without one (a PUT's Content-Type is not kept).
const FILE_TYPE: &str = "binary/octet-stream";

/// The Content-Type of a folder (a key ending in `/`, a directory), as
/// s3fs and other file-system clients of S3 mark theirs.
const DIR_TYPE: &str = "application/x-directory";

/// The user metadata key clients such as rclone keep a file's modification
/// time in (seconds, with a fraction): the gateway stores it as the file's
/// mtime and returns the mtime under it.
const MTIME_META: &str = "mtime";

impl Gateway {
    pub(crate) fn bucket_dir(&self, bucket: &str) -> S3Result<String> {
        bucket_path(self.root(), bucket)
    }

    pub(crate) fn object(&self, bucket: &str, key: &str) -> S3Result<String> {
        object_path(self.root(), bucket, key)
    }

    /// The error for a path of `bucket` that was not found: the bucket's
    /// when the bucket is missing, else `missing`'s.
    pub(crate) async fn not_found(
        &self,
        client: &Client,
        bucket: &str,
        e: FsError,
        missing: Subject<'_>,
    ) -> S3Error {
        if matches!(e, FsError::NotFound(_) | FsError::NotADirectory(_)) {
            if let Ok(dir) = self.bucket_dir(bucket) {
                match client.stat(&dir).await {
                    Ok(a) if a.kind == FileKind::Dir => {}
                    Ok(_) => return s3_err(FsError::NotADirectory(dir), Subject::Bucket(bucket)),
                    Err(e) => return s3_err(e, Subject::Bucket(bucket)),
                }
            }
        }
        s3_err(e, missing)
    }

    /// Writes `body` as the new content of the file at `path` (replacing
    /// the old one whole at the close), making the directories above it.
    pub(crate) async fn write_object(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        path: &str,
        body: Option<StreamingBlob>,
        expect: (Option<i64>, Option<&str>),
        mtime_ns: Option<i64>,
    ) -> S3Result<Attr> {
        let mut writer = self.open_writer(client, (bucket, key), path).await?;
        let (expect_len, expect_md5) = expect;
        let mut md5 = expect_md5.map(|_| <s3s::crypto::Md5 as s3s::crypto::Checksum>::new());
        let mut written: u64 = 0;
        let mut failed: Option<S3Error> = None;
        if let Some(mut body) = body {
            while let Some(chunk) = body.next().await {
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) => {
                        failed = Some(body_err(e));
                        break;
                    }
                };
                if let Some(m) = md5.as_mut() {
                    s3s::crypto::Checksum::update(m, &chunk);
                }
                if let Err(e) = writer.write(&chunk).await {
                    failed = Some(s3_err(e, Subject::Object(bucket, key)));
                    // The rest of the body is read and dropped, so that the
                    // client, still sending, reads the answer (a full tier's
                    // 507) instead of a connection reset.
                    while let Some(Ok(_)) = body.next().await {}
                    break;
                }
                written += chunk.len() as u64;
            }
        }
        if failed.is_none() {
            if let Some(n) = expect_len.filter(|n| *n as u64 != written) {
                failed = Some(body_err(format!("{written} bytes of {n}")));
            }
        }
        if let (None, Some(m), Some(want)) = (&failed, md5, expect_md5) {
            let got = base64(&s3s::crypto::Checksum::finalize(m));
            if got != want {
                failed = Some(S3Error::with_message(
                    S3ErrorCode::BadDigest,
                    format!("{bucket}/{key}: the body's MD5 is {got}, Content-MD5 says {want}"),
                ));
            }
        }
        if let Some(e) = failed {
            let _ = writer.abort().await;
            return Err(e);
        }
        let set = mtime_ns.map(|ns| SetAttr {
            mtime: Some(TimeSet::Ns(ns)),
            ..Default::default()
        });
        writer
            .close_with(set)
            .await
            .map_err(|e| s3_err(e, Subject::Object(bucket, key)))
    }

    async fn open_writer(
        &self,
        client: &Client,
        (bucket, key): (&str, &str),
        path: &str,
    ) -> S3Result<FileWriter> {
        let options = WriteOptions {
            create: true,
            replace: true,
            mode: 0o644,
            ..Default::default()
        };
        // A directory made here may be removed by a DELETE emptying it
        // before the open: try again a few times.
        let mut tries = 0;
        loop {
            match FileWriter::open(client, path, &options).await {
                Ok(w) => return Ok(w),
                Err(FsError::NotFound(_)) if tries < 3 => {
                    tries += 1;
                    let parent = path.rsplit_once('/').map(|(p, _)| p).unwrap_or("/");
                    if parent != self.bucket_dir(bucket)? {
                        match client.mkdir(parent, true).await {
                            Ok(_) | Err(FsError::AlreadyExists(_)) => continue,
                            Err(e @ FsError::NotADirectory(_)) => {
                                return Err(conflict(bucket, key, e))
                            }
                            Err(e) => {
                                return Err(self
                                    .not_found(client, bucket, e, Subject::Object(bucket, key))
                                    .await)
                            }
                        }
                    }
                    return Err(self
                        .not_found(
                            client,
                            bucket,
                            FsError::NotFound(path.into()),
                            Subject::Bucket(bucket),
                        )
                        .await);
                }
                Err(e @ (FsError::NotADirectory(_) | FsError::IsADirectory(_))) => {
                    return Err(conflict(bucket, key, e))
                }
                Err(e) => {
                    return Err(self
                        .not_found(client, bucket, e, Subject::Object(bucket, key))
                        .await)
                }
            }
        }
    }

    /// Removes the directories above `path` that its removal left empty,
    /// up to the bucket (S3 has no empty "folders" left behind).
    async fn prune(&self, client: &Client, bucket: &str, path: &str) {
        let Ok(top) = self.bucket_dir(bucket) else {
            return;
        };
        let mut dir = path;
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if parent.len() <= top.len() || client.rmdir(parent).await.is_err() {
                return;
            }
            dir = parent;
        }
    }

    async fn delete_key(&self, client: &Client, bucket: &str, key: &str) -> S3Result<()> {
        let path = self.object(bucket, key)?;
        let done = if is_dir_key(key) {
            client.rmdir(&path).await.map(|_| ())
        } else {
            client.remove(&path, false).await.map(|_| ())
        };
        match done {
            Ok(()) => {
                self.prune(client, bucket, &path).await;
                Ok(())
            }
            // Deleting what is not there succeeds in S3; a "folder" with
            // objects in it stays (its marker is not an object here).
            Err(FsError::NotFound(_) | FsError::IsADirectory(_) | FsError::NotEmpty(_)) => {
                match client.stat(&self.bucket_dir(bucket)?).await {
                    Ok(_) => Ok(()),
                    Err(e) => Err(s3_err(e, Subject::Bucket(bucket))),
                }
            }
            Err(FsError::NotADirectory(_)) => Ok(()),
            Err(e) => Err(s3_err(e, Subject::Object(bucket, key))),
        }
    }

    async fn list_page(
        &self,
        bucket: &str,
        prefix: Option<&str>,
        delimiter: Option<&str>,
        after: &str,
        max_keys: Option<i32>,
    ) -> S3Result<Listed> {
        let prefix = prefix.unwrap_or_default();
        let client = self.client().await?;
        let dir = self.bucket_dir(bucket)?;
        match client.stat(&dir).await {
            Ok(a) if a.kind == FileKind::Dir => {}
            Ok(_) => return Err(s3_err(FsError::NotADirectory(dir), Subject::Bucket(bucket))),
            Err(e) => return Err(s3_err(e, Subject::Bucket(bucket))),
        }
        let max = max_keys.unwrap_or(MAX_KEYS).clamp(0, MAX_KEYS);
        let page = list(
            client,
            &dir,
            &Query {
                prefix,
                delimiter,
                after,
                max: max as usize,
            },
        )
        .await
        .map_err(|e| s3_err(e, Subject::Bucket(bucket)))?;
        let last = page.items.last().map(|i| match i {
            Item::Object(k, _) | Item::Prefix(k) => k.clone(),
        });
        let mut objects = Vec::new();
        let mut prefixes = Vec::new();
        for item in page.items {
            match item {
                Item::Object(key, attr) => objects.push(Object {
                    e_tag: Some(ETag::Strong(etag(&attr))),
                    last_modified: Some(timestamp(attr.mtime_ns)),
                    size: Some(attr.size as i64),
                    storage_class: Some(ObjectStorageClass::from_static(
                        ObjectStorageClass::STANDARD,
                    )),
                    key: Some(key),
                    ..Default::default()
                }),
                Item::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(p) }),
            }
        }
        Ok(Listed {
            next: if page.truncated { last } else { None },
            truncated: page.truncated,
            contents: objects,
            prefixes,
            max,
        })
    }

    async fn copy(&self, req: CopyObjectInput) -> S3Result<CopyObjectOutput> {
        let (src_bucket, src_key) = match &req.copy_source {
            CopySource::Bucket { bucket, key, .. } => (bucket.to_string(), key.to_string()),
            _ => {
                return Err(s3_error!(
                    NotImplemented,
                    "only bucket/key copy sources are served"
                ))
            }
        };
        let client = self.client().await?;
        let src = self.object(&src_bucket, &src_key)?;
        let dst = self.object(&req.bucket, &req.key)?;
        let mut reader = match FileReader::open(client, &src).await {
            Ok(r) => r,
            Err(e) => {
                return Err(self
                    .not_found(
                        client,
                        &src_bucket,
                        e,
                        Subject::Object(&src_bucket, &src_key),
                    )
                    .await)
            }
        };
        let replace = req
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let mtime = match replace {
            true => meta_mtime(req.metadata.as_ref()),
            false => Some(reader.attr().mtime_ns),
        };
        let size = reader.size();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move { pump(&mut reader, size, tx).await });
        let body = StreamingBlob::wrap(Chunks(rx));
        let attr = self
            .write_object(
                client,
                (&req.bucket, &req.key),
                &dst,
                Some(body),
                (Some(size as i64), None),
                mtime,
            )
            .await?;
        Ok(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(etag(&attr))),
                last_modified: Some(timestamp(attr.mtime_ns)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// A page of a listing, as both versions of ListObjects answer it.
struct Listed {
    contents: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
    truncated: bool,
    /// The key to continue after, when truncated.
    next: Option<String>,
    max: i32,
}

/// An error for a key whose path runs into a file where a directory must
/// be, or the other way round.
fn conflict(bucket: &str, key: &str, e: FsError) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::InvalidRequest,
        format!("{bucket}/{key}: a part of the key is a file where a directory must be, or a directory where a file must be ({e})"),
    )
}

/// The mtime user metadata (decimal seconds, as rclone writes it) as
/// nanoseconds since the epoch, parsed exactly (no float rounding).
pub(crate) fn meta_mtime(meta: Option<&Metadata>) -> Option<i64> {
    let text = meta?.get(MTIME_META)?.trim();
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().ok().filter(|s| *s >= 0)?;
    if frac.len() > 9 && !frac[9..].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = &frac[..frac.len().min(9)];
    let nanos: i64 = match digits {
        "" => 0,
        d => format!("{d:0<9}")
            .parse()
            .ok()
            .filter(|_| d.bytes().all(|b| b.is_ascii_digit()))?,
    };
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// The metadata returned with an object: its mtime.
fn metadata(mtime_ns: i64) -> Metadata {
    let secs = mtime_ns.div_euclid(1_000_000_000);
    let nanos = mtime_ns.rem_euclid(1_000_000_000);
    HashMap::from([(MTIME_META.to_string(), format!("{secs}.{nanos:09}"))])
}

/// Standard base64 of `bytes` (for comparing with a Content-MD5 header).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A stream of the chunks a reading task sends.
pub(crate) struct Chunks(pub tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>);

impl futures::Stream for Chunks {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx)
    }
}

/// Reads `len` bytes from `reader`'s position into `tx`, a chunk at a time.
pub(crate) async fn pump(
    reader: &mut FileReader,
    mut len: u64,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    while len > 0 {
        let n = (len as usize).min(CHUNK);
        let mut buf = vec![0u8; n];
        let chunk = match reader.read_full(&mut buf).await {
            Ok(got) if got == n => Ok(Bytes::from(buf)),
            Ok(got) => Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file ended {} bytes early", len - got as u64),
            )),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        };
        let failed = chunk.is_err();
        if tx.send(chunk).await.is_err() || failed {
            return;
        }
        len -= n as u64;
    }
}

/// What a handler keeps of a request besides its input.
struct RequestHead {
    headers: http::HeaderMap,
}

/// An empty body sent with `Expect: 100-continue` gets its answer at once
/// (hyper sends no "100 Continue" for an empty body, as HTTP allows).
/// botocore then keeps the early answer's status line for the next request
/// with the same header on that connection and misreads its response, so
/// such a connection is closed after the answer.
pub(crate) fn close_after_unasked_continue(
    head: &http::HeaderMap,
    empty: bool,
    out: &mut http::HeaderMap,
) {
    let expects = head
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if empty && expects {
        out.insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

fn output_body(bytes: Bytes) -> StreamingBlob {
    StreamingBlob::wrap(futures::stream::iter([Ok::<_, std::io::Error>(bytes)]))
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let client = self.client().await?;
        let entries = client
            .list_all(self.root())
            .await
            .map_err(|e| s3_err(e, Subject::Bucket(self.root())))?;
        let buckets = entries
            .into_iter()
            .filter(|e| e.attr.kind == FileKind::Dir && !e.name.starts_with('.'))
            .map(|e| Bucket {
                creation_date: Some(timestamp(e.attr.ctime_ns)),
                name: Some(e.name),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = req.input.bucket;
        let dir = self.bucket_dir(&bucket)?;
        let client = self.client().await?;
        client
            .mkdir(&dir, false)
            .await
            .map_err(|e| s3_err(e, Subject::Bucket(&bucket)))?;
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(format!("/{bucket}")),
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let client = self.client().await?;
        self.bucket_exists(client, &req.input.bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let client = self.client().await?;
        self.bucket_exists(client, &req.input.bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    /// Buckets are never versioned: the answer of a bucket that never was.
    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let client = self.client().await?;
        self.bucket_exists(client, &req.input.bucket).await?;
        Ok(S3Response::new(GetBucketVersioningOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = req.input.bucket;
        let client = self.client().await?;
        client
            .rmdir(&self.bucket_dir(&bucket)?)
            .await
            .map_err(|e| s3_err(e, Subject::Bucket(&bucket)))?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (input.bucket.as_str(), input.key.as_str());
        let path = self.object(bucket, key)?;
        let client = self.client().await?;
        if is_dir_key(key) {
            let attr = self.dir_marker(client, bucket, key, &path).await?;
            return Ok(S3Response::new(GetObjectOutput {
                body: Some(output_body(Bytes::new())),
                content_length: Some(0),
                content_type: Some(DIR_TYPE.into()),
                e_tag: Some(ETag::Strong(etag(&attr))),
                last_modified: Some(timestamp(attr.mtime_ns)),
                ..Default::default()
            }));
        }
        let mut reader = match FileReader::open(client, &path).await {
            Ok(r) => r,
            Err(e) => {
                return Err(self
                    .not_found(client, bucket, e, Subject::Object(bucket, key))
                    .await)
            }
        };
        let attr = reader.attr().clone();
        let size = attr.size;
        let (start, end, content_range) = match input.range {
            None => (0, size, None),
            Some(range) => {
                let r = range.check(size).map_err(|_| {
                    S3Error::with_message(
                        S3ErrorCode::InvalidRange,
                        format!("{bucket}/{key}: the range is outside the object's {size} bytes"),
                    )
                })?;
                (
                    r.start,
                    r.end,
                    Some(format!("bytes {}-{}/{size}", r.start, r.end - 1)),
                )
            }
        };
        let len = end - start;
        reader.seek(start);
        let body = if len as usize <= CHUNK {
            let mut buf = vec![0u8; len as usize];
            let got = reader
                .read_full(&mut buf)
                .await
                .map_err(|e| s3_err(e, Subject::Object(bucket, key)))?;
            buf.truncate(got);
            output_body(Bytes::from(buf))
        } else {
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            tokio::spawn(async move { pump(&mut reader, len, tx).await });
            StreamingBlob::wrap(Chunks(rx))
        };
        Ok(S3Response::new(GetObjectOutput {
            body: Some(body),
            content_length: Some(len as i64),
            content_range,
            content_type: Some(FILE_TYPE.into()),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(ETag::Strong(etag(&attr))),
            last_modified: Some(timestamp(attr.mtime_ns)),
            metadata: Some(metadata(attr.mtime_ns)),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let (bucket, key) = (input.bucket.as_str(), input.key.as_str());
        let path = self.object(bucket, key)?;
        let client = self.client().await?;
        let attr = if is_dir_key(key) {
            self.dir_marker(client, bucket, key, &path).await?
        } else {
            match client.stat(&path).await {
                Ok(a) if a.kind == FileKind::File => a,
                Ok(_) => {
                    return Err(s3_err(
                        FsError::IsADirectory(path),
                        Subject::Object(bucket, key),
                    ))
                }
                Err(e) => {
                    return Err(self
                        .not_found(client, bucket, e, Subject::Object(bucket, key))
                        .await)
                }
            }
        };
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(if attr.kind == FileKind::File {
                attr.size as i64
            } else {
                0
            }),
            content_type: Some(match attr.kind {
                FileKind::File => FILE_TYPE.into(),
                _ => DIR_TYPE.into(),
            }),
            accept_ranges: Some("bytes".into()),
            e_tag: Some(ETag::Strong(etag(&attr))),
            last_modified: Some(timestamp(attr.mtime_ns)),
            metadata: Some(metadata(attr.mtime_ns)),
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let req = RequestHead {
            headers: req.headers,
        };
        let (bucket, key) = (input.bucket.as_str(), input.key.as_str());
        let path = self.object(bucket, key)?;
        let client = self.client().await?;
        if is_dir_key(key) {
            if input.content_length.unwrap_or(0) > 0 {
                return Err(s3_error!(
                    InvalidRequest,
                    "{bucket}/{key}: a key ending in / names a folder and takes no content"
                ));
            }
            self.bucket_exists(client, bucket).await?;
            match client.mkdir(&path, true).await {
                Ok(_) | Err(FsError::AlreadyExists(_)) => {}
                Err(e) => return Err(conflict(bucket, key, e)),
            }
            let attr = self.dir_marker(client, bucket, key, &path).await?;
            return Ok(S3Response::new(PutObjectOutput {
                e_tag: Some(ETag::Strong(etag(&attr))),
                ..Default::default()
            }));
        }
        let mtime = meta_mtime(input.metadata.as_ref());
        let empty = input.content_length == Some(0);
        let attr = self
            .write_object(
                client,
                (bucket, key),
                &path,
                input.body,
                (input.content_length, input.content_md5.as_deref()),
                mtime,
            )
            .await?;
        let mut resp = S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(etag(&attr))),
            size: Some(attr.size as i64),
            ..Default::default()
        });
        close_after_unasked_continue(&req.headers, empty, &mut resp.headers);
        Ok(resp)
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let client = self.client().await?;
        self.delete_key(client, &req.input.bucket, &req.input.key)
            .await?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let client = self.client().await?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for obj in input.delete.objects {
            match self.delete_key(client, &input.bucket, &obj.key).await {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(obj.key),
                    ..Default::default()
                }),
                Ok(()) => {}
                Err(e) => errors.push(s3s::dto::Error {
                    code: Some(e.code().as_str().to_string()),
                    message: e.message().map(str::to_string),
                    key: Some(obj.key),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        Ok(S3Response::new(self.copy(req.input).await?))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let after = input
            .continuation_token
            .as_ref()
            .or(input.start_after.as_ref());
        let l = self
            .list_page(
                &input.bucket,
                input.prefix.as_deref(),
                input.delimiter.as_deref(),
                after.map_or("", |a| a.as_str()),
                input.max_keys,
            )
            .await?;
        Ok(S3Response::new(ListObjectsV2Output {
            key_count: Some((l.contents.len() + l.prefixes.len()) as i32),
            contents: Some(l.contents),
            common_prefixes: Some(l.prefixes),
            is_truncated: Some(l.truncated),
            next_continuation_token: l.next,
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            max_keys: Some(l.max),
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let after = input.marker.as_deref().unwrap_or_default();
        let l = self
            .list_page(
                &input.bucket,
                input.prefix.as_deref(),
                input.delimiter.as_deref(),
                after,
                input.max_keys,
            )
            .await?;
        Ok(S3Response::new(ListObjectsOutput {
            contents: Some(l.contents),
            common_prefixes: Some(l.prefixes),
            is_truncated: Some(l.truncated),
            next_marker: l.next,
            marker: input.marker,
            max_keys: Some(l.max),
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        Ok(S3Response::new(self.create_upload(req.input).await?))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let empty = req.input.content_length == Some(0);
        let mut resp = S3Response::new(self.upload_part_of(req.input).await?);
        close_after_unasked_continue(&req.headers, empty, &mut resp.headers);
        Ok(resp)
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        Ok(S3Response::new(self.complete_upload(req.input).await?))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        Ok(S3Response::new(self.abort_upload(req.input).await?))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        Ok(S3Response::new(self.list_parts_of(req.input).await?))
    }
}

impl Gateway {
    /// `NoSuchBucket` unless `bucket` is a directory under the root.
    async fn bucket_exists(&self, client: &Client, bucket: &str) -> S3Result<()> {
        match client.stat(&self.bucket_dir(bucket)?).await {
            Ok(a) if a.kind == FileKind::Dir => Ok(()),
            Ok(_) => Err(s3_err(
                FsError::NotADirectory(bucket.into()),
                Subject::Bucket(bucket),
            )),
            Err(e) => Err(s3_err(e, Subject::Bucket(bucket))),
        }
    }

    /// The directory a key ending in `/` names.
    async fn dir_marker(
        &self,
        client: &Client,
        bucket: &str,
        key: &str,
        path: &str,
    ) -> S3Result<Attr> {
        match client.stat(path).await {
            Ok(a) if a.kind == FileKind::Dir => Ok(a),
            Ok(_) => Err(s3_err(
                FsError::NotFound(path.into()),
                Subject::Object(bucket, key),
            )),
            Err(e) => Err(self
                .not_found(client, bucket, e, Subject::Object(bucket, key))
                .await),
        }
    }

    /// The path of `name` in the gateway's root.
    pub(crate) fn in_root(&self, name: &str) -> String {
        child(self.root(), name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        // MD5 of the empty string, as S3 clients send it.
        let md5 = <s3s::crypto::Md5 as s3s::crypto::Checksum>::checksum(b"");
        assert_eq!(base64(&md5), "1B2M2Y8AsgTpgAmY7PhCfg==");
    }

    #[test]
    fn mtime_metadata_round_trips_through_the_file_mtime() {
        let meta = |v: &str| HashMap::from([(MTIME_META.to_string(), v.to_string())]);
        assert_eq!(
            meta_mtime(Some(&meta("1700000000.5"))),
            Some(1_700_000_000_500_000_000)
        );
        assert_eq!(
            meta_mtime(Some(&meta("1577836800.123456789"))),
            Some(1_577_836_800_123_456_789)
        );
        assert_eq!(meta_mtime(Some(&meta("12"))), Some(12_000_000_000));
        assert_eq!(meta_mtime(Some(&meta("-1"))), None);
        assert_eq!(meta_mtime(Some(&meta("1.2x"))), None);
        assert_eq!(
            metadata(1_700_000_000_000_000_007)[MTIME_META],
            "1700000000.000000007"
        );
    }
}
