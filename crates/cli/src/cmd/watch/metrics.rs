//! `--metrics ADDR`: the verdict served at `/metrics` for Prometheus.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use anyhow::Context;

/// The OpenMetrics content type (what Prometheus asks for).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A small HTTP server on its own thread, answering `/metrics` with the
/// latest text handed to [`MetricsServer::set`].
pub(crate) struct MetricsServer {
    text: Arc<Mutex<String>>,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`, or `PORT` for every interface) and
    /// says on stderr where.
    pub(crate) fn start(addr: &str) -> anyhow::Result<MetricsServer> {
        let addr = if addr.bytes().all(|b| b.is_ascii_digit()) {
            format!("0.0.0.0:{addr}")
        } else {
            addr.to_owned()
        };
        let server = tiny_http::Server::http(&addr)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("--metrics {addr}: cannot listen"))?;
        let server = Arc::new(server);
        if let Some(bound) = server.server_addr().to_ip() {
            eprintln!("snapdiff: metrics at http://{bound}/metrics");
        }
        let text = Arc::new(Mutex::new(String::from("# EOF\n")));
        let thread = {
            let (server, text) = (Arc::clone(&server), Arc::clone(&text));
            std::thread::spawn(move || serve(&server, &text))
        };
        Ok(MetricsServer {
            text,
            server,
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
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(server: &tiny_http::Server, text: &Mutex<String>) {
    for request in server.incoming_requests() {
        let path = request.url().split('?').next().unwrap_or_default();
        let response = if path == "/metrics" {
            let body = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let header = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                .expect("a valid header");
            tiny_http::Response::from_string(body).with_header(header)
        } else {
            tiny_http::Response::from_string("snapdiff serves /metrics\n").with_status_code(404)
        };
        // A scraper that went away is its own business.
        let _ = request.respond(response);
    }
}
