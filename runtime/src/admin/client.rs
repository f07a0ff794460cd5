//! The admin API's client, for `valet-run policy push|list` and the `fs` commands with
//! `--admin`: a small HTTP/1.1 client, one request per connection, over TCP or a Unix socket.
//!
//! Why not hyper's client (already in the tree through axum): an upload the server refuses
//! from its headers alone (a wrong token, a module over the size limit) must come back as
//! the server's answer, not as a broken pipe under a client still writing the body. That
//! needs `Expect: 100-continue` from the client side, which hyper 1's client does not
//! implement (it sends the body at once), so this client does it itself: it sends the
//! head, waits briefly for `100 Continue` or the final answer, and only then the body.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::AdminAddr;

/// The admin token from `file`, or from `DEVICE/admin.token` where the server wrote it.
pub fn read_token(file: Option<PathBuf>, device: PathBuf) -> Result<String> {
    let path = file.unwrap_or_else(|| device.join("admin.token"));
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("reading the admin token {}", path.display()))?
        .trim()
        .to_string())
}

/// What an answer's JSON says went wrong, or its raw text.
pub fn api_error(code: u16, body: &[u8]) -> anyhow::Error {
    let text = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    anyhow::anyhow!("admin API answered {code}: {text}")
}

/// `s` as one segment of a request path: every byte but letters, digits and `-._~`
/// percent-encoded (a tenant named `a/b` or `a b` is still one segment).
pub fn path_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Sends one request; returns the status code and body.
pub fn request(
    addr: &AdminAddr,
    token: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>)> {
    // With a body, ask the server to look at the headers first: one that refuses the
    // request from them (a wrong token, a module over the size limit) answers before the
    // body is sent, instead of closing the connection under a client still writing it.
    let expect = if body.is_empty() {
        ""
    } else {
        "Expect: 100-continue\r\n"
    };
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: valet\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: {}\r\n{expect}Connection: close\r\n\r\n",
        body.len()
    );
    let mut response = Vec::new();
    let mut exchange = |s: &mut dyn Conn| -> std::io::Result<()> {
        s.write_all(head.as_bytes())?;
        if !body.is_empty() {
            if let Some(end) = interim(s, &mut response)? {
                if status_of(&response[..end]) != Some(100) {
                    // The final answer, given without the body.
                    return s.read_to_end(&mut response).map(drop);
                }
                response.drain(..end + 4);
            }
            match s.write_all(body).and_then(|()| s.flush()) {
                Ok(()) => {}
                // The server answered early and closed; its answer may still be readable.
                Err(e)
                    if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) =>
                {
                    let _ = s.read_to_end(&mut response);
                    return if response.is_empty() { Err(e) } else { Ok(()) };
                }
                Err(e) => return Err(e),
            }
        }
        s.read_to_end(&mut response)?;
        Ok(())
    };
    match addr {
        AdminAddr::Tcp(a) => {
            exchange(&mut TcpStream::connect(a).with_context(|| format!("connecting to {a}"))?)
        }
        AdminAddr::Unix(p) => exchange(
            &mut UnixStream::connect(p)
                .with_context(|| format!("connecting to {}", p.display()))?,
        ),
    }
    .context("talking to the admin API")?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("malformed HTTP response")?;
    let status_line = String::from_utf8_lossy(&response[..split]);
    let Some(code) = status_of(&response[..split]) else {
        bail!("malformed HTTP status line");
    };
    let body = decode_body(&status_line, &response[split + 4..]);
    Ok((code, body))
}

/// Undoes chunked transfer encoding when the server used it.
fn decode_body(head: &str, raw: &[u8]) -> Vec<u8> {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return raw.to_vec();
    }
    let mut out = Vec::new();
    let mut rest = raw;
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || eol + 2 + size > rest.len() {
            break;
        }
        out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
        rest = &rest[(eol + 4 + size).min(rest.len())..];
    }
    out
}

/// How long to wait for `100 Continue` before sending the body anyway (RFC 9110 §10.1.1).
const CONTINUE_WAIT: Duration = Duration::from_secs(2);

/// The status code of a response head.
fn status_of(head: &[u8]) -> Option<u16> {
    String::from_utf8_lossy(head)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
}

/// Reads the server's first response head into `response`; returns where it ends (the
/// `\r\n\r\n`), or None when the server said nothing within [`CONTINUE_WAIT`].
fn interim(s: &mut dyn Conn, response: &mut Vec<u8>) -> std::io::Result<Option<usize>> {
    s.set_read_timeout(Some(CONTINUE_WAIT))?;
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(end) = response.windows(4).position(|w| w == b"\r\n\r\n") {
            break Some(end);
        }
        match s.read(&mut chunk) {
            Ok(0) => break None,
            Ok(n) => response.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if response.is_empty() {
                    break None;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    s.set_read_timeout(None)?;
    Ok(end)
}

/// A connection to the API.
trait Conn: Read + Write {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()>;
}

impl Conn for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
}

impl Conn for UnixStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
}
