//! What a peer reads from a connection: one HTTP/1.1 request, head and body
//! (`content-length` or chunked, trailers included), exactly as it arrived.

use std::io::{self, BufRead};

/// One request as it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// Everything read: the head, the blank line, the body (chunked framing included).
    pub bytes: Vec<u8>,
    /// How long the head is: the request line and the header lines, without the blank
    /// line.
    pub head_len: usize,
}

impl Received {
    /// The request line and the header lines, without the blank line.
    pub fn head(&self) -> &[u8] {
        self.bytes.get(..self.head_len).unwrap_or_default()
    }

    /// The request target of the request line (`/` if it has none).
    pub fn path(&self) -> String {
        let head = String::from_utf8_lossy(self.head());
        head.split_whitespace().nth(1).unwrap_or("/").to_owned()
    }
}

/// Reads a request: its head (empty lines before it are skipped) and its body.
///
/// # Errors
/// When the connection ends before a request, breaks off inside one, or a chunk size is
/// not hexadecimal.
pub fn read_request(reader: &mut impl BufRead) -> io::Result<Received> {
    let mut bytes = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if line.trim_ascii().is_empty() {
            if bytes.is_empty() {
                continue;
            }
            let head_len = bytes.len();
            bytes.extend_from_slice(&line);
            return read_body(reader, Received { bytes, head_len }, length, chunked);
        }
        bytes.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        if let Some((name, value)) = text.split_once(':') {
            match name.trim() {
                "content-length" => length = value.trim().parse().unwrap_or(0),
                "transfer-encoding" => chunked = value.contains("chunked"),
                _ => {}
            }
        }
    }
}

/// Reads the body that follows `request`'s head onto its bytes.
fn read_body(reader: &mut impl BufRead, mut request: Received, length: usize, chunked: bool) -> io::Result<Received> {
    if !chunked {
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body)?;
        request.bytes.extend_from_slice(&body);
        return Ok(request);
    }
    loop {
        let mut size_line = Vec::new();
        reader.read_until(b'\n', &mut size_line)?;
        request.bytes.extend_from_slice(&size_line);
        let size_text = String::from_utf8_lossy(&size_line);
        let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                let mut trailer = Vec::new();
                if reader.read_until(b'\n', &mut trailer)? == 0 {
                    return Ok(request);
                }
                request.bytes.extend_from_slice(&trailer);
                if trailer.trim_ascii().is_empty() {
                    return Ok(request);
                }
            }
        }
        let mut chunk = vec![0u8; size + 2];
        reader.read_exact(&mut chunk)?;
        request.bytes.extend_from_slice(&chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_read_with_its_body_and_the_next_one_is_left() {
        let mut wire: &[u8] = b"\r\nPOST /check HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\r\n";

        let first = read_request(&mut wire).expect("a request");

        assert_eq!(first.bytes, b"POST /check HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc");
        assert_eq!(
            (first.head(), first.path().as_str()),
            (&b"POST /check HTTP/1.1\r\ncontent-length: 3\r\n"[..], "/check")
        );
        assert_eq!(read_request(&mut wire).expect("the next one").bytes, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(read_request(&mut wire).map_err(|e| e.kind()), Err(io::ErrorKind::UnexpectedEof));
    }

    #[test]
    fn a_chunked_body_is_read_to_its_last_chunk_and_trailers() {
        let mut wire: &[u8] =
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\nrest";

        let request = read_request(&mut wire).expect("a request");

        assert!(request.bytes.ends_with(b"2\r\nok\r\n0\r\nx-t: 1\r\n\r\n"));
        assert_eq!(wire, b"rest");
    }
}
