//! The data port: block bytes between clients and this node's block files.
//!
//! A connection opens with [`DATA_MAGIC`] and the protocol version; the node
//! answers [`DataReply::Hello`]. Then the client sends [`DataRequest`] frames.
//! Every request carries a token the namespace issued; the port checks it
//! before touching a block. Reads go from the block file to the socket with
//! `sendfile`; bytes never pass through an actor mailbox. A connection that
//! sends garbage, a bad token or stops half way is closed and logged; it
//! affects nothing else.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::{TcpListener, TcpStream};

use curvine_actors::blocks::{BlockManagerRef, BlockStore};
use curvine_actors::token::TokenKey;
use curvine_messages::block::{
    next_reservation, units, verify_units, Access, BlockMsg, BlockRecord, DataFrame, DataReply,
    DataRequest, LocalCommit, CHECKSUM_UNIT, DATA_MAGIC, DATA_VERSION, FIRST_RESERVATION,
    MAX_BLOCK_SIZE, MAX_CHUNK,
};
use curvine_messages::codec::{from_bytes, to_bytes};
use curvine_messages::{FsError, FsResult};

use curvine_wire::frame::{read_frame, write_frame};
use curvine_wire::tls::{Accepted, Tls, Transport};

use crate::service::fills::Fills;

/// What every connection of the data port needs.
#[derive(Clone)]
pub struct DataContext {
    pub store: Arc<BlockStore>,
    pub manager: BlockManagerRef,
    pub tokens: TokenKey,
    pub node_id: String,
    pub host_key: String,
    /// Fills of UFS blocks.
    pub fills: Arc<Fills>,
    pub metrics: curvine_actors::stats::Metrics,
    pub tracer: curvine_actors::trace::Tracer,
    /// TLS settings when the data port is encrypted.
    pub tls: Option<Arc<Tls>>,
}

/// An error that ends the connection (the stream is out of step).
struct Fatal(String);

type Stream = BufReader<Transport>;

async fn reply(stream: &mut Stream, reply: &DataReply) -> std::io::Result<()> {
    let bytes = to_bytes("data reply", reply)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let s = stream.get_mut();
    write_frame(s, &bytes).await?;
    s.flush().await
}

/// Writes a chunk header with MSG_MORE, so the kernel sends it in the same
/// segment as the bytes that follow instead of a packet of its own (over
/// TLS, into the record that carries them).
async fn send_more(stream: &mut Transport, bytes: &[u8]) -> std::io::Result<()> {
    match stream.plain() {
        Some(tcp) => send_more_tcp(tcp, bytes).await,
        None => stream.write_all(bytes).await,
    }
}

async fn send_more_tcp(stream: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: the pointer and length describe a live slice.
            let r = unsafe {
                libc::send(
                    stream.as_raw_fd(),
                    bytes.as_ptr().cast(),
                    bytes.len(),
                    libc::MSG_MORE | libc::MSG_NOSIGNAL,
                )
            };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        });
        match sent {
            Ok(k) => bytes = &bytes[k..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends `n` bytes of `file` from `offset`: with sendfile(2) on a plain
/// connection, through `buf` over TLS.
async fn send_file(
    stream: &mut Transport,
    file: &File,
    offset: u64,
    n: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    if let Some(tcp) = stream.plain() {
        return sendfile_tcp(tcp, file, offset, n).await;
    }
    if buf.len() < n {
        buf.resize(n, 0);
    }
    file.read_exact_at(&mut buf[..n], offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            std::io::Error::new(e.kind(), "block file is shorter than its index says")
        } else {
            e
        }
    })?;
    stream.write_all(&buf[..n]).await
}

async fn sendfile_tcp(
    stream: &TcpStream,
    file: &File,
    offset: u64,
    n: usize,
) -> std::io::Result<()> {
    let mut off = offset as libc::off_t;
    let mut left = n;
    while left > 0 {
        stream.writable().await?;
        let sent = stream.try_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors are open for the duration of the call.
            let r = unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut off, left) };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        });
        match sent {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "block file is shorter than its index says",
                ))
            }
            Ok(k) => left -= k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub async fn serve(listener: TcpListener, ctx: DataContext) {
    loop {
        let (stream, peer) = crate::ports::next_connection(&listener, "data port").await;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let stream = match open(stream, ctx.tls.as_deref()).await {
                Ok(Some(stream)) => stream,
                Ok(None) => {
                    tracing::warn!(%peer, "refused a plain data connection: this node's data port requires TLS");
                    return;
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "refused a data connection");
                    return;
                }
            };
            match connection(stream, &ctx).await {
                Ok(()) => {}
                Err(e) => tracing::warn!(%peer, error = %e, "data connection closed"),
            }
        });
    }
}

/// The connection's transport: TLS after its handshake when the port is
/// encrypted; `None` when the client spoke plain to it (answered with a
/// refusal that says so).
async fn open(stream: TcpStream, tls: Option<&Tls>) -> std::io::Result<Option<Transport>> {
    let (stream, timeout) = match Accepted::from(stream, tls).await? {
        Accepted::Ready(transport) => return Ok(Some(transport)),
        Accepted::PlainOnTls { stream, timeout } => (stream, timeout),
    };
    let mut stream = BufReader::new(Transport::Plain(stream));
    let mut hello = [0u8; 6];
    tokio::time::timeout(timeout, stream.read_exact(&mut hello))
        .await
        .map_err(|_| std::io::Error::other("no opening"))??;
    reply(
        &mut stream,
        &DataReply::Hello {
            accepted: false,
            message: "this node requires TLS on its data port: set tls.enabled = true, \
                      tls.data = true and tls.ca in the client's config"
                .into(),
            node_id: String::new(),
            host_key: String::new(),
        },
    )
    .await?;
    Ok(None)
}

async fn connection(stream: Transport, ctx: &DataContext) -> Result<(), String> {
    let mut stream = BufReader::with_capacity(256 * 1024, stream);
    let mut hello = [0u8; 6];
    stream
        .read_exact(&mut hello)
        .await
        .map_err(|e| format!("no hello: {e}"))?;
    let version = u16::from_be_bytes([hello[4], hello[5]]);
    let refusal = if hello[..4] != DATA_MAGIC {
        Some("this is a curvine data port; the peer did not speak its protocol".to_string())
    } else if version != DATA_VERSION {
        Some(format!(
            "client speaks data protocol version {version}, this node {DATA_VERSION}"
        ))
    } else {
        None
    };
    let accepted = refusal.is_none();
    reply(
        &mut stream,
        &DataReply::Hello {
            accepted,
            message: refusal.clone().unwrap_or_default(),
            node_id: ctx.node_id.clone(),
            host_key: ctx.host_key.clone(),
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    if let Some(why) = refusal {
        return Err(why);
    }
    loop {
        let frame = match read_frame(&mut stream).await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => return Err(format!("bad frame: {e}")),
        };
        let DataFrame { trace, request } = match from_bytes("data request", &frame) {
            Ok(r) => r,
            Err(e) => {
                let _ = reply(&mut stream, &DataReply::Error(FsError::from(e.clone()))).await;
                return Err(format!("garbage request: {e}"));
            }
        };
        let kind = request.kind_name();
        let started = std::time::Instant::now();
        // A traced request gets a span; what it asks of other actors and
        // nodes (the block manager, a UFS fill's namespace calls) joins it.
        let span = ctx.tracer.start(trace, 0, "data-server", "port", kind);
        let handled = curvine_actors::trace::scope(
            span.as_ref().map(|s| s.ctx()),
            handle(&mut stream, ctx, request),
        )
        .await;
        if let Some(span) = span {
            span.end(match &handled {
                Ok(Ok(_)) => curvine_messages::trace::Outcome::Ok,
                Ok(Err(e)) => curvine_messages::trace::Outcome::Error(e.kind_name().into()),
                Err(_) => curvine_messages::trace::Outcome::Error("broken".into()),
            });
        }
        let outcome = match &handled {
            Ok(Ok(_)) => "ok",
            Ok(Err(_)) => "error",
            Err(_) => "broken",
        };
        ctx.metrics
            .histogram(
                "curvine_data_request_duration_seconds",
                "Time the data port took to serve a request, per request kind.",
                &[("kind", kind)],
            )
            .observe(started.elapsed());
        ctx.metrics.add(
            "curvine_data_requests_total",
            "Requests the data port served, per request kind and outcome.",
            &[("kind", kind), ("outcome", outcome)],
            1,
        );
        match kind {
            "read" | "open_local" => ctx.metrics.add(
                "curvine_cache_hits_total",
                "Block reads served from this node's cache (data port and short-circuit opens).",
                &[],
                1,
            ),
            "fill" => ctx.metrics.add(
                "curvine_cache_misses_total",
                "Block reads that had to fetch from the under-file-system (fills).",
                &[],
                1,
            ),
            _ => {}
        }
        match handled {
            Ok(Ok(Some(r))) => reply(&mut stream, &r).await.map_err(|e| e.to_string())?,
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "data request failed");
                reply(&mut stream, &DataReply::Error(e))
                    .await
                    .map_err(|e| e.to_string())?
            }
            Err(Fatal(why)) => return Err(why),
        }
    }
}

async fn handle(stream: &mut Stream, ctx: &DataContext, request: DataRequest) -> Handled {
    match request {
        DataRequest::Read { token, offset, len } => {
            if let Err(e) = ctx.tokens.check(&token, Access::Read) {
                return Ok(Err(e));
            }
            read(stream, ctx, token.block, offset, len).await
        }
        DataRequest::Write {
            token,
            tier,
            size_hint,
        } => {
            if let Err(e) = ctx.tokens.check(&token, Access::Write) {
                return Ok(Err(e));
            }
            write(stream, ctx, token.block, tier, size_hint)
                .await
                .map(|r| r.map(Some))
        }
        DataRequest::OpenLocal { token } => Ok(async {
            ctx.tokens.check(&token, Access::Read)?;
            let (record, path) = ctx.store.locate(token.block)?;
            ctx.store.touch(token.block);
            ctx.metrics.add(
                "curvine_data_bytes_local_total",
                crate::service::files::LOCAL_BYTES_HELP,
                &[],
                record.len,
            );
            Ok(DataReply::Local {
                path: path.display().to_string(),
                len: record.len,
                offset: record.offset(),
                crcs: record.crcs,
            })
        }
        .await
        .map(Some)),
        DataRequest::CreateLocal {
            token,
            tier,
            size_hint,
            after,
        } => Ok(async {
            ctx.tokens.check(&token, Access::Write)?;
            let r = reserve(ctx, token.block, tier, size_hint, after).await?;
            Ok(DataReply::Local {
                path: r.path,
                len: 0,
                crcs: Vec::new(),
                offset: r.offset,
            })
        }
        .await
        .map(Some)),
        DataRequest::CommitLocal { token, len, crcs } => {
            let c = LocalCommit { token, len, crcs };
            Ok(ctx
                .manager
                .commit_local(&ctx.store, &ctx.tokens, c)
                .await
                .map(|crc| Some(DataReply::Committed { len, crc })))
        }
        DataRequest::Fill {
            token,
            path,
            index,
            offset,
            len,
        } => {
            if let Err(e) = ctx.tokens.check(&token, Access::Fill) {
                return Ok(Err(e));
            }
            fill(stream, &ctx.fills, token.block, &path, index, offset, len).await
        }
        DataRequest::Abort { token } => Ok(async {
            ctx.tokens.check(&token, Access::Write)?;
            ctx.manager.cast(BlockMsg::Abort { block: token.block });
            Ok(DataReply::Done)
        }
        .await
        .map(Some)),
    }
}

/// Streams a block of a UFS file from its object (see `Fills::start_fill`).
async fn fill(
    stream: &mut Stream,
    fills: &Arc<Fills>,
    ino: u64,
    path: &str,
    index: u32,
    offset: u64,
    len: u64,
) -> Handled {
    let mut fill = match fills.start_fill(ino, path, index, offset, len, false).await {
        Ok(f) => f,
        Err(e) => return Ok(Err(e)),
    };
    let fatal = |e: std::io::Error| Fatal(format!("sending {path} block {index}: {e}"));
    reply(
        stream,
        &DataReply::Reading {
            offset: fill.offset,
            len: fill.len,
        },
    )
    .await
    .map_err(fatal)?;
    let mut header = Vec::with_capacity(4 + 4 * (MAX_CHUNK / CHECKSUM_UNIT));
    let mut sent = 0u64;
    while sent < fill.len {
        match fill.chunks.recv().await {
            Some(Ok((_, data, crcs))) => {
                curvine_messages::block::chunk_header(data.len(), &crcs, &mut header);
                let s = stream.get_mut();
                send_more(s, &header).await.map_err(fatal)?;
                s.write_all(&data).await.map_err(fatal)?;
                sent += data.len() as u64;
            }
            Some(Err(e)) => {
                let s = stream.get_mut();
                s.write_all(&curvine_messages::block::ERROR_CHUNK.to_be_bytes())
                    .await
                    .map_err(fatal)?;
                reply(stream, &DataReply::Error(e.clone()))
                    .await
                    .map_err(fatal)?;
                return Err(Fatal(format!("{path} block {index}: {e}")));
            }
            None => {
                return Err(Fatal(format!(
                    "{path} block {index}: the fill ended after {sent} of {} bytes",
                    fill.len
                )))
            }
        }
    }
    stream.get_mut().flush().await.map_err(fatal)?;
    Ok(Ok(None))
}

/// `Ok(Ok(None))`: the reply was sent with the bytes.
type Handled = Result<FsResult<Option<DataReply>>, Fatal>;

/// Reserves room for a new block (at most the largest block size).
async fn reserve(
    ctx: &DataContext,
    block: u64,
    tier: Option<curvine_messages::block::TierKind>,
    size_hint: u64,
    after: Option<(u64, u64)>,
) -> FsResult<curvine_messages::block::Reservation> {
    let size = size_hint.clamp(1, MAX_BLOCK_SIZE);
    ctx.manager.reserve(block, tier, size, true, after).await
}

/// Grows the reservation of a block being written from `reserved` to hold
/// `need` bytes: at least double (see [`next_reservation`]) where a tier
/// has room for that, else exactly `need`. Returns the new reservation.
async fn grow(
    ctx: &DataContext,
    block: u64,
    tier: Option<curvine_messages::block::TierKind>,
    reserved: u64,
    need: u64,
    cap: u64,
) -> FsResult<u64> {
    let more = next_reservation(reserved, need, cap);
    let doubled = if more > need {
        // Without making room: exactly `need` is asked next, making room.
        let size = more.clamp(1, MAX_BLOCK_SIZE);
        ctx.manager
            .reserve_now(block, tier, (size, true), None)
            .await
    } else {
        reserve(ctx, block, tier, more, None).await
    };
    match doubled {
        Err(FsError::NoSpace(_)) if more > need => {
            reserve(ctx, block, tier, need, None).await.map(|_| need)
        }
        r => r.map(|_| more),
    }
}

/// A block's record and its file, opened. A block moved between finding
/// its record and opening its file (to another tier, or into an extent
/// file) is found again once.
fn open_block(ctx: &DataContext, block: u64) -> FsResult<(BlockRecord, File)> {
    let mut last = None;
    for _ in 0..2 {
        let (record, path) = ctx.store.locate(block)?;
        match File::open(&path) {
            Ok(f) => return Ok((record, f)),
            Err(e) => last = Some(format!("block {block:#x} file {}: {e}", path.display())),
        }
    }
    Err(FsError::Io(last.unwrap_or_default()))
}

async fn read(
    stream: &mut Stream,
    ctx: &DataContext,
    block: u64,
    offset: u64,
    len: u64,
) -> Handled {
    let (record, file) = match open_block(ctx, block) {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    if offset >= record.len && !(offset == 0 && record.len == 0) {
        return Ok(Err(FsError::InvalidArgument(format!(
            "read at {offset} past the end of block {block:#x} ({} bytes)",
            record.len
        ))));
    }
    let base = record.offset();
    let unit = CHECKSUM_UNIT as u64;
    let start = offset / unit * unit;
    let end = offset.saturating_add(len).min(record.len);
    let end = end.div_ceil(unit).saturating_mul(unit).min(record.len);
    let fatal = |e: std::io::Error| Fatal(format!("sending block {block:#x}: {e}"));
    let reading = DataReply::Reading {
        offset: start,
        len: end - start,
    };
    if start == end {
        reply(stream, &reading).await.map_err(fatal)?;
    } else {
        // The reply goes out in one segment with the first chunk.
        let bytes = to_bytes("data reply", &reading).map_err(|e| Fatal(e.to_string()))?;
        let mut frame = Vec::with_capacity(4 + bytes.len());
        frame.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        frame.extend_from_slice(&bytes);
        send_more(stream.get_mut(), &frame).await.map_err(fatal)?;
    }
    let mut pos = start;
    let mut header = Vec::with_capacity(4 + 4 * (MAX_CHUNK / CHECKSUM_UNIT));
    let mut buf = Vec::new();
    while pos < end {
        let n = (end - pos).min(MAX_CHUNK as u64) as usize;
        let first = (pos / unit) as usize;
        let last = first + units(n as u64);
        let crcs = record
            .crcs
            .get(first..last)
            .ok_or_else(|| Fatal(format!("block {block:#x} index has too few checksums")))?;
        curvine_messages::block::chunk_header(n, crcs, &mut header);
        let s = stream.get_mut();
        send_more(s, &header).await.map_err(fatal)?;
        send_file(s, &file, base + pos, n, &mut buf)
            .await
            .map_err(fatal)?;
        pos += n as u64;
    }
    // Over TLS the last records may still sit in the session's buffer.
    stream.get_mut().flush().await.map_err(fatal)?;
    ctx.store.touch(block);
    ctx.metrics.add(
        "curvine_data_bytes_sent_total",
        "Block bytes this node's data port sent to readers (short-circuit reads do not pass it: see curvine_data_bytes_local_total).",
        &[],
        end - start,
    );
    // The bytes were the reply; nothing follows them.
    Ok(Ok(None))
}

async fn write(
    stream: &mut Stream,
    ctx: &DataContext,
    block: u64,
    tier: Option<curvine_messages::block::TierKind>,
    size_hint: u64,
) -> Result<FsResult<DataReply>, Fatal> {
    let size = size_hint.clamp(1, MAX_BLOCK_SIZE);
    // The node reserves what was announced where a tier has room for it,
    // else a first part, grown as the bytes arrive (a no-op for the whole).
    let mut reserved = size.min(FIRST_RESERVATION);
    let reservation = match reserve(ctx, block, tier, size, None).await {
        Ok(r) => r,
        Err(e) => return Ok(Err(e)),
    };
    let abort = |ctx: &DataContext| ctx.manager.cast(BlockMsg::Abort { block });
    let mut file = match OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&reservation.path)
    {
        Ok(f) => f,
        Err(e) => {
            abort(ctx);
            return Ok(Err(FsError::Io(format!(
                "tier {} file {}: {e}",
                reservation.tier, reservation.path
            ))));
        }
    };
    if let Err(e) = reply(stream, &DataReply::Ready).await {
        abort(ctx);
        return Err(Fatal(e.to_string()));
    }
    let mut crcs: Vec<u32> = Vec::new();
    let mut total: u64 = 0;
    let mut data = Vec::with_capacity(MAX_CHUNK);
    let mut last_short = false;
    let outcome: Result<(), Result<FsError, Fatal>> = async {
        loop {
            let n = stream
                .read_u32()
                .await
                .map_err(|e| Err(Fatal(format!("block {block:#x}: writer went away: {e}"))))?
                as usize;
            if n == 0 {
                return Ok(());
            }
            if n > MAX_CHUNK || last_short {
                return Err(Err(Fatal(format!(
                    "block {block:#x}: bad chunk of {n} bytes (chunks are at most {MAX_CHUNK} bytes and only the last may be short of a checksum unit)"
                ))));
            }
            if total + n as u64 > size {
                return Err(Err(Fatal(format!(
                    "block {block:#x}: more bytes than the {size} announced"
                ))));
            }
            if total + n as u64 > reserved {
                reserved = grow(ctx, block, tier, reserved, total + n as u64, size)
                    .await
                    .map_err(Ok)?;
            }
            last_short = !n.is_multiple_of(CHECKSUM_UNIT);
            let mut chunk_crcs = vec![0u32; units(n as u64)];
            for c in chunk_crcs.iter_mut() {
                *c = stream
                    .read_u32()
                    .await
                    .map_err(|e| Err(Fatal(format!("block {block:#x}: {e}"))))?;
            }
            data.resize(n, 0);
            stream
                .read_exact(&mut data)
                .await
                .map_err(|e| Err(Fatal(format!("block {block:#x}: writer went away: {e}"))))?;
            verify_units(&data, &chunk_crcs, crcs.len(), &format!("block {block:#x} as received"))
                .map_err(|e| {
                    ctx.store
                        .checksum_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Err(Fatal(e.to_string()))
                })?;
            file.write_all(&data).map_err(|e| {
                Ok(if e.raw_os_error() == Some(libc::ENOSPC) {
                    FsError::NoSpace(format!("tier {} ({}) is full", reservation.tier, reservation.path))
                } else {
                    FsError::Io(format!("writing {}: {e}", reservation.path))
                })
            })?;
            crcs.extend_from_slice(&chunk_crcs);
            total += n as u64;
        }
    }
    .await;
    match outcome {
        Ok(()) => {}
        Err(Ok(e)) => {
            abort(ctx);
            // The client is still sending; the stream is out of step after this.
            let _ = reply(stream, &DataReply::Error(e.clone())).await;
            return Err(Fatal(e.to_string()));
        }
        Err(Err(fatal)) => {
            abort(ctx);
            let _ = reply(
                stream,
                &DataReply::Error(FsError::Protocol(fatal.0.clone())),
            )
            .await;
            return Err(fatal);
        }
    }
    if ctx.store.syncs_kind(reservation.tier) {
        if let Err(e) = file.sync_data() {
            abort(ctx);
            return Ok(Err(FsError::Io(format!("sync {}: {e}", reservation.path))));
        }
    }
    drop(file);
    let len = total;
    Ok(ctx
        .manager
        .call(move |reply| BlockMsg::Commit {
            block,
            len,
            crcs: crcs.clone(),
            reply,
        })
        .await
        .map(|crc| DataReply::Committed { len, crc }))
}
