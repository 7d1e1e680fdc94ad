//! `curvine-fuse-transport`: a FUSE file system of one read-only file of
//! zeros (`/f`), served either by threads reading /dev/fuse (as the
//! curvine mount does today) or over FUSE-over-io_uring (Linux 6.14+,
//! the `fuse` module's `enable_uring`), one queue per CPU. It does no file
//! system work, so fio on it measures what the kernel's transport costs a
//! request, and what io_uring would take off it.
//!
//!   curvine-fuse-transport --mode dev --threads 4 MOUNTPOINT
//!   curvine-fuse-transport --mode uring --depth 16 MOUNTPOINT
//!
//! Runs in the foreground until the mount point is unmounted (or the
//! process is killed; `umount -l` then). Needs root.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

const FILE_SIZE: u64 = 4 << 30;
const MAX_WRITE: u32 = 1 << 20;
const BUF_SIZE: usize = MAX_WRITE as usize + 64 * 1024;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

// Opcodes (include/uapi/linux/fuse.h).
const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const ACCESS: u32 = 34;
const INTERRUPT: u32 = 36;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

// INIT flags.
const ASYNC_READ: u64 = 1 << 0;
const BIG_WRITES: u64 = 1 << 5;
const MAX_PAGES: u64 = 1 << 22;
const INIT_EXT: u64 = 1 << 30;
const OVER_IO_URING: u64 = 1 << 41;

// FUSE-over-io_uring: commands, and the layout of an entry's header buffer
// (128 bytes for the fuse_in/out_header, 128 for the operation's first
// argument, then the entry's own fields).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const OP_IN: usize = 128;
const ENT: usize = 256;
/// The kernel copies an operation's first argument into the 128 bytes at
/// `OP_IN` without checking it fits: room to spare.
const HEADER_BUF: usize = 1024;

struct Args {
    mode: String,
    threads: usize,
    depth: usize,
    mountpoint: String,
}

fn usage() -> ! {
    eprintln!(
        "usage: curvine-fuse-transport --mode dev|uring [--threads N] [--depth N] MOUNTPOINT"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        mode: "dev".into(),
        threads: 4,
        depth: 16,
        mountpoint: String::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |what: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
                .unwrap_or_else(|| {
                    eprintln!("curvine-fuse-transport: {what} takes a number above 0");
                    usage()
                })
        };
        match arg.as_str() {
            "--threads" => a.threads = num("--threads"),
            "--depth" => a.depth = num("--depth"),
            "--mode" => a.mode = it.next().unwrap_or_else(|| usage()),
            "-h" | "--help" => usage(),
            m if !m.starts_with('-') => a.mountpoint = m.to_string(),
            other => {
                eprintln!("curvine-fuse-transport: unknown flag {other}");
                usage()
            }
        }
    }
    if a.mountpoint.is_empty() || !matches!(a.mode.as_str(), "dev" | "uring") {
        usage()
    }
    a
}

fn os_err(what: &str) -> ! {
    eprintln!(
        "curvine-fuse-transport: {what}: {}",
        std::io::Error::last_os_error()
    );
    std::process::exit(1)
}

fn main() {
    let args = parse_args();
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        os_err("opening /dev/fuse");
    }
    let target = CString::new(args.mountpoint.clone()).unwrap_or_else(|_| usage());
    let opts = CString::new(format!(
        "fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    ))
    .unwrap();
    let rc = unsafe {
        libc::mount(
            c"transport".as_ptr(),
            target.as_ptr(),
            c"fuse.transport".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        os_err("mount");
    }
    let uring = args.mode == "uring";
    // Requests answered through /dev/fuse, and through the rings.
    let served = Arc::new(AtomicU64::new(0));
    let ringed = Arc::new(AtomicU64::new(0));
    // INIT comes through /dev/fuse in both modes.
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            os_err("reading INIT");
        }
        if u32_at(&buf, 4) == INIT {
            let out = init_reply(&buf[IN_HEADER..n as usize], uring);
            send(fd, u64_at(&buf, 8), 0, &out, &[]);
            break;
        }
    }
    let mut handles = Vec::new();
    // /dev/fuse readers: every request in dev mode; in uring mode, what the
    // kernel keeps on /dev/fuse (forgets, interrupts).
    let readers = if uring { 1 } else { args.threads };
    for _ in 0..readers {
        let served = served.clone();
        handles.push(std::thread::spawn(move || dev_loop(fd, &served)));
    }
    if uring {
        let cpus = possible_cpus();
        eprintln!(
            "curvine-fuse-transport: io_uring, {cpus} queues of {} entries",
            args.depth
        );
        for qid in 0..cpus {
            let (ringed, depth) = (ringed.clone(), args.depth);
            handles.push(std::thread::spawn(move || {
                pin_to(qid);
                if let Err(e) = queue_loop(fd, qid as u16, depth, &ringed) {
                    eprintln!("curvine-fuse-transport: queue {qid}: {e}");
                    std::process::exit(1);
                }
            }));
        }
    } else {
        eprintln!(
            "curvine-fuse-transport: /dev/fuse, {} threads",
            args.threads
        );
    }
    for h in handles {
        let _ = h.join();
    }
    eprintln!(
        "curvine-fuse-transport: unmounted after {} requests through /dev/fuse and {} through io_uring",
        served.load(Ordering::Relaxed),
        ringed.load(Ordering::Relaxed)
    );
}

fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| s.trim().rsplit(['-', ',']).next()?.parse::<usize>().ok())
        .map(|last| last + 1)
        .unwrap_or(1)
}

fn pin_to(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

fn init_reply(init_in: &[u8], uring: bool) -> Vec<u8> {
    let minor = u32_at(init_in, 4);
    let max_readahead = u32_at(init_in, 8);
    let mut flags = ASYNC_READ | BIG_WRITES | MAX_PAGES | INIT_EXT;
    if uring {
        flags |= OVER_IO_URING;
    }
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&7u32.to_ne_bytes());
    out.extend_from_slice(&minor.to_ne_bytes());
    out.extend_from_slice(&max_readahead.to_ne_bytes());
    out.extend_from_slice(&(flags as u32).to_ne_bytes());
    out.extend_from_slice(&64u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&48u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&MAX_WRITE.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.extend_from_slice(&256u16.to_ne_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_ne_bytes()); // map_alignment
    out.extend_from_slice(&((flags >> 32) as u32).to_ne_bytes());
    out.resize(64, 0);
    out
}

fn attr(ino: u64) -> Vec<u8> {
    let (mode, size, nlink) = if ino == 1 {
        (libc::S_IFDIR | 0o755, 0, 2u32)
    } else {
        (libc::S_IFREG | 0o444, FILE_SIZE, 1u32)
    };
    let mut a = Vec::with_capacity(88);
    a.extend_from_slice(&ino.to_ne_bytes());
    a.extend_from_slice(&size.to_ne_bytes());
    a.extend_from_slice(&size.div_ceil(512).to_ne_bytes());
    a.resize(48 + 12, 0); // times
    a.extend_from_slice(&mode.to_ne_bytes());
    a.extend_from_slice(&nlink.to_ne_bytes());
    a.resize(88 - 8, 0); // uid, gid, rdev
    a.extend_from_slice(&4096u32.to_ne_bytes()); // blksize
    a.extend_from_slice(&0u32.to_ne_bytes());
    a
}

/// What to answer a request: `None` for those that take no answer, else
/// (error, reply bytes, bytes of zeros after them).
fn answer(opcode: u32, nodeid: u64, args: &[u8]) -> Option<(i32, Vec<u8>, usize)> {
    const VALID: u64 = 3600;
    Some(match opcode {
        FORGET | BATCH_FORGET | INTERRUPT => return None,
        LOOKUP => {
            let name = args.split(|b| *b == 0).next().unwrap_or_default();
            if nodeid != 1 || name != b"f" {
                (-libc::ENOENT, Vec::new(), 0)
            } else {
                let mut out = Vec::with_capacity(128);
                out.extend_from_slice(&2u64.to_ne_bytes());
                out.extend_from_slice(&0u64.to_ne_bytes());
                out.extend_from_slice(&VALID.to_ne_bytes());
                out.extend_from_slice(&VALID.to_ne_bytes());
                out.extend_from_slice(&[0u8; 8]);
                out.extend_from_slice(&attr(2));
                (0, out, 0)
            }
        }
        GETATTR => {
            let mut out = Vec::with_capacity(104);
            out.extend_from_slice(&VALID.to_ne_bytes());
            out.extend_from_slice(&[0u8; 8]);
            out.extend_from_slice(&attr(nodeid));
            (0, out, 0)
        }
        OPEN | OPENDIR => {
            let mut out = 1u64.to_ne_bytes().to_vec();
            out.resize(16, 0);
            (0, out, 0)
        }
        READ if args.len() >= 20 => {
            let offset = u64_at(args, 8);
            let size = u32_at(args, 16) as u64;
            let n = size.min(FILE_SIZE.saturating_sub(offset)) as usize;
            (0, Vec::new(), n)
        }
        STATFS => (0, vec![0u8; 80], 0),
        READDIR | RELEASE | RELEASEDIR | FLUSH | ACCESS | DESTROY => (0, Vec::new(), 0),
        _ => (-libc::ENOSYS, Vec::new(), 0),
    })
}

static ZEROS: [u8; BUF_SIZE] = [0u8; BUF_SIZE];

/// Writes an answer to /dev/fuse.
fn send(fd: RawFd, unique: u64, error: i32, out: &[u8], zeros: &[u8]) {
    let len = (OUT_HEADER + out.len() + zeros.len()) as u32;
    let mut header = [0u8; OUT_HEADER];
    header[..4].copy_from_slice(&len.to_ne_bytes());
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    header[8..].copy_from_slice(&unique.to_ne_bytes());
    let iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut _,
            iov_len: OUT_HEADER,
        },
        libc::iovec {
            iov_base: out.as_ptr() as *mut _,
            iov_len: out.len(),
        },
        libc::iovec {
            iov_base: zeros.as_ptr() as *mut _,
            iov_len: zeros.len(),
        },
    ];
    // A request interrupted meanwhile is answered ENOENT: nothing to do.
    unsafe { libc::writev(fd, iov.as_ptr(), 3) };
}

fn dev_loop(fd: RawFd, served: &AtomicU64) {
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::ENOENT) => continue,
                _ => return, // ENODEV: unmounted
            }
        }
        let n = n as usize;
        if n < IN_HEADER {
            continue;
        }
        let (opcode, unique, nodeid) = (u32_at(&buf, 4), u64_at(&buf, 8), u64_at(&buf, 16));
        if let Some((error, out, zeros)) = answer(opcode, nodeid, &buf[IN_HEADER..n]) {
            send(fd, unique, error, &out, &ZEROS[..zeros]);
            served.fetch_add(1, Ordering::Relaxed);
        }
        if opcode == DESTROY {
            return;
        }
    }
}

/// One ring entry's buffers, registered with the kernel.
struct Entry {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

fn uring_cmd(
    fd: RawFd,
    op: u32,
    slot: usize,
    qid: u16,
    commit_id: u64,
    iov: Option<u64>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(fd), op)
        .cmd(cmd)
        .addr(iov)
        .build()
        .user_data(slot as u64);
    if iov.is_none() {
        return sqe;
    }
    // REGISTER also names how many iovecs (header, payload) `addr` holds,
    // in the SQE's `len`, which the crate does not set for this opcode.
    // SAFETY: Entry128 is repr(C), 128 bytes: the kernel's io_uring_sqe
    // (len at byte 24) followed by the command's last 64 bytes.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn queue_loop(fd: RawFd, qid: u16, depth: usize, served: &AtomicU64) -> std::io::Result<()> {
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build((depth * 2).next_power_of_two() as u32)?;
    let mut entries: Vec<Entry> = (0..depth)
        .map(|_| {
            let mut header = vec![0u8; HEADER_BUF].into_boxed_slice();
            let mut payload = vec![0u8; BUF_SIZE].into_boxed_slice();
            let iov = Box::new([
                libc::iovec {
                    iov_base: header.as_mut_ptr().cast(),
                    iov_len: HEADER_BUF,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: BUF_SIZE,
                },
            ]);
            Entry {
                header,
                payload,
                iov,
            }
        })
        .collect();
    let register = |e: &Entry, slot: usize| {
        uring_cmd(fd, CMD_REGISTER, slot, qid, 0, Some(e.iov.as_ptr() as u64))
    };
    for (slot, e) in entries.iter().enumerate() {
        unsafe { ring.submission().push(&register(e, slot)) }.expect("queue has room");
    }
    let mut live = depth;
    while live > 0 {
        ring.submit_and_wait(1)?;
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (slot, res) in done {
            if res == -libc::EAGAIN {
                // The kernel has not taken the INIT answer in yet.
                std::thread::sleep(Duration::from_millis(1));
                unsafe { ring.submission().push(&register(&entries[slot], slot)) }
                    .expect("queue has room");
                continue;
            }
            if res < 0 {
                if res != -libc::ENOTCONN && res != -libc::ECANCELED {
                    return Err(std::io::Error::from_raw_os_error(-res));
                }
                live -= 1;
                continue;
            }
            let e = &mut entries[slot];
            let (h, p) = (&mut e.header, &mut e.payload);
            let len = u32_at(h, 0) as usize;
            let (opcode, unique, nodeid) = (u32_at(h, 4), u64_at(h, 8), u64_at(h, 16));
            let commit_id = u64_at(h, ENT + 8);
            let payload_sz = u32_at(h, ENT + 16) as usize;
            let op_in = len.saturating_sub(IN_HEADER + payload_sz).min(OP_IN);
            let mut args = h[OP_IN..OP_IN + op_in].to_vec();
            args.extend_from_slice(&p[..payload_sz.min(p.len())]);
            let (error, out, zeros) = answer(opcode, nodeid, &args).unwrap_or((0, Vec::new(), 0));
            let mut header = [0u8; OUT_HEADER];
            header[..4].copy_from_slice(&((OUT_HEADER + out.len() + zeros) as u32).to_ne_bytes());
            header[4..8].copy_from_slice(&error.to_ne_bytes());
            header[8..].copy_from_slice(&unique.to_ne_bytes());
            h[..OUT_HEADER].copy_from_slice(&header);
            // The answer's bytes go in the payload buffer; a read's zeros
            // are whatever it holds (this file system's data is not
            // checked), copied by the kernel as the answer's bytes would be.
            p[..out.len()].copy_from_slice(&out);
            h[ENT..ENT + 8].fill(0);
            h[ENT + 16..ENT + 20].copy_from_slice(&((out.len() + zeros) as u32).to_ne_bytes());
            served.fetch_add(1, Ordering::Relaxed);
            let commit = uring_cmd(fd, CMD_COMMIT_AND_FETCH, slot, qid, commit_id, None);
            unsafe { ring.submission().push(&commit) }.expect("queue has room");
        }
    }
    Ok(())
}
