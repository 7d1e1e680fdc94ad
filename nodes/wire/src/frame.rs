//! Length-prefixed frames: what the client port and the data port send
//! their postcard payloads in (a u32 length, big-endian, then the bytes).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use curvine_messages::codec::check_frame_len;

/// Writes one length-prefixed frame.
pub async fn write_frame<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    payload: &[u8],
) -> std::io::Result<()> {
    let len = (payload.len() as u32).to_be_bytes();
    if payload.len() <= SMALL_FRAME {
        // One write, so one segment (and one wake-up of the reader)
        // instead of the length on its own ahead of the payload.
        let mut frame = Vec::with_capacity(4 + payload.len());
        frame.extend_from_slice(&len);
        frame.extend_from_slice(payload);
        return w.write_all(&frame).await;
    }
    w.write_all(&len).await?;
    w.write_all(payload).await
}

/// Frames up to this size are written with their length in one write.
const SMALL_FRAME: usize = 64 * 1024;

/// Reads one length-prefixed frame; `None` at a clean end of stream.
pub async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    check_frame_len(len)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    Ok(Some(buf))
}
