//! The Python package `curvinefs` (an fsspec file system over the native
//! client) against a real node: pandas and pyarrow reading and writing
//! through it, fsspec's own calls, forked workers, and what it writes
//! checked through the client library (and the other way round).

use curvine_integration::{
    assert_short_circuit, random_bytes, read_file, runtime, write_file, NodeProcess,
};

/// Runs a Python script with `fs` (the node's file system), `url` (the
/// `curvine://host:port` prefix) and `opts` (storage options) defined.
fn python(node: &NodeProcess, script: &str) -> String {
    let prelude = format!(
        r#"
import fsspec, io, os, sys
import curvinefs
opts = {{"options": {{"client.cookie": "{cookie}"}}}}
fs = fsspec.filesystem("curvine", cluster="{addr}", **opts)
url = "curvine://{addr}"
"#,
        cookie = node.cookie(),
        addr = node.addr
    );
    curvine_integration::python_script("the Python script", &format!("{prelude}\n{script}"))
}

#[test]
fn pandas_and_pyarrow_read_and_write_through_fsspec() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n1"), &[]);
    let rt = runtime();
    let client = rt.block_on(node.client());
    rt.block_on(client.mkdir("/in", false)).unwrap();
    let from_cluster = random_bytes(9 << 20, 3);
    rt.block_on(write_file(&client, "/in/blob.bin", &from_cluster, 1));

    let out = python(
        &node,
        r#"
import tempfile
import pandas as pd, pyarrow as pa, pyarrow.parquet as pq

# A file of the cluster, whole, in ranges and through seeks.
data = fs.cat_file("/in/blob.bin")
print("blob", len(data), sum(data) % (1 << 32), data[-8:].hex())
assert fs.cat_file("/in/blob.bin", 100, 110) == data[100:110]
assert fs.cat_file("/in/blob.bin", -5) == data[-5:]
with fs.open("/in/blob.bin", "rb") as f:
    f.seek(8 << 20)
    assert f.read(1000) == data[8 << 20:(8 << 20) + 1000]
    assert f.size == len(data)

# pandas and pyarrow, by URL and with the file system.
df = pd.DataFrame({"id": range(5000), "name": [f"row-{i}" for i in range(5000)]})
fs.makedirs("/out/tables", exist_ok=True)
df.to_csv(url + "/out/tables/t.csv", index=False, storage_options=opts)
back = pd.read_csv(url + "/out/tables/t.csv", storage_options=opts)
assert back.equals(df), back
pq.write_table(pa.Table.from_pandas(df), "/out/tables/t.parquet", filesystem=fs)
t = pq.read_table("/out/tables/t.parquet", filesystem=fs)
assert t.num_rows == 5000 and t.column("name")[4999].as_py() == "row-4999"
assert pd.read_parquet(url + "/out/tables/t.parquet", storage_options=opts).equals(df)

# fsspec's calls.
assert sorted(fs.ls("/out/tables", detail=False)) == ["/out/tables/t.csv", "/out/tables/t.parquet"]
info = fs.info("/out/tables/t.csv")
assert info["type"] == "file" and info["size"] > 0 and fs.isdir("/out/tables")
with fs.open("/out/w.bin", "wb") as f:
    for i in range(12):
        f.write(bytes([i]) * (1 << 20))
assert fs.size("/out/w.bin") == 12 << 20
with fs.open("/out/w.bin", "ab") as f:
    f.write(b"tail")
assert fs.cat_file("/out/w.bin", -4) == b"tail"
fs.pipe_file("/out/p.txt", b"piped")
fs.mv("/out/p.txt", "/out/q.txt")
assert not fs.exists("/out/p.txt") and fs.cat_file("/out/q.txt") == b"piped"
local = os.path.join(tempfile.mkdtemp(), "local.bin")
with open(local, "wb") as f:
    f.write(b"L" * 300_000)
fs.put_file(local, "/out/put.bin")
fs.get_file("/out/put.bin", local + ".back")
assert open(local + ".back", "rb").read() == b"L" * 300_000
try:
    fs.info("/out/missing")
    raise SystemExit("no error for a missing file")
except FileNotFoundError as e:
    assert e.filename == "/out/missing", e
fs.rm("/out/put.bin")
assert not fs.exists("/out/put.bin")

# Forked workers (as a DataLoader's) connect anew and read.
import multiprocessing
def work(i):
    return len(fs.cat_file("/in/blob.bin", i, i + 10))
with multiprocessing.get_context("fork").Pool(2) as pool:
    assert pool.map(work, range(4)) == [10] * 4
print("ok")
"#,
    );
    assert!(out.contains("ok"), "{out}");
    let sum = from_cluster.iter().map(|b| u64::from(*b)).sum::<u64>() % (1 << 32);
    let tail: String = from_cluster[from_cluster.len() - 8..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert!(
        out.contains(&format!("blob {} {sum} {tail}", from_cluster.len())),
        "{out}"
    );
    // What Python wrote is the cluster's file, byte for byte.
    let w = rt.block_on(read_file(&client, "/out/w.bin")).unwrap();
    assert_eq!(w.len(), (12 << 20) + 4);
    assert!(
        w[..1 << 20].iter().all(|b| *b == 0) && w[11 << 20..(12 << 20)].iter().all(|b| *b == 11)
    );
    let csv = rt
        .block_on(read_file(&client, "/out/tables/t.csv"))
        .unwrap();
    assert!(csv.starts_with(b"id,name\n0,row-0\n"));
}

#[test]
fn reads_of_blocks_on_this_host_are_short_circuit() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("n1"), &[]);
    let rt = runtime();
    let client = rt.block_on(node.client());
    rt.block_on(client.mkdir("/small", false)).unwrap();
    for i in 0..10u64 {
        let bytes = random_bytes(60_000, i);
        rt.block_on(write_file(&client, &format!("/small/f{i}"), &bytes, 1));
    }
    assert_short_circuit(&node, 10, || {
        let out = python(
            &node,
            r#"
for i in range(10):
    assert len(fs.cat_file(f"/small/f{i}")) == 60_000
print("ok")
"#,
        );
        assert!(out.contains("ok"), "{out}");
    });
}
