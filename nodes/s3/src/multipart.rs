//! Multipart uploads. An upload is a directory `ROOT/.s3-uploads/ID`
//! holding the object it is for (`target`: bucket, key and the mtime asked
//! for) and its parts as files (`00001`...). Completing it streams the
//! parts in order into the object, which replaces the old content whole
//! at its close, then removes the directory; aborting removes it.

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_client::Client;
use curvine_messages::{FileKind, FsError};

use crate::error::{s3_err, Subject};
use crate::keys::{etag, timestamp, UPLOADS};
use crate::objects::{pump, Chunks};
use crate::Gateway;

/// The part numbers S3 allows.
const PARTS: std::ops::RangeInclusive<i32> = 1..=10_000;

const TARGET: &str = "target";

/// What an upload is for.
struct Target {
    bucket: String,
    key: String,
    mtime_ns: Option<i64>,
}

impl Gateway {
    fn upload_dir(&self, id: &str) -> S3Result<String> {
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(s3_error!(NoSuchUpload, "no upload {id:?}"));
        }
        Ok(format!("{}/{id}", self.in_root(UPLOADS)))
    }

    async fn target(&self, client: &Client, id: &str) -> S3Result<Target> {
        let path = format!("{}/{TARGET}", self.upload_dir(id)?);
        let mut reader = FileReader::open(client, &path)
            .await
            .map_err(|e| s3_err(e, Subject::Upload(id)))?;
        let mut text = Vec::new();
        reader
            .read_to_end(&mut text)
            .await
            .map_err(|e| s3_err(e, Subject::Upload(id)))?;
        let text = String::from_utf8_lossy(&text);
        let mut lines = text.lines();
        let (Some(bucket), Some(key)) = (lines.next(), lines.next()) else {
            tracing::warn!(upload = id, "a multipart upload's target file is damaged");
            return Err(S3Error::with_message(
                S3ErrorCode::InternalError,
                format!("upload {id}: its target file is damaged"),
            ));
        };
        Ok(Target {
            bucket: bucket.to_string(),
            key: key.to_string(),
            mtime_ns: lines.next().and_then(|l| l.parse().ok()),
        })
    }

    /// The directory and target of upload `id` of `bucket`/`key`, or
    /// `NoSuchUpload`.
    async fn upload_of(
        &self,
        client: &Client,
        id: &str,
        bucket: &str,
        key: &str,
    ) -> S3Result<(String, Target)> {
        let target = self.target(client, id).await?;
        if target.bucket != bucket || target.key != key {
            return Err(s3_error!(
                NoSuchUpload,
                "upload {id} is not for {bucket}/{key}"
            ));
        }
        Ok((self.upload_dir(id)?, target))
    }

    pub(crate) async fn create_upload(
        &self,
        input: CreateMultipartUploadInput,
    ) -> S3Result<CreateMultipartUploadOutput> {
        let client = self.client().await?;
        // Checks the key, and that the bucket is there.
        self.object(&input.bucket, &input.key)?;
        let dir = self.bucket_dir(&input.bucket)?;
        match client.stat(&dir).await {
            Ok(a) if a.kind == FileKind::Dir => {}
            Ok(_) => {
                return Err(s3_err(
                    FsError::NotADirectory(dir),
                    Subject::Bucket(&input.bucket),
                ))
            }
            Err(e) => return Err(s3_err(e, Subject::Bucket(&input.bucket))),
        }
        let id: String = (0..16)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        let updir = self.upload_dir(&id)?;
        client
            .mkdir(&updir, true)
            .await
            .map_err(|e| s3_err(e, Subject::Upload(&id)))?;
        let mtime = crate::objects::meta_mtime(input.metadata.as_ref())
            .map(|n| n.to_string())
            .unwrap_or_default();
        let text = format!("{}\n{}\n{mtime}\n", input.bucket, input.key);
        let mut w = FileWriter::open(
            client,
            &format!("{updir}/{TARGET}"),
            &WriteOptions::create(),
        )
        .await
        .map_err(|e| s3_err(e, Subject::Upload(&id)))?;
        w.write(text.as_bytes())
            .await
            .map_err(|e| s3_err(e, Subject::Upload(&id)))?;
        w.close()
            .await
            .map_err(|e| s3_err(e, Subject::Upload(&id)))?;
        Ok(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        })
    }

    pub(crate) async fn upload_part_of(
        &self,
        input: UploadPartInput,
    ) -> S3Result<UploadPartOutput> {
        if !PARTS.contains(&input.part_number) {
            return Err(s3_error!(
                InvalidArgument,
                "part numbers run from 1 to 10000, not {}",
                input.part_number
            ));
        }
        let client = self.client().await?;
        let (dir, _) = self
            .upload_of(client, &input.upload_id, &input.bucket, &input.key)
            .await?;
        let path = format!("{dir}/{:05}", input.part_number);
        let attr = self
            .write_object(
                client,
                (&input.bucket, &input.key),
                &path,
                input.body,
                (input.content_length, input.content_md5.as_deref()),
                None,
            )
            .await?;
        Ok(UploadPartOutput {
            e_tag: Some(ETag::Strong(etag(&attr))),
            ..Default::default()
        })
    }

    pub(crate) async fn complete_upload(
        &self,
        input: CompleteMultipartUploadInput,
    ) -> S3Result<CompleteMultipartUploadOutput> {
        let client = self.client().await?;
        let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
        let (dir, target) = self.upload_of(client, id, bucket, key).await?;
        let asked = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        if asked.is_empty() {
            return Err(s3_error!(
                MalformedXML,
                "a completion names at least one part"
            ));
        }
        let mut parts = Vec::with_capacity(asked.len());
        let mut last = 0;
        let mut total: u64 = 0;
        for p in &asked {
            let n = p.part_number.unwrap_or(0);
            if n <= last {
                return Err(s3_error!(
                    InvalidPartOrder,
                    "parts must be listed in ascending order ({n} after {last})"
                ));
            }
            last = n;
            let path = format!("{dir}/{n:05}");
            let attr = match client.stat(&path).await {
                Ok(a) => a,
                Err(FsError::NotFound(_)) => {
                    return Err(s3_error!(InvalidPart, "upload {id} has no part {n}"))
                }
                Err(e) => return Err(s3_err(e, Subject::Upload(id))),
            };
            let want = p.e_tag.as_ref().map(|t| match t {
                ETag::Strong(s) | ETag::Weak(s) => s.trim_matches('"').to_string(),
            });
            if want.is_some_and(|w| w != etag(&attr)) {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n} of upload {id} has another ETag than the one given"
                ));
            }
            total += attr.size;
            parts.push(path);
        }
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let reader_client = client.clone();
        tokio::spawn(async move {
            for path in parts {
                let mut reader = match FileReader::open(&reader_client, &path).await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx
                            .send(Err(std::io::Error::other(format!("{path}: {e}"))))
                            .await;
                        return;
                    }
                };
                let size = reader.size();
                pump(&mut reader, size, tx.clone()).await;
            }
        });
        let path = self.object(bucket, key)?;
        let attr = self
            .write_object(
                client,
                (bucket, key),
                &path,
                Some(StreamingBlob::wrap(Chunks(rx))),
                (Some(total as i64), None),
                target.mtime_ns,
            )
            .await?;
        if let Err(e) = client.remove(&dir, true).await {
            tracing::warn!(upload = %id, error = %e, "cannot remove a completed upload's parts");
        }
        Ok(CompleteMultipartUploadOutput {
            bucket: Some(bucket.clone()),
            key: Some(key.clone()),
            e_tag: Some(ETag::Strong(etag(&attr))),
            location: Some(format!("/{bucket}/{key}")),
            ..Default::default()
        })
    }

    pub(crate) async fn abort_upload(
        &self,
        input: AbortMultipartUploadInput,
    ) -> S3Result<AbortMultipartUploadOutput> {
        let client = self.client().await?;
        let (dir, _) = self
            .upload_of(client, &input.upload_id, &input.bucket, &input.key)
            .await?;
        client
            .remove(&dir, true)
            .await
            .map_err(|e| s3_err(e, Subject::Upload(&input.upload_id)))?;
        Ok(AbortMultipartUploadOutput::default())
    }

    pub(crate) async fn list_parts_of(&self, input: ListPartsInput) -> S3Result<ListPartsOutput> {
        let client = self.client().await?;
        let (dir, _) = self
            .upload_of(client, &input.upload_id, &input.bucket, &input.key)
            .await?;
        let after = input.part_number_marker.unwrap_or(0);
        let max = input.max_parts.unwrap_or(1000).clamp(0, 1000) as usize;
        let mut parts: Vec<Part> = client
            .list_all(&dir)
            .await
            .map_err(|e| s3_err(e, Subject::Upload(&input.upload_id)))?
            .into_iter()
            .filter_map(|e| {
                let n: i32 = e.name.parse().ok()?;
                (n > after).then(|| Part {
                    part_number: Some(n),
                    size: Some(e.attr.size as i64),
                    e_tag: Some(ETag::Strong(etag(&e.attr))),
                    last_modified: Some(timestamp(e.attr.mtime_ns)),
                    ..Default::default()
                })
            })
            .collect();
        parts.sort_by_key(|p| p.part_number);
        let truncated = parts.len() > max;
        parts.truncate(max);
        Ok(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            next_part_number_marker: parts
                .last()
                .and_then(|p| p.part_number)
                .filter(|_| truncated),
            is_truncated: Some(truncated),
            parts: Some(parts),
            ..Default::default()
        })
    }
}
