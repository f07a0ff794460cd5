//! Serving the admin API and the metrics listener with the bounds `axum::serve` does not
//! set: it gives hyper no timer, so a connection that never sends a whole request's headers
//! lives forever, and it accepts every connection, so idle clients could take all of the
//! process's descriptors (which the guests' files need too).
//!
//! Here each connection must send its request's headers within [`Bounds::header_timeout`]
//! (a keep-alive connection too, for each next request), and at most
//! [`Bounds::max_connections`] are served at once: the next waits in the kernel's backlog,
//! not accepted, until one ends.

use std::sync::Arc;
use std::time::Duration;

use axum::serve::Listener;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

/// What one server allows its clients.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Time from the connection's start, or from its last answer, to a request's headers.
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            header_timeout: Duration::from_secs(10),
            max_connections: 64,
        }
    }
}

/// Serves `app` on `listener` within `bounds`, until the runtime stops. The runtime needs
/// its time driver (the header timeout).
pub async fn serve<L: Listener>(mut listener: L, app: Router, bounds: Bounds) {
    let slots = Arc::new(Semaphore::new(bounds.max_connections.max(1)));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (io, _) = listener.accept().await;
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(bounds.header_timeout);
            // A client that goes away or breaks the protocol is no error of the server's.
            let _ = http.serve_connection(TokioIo::new(io), service).await;
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;

    use axum::routing::get;

    /// A server on a thread of its own, as the admin API and the metrics listener run.
    fn start(bounds: Bounds) -> std::net::SocketAddr {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", get(|| async { "hi" }));
        std::thread::spawn(move || runtime.block_on(serve(listener, app, bounds)));
        addr
    }

    fn get_root(conn: &mut TcpStream) -> std::io::Result<String> {
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut answer = String::new();
        conn.read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// A connection that sends nothing is closed by the server (the read sees its end);
    /// without the timeout it would stay open until the guard below gave up.
    #[test]
    fn a_connection_without_a_request_is_closed() {
        let addr = start(Bounds {
            header_timeout: Duration::from_millis(100),
            max_connections: 4,
        });
        let mut idle = TcpStream::connect(addr).unwrap();
        // A guard against hanging forever, not a measure of speed.
        idle.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut buf = [0u8; 64];
        match idle.read(&mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the idle connection was not closed: {e}"),
        }
        let mut conn = TcpStream::connect(addr).unwrap();
        assert!(get_root(&mut conn).unwrap().ends_with("hi"));
    }

    /// Past the cap a connection is not served until one of those served ends.
    #[test]
    fn connections_past_the_cap_wait_for_one_to_end() {
        let addr = start(Bounds {
            header_timeout: Duration::from_secs(600),
            max_connections: 1,
        });
        let first = TcpStream::connect(addr).unwrap();
        let mut second = TcpStream::connect(addr).unwrap();
        second
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let waited = get_root(&mut second).unwrap_err();
        assert!(
            matches!(waited.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
            "{waited}"
        );
        drop(first);
        let mut third = TcpStream::connect(addr).unwrap();
        drop(second);
        third
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        assert!(get_root(&mut third).unwrap().ends_with("hi"));
    }
}
