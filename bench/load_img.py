#!/usr/bin/env python3
"""Small-file reader for B2, modelled on the load_img.py of the small-file
benchmark this suite follows: P worker processes read whole files picked
from a directory tree, optionally decoding each as an image with Pillow.

Used alike for a FUSE mount of the cluster, the peers (rclone mount, s3fs)
and a tmpfs directory, so every row of B2 that reads through a file system
is the same program.

    bench/load_img.py DIR --num_workers 8 [--num_samples N] [--decode]
                      [--phases cold,warm] [--label L] [--json]
                      [--fsspec URL]

With --fsspec URL (e.g. curvine://127.0.0.1:8995) DIR is a directory of
that fsspec file system, listed with `find` and read with `cat_file`
(each worker process with its own instance) instead of open().

Phases: `cold` reads every file once in a random order (on a fresh mount
each read goes to the object store); `warm` then reads --num_samples files
picked at random. The file list is taken before timing starts. Each phase
prints one line (or one JSON object with --json): files, bytes, seconds,
files/s, MB/s.
"""

import argparse
import io
import json
import multiprocessing
import os
import random
import sys
import time

DECODE = False
FS = None


def filesystem(url):
    import fsspec

    fs, _ = fsspec.core.url_to_fs(url)
    return fs


def init(decode, url=None):
    global DECODE, FS
    DECODE = decode
    FS = filesystem(url) if url else None


def read_one(path):
    if FS is not None:
        data = FS.cat_file(path)
    else:
        with open(path, "rb") as f:
            data = f.read()
    if DECODE:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as img:
            img.convert("RGB").load()
    return len(data)


def read_chunk(paths):
    return sum(read_one(p) for p in paths), len(paths)


def chunks(items, n):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def run_phase(pool, paths, chunk):
    start = time.perf_counter()
    files = nbytes = 0
    for b, n in pool.imap_unordered(read_chunk, chunks(paths, chunk)):
        nbytes += b
        files += n
    return files, nbytes, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--num_workers", type=int, default=8)
    ap.add_argument("--num_samples", type=int, default=0,
                    help="files read in the warm phase (default: as many as there are)")
    ap.add_argument("--decode", action="store_true", help="decode every file with Pillow")
    ap.add_argument("--phases", default="cold,warm")
    ap.add_argument("--chunk", type=int, default=16, help="files per task handed to a worker")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fsspec", default="", help="read DIR of this fsspec URL's file system")
    a = ap.parse_args()

    phases = [p for p in a.phases.split(",") if p]
    bad = [p for p in phases if p not in ("cold", "warm")]
    if bad or a.num_workers < 1 or a.num_samples < 0 or a.chunk < 1:
        ap.error(f"bad --phases {bad}" if bad else "--num_workers and --chunk must be >= 1")
    if a.decode:
        try:
            import PIL  # noqa: F401
        except ImportError:
            sys.exit("load_img.py: --decode needs Pillow (pip install pillow)")
    if a.fsspec:
        fs = filesystem(a.fsspec)
        if not fs.isdir(a.dir):
            sys.exit(f"load_img.py: {a.fsspec} {a.dir}: not a directory")
        paths = sorted(fs.find(a.dir))
    elif not os.path.isdir(a.dir):
        sys.exit(f"load_img.py: {a.dir}: not a directory")
    else:
        paths = sorted(os.path.join(root, f) for root, _, files in os.walk(a.dir) for f in files)
    if not paths:
        sys.exit(f"load_img.py: {a.dir}: no files")
    rng = random.Random(a.seed)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(a.num_workers, initializer=init, initargs=(a.decode, a.fsspec or None)) as pool:
        pool.map(len, [[]] * a.num_workers)  # every worker is up before timing
        for phase in phases:
            if phase == "cold":
                order = paths[:]
                rng.shuffle(order)
            else:
                order = [rng.choice(paths) for _ in range(a.num_samples or len(paths))]
            files, nbytes, secs = run_phase(pool, order, a.chunk)
            row = {"action": "load_img", "phase": phase, "threads": a.num_workers,
                   "files": files, "bytes": nbytes, "seconds": secs,
                   "files_per_sec": files / max(secs, 1e-9),
                   "mb_per_sec": nbytes / 1e6 / max(secs, 1e-9), "decode": a.decode,
                   "via": "fsspec" if a.fsspec else "open"}
            if a.label:
                row["label"] = a.label
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"load_img ({phase}) files: {files}, cost: {secs:.2f}s, "
                      f"speed: {row['files_per_sec']:.0f} files/s, {row['mb_per_sec']:.1f} MB/s",
                      flush=True)


if __name__ == "__main__":
    main()
