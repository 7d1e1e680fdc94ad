//! The S3 gateway (`s3.listen`) against real S3 clients: boto3, the `aws`
//! CLI, rclone's S3 backend and an s3fs mount, talking to a real node process, with what
//! they store checked through the client library (and the other way round).

use std::path::Path;
use std::process::{Command, Output};

use curvine_integration::{
    assert_short_circuit, random_bytes, read_file, runtime, write_file, NodeProcess,
};

const ACCESS: &str = "gateway-access";
const SECRET: &str = "gateway-secret-123";

fn gateway_node(dir: &Path) -> NodeProcess {
    gateway_node_with(dir, &[])
}

/// A node serving the S3 gateway with the test's keys, and `extra` arguments.
fn gateway_node_with(dir: &Path, extra: &[&str]) -> NodeProcess {
    let (access, secret) = (
        format!("s3.access_key={ACCESS}"),
        format!("s3.secret_key={SECRET}"),
    );
    let mut args = vec!["-c", "s3.listen=127.0.0.1:0", "-c", &access, "-c", &secret];
    args.extend_from_slice(extra);
    let node = NodeProcess::start(&dir.join("n1"), &args);
    assert!(
        !node.s3_addr.is_empty(),
        "the ready file names the S3 gateway"
    );
    node
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a Python script with boto3 against the gateway (`s3`: a client
/// with the right keys, `endpoint`: its URL).
fn python(node: &NodeProcess, script: &str) -> String {
    let prelude = format!(
        r#"
import boto3, botocore, io, os, sys
from botocore.config import Config
endpoint = "http://{addr}"
def client(key="{ACCESS}", secret="{SECRET}", **kw):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                        aws_secret_access_key=secret, region_name="us-east-1",
                        config=Config(retries={{"max_attempts": 1}}, **kw))
s3 = client()
def code(f):
    try:
        f()
    except botocore.exceptions.ClientError as e:
        return e.response["Error"]["Code"]
    return "OK"
"#,
        addr = node.s3_addr
    );
    curvine_integration::python_script("the boto3 script", &format!("{prelude}\n{script}"))
}

/// A PUT that no tier has room for is answered 507 InsufficientStorage,
/// as S3-compatible stores answer when their disks are full (not 500: the
/// store is not broken), naming the tier; the object it would have
/// replaced is kept whole.
#[test]
fn a_put_no_tier_has_room_for_is_507_and_keeps_the_old_object() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = format!("data.tiers=[MEM:8MiB]{}", dir.path().join("mem").display());
    let node = gateway_node_with(dir.path(), &["-c", &tiers]);
    let out = python(
        &node,
        r#"
s3.create_bucket(Bucket="full")
old = os.urandom(1 << 20)
s3.put_object(Bucket="full", Key="k", Body=old)
try:
    s3.put_object(Bucket="full", Key="k", Body=os.urandom(12 << 20))
    raise SystemExit("a PUT larger than the tier succeeded")
except botocore.exceptions.ClientError as e:
    err = e.response
print("answer", err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"])
assert err["Error"]["Code"] == "InsufficientStorage", err
assert err["ResponseMetadata"]["HTTPStatusCode"] == 507, err
assert "tier MEM" in err["Error"]["Message"], err
assert s3.get_object(Bucket="full", Key="k")["Body"].read() == old
"#,
    );
    assert!(out.contains("answer InsufficientStorage 507"), "{out}");
}

#[test]
fn boto3_sees_objects_as_the_clusters_files() {
    let dir = tempfile::tempdir().unwrap();
    let node = gateway_node(dir.path());
    let rt = runtime();
    let client = rt.block_on(node.client());
    rt.block_on(client.mkdir("/data", false)).unwrap();
    let from_cluster = random_bytes(3 << 20, 7);
    rt.block_on(write_file(
        &client,
        "/data/from-cluster.bin",
        &from_cluster,
        1,
    ));

    let out = python(
        &node,
        r#"
# Buckets are top-level directories.
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
assert names == ["data"], names
s3.create_bucket(Bucket="photos")
assert code(lambda: s3.create_bucket(Bucket="photos")) == "BucketAlreadyOwnedByYou"
assert code(lambda: s3.head_bucket(Bucket="nope")) in ("404", "NoSuchBucket")
v = s3.get_bucket_versioning(Bucket="photos")
assert "Status" not in v, v
assert code(lambda: s3.get_bucket_versioning(Bucket="nope")) == "NoSuchBucket"

# Objects, nested keys, and a file written through the cluster.
body = os.urandom(100_000)
s3.put_object(Bucket="photos", Key="2024/jan/a.jpg", Body=body)
s3.put_object(Bucket="photos", Key="2024/jan/b.jpg", Body=b"b")
s3.put_object(Bucket="photos", Key="2024-notes.txt", Body=b"notes")
s3.put_object(Bucket="photos", Key="top.txt", Body=b"top")
got = s3.get_object(Bucket="photos", Key="2024/jan/a.jpg")
assert got["Body"].read() == body
assert got["ContentLength"] == 100_000
head = s3.head_object(Bucket="photos", Key="2024/jan/a.jpg")
assert head["ContentLength"] == 100_000 and head["ETag"] == got["ETag"]
data = s3.get_object(Bucket="data", Key="from-cluster.bin")["Body"].read()
print("cluster-bytes", len(data), data[:4].hex())

# Ranges.
r = s3.get_object(Bucket="photos", Key="2024/jan/a.jpg", Range="bytes=10-19")
assert r["Body"].read() == body[10:20] and r["ContentRange"] == "bytes 10-19/100000"
r = s3.get_object(Bucket="photos", Key="2024/jan/a.jpg", Range="bytes=-5")
assert r["Body"].read() == body[-5:]
assert code(lambda: s3.get_object(Bucket="photos", Key="top.txt", Range="bytes=50-60")) == "InvalidRange"

# Listing in S3's byte order ("2024-notes.txt" before "2024/..."), with
# a delimiter, and in pages.
keys = [o["Key"] for o in s3.list_objects_v2(Bucket="photos")["Contents"]]
assert keys == ["2024-notes.txt", "2024/jan/a.jpg", "2024/jan/b.jpg", "top.txt"], keys
l = s3.list_objects_v2(Bucket="photos", Delimiter="/")
assert [p["Prefix"] for p in l["CommonPrefixes"]] == ["2024/"], l
assert [o["Key"] for o in l["Contents"]] == ["2024-notes.txt", "top.txt"]
l = s3.list_objects_v2(Bucket="photos", Prefix="2024/jan/", Delimiter="/")
assert [o["Key"] for o in l["Contents"]] == ["2024/jan/a.jpg", "2024/jan/b.jpg"]
l = s3.list_objects_v2(Bucket="photos", Prefix="2024", Delimiter="-")
assert [p["Prefix"] for p in l["CommonPrefixes"]] == ["2024-"], l
seen, token = [], None
while True:
    kw = {"ContinuationToken": token} if token else {}
    page = s3.list_objects_v2(Bucket="photos", MaxKeys=1, **kw)
    seen += [o["Key"] for o in page.get("Contents", [])]
    if not page["IsTruncated"]:
        break
    token = page["NextContinuationToken"]
assert seen == keys, seen
v1 = s3.list_objects(Bucket="photos", MaxKeys=2)
assert [o["Key"] for o in v1["Contents"]] == keys[:2] and v1["IsTruncated"]
v1 = s3.list_objects(Bucket="photos", Marker=v1["NextMarker"])
assert [o["Key"] for o in v1["Contents"]] == keys[2:]

# Copy, overwrite (a new ETag), multipart.
s3.copy_object(Bucket="photos", Key="copy.jpg", CopySource={"Bucket": "photos", "Key": "2024/jan/a.jpg"})
assert s3.get_object(Bucket="photos", Key="copy.jpg")["Body"].read() == body
before = s3.head_object(Bucket="photos", Key="top.txt")["ETag"]
s3.put_object(Bucket="photos", Key="top.txt", Body=b"top, again")
after = s3.head_object(Bucket="photos", Key="top.txt")
assert after["ETag"] != before and after["ContentLength"] == 10
big = os.urandom(12 << 20)
from boto3.s3.transfer import TransferConfig
cfg = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
s3.upload_fileobj(io.BytesIO(big), "photos", "big/model.bin", Config=cfg)
out = io.BytesIO()
s3.download_fileobj("photos", "big/model.bin", out, Config=cfg)
assert out.getvalue() == big
up = s3.create_multipart_upload(Bucket="photos", Key="aborted.bin")["UploadId"]
s3.upload_part(Bucket="photos", Key="aborted.bin", UploadId=up, PartNumber=1, Body=b"x" * 100)
parts = s3.list_parts(Bucket="photos", Key="aborted.bin", UploadId=up)["Parts"]
assert [p["PartNumber"] for p in parts] == [1]
s3.abort_multipart_upload(Bucket="photos", Key="aborted.bin", UploadId=up)
assert code(lambda: s3.list_parts(Bucket="photos", Key="aborted.bin", UploadId=up)) == "NoSuchUpload"
assert code(lambda: s3.head_object(Bucket="photos", Key="aborted.bin")) in ("404", "NoSuchKey")

# Errors in S3's codes.
assert code(lambda: s3.get_object(Bucket="photos", Key="missing")) == "NoSuchKey"
assert code(lambda: s3.get_object(Bucket="nope", Key="x")) == "NoSuchBucket"
assert code(lambda: s3.put_object(Bucket="photos", Key="a/../b", Body=b"")) == "InvalidArgument"
assert code(lambda: s3.put_object(Bucket="photos", Key="top.txt/x", Body=b"")) == "InvalidRequest"
assert code(lambda: s3.delete_bucket(Bucket="photos")) == "BucketNotEmpty"
assert code(lambda: client(secret="wrong").list_buckets()) == "SignatureDoesNotMatch"
c = code(lambda: client(key="nobody").list_buckets()); assert c == "InvalidAccessKeyId", c
anon = client(signature_version=botocore.UNSIGNED)
assert code(lambda: anon.get_object(Bucket="photos", Key="top.txt")) == "AccessDenied"

# Deletes: missing keys succeed, emptied "folders" go with their last object.
s3.delete_object(Bucket="photos", Key="missing")
s3.delete_objects(Bucket="photos", Delete={"Objects": [{"Key": "2024/jan/a.jpg"}, {"Key": "2024/jan/b.jpg"}]})
l = s3.list_objects_v2(Bucket="photos", Delimiter="/")
assert [p["Prefix"] for p in l.get("CommonPrefixes", [])] == ["big/"], l
print("ok")
"#,
    );
    assert!(out.contains("ok"), "{out}");
    let expect = format!(
        "cluster-bytes {} {}",
        from_cluster.len(),
        from_cluster[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert!(out.contains(&expect), "{out}");
    // What S3 wrote is the cluster's file, byte for byte.
    let copy = rt.block_on(read_file(&client, "/photos/copy.jpg")).unwrap();
    assert_eq!(copy.len(), 100_000);
    let top = rt.block_on(read_file(&client, "/photos/top.txt")).unwrap();
    assert_eq!(top, b"top, again");
    assert_eq!(
        rt.block_on(client.stat("/photos/big/model.bin"))
            .unwrap()
            .size,
        12 << 20
    );
    // Nothing of the uploads is left behind.
    let uploads = rt.block_on(client.list_all("/.s3-uploads")).unwrap();
    assert!(
        uploads.is_empty(),
        "{:?}",
        uploads.iter().map(|e| &e.name).collect::<Vec<_>>()
    );
    // The clients' mistakes above (missing keys, bad signatures, bad
    // names) are theirs: none is an error in the node's log.
    let log = node.log_text();
    let errors: Vec<_> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn aws_cli_and_rclone_copy_trees_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let node = gateway_node(dir.path());
    let src = dir.path().join("src");
    for i in 0..40u64 {
        let sub = src.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&sub).unwrap();
        let len = (i as usize * 7919) % 200_000;
        std::fs::write(sub.join(format!("f{i}.bin")), random_bytes(len, i)).unwrap();
    }
    std::fs::write(src.join("large.bin"), random_bytes(20 << 20, 99)).unwrap();
    let endpoint = format!("http://{}", node.s3_addr);
    let aws = |args: &[&str]| {
        run(Command::new("aws")
            .args(["--endpoint-url", &endpoint])
            .args(args)
            .env("AWS_ACCESS_KEY_ID", ACCESS)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env_remove("AWS_CA_BUNDLE")
            .env_remove("AWS_PROFILE"))
    };
    aws(&["s3", "mb", "s3://tree"]);
    aws(&[
        "s3",
        "sync",
        "--only-show-errors",
        src.to_str().unwrap(),
        "s3://tree/up",
    ]);
    let down = dir.path().join("down");
    aws(&[
        "s3",
        "cp",
        "--recursive",
        "--only-show-errors",
        "s3://tree/up",
        down.to_str().unwrap(),
    ]);
    run(Command::new("diff").arg("-r").arg(&src).arg(&down));
    // A second sync finds nothing to send.
    let again = aws(&[
        "s3",
        "sync",
        "--no-progress",
        src.to_str().unwrap(),
        "s3://tree/up",
    ]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(!text.contains("upload:"), "{text}");

    // rclone's S3 backend: copy the tree in, check it, copy it back.
    let rclone = |args: &[&str]| {
        run(Command::new("rclone")
            .args(args)
            .env("RCLONE_CONFIG_GW_TYPE", "s3")
            .env("RCLONE_CONFIG_GW_PROVIDER", "Other")
            .env("RCLONE_CONFIG_GW_ENDPOINT", &endpoint)
            .env("RCLONE_CONFIG_GW_ACCESS_KEY_ID", ACCESS)
            .env("RCLONE_CONFIG_GW_SECRET_ACCESS_KEY", SECRET)
            .env("RCLONE_CONFIG_GW_REGION", "us-east-1")
            .env_remove("AWS_CA_BUNDLE"))
    };
    rclone(&["copy", src.to_str().unwrap(), "gw:tree/rc", "--transfers=8"]);
    rclone(&["check", src.to_str().unwrap(), "gw:tree/rc"]);
    let back = dir.path().join("back");
    rclone(&["copy", "gw:tree/rc", back.to_str().unwrap()]);
    run(Command::new("diff").arg("-r").arg(&src).arg(&back));
    // rclone keeps modification times in `mtime` metadata: the gateway
    // stores them as the files' mtimes, so a second copy sends nothing.
    let out = rclone(&["copy", src.to_str().unwrap(), "gw:tree/rc", "-v"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("Copied"), "{log}");

    // Through the cluster, the tree is files with the same bytes.
    let rt = runtime();
    let client = rt.block_on(node.client());
    let want = std::fs::read(src.join("d1/f5.bin")).unwrap();
    assert_eq!(
        rt.block_on(read_file(&client, "/tree/rc/d1/f5.bin"))
            .unwrap(),
        want
    );
    assert_eq!(
        rt.block_on(read_file(&client, "/tree/up/d1/f5.bin"))
            .unwrap(),
        want
    );
}

#[test]
fn a_gateway_without_keys_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(curvine_integration::bin("curvine-node"))
        .args(["start", "--data-dir"])
        .arg(dir.path().join("n"))
        .args(["--listen", "127.0.0.1:0", "-c", "s3.listen=127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("s3.access_key") && err.contains("s3.secret_key"),
        "{err}"
    );
}

#[test]
fn gets_of_cached_objects_read_the_block_files_on_this_host() {
    let dir = tempfile::tempdir().unwrap();
    let node = gateway_node(dir.path());
    let rt = runtime();
    let client = rt.block_on(node.client());
    rt.block_on(client.mkdir("/cached", false)).unwrap();
    for i in 0..10u64 {
        let bytes = random_bytes(50_000 + i as usize * 1_000, i);
        rt.block_on(write_file(&client, &format!("/cached/f{i}"), &bytes, 1));
    }
    assert_short_circuit(&node, 10, || {
        let out = python(
            &node,
            r#"
for i in range(10):
    body = s3.get_object(Bucket="cached", Key=f"f{i}")["Body"].read()
    assert len(body) == 50_000 + i * 1_000, len(body)
print("ok")
"#,
        );
        assert!(out.contains("ok"), "{out}");
    });
}

/// An s3fs mount of a bucket of the gateway, unmounted when dropped.
struct S3fsMount(std::path::PathBuf);

impl Drop for S3fsMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.0).status();
    }
}

#[test]
fn s3fs_mounts_a_bucket_with_folders_as_directories() {
    let dir = tempfile::tempdir().unwrap();
    let node = gateway_node(dir.path());
    let rt = runtime();
    let client = rt.block_on(node.client());
    rt.block_on(client.mkdir("/vol/models", true)).unwrap();
    let model = random_bytes(3 << 20, 7);
    rt.block_on(write_file(&client, "/vol/models/m.bin", &model, 1));

    // s3fs (FUSE over S3) tells folders from objects by their Content-Type.
    let passwd = dir.path().join("passwd");
    std::fs::write(&passwd, format!("{ACCESS}:{SECRET}\n")).unwrap();
    std::fs::set_permissions(&passwd, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(Command::new("s3fs")
        .arg("vol")
        .arg(&mnt)
        .arg("-o")
        .arg(format!("passwd_file={}", passwd.display()))
        .arg("-o")
        .arg(format!("url=http://{}", node.s3_addr))
        .args(["-o", "use_path_request_style", "-o", "retries=1"])
        .env_remove("AWS_CA_BUNDLE"));
    let mount = S3fsMount(mnt.clone());

    assert!(std::fs::metadata(mnt.join("models")).unwrap().is_dir());
    assert!(std::fs::read(mnt.join("models/m.bin")).unwrap() == model);
    std::fs::create_dir(mnt.join("out")).unwrap();
    std::fs::write(mnt.join("out/a.txt"), b"written by s3fs").unwrap();
    std::fs::rename(mnt.join("out/a.txt"), mnt.join("out/b.txt")).unwrap();
    let listed: Vec<_> = std::fs::read_dir(mnt.join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed, ["b.txt"]);
    drop(mount);

    // Through the cluster: a directory and a file with those bytes.
    let out = rt.block_on(client.stat("/vol/out")).unwrap();
    assert_eq!(out.kind, curvine_messages::FileKind::Dir);
    assert_eq!(
        rt.block_on(read_file(&client, "/vol/out/b.txt")).unwrap(),
        b"written by s3fs"
    );
    assert!(rt.block_on(client.stat("/vol/out/a.txt")).is_err());
}
