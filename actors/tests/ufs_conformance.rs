//! One conformance suite for every UFS backend: a local directory always,
//! and a real S3 server when the test command started one (it exports
//! `UFS_TEST_S3_ENDPOINT`, `UFS_TEST_S3_ACCESS`, `UFS_TEST_S3_SECRET` and
//! `UFS_TEST_S3_BUCKET`; under `CI` the S3 half is required).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use curvine_actors::ufs::{Ufs, UfsOptions, UfsUri};
use curvine_messages::FsError;

struct S3Env {
    endpoint: String,
    access: String,
    secret: String,
    bucket: String,
}

fn s3_env() -> Option<S3Env> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    match (
        get("UFS_TEST_S3_ENDPOINT"),
        get("UFS_TEST_S3_ACCESS"),
        get("UFS_TEST_S3_SECRET"),
        get("UFS_TEST_S3_BUCKET"),
    ) {
        (Some(endpoint), Some(access), Some(secret), Some(bucket)) => Some(S3Env {
            endpoint,
            access,
            secret,
            bucket,
        }),
        _ => {
            assert!(
                std::env::var("CI").is_err(),
                "CI runs the S3 half of the UFS suite: start the test S3 server (integration/s3-server.sh)"
            );
            eprintln!("no test S3 server (UFS_TEST_S3_*): testing the local backend only");
            None
        }
    }
}

fn opts() -> UfsOptions {
    UfsOptions {
        retries: 1,
        retry_min_delay: Duration::from_millis(20),
        retry_max_delay: Duration::from_millis(100),
        timeout: Duration::from_secs(10),
        part_size: 5 << 20,
        ..UfsOptions::default()
    }
}

fn s3_props(env: &S3Env, secret: &str) -> BTreeMap<String, String> {
    [
        ("s3.endpoint_url", env.endpoint.as_str()),
        ("s3.credentials.access", env.access.as_str()),
        ("s3.credentials.secret", secret),
        ("s3.region_name", "us-east-1"),
        ("s3.force.path.style", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Every backend, each at a fresh root.
fn backends(test: &str) -> (Vec<Ufs>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let local = UfsUri::parse(&format!("file://{}", dir.path().display())).unwrap();
    let mut all = vec![Ufs::new(&local, &BTreeMap::new(), &opts()).unwrap()];
    if let Some(env) = s3_env() {
        let uri = UfsUri::parse(&format!(
            "s3://{}/{test}-{}",
            env.bucket,
            rand::random::<u32>()
        ))
        .unwrap();
        all.push(Ufs::new(&uri, &s3_props(&env, &env.secret), &opts()).unwrap());
    }
    (all, dir)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn read_range(
    ufs: &Ufs,
    rel: &str,
    off: u64,
    len: u64,
    etag: Option<&str>,
) -> Result<Vec<u8>, FsError> {
    let mut stream = Box::pin(ufs.read(rel, off, len, etag).await?);
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

#[test]
fn objects_write_stat_read_ranges() {
    let (all, _dir) = backends("objects");
    rt().block_on(async {
        for ufs in &all {
            let data = pattern(300_000, 7);
            let obj = ufs.write_all("a/b/file.bin", data.clone()).await.unwrap();
            assert_eq!(obj.len, 300_000, "{ufs:?}");
            assert!(!obj.is_dir);
            assert!(obj.mtime_ns > 0, "{ufs:?}: mtime");
            let st = ufs.stat("a/b/file.bin").await.unwrap().unwrap();
            assert!(st.same_content(&obj), "{ufs:?}: {st:?} vs {obj:?}");
            assert_eq!(st.name, "file.bin");
            if ufs.uri().scheme == curvine_actors::ufs::Scheme::S3 {
                assert!(!st.etag.is_empty(), "S3 objects carry an etag");
            }
            assert_eq!(
                read_range(ufs, "a/b/file.bin", 0, 300_000, None)
                    .await
                    .unwrap(),
                data
            );
            assert_eq!(
                read_range(ufs, "a/b/file.bin", 1000, 65536, Some(&st.etag))
                    .await
                    .unwrap(),
                data[1000..1000 + 65536]
            );
            assert_eq!(ufs.read_all("a/b/file.bin").await.unwrap(), data);
            // Directories are prefixes; missing names are None.
            let d = ufs.stat("a/b").await.unwrap().unwrap();
            assert!(d.is_dir, "{ufs:?}: a/b is a directory");
            assert!(ufs.stat("a").await.unwrap().unwrap().is_dir);
            assert_eq!(ufs.stat("a/missing").await.unwrap(), None);
            assert_eq!(ufs.stat("a/b/file.bin/x").await.unwrap(), None);
            let e = read_range(ufs, "a/nothing", 0, 10, None).await.unwrap_err();
            assert!(matches!(e, FsError::NotFound(_)), "{ufs:?}: {e}");
            assert!(e.to_string().contains("a/nothing"), "{e}");
            // Empty objects and empty directories.
            let empty = ufs.write_all("a/empty", Vec::new()).await.unwrap();
            assert_eq!(empty.len, 0);
            ufs.mkdir("emptydir").await.unwrap();
            assert!(
                ufs.stat("emptydir").await.unwrap().unwrap().is_dir,
                "{ufs:?}"
            );
        }
    });
}

#[test]
fn listings_page_in_name_order() {
    let (all, _dir) = backends("listing");
    rt().block_on(async {
        for ufs in &all {
            let mut names: Vec<String> = (0..23).map(|i| format!("f{i:03}.txt")).collect();
            for n in &names {
                ufs.write_all(&format!("d/{n}"), n.as_bytes().to_vec())
                    .await
                    .unwrap();
            }
            // A directory sorts before `f005.txt` by name, after it by key.
            ufs.write_all("d/f005/inner", b"i".to_vec()).await.unwrap();
            ufs.write_all("d/f005.x", b"x".to_vec()).await.unwrap();
            names.push("f005.x".into());
            names.push("f005".into());
            names.sort();
            let mut seen = Vec::new();
            let mut cursor: Option<String> = None;
            let mut pages = 0;
            loop {
                let page = ufs.list_page("d", cursor.as_deref(), 7).await.unwrap();
                assert!(page.entries.len() <= 7);
                pages += 1;
                for e in &page.entries {
                    seen.push(e.name.clone());
                    assert_eq!(e.is_dir, e.name == "f005", "{ufs:?}: {e:?}");
                    if !e.is_dir {
                        let want = if e.name == "f005.x" {
                            1
                        } else {
                            e.name.len() as u64
                        };
                        assert_eq!(e.len, want, "{ufs:?}: {e:?}");
                    }
                }
                cursor = page.next;
                if cursor.is_none() {
                    break;
                }
                assert!(pages < 20);
            }
            seen.sort();
            assert_eq!(seen, names, "{ufs:?}: every name once");
            assert_eq!(pages, 4, "{ufs:?}: 25 entries in pages of 7");
            // A page that ends on a directory continues after everything below it.
            let mut cursor = None;
            let mut all = Vec::new();
            loop {
                let page = ufs.list_page("d", cursor.as_deref(), 1).await.unwrap();
                all.extend(page.entries.into_iter().map(|e| e.name));
                cursor = page.next;
                if cursor.is_none() {
                    break;
                }
            }
            all.sort();
            assert_eq!(all, names, "{ufs:?}: pages of one");
            // The root lists its directory; a missing directory lists empty or NotFound.
            let root = ufs.list_page("", None, 100).await.unwrap();
            assert_eq!(
                root.entries
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>(),
                ["d"]
            );
            assert!(root.next.is_none());
            match ufs.list_page("nope", None, 10).await {
                Ok(p) => assert!(p.entries.is_empty()),
                Err(e) => assert!(matches!(e, FsError::NotFound(_)), "{e}"),
            }
        }
    });
}

#[test]
fn large_objects_upload_in_parts() {
    let (all, _dir) = backends("multipart");
    rt().block_on(async {
        for ufs in &all {
            // 12 MiB + a bit in uneven writes: three 5 MiB parts on S3.
            let data = pattern((12 << 20) + 12_345, 3);
            let mut w = ufs.writer("big/object").await.unwrap();
            for chunk in data.chunks(1_000_003) {
                w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
            }
            assert_eq!(w.written(), data.len() as u64);
            // Nothing is visible before close.
            assert_eq!(ufs.stat("big/object").await.unwrap(), None, "{ufs:?}");
            let obj = w.close().await.unwrap();
            assert_eq!(obj.len, data.len() as u64);
            let back = read_range(ufs, "big/object", 0, obj.len, None)
                .await
                .unwrap();
            assert!(back == data, "{ufs:?}: multipart object differs");
            let tail = read_range(ufs, "big/object", obj.len - 100, 100, None)
                .await
                .unwrap();
            assert_eq!(tail, data[data.len() - 100..]);
            // An aborted upload leaves nothing.
            let mut w = ufs.writer("big/aborted").await.unwrap();
            w.write(Bytes::from(pattern(6 << 20, 1))).await.unwrap();
            w.abort().await;
            assert_eq!(ufs.stat("big/aborted").await.unwrap(), None, "{ufs:?}");
        }
    });
}

#[test]
fn delete_and_rename() {
    let (all, _dir) = backends("rename");
    rt().block_on(async {
        for ufs in &all {
            ufs.write_all("x/one", b"1".to_vec()).await.unwrap();
            ufs.write_all("x/sub/two", b"22".to_vec()).await.unwrap();
            ufs.rename("x/one", "y/uno", false).await.unwrap();
            assert_eq!(ufs.stat("x/one").await.unwrap(), None);
            assert_eq!(ufs.read_all("y/uno").await.unwrap(), b"1");
            ufs.rename("x", "z", true).await.unwrap();
            assert_eq!(
                ufs.stat("x").await.unwrap(),
                None,
                "{ufs:?}: old directory gone"
            );
            assert_eq!(ufs.read_all("z/sub/two").await.unwrap(), b"22");
            ufs.delete("y/uno").await.unwrap();
            assert_eq!(ufs.stat("y/uno").await.unwrap(), None);
            ufs.delete("y/uno").await.unwrap(); // missing: not an error
            ufs.delete_dir("z").await.unwrap();
            assert_eq!(ufs.stat("z").await.unwrap(), None, "{ufs:?}");
            assert!(
                ufs.delete_dir("").await.is_err(),
                "the root is never deleted"
            );
        }
    });
}

#[test]
fn a_changed_object_is_never_read_as_the_old_one() {
    let (all, _dir) = backends("changed");
    rt().block_on(async {
        for ufs in &all {
            let first = ufs.write_all("obj", pattern(1000, 1)).await.unwrap();
            // Stores keep mtime in seconds: make the change visible in it.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let second = ufs.write_all("obj", pattern(1000, 2)).await.unwrap();
            assert!(
                !first.same_content(&second),
                "{ufs:?}: {first:?} vs {second:?}"
            );
            if !first.etag.is_empty() {
                let e = read_range(ufs, "obj", 0, 1000, Some(&first.etag))
                    .await
                    .unwrap_err();
                assert!(matches!(e, FsError::Stale(_)), "{ufs:?}: {e}");
                assert_eq!(e.errno(), libc::ESTALE);
                assert_eq!(
                    read_range(ufs, "obj", 0, 1000, Some(&second.etag))
                        .await
                        .unwrap(),
                    pattern(1000, 2)
                );
            }
        }
    });
}

#[test]
fn unreachable_missing_and_refused_are_clear_errors() {
    rt().block_on(async {
        // Nothing listens on port 1.
        let uri = UfsUri::parse("s3://bucket/x").unwrap();
        let mut props = BTreeMap::new();
        props.insert(
            "s3.endpoint_url".to_string(),
            "http://127.0.0.1:1".to_string(),
        );
        props.insert("s3.credentials.access".to_string(), "a".to_string());
        props.insert("s3.credentials.secret".to_string(), "TOPSECRET".to_string());
        let ufs = Ufs::new(&uri, &props, &opts()).unwrap();
        let e = ufs.check().await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, FsError::Ufs(_)), "{text}");
        assert!(text.contains("s3://bucket/x"), "{text}");
        assert!(!text.contains("TOPSECRET"), "{text}");
        assert!(!format!("{ufs:?}").contains("TOPSECRET"));
        // A local directory that does not exist.
        let missing = UfsUri::parse("file:///nonexistent/curvine-ufs").unwrap();
        let e = Ufs::new(&missing, &BTreeMap::new(), &opts()).unwrap_err();
        assert!(matches!(e, FsError::NotFound(_)), "{e}");
        assert!(e.to_string().contains("/nonexistent/curvine-ufs"), "{e}");
        assert!(
            !std::path::Path::new("/nonexistent").exists(),
            "nothing is created"
        );

        let Some(env) = s3_env() else { return };
        let nobucket = UfsUri::parse("s3://curvine-no-such-bucket/x").unwrap();
        let e = Ufs::new(&nobucket, &s3_props(&env, &env.secret), &opts())
            .unwrap()
            .check()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("NoSuchBucket"), "{e}");
        let uri = UfsUri::parse(&format!("s3://{}/x", env.bucket)).unwrap();
        let e = Ufs::new(&uri, &s3_props(&env, "wrong-secret"), &opts())
            .unwrap()
            .check()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("SignatureDoesNotMatch"), "{e}");
        assert!(!e.contains("wrong-secret"), "{e}");
        let mut unknown = s3_props(&env, &env.secret);
        unknown.insert("s3.credentials.access".into(), "AKIANOSUCHKEY".into());
        let e = Ufs::new(&uri, &unknown, &opts())
            .unwrap()
            .check()
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("InvalidAccessKeyId"), "{e}");
    });
}
