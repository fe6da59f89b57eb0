//! An OpenAI-style streaming server over HTTPS on hyper and tokio-rustls, the
//! stack of Rust LLM gateways. Each token is one SSE event in a body chunk of
//! its own; the finish chunk and `data: [DONE]` share the last one.
//!
//! Usage: rustls_sse_server LOG (certificate and key in STREAM_SHAPES_TLS_CERT
//! and STREAM_SHAPES_TLS_KEY); prints its port, then serves until killed.
//! LOG gets a JSON line per request: its path and, for each token, the
//! CLOCK_MONOTONIC time the connection's task took the chunk to write it
//! (hyper writes it in the same poll, through rustls's Writer).
use std::convert::Infallible;
use std::fs::File;
use std::io::{BufReader, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream;
use hyper::body::{Bytes, HttpBody};
use hyper::server::conn::Http;
use hyper::service::service_fn;
use hyper::{Body, Request, Response};
use rustls_sse::{json_number, monotonic_ns};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

const TOKEN: &str = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}\n\n";
const FINISH: &str = "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

fn tls_config() -> rustls::ServerConfig {
    let pem = |var: &str| BufReader::new(File::open(std::env::var(var).expect(var)).expect(var));
    let certs = rustls_pemfile::certs(&mut pem("STREAM_SHAPES_TLS_CERT")).unwrap();
    let key = rustls_pemfile::pkcs8_private_keys(&mut pem("STREAM_SHAPES_TLS_KEY")).unwrap().remove(0);
    let mut config = rustls::ServerConfig::builder()
        .with_safe_defaults()
        .with_no_client_auth()
        .with_single_cert(certs.into_iter().map(rustls::Certificate).collect(), rustls::PrivateKey(key))
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

async fn serve(req: Request<Body>, log: Arc<Mutex<File>>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let mut body = req.into_body();
    let mut text = Vec::new();
    while let Some(Ok(piece)) = body.data().await {
        text.extend_from_slice(&piece);
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    let tokens = json_number(&text, "tokens", 5.0) as usize;
    let interval = Duration::from_secs_f64(json_number(&text, "interval_ms", 3.0) / 1000.0);
    let written: Arc<Mutex<Vec<u64>>> = Arc::default();
    // Chunk i is made when hyper's connection task polls for it, just before it writes it.
    let events = stream::unfold(0usize, move |i| {
        let (written, log, path) = (written.clone(), log.clone(), path.clone());
        async move {
            if i > tokens {
                return None;
            }
            if i == tokens {
                let token_ns = written.lock().unwrap().clone();
                let line = format!("{{\"path\":\"{}\",\"token_ns\":{:?}}}\n", path, token_ns);
                log.lock().unwrap().write_all(line.as_bytes()).unwrap();
                return Some((Ok::<_, Infallible>(Bytes::from_static(FINISH.as_bytes())), i + 1));
            }
            tokio::time::sleep(interval).await;
            written.lock().unwrap().push(monotonic_ns());
            Some((Ok(Bytes::from_static(TOKEN.as_bytes())), i + 1))
        }
    });
    Ok(Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::wrap_stream(events))
        .unwrap())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let log = Arc::new(Mutex::new(File::create(std::env::args().nth(1).expect("usage: rustls_sse_server LOG")).unwrap()));
    let acceptor = TlsAcceptor::from(Arc::new(tls_config()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("{}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    loop {
        let (socket, _) = listener.accept().await.unwrap();
        socket.set_nodelay(true).unwrap();   // each token leaves at once, as streaming servers set it
        let (acceptor, log) = (acceptor.clone(), log.clone());
        tokio::spawn(async move {
            if let Ok(tls) = acceptor.accept(socket).await {
                let service = service_fn(move |req| serve(req, log.clone()));
                let _ = Http::new().http1_only(true).serve_connection(tls, service).await;
            }
        });
    }
}
