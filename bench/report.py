#!/usr/bin/env python3
"""Writes bench/RESULTS.md (to stdout) from the raw figures the benchmark
scripts keep in bench/results: data.jsonl (B1, bench/run-data.sh),
meta.jsonl (B4, bench/run-meta.sh), cluster.jsonl, ufs.jsonl (B2,
bench/run-ufs.sh) and fuse.jsonl (B1 and B3 through the mount,
bench/run-fuse.sh), each with an .info.json about its run."""

import json
import os
import platform
import statistics
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def sh(cmd):
    try:
        return subprocess.check_output(cmd, shell=True, text=True).strip()
    except Exception:
        return "?"


def load(name):
    path = os.path.join(RESULTS, name + ".jsonl")
    info = os.path.join(RESULTS, name + ".info.json")
    if not os.path.exists(path):
        return None, None
    rows = [json.loads(line) for line in open(path) if line.strip()]
    meta = json.load(open(info)) if os.path.exists(info) else {}
    return rows, meta


def ratio(a, b):
    return f"{a / b:.2f}" if b else "-"


def header():
    mem = sh("free -g | awk '/Mem:/ {print $2}'")
    cpu = sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2").strip()
    print("# Benchmark results\n")
    print(f"- machine: {os.cpu_count()} cores ({cpu}), {mem} GiB, kernel {platform.release()}")
    print("- every figure is next to a baseline measured in the same run; the")
    print("  machine is noisy, so ratios are the figures to compare, and repeated")
    print("  runs are summarised by their median\n")


def data_section(rows, meta):
    print("## B1. Large files (`curvine-bench --action fs.write|fs.read`)\n")
    print(f"- run: {meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"`bench/run-data.sh{' --quick' if meta.get('quick') else ''}`; raw figures in "
          "`bench/results/data.jsonl`")
    print(f"- {meta.get('files', '?')} files of {meta.get('file_size', '?')} per run, "
          "128KiB buffers, `--checksum true` (crc32c of every buffer written, every "
          "buffer read verified), one node on the same host as the client, "
          f"{meta.get('reps', '?')} repetitions per figure (median shown, "
          "min-max in brackets)")
    print("- baselines: the same tool doing plain file I/O (`local.write|local.read`) "
          "on a tmpfs directory, or on the disk for the disk rows; `iperf3` over "
          "loopback for the data-port rows\n")

    def med(label, action, threads):
        xs = [r["gib_per_sec"] for r in rows
              if r.get("label") == label and r["action"] == action and r["threads"] == threads]
        if not xs:
            return None
        return statistics.median(xs), min(xs), max(xs)

    def cell(m):
        return f"{m[0]:.2f} [{m[1]:.2f}-{m[2]:.2f}]" if m else "-"

    print("| figure | tasks | curvine GiB/s | baseline GiB/s | ratio | target |")
    print("|---|---|---|---|---|---|")
    threads = sorted({r["threads"] for r in rows})
    targets = []
    specs = [
        ("write, MEM tier, short-circuit", "mem", "fs.write", "tmpfs", "local.write", 0.8),
        ("read, MEM tier, short-circuit", "mem", "fs.read", "tmpfs", "local.read", 0.9),
        ("read, MEM tier, data port (no short-circuit)", "mem-remote", "fs.read", "iperf3", "iperf3", 0.7),
        ("write, MEM tier, data port (no short-circuit)", "mem-remote", "fs.write", "tmpfs", "local.write", None),
        ("write, disk tier", "disk", "fs.write", "disk", "local.write", None),
        ("read, disk tier, page cache dropped", "disk", "fs.read", "disk", "local.read", None),
    ]
    for title, label, action, base_label, base_action, target in specs:
        for t in threads:
            c = med(label, action, t)
            b = med(base_label, base_action, t)
            if not c or not b:
                continue
            r = c[0] / b[0]
            tgt = f">= {target:.2f}" if target else ""
            if target:
                targets.append((f"{title}, {t} tasks", target, r))
            print(f"| {title} | {t} | {cell(c)} | {cell(b)} | {r:.2f} | {tgt} |")
    if targets:
        print("\n### Against the targets\n")
        print("| figure | target ratio | measured | status |")
        print("|---|---|---|---|")
        for name, target, r in targets:
            print(f"| {name} | {target:.2f} | {r:.2f} | {'met' if r >= target else 'not met'} |")
    notes = os.path.join(HERE, "notes-data.md")
    if os.path.exists(notes):
        print()
        print(open(notes).read().rstrip())
    print()


def meta_section(rows, meta):
    by = {(r["action"], r["threads"]): r for r in rows}
    print("## B4. Metadata through the client library\n")
    print(f"- run: {meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"`bench/run-meta.sh` ({meta.get('entries', '?')} entries in 100 directories); "
          f"node data on {meta.get('fstype', '?')}; raw figures in `bench/results/meta.jsonl`\n")
    print("One node, default config (16 shards in one LMDB environment, fsync on every")
    print("commit), client and node on the same 2 cores. Baseline: the same program")
    print("doing the same operations with plain system calls on tmpfs, same run.")
    print("`ls` counts directory listings (each returns 1,000 entries with attributes).\n")
    print("| operation | tasks | curvine ops/s | tmpfs ops/s | ratio |")
    print("|---|---|---|---|---|")
    for op in ["create", "stat", "ls", "rename", "unlink"]:
        for t in sorted({r["threads"] for r in rows}):
            c = by.get((f"meta.{op}", t))
            l = by.get((f"local.meta.{op}", t))
            if c and l:
                print(f"| {op} | {t} | {c['ops_per_sec']:,.0f} | {l['ops_per_sec']:,.0f} | "
                      f"{ratio(c['ops_per_sec'], l['ops_per_sec'])} |")
    print("\nDurable baseline: the same program on the node's disk, each change made")
    print("durable with fsync of the file and its directory (8 tasks), same run:\n")
    print("| operation | curvine ops/s | ext4 + fsync ops/s | ratio |")
    print("|---|---|---|---|")
    for op in ["create", "rename", "unlink"]:
        c = by.get((f"meta.{op}", 8))
        l = by.get((f"local.meta.sync.{op}", 8))
        if c and l:
            print(f"| {op} | {c['ops_per_sec']:,.0f} | {l['ops_per_sec']:,.0f} | "
                  f"{ratio(c['ops_per_sec'], l['ops_per_sec'])} |")
    c8 = by.get(("meta.create", 8))
    s8 = by.get(("meta.stat", 8))
    print("\n### Against the targets\n")
    print("| figure | target | measured | status |")
    print("|---|---|---|---|")
    if c8:
        ok = "met" if c8["ops_per_sec"] >= 15000 else "not met"
        print(f"| creates/s, 8 tasks | 15,000 | {c8['ops_per_sec']:,.0f} | {ok} |")
    if s8:
        ok = "met" if s8["ops_per_sec"] >= 25000 else "not met"
        print(f"| uncached stats/s, 8 tasks | 25,000 | {s8['ops_per_sec']:,.0f} | {ok} |")
    notes = os.path.join(HERE, "notes-meta.md")
    if os.path.exists(notes):
        print()
        print(open(notes).read().rstrip())
    print()


def cluster_section(rows, meta):
    print("## Cluster: 3 node processes on this machine beside one node\n")
    print(f"- run: {meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"`bench/run-cluster.sh{' --quick' if meta.get('quick') else ''}`; raw figures in "
          "`bench/results/cluster.jsonl`")
    print(f"- 8 client tasks talking to the first node; metadata: {meta.get('entries', '?')} "
          f"entries in 100 directories (`meta.all`); B1: {meta.get('files', '?')} files of "
          f"{meta.get('file_size', '?')}, 128KiB buffers, checksums on; "
          f"{meta.get('reps', '?')} repetitions, median shown")
    print("- the cluster's 16 shards are spread 6/5/5 over its nodes, so about two")
    print("  thirds of the metadata requests go from the node the client talks to")
    print("  into another node over ractor_cluster; all processes share the same 2 cores\n")

    def med(label, action):
        xs = [r.get("ops_per_sec", r.get("gib_per_sec")) for r in rows
              if r.get("label") == label and r["action"] == action]
        return statistics.median(xs) if xs else None

    print("| figure | one node | 3-node cluster | ratio |")
    print("|---|---|---|---|")
    for op in ["create", "stat", "ls", "rename", "unlink"]:
        a, b = med("single", f"meta.{op}"), med("cluster", f"meta.{op}")
        if a and b:
            print(f"| {op} ops/s | {a:,.0f} | {b:,.0f} | {ratio(b, a)} |")
    specs = [
        ("write GiB/s (short-circuit)", "single", "cluster", "fs.write"),
        ("read GiB/s (short-circuit)", "single", "cluster", "fs.read"),
        ("read GiB/s (data port)", "single-remote", "cluster-remote", "fs.read"),
        ("write GiB/s, 2 replicas (cluster) vs 1 (one node)", "single", "cluster-replicas2", "fs.write"),
    ]
    for title, la, lb, action in specs:
        a, b = med(la, action), med(lb, action)
        if a and b:
            print(f"| {title} | {a:.2f} | {b:.2f} | {ratio(b, a)} |")
    notes = os.path.join(HERE, "notes-cluster.md")
    if os.path.exists(notes):
        print()
        print(open(notes).read().rstrip())
    print()


def ufs_section(rows, meta):
    print("## B2: small files over S3 (client library and FUSE mount)\n")
    print(f"- run: {meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"`bench/run-ufs.sh{' --quick' if meta.get('quick') else ''}`; raw figures in "
          "`bench/results/ufs.jsonl`")
    print(f"- S3 server: {meta.get('s3_server', '?')} on loopback, credentials enforced; "
          f"{meta.get('files', '?')} files of 60-140 KB; one node with a MEM tier; "
          f"{meta.get('reps', '?')} repetitions, median shown")
    print("- readers are tasks of one `curvine-bench` process reading whole files: "
          "`direct` is a GET per file from S3 (every file once, random order); "
          "`first read` is every file once through a fresh cache_mode mount (each read "
          "goes to S3 and fills the cache); `warm` is "
          f"{meta.get('reads', '?')} files picked at random once all are cached; the "
          "`FUSE mount` rows do the same with plain file reads (threads of one "
          "`curvine-bench --action local.small-read`) under a default FUSE mount of "
          "the node\n")

    def med(label, phase, threads, key="files_per_sec"):
        xs = [r[key] for r in rows if r.get("label") == label and r.get("phase") == phase
              and r.get("threads") == threads]
        return statistics.median(xs) if xs else None

    print("| figure | readers | files/s | baseline: S3 direct files/s | ratio |")
    print("|---|---|---|---|---|")
    for t in (2, 8):
        base = med("direct", "direct", t)
        for title, label, phase in (
            ("first read through the cache", "cache", "cold"),
            ("warm reads", "cache", "warm"),
            ("FUSE mount: first read", "fuse", "cold"),
            ("FUSE mount: warm reads", "fuse", "warm"),
        ):
            v = med(label, phase, t)
            if v and base:
                print(f"| {title} | {t} | {v:,.0f} | {base:,.0f} | {ratio(v, base)} |")
    load = [r for r in rows if r.get("label") == "load"]
    base = med("direct", "direct", 8)
    base_mb = med("direct", "direct", 8, "mb_per_sec")
    if load and base:
        f = statistics.median(r["files_per_sec"] for r in load)
        mb = statistics.median(r["mb_per_sec"] for r in load)
        print(f"| load job (files/s) | {meta.get('files', '?')} files | {f:,.0f} | {base:,.0f} | {ratio(f, base)} |")
        print(f"| load job (MB/s) | | {mb:,.1f} | {base_mb:,.1f} | {ratio(mb, base_mb)} |")
    notes = os.path.join(HERE, "notes-ufs.md")
    if os.path.exists(notes):
        print()
        print(open(notes).read().rstrip())
    print()


def fuse_section(rows, meta):
    print("## B1 and B3 through the FUSE mount (`fuse.write|fuse.read`, fio)\n")
    print(f"- run: {meta.get('date', '?')}, commit {meta.get('commit', '?')}, "
          f"`bench/run-fuse.sh{' --quick' if meta.get('quick') else ''}`; raw figures in "
          "`bench/results/fuse.jsonl`")
    print(f"- B1: {meta.get('files', '?')} files of 100MB per run, 128KiB buffers, "
          "`--checksum true`; one node with a MEM tier in /dev/shm; the page cache is "
          f"dropped before each read; {meta.get('reps', '?')} repetitions (median, "
          "min-max in brackets). `mount` is the default mount; `passthrough` mounts "
          "with `--passthrough --block-size 128MiB`, so each file is one block the "
          "kernel reads itself")
    print(f"- B3: fio `--direct=1 --iodepth=1 --ioengine=libaio`, {meta.get('runtime', '?')}s "
          f"per job, on a {meta.get('fio_size', '?')} file cached in the MEM tier (passthrough: "
          f"a {meta.get('fio_pt_size', '?')} file of one block); baseline: the same job on "
          "the same bytes in tmpfs\n")

    def med(label, action, threads):
        xs = [r["gib_per_sec"] for r in rows if r.get("label") == label
              and r.get("action") == action and r.get("threads") == threads]
        return (statistics.median(xs), min(xs), max(xs)) if xs else None

    def cell(m):
        return f"{m[0]:.2f} [{m[1]:.2f}-{m[2]:.2f}]" if m else "-"

    print("| figure | tasks | mount GiB/s | tmpfs GiB/s | ratio | target |")
    print("|---|---|---|---|---|---|")
    for title, label, action, base, target in (
        ("fuse.write", "mount", "fuse.write", "local.write", 0.6),
        ("fuse.read", "mount", "fuse.read", "local.read", 0.7),
        ("fuse.write, passthrough mount", "passthrough", "fuse.write", "local.write", None),
        ("fuse.read, passthrough", "passthrough", "fuse.read", "local.read", 0.9),
    ):
        for t in (2, 8):
            c, b = med(label, action, t), med("tmpfs", base, t)
            if c and b:
                tgt = f">= {target:.2f}" if target else ""
                print(f"| {title} | {t} | {cell(c)} | {cell(b)} | {ratio(c[0], b[0])} | {tgt} |")
    fio = [r for r in rows if r.get("action") == "fio"]
    if fio:
        print("\n| fio job | jobs | mount | tmpfs | ratio | passthrough | tmpfs | ratio |")
        print("|---|---|---|---|---|---|---|---|")

        def one(label, rw, bs, jobs):
            xs = [r for r in fio if r["label"] == label and r["rw"] == rw and r["bs"] == bs
                  and r["threads"] == jobs]
            if not xs:
                return None
            key = "mib_per_sec" if rw == "read" else "iops"
            return statistics.median(x[key] for x in xs)

        for rw, bs, unit in (("read", "256k", "MiB/s"), ("randread", "4k", "IOPS")):
            for jobs in (1, 4, 16):
                m, t = one("mount", rw, bs, jobs), one("tmpfs", rw, bs, jobs)
                p, tp = one("passthrough", rw, bs, jobs), one("tmpfs-pt", rw, bs, jobs)
                if m is None or t is None:
                    continue
                print(f"| {rw} {bs} | {jobs} | {m:,.0f} {unit} | {t:,.0f} {unit} | {ratio(m, t)} | "
                      f"{(f'{p:,.0f} {unit}' if p else '-')} | {(f'{tp:,.0f} {unit}' if tp else '-')} | "
                      f"{ratio(p, tp) if p and tp else '-'} |")
    notes = os.path.join(HERE, "notes-fuse.md")
    if os.path.exists(notes):
        print()
        print(open(notes).read().rstrip())
    print()


def main():
    header()
    rows, meta = load("data")
    if rows:
        data_section(rows, meta)
    rows, meta = load("meta")
    if rows:
        meta_section(rows, meta)
    rows, meta = load("cluster")
    if rows:
        cluster_section(rows, meta)
    rows, meta = load("ufs")
    if rows:
        ufs_section(rows, meta)
    rows, meta = load("fuse")
    if rows:
        fuse_section(rows, meta)


if __name__ == "__main__":
    main()
