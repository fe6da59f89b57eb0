//! What the server and the client share: the clock the tracer stamps with.

/// CLOCK_MONOTONIC in ns, the clock of the kernel's BPF timestamps
/// (std's Instant reads it too, but does not expose the value).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The number after `"key":` in a small JSON body (the tests' requests), or `default`.
pub fn json_number(body: &str, key: &str, default: f64) -> f64 {
    let needle = format!("\"{}\":", key);
    body.find(&needle)
        .map(|at| &body[at + needle.len()..])
        .map(|rest| rest.trim_start())
        .and_then(|rest| {
            let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .unwrap_or(default)
}
