//! Streamed OpenAI-style calls over HTTPS with ureq, a blocking Rust client
//! with rustls compiled in, timed by the caller: the protocol of
//! tests/programs/llm_go_client.go.
//!
//! Usage: rustls_sse_client BASE_URL CALLS TOKENS. The server's certificate
//! is not checked (the tests' own, self-signed). A warm-up call on an agent
//! of its own comes first; then it prints "ready" and waits for a line on
//! stdin (a tracer attaches meanwhile), makes CALLS calls on one agent (its
//! pool reuses the connection), and prints one JSON line per call: when it
//! began and returned, and the CLOCK_MONOTONIC ns at which each token
//! event's line reached the application. The prompt carries a marker and
//! the Authorization header a secret that must reach no output of the tracer.
use std::io::{BufRead, BufReader};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::{ServerCertVerified, ServerCertVerifier};
use rustls_sse::monotonic_ns;

struct AnyCertificate;

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(&self, _: &rustls::Certificate, _: &[rustls::Certificate], _: &rustls::ServerName,
                          _: &mut dyn Iterator<Item = &[u8]>, _: &[u8], _: SystemTime)
                          -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
}

fn agent() -> ureq::Agent {
    let tls = rustls::ClientConfig::builder()
        .with_safe_defaults()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate))
        .with_no_client_auth();
    ureq::AgentBuilder::new().tls_config(Arc::new(tls)).build()
}

/// One streamed call: its JSON line.
fn call(agent: &ureq::Agent, base: &str, k: i64, tokens: usize) -> String {
    let model = format!("rust-test-{}", k.rem_euclid(2));
    let path = "/v1/chat/completions";
    let body = format!("{{\"model\":\"{}\",\"stream\":true,\"tokens\":{},\"interval_ms\":3,\
                        \"messages\":[{{\"role\":\"user\",\"content\":\"PRIVATE-MARKER-5e1d say something\"}}],\
                        \"prompt\":\"PRIVATE-MARKER-5e1d\"}}", model, tokens);
    let began = monotonic_ns();
    let response = agent.post(&format!("{}{}", base, path))
        .set("content-type", "application/json")
        .set("authorization", "Bearer sk-SECRET-b7c2e9")
        .send_string(&body)
        .expect("the call failed");
    let mut received = Vec::new();
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.expect("the stream broke");
        if line.starts_with("data: ") && line.contains("\"content\"") {
            received.push(monotonic_ns());
        }
    }
    format!("{{\"model\":\"{}\",\"path\":\"{}\",\"received_ns\":{:?},\"began_ns\":{},\"returned_ns\":{}}}",
            model, path, received, began, monotonic_ns())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (base, calls, tokens) = (&args[1], args[2].parse::<i64>().unwrap(), args[3].parse::<usize>().unwrap());
    call(&agent(), base, -1, 1);
    let agent = agent();
    println!("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    for k in 0..calls {
        println!("{}", call(&agent, base, k, tokens));
    }
}
