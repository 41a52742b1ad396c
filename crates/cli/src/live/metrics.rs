//! `--metrics ADDR`: the verdict served at `/metrics` for Prometheus.
//!
//! Under `capture --watch` this runs in the process that runs the job, so
//! nobody who can reach the port may be able to harm the job: one thread
//! serves every connection from a poll loop; at most [`MAX_CONNECTIONS`]
//! are open at once (a new one closes the oldest), each is closed
//! [`REQUEST_TIMEOUT`] after it opened, and a request of more than
//! [`MAX_REQUEST`] bytes is refused. A peer costs no thread and at most
//! one bounded buffer. Written on mio, not on an HTTP server crate: the
//! one used before (tiny_http) kept a thread for each connection and read a
//! request line without bound, and a GET of one path needs nothing more
//! than its request line.

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};

/// The OpenMetrics content type (what Prometheus asks for).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Connections open at once; a new one past it closes the oldest.
pub(crate) const MAX_CONNECTIONS: usize = 64;
/// How long a connection may take to send its request and read the answer.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest request read (Prometheus sends a few hundred bytes).
pub(crate) const MAX_REQUEST: usize = 8 * 1024;

const LISTENER: Token = Token(0);
const STOP: Token = Token(1);

/// The `/metrics` server, on its own thread, answering with the latest text
/// handed to [`MetricsServer::set`].
pub(crate) struct MetricsServer {
    text: Arc<Mutex<String>>,
    stop: Waker,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`, or `PORT` for loopback only) and
    /// says on stderr where, and that every host can read it when the
    /// address is not a loopback one.
    pub(crate) fn start(addr: &str) -> anyhow::Result<MetricsServer> {
        let addr = if addr.bytes().all(|b| b.is_ascii_digit()) {
            format!("127.0.0.1:{addr}")
        } else {
            addr.to_owned()
        };
        let listener = std::net::TcpListener::bind(&addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .with_context(|| format!("--metrics {addr}: cannot listen"))?;
        let bound = listener.local_addr()?;
        let mut listener = TcpListener::from_std(listener);
        let poll = Poll::new().context("--metrics: cannot poll")?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let stop = Waker::new(poll.registry(), STOP)?;
        eprintln!("snapdiff: metrics at http://{bound}/metrics");
        if !bound.ip().is_loopback() {
            eprintln!(
                "snapdiff: --metrics {bound} is open to every host that can reach this one \
                 (it tells them the job's hosts, process names and source paths)"
            );
        }
        let text = Arc::new(Mutex::new(String::from("# EOF\n")));
        let thread = {
            let text = Arc::clone(&text);
            std::thread::Builder::new()
                .name("snapdiff-metrics".into())
                .spawn(move || serve(poll, listener, &text))?
        };
        Ok(MetricsServer {
            text,
            stop,
            thread: Some(thread),
        })
    }

    /// What the next scrape gets.
    pub(crate) fn set(&self, text: String) {
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = text;
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if self.stop.wake().is_ok()
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

/// The poll loop: accepts, reads requests, answers, closes; returns when
/// woken by [`STOP`] or when polling fails (the metrics stop, the job and
/// the watch go on).
fn serve(mut poll: Poll, listener: TcpListener, text: &Mutex<String>) {
    let mut events = Events::with_capacity(256);
    // By token, and tokens only grow: the first is the oldest.
    let mut open: BTreeMap<Token, Connection> = BTreeMap::new();
    let mut next_token = STOP.0 + 1;
    loop {
        let timeout = open
            .values()
            .next()
            .map(|c| (c.opened + REQUEST_TIMEOUT).saturating_duration_since(Instant::now()));
        if let Err(e) = poll.poll(&mut events, timeout)
            && e.kind() != ErrorKind::Interrupted
        {
            return;
        }
        for event in events.iter() {
            match event.token() {
                STOP => return,
                LISTENER => {
                    // Accepted until none is waiting (mio's events are
                    // edge-triggered); a failure (no descriptor left) waits
                    // for the next connection.
                    while let Ok((mut stream, _)) = listener.accept() {
                        if open.len() >= MAX_CONNECTIONS
                            && let Some((_, mut oldest)) = open.pop_first()
                        {
                            let _ = poll.registry().deregister(&mut oldest.stream);
                        }
                        let token = Token(next_token);
                        next_token += 1;
                        let interest = Interest::READABLE | Interest::WRITABLE;
                        if poll
                            .registry()
                            .register(&mut stream, token, interest)
                            .is_ok()
                        {
                            open.insert(token, Connection::new(stream));
                        }
                    }
                }
                token => {
                    if let Some(connection) = open.get_mut(&token)
                        && connection.advance(text) != Progress::Waiting
                        && let Some(mut done) = open.remove(&token)
                    {
                        let _ = poll.registry().deregister(&mut done.stream);
                    }
                }
            }
        }
        let now = Instant::now();
        while let Some(entry) = open.first_entry()
            && entry.get().opened + REQUEST_TIMEOUT <= now
        {
            let _ = poll.registry().deregister(&mut entry.remove().stream);
        }
    }
}

/// One client's connection: its request as read so far, then the answer
/// and how much of it was written.
struct Connection {
    stream: TcpStream,
    opened: Instant,
    request: Vec<u8>,
    answer: Vec<u8>,
    written: usize,
}

#[derive(Debug, PartialEq)]
enum Progress {
    /// More to read or to write when the socket is ready.
    Waiting,
    /// Answered, or the peer went away: close it.
    Finished,
}

impl Connection {
    fn new(stream: TcpStream) -> Connection {
        Connection {
            stream,
            opened: Instant::now(),
            request: Vec::new(),
            answer: Vec::new(),
            written: 0,
        }
    }

    /// Reads what the socket has (until the request's header ends), then
    /// writes what the socket takes of the answer.
    fn advance(&mut self, text: &Mutex<String>) -> Progress {
        let mut chunk = [0u8; 4096];
        while self.answer.is_empty() {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Progress::Finished,
                Ok(n) => {
                    self.request.extend_from_slice(&chunk[..n]);
                    if let Some(end) = header_end(&self.request) {
                        self.answer = answer(&self.request[..end], text);
                    } else if self.request.len() > MAX_REQUEST {
                        self.answer = response("431 Request Header Fields Too Large", "", "");
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Progress::Finished,
            }
        }
        self.request = Vec::new();
        while self.written < self.answer.len() {
            match self.stream.write(&self.answer[self.written..]) {
                Ok(0) => return Progress::Finished,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Progress::Finished,
            }
        }
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        Progress::Finished
    }
}

/// Where the request's header ends (after its blank line), if it has.
fn header_end(request: &[u8]) -> Option<usize> {
    let crlf = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    crlf.or_else(|| request.windows(2).position(|w| w == b"\n\n").map(|i| i + 2))
}

/// The answer to a request: the metrics for `GET /metrics`.
fn answer(request: &[u8], text: &Mutex<String>) -> Vec<u8> {
    let line = request.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.trim_ascii().split(|&b| b == b' ');
    let (method, target) = (words.next(), words.next().unwrap_or_default());
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (Some(b"GET"), b"/metrics") => {
            let body = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
            response("200 OK", CONTENT_TYPE, &body)
        }
        (Some(b"GET"), _) => response(
            "404 Not Found",
            "text/plain; charset=utf-8",
            "snapdiff serves /metrics\n",
        ),
        _ => response(
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "snapdiff answers GET /metrics\n",
        ),
    }
}

/// An HTTP/1.1 response that closes the connection.
fn response(status: &str, content_type: &str, body: &str) -> Vec<u8> {
    let mut head = format!("HTTP/1.1 {status}\r\n");
    if !content_type.is_empty() {
        head.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpStream as StdStream};

    /// A server on a free loopback port, and its address. A port free a
    /// moment ago may be taken by a test running beside this one before
    /// the server binds it: another is tried then.
    fn server() -> (MetricsServer, SocketAddr) {
        for _ in 0..100 {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            drop(listener);
            if let Ok(server) = MetricsServer::start(&port.to_string()) {
                server.set("snapdiff_suspects 3\n# EOF\n".into());
                return (server, format!("127.0.0.1:{port}").parse().unwrap());
            }
        }
        panic!("no loopback port could be listened on");
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = StdStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.write_all(request).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn a_port_alone_listens_on_loopback_and_serves_the_text_set() {
        let (_server, addr) = server();
        let answer = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains(CONTENT_TYPE), "{answer}");
        assert!(
            answer.ends_with("\r\n\r\nsnapdiff_suspects 3\n# EOF\n"),
            "{answer}"
        );
        let answer = get(addr, b"GET /other HTTP/1.1\r\n\r\n");
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    }

    #[test]
    fn idle_connections_and_an_endless_request_line_leave_scrapes_answered() {
        let (_server, addr) = server();
        // Four times as many idle connections as are kept: the oldest are
        // closed, the newest scrape is answered.
        let idle: Vec<StdStream> = (0..4 * MAX_CONNECTIONS)
            .map(|_| StdStream::connect(addr).unwrap())
            .collect();
        let answer = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(answer.contains("snapdiff_suspects 3"), "{answer}");
        // A request line without an end is refused once past the bound;
        // the writer sees the connection closed long before 64 MiB.
        let mut endless = StdStream::connect(addr).unwrap();
        endless.write_all(b"GET /").unwrap();
        let chunk = vec![b'a'; 64 * 1024];
        let sent = (0..1024)
            .take_while(|_| endless.write_all(&chunk).is_ok())
            .count();
        assert!(sent < 1024, "a request line of 64 MiB was read");
        let answer = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(answer.contains("snapdiff_suspects 3"), "{answer}");
        drop(idle);
    }
}
