//! Sending profiles to one HTTP endpoint without ever holding up tracing: the event loop hands
//! each payload to a bounded queue and goes on; a thread of its own sends them in order.
//!
//! - An endpoint that is slow or away never blocks the event loop: [`Pusher::push`] takes a
//!   lock held only to move a payload, never across a request.
//! - A failed send (no connection, a timeout, 5xx, 429) is retried, the payload kept at the
//!   head of the queue, after a backoff that doubles from 1 s up to 30 s.
//! - A payload the endpoint refuses for good (another 4xx) is dropped and counted as
//!   `rejected`: sending it again would fail again.
//! - The queue holds at most `capacity` payloads: when it is full, the oldest is dropped and
//!   counted, so what is sent when the endpoint is back is the most recent.
//! - Every count is in `status --json` and the service's last log line.
use crate::service::config::Endpoint;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// First and longest wait before sending again after a failure.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Longest a request may take, connecting included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One request body.
#[derive(Debug, Clone)]
pub struct Payload {
    /// Appended to the endpoint's base URL.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// For the log: which target, process and interval.
    pub what: String,
}

/// What a pusher did, so far.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, PartialEq, Eq)]
pub struct PushCounts {
    /// Payloads the endpoint took.
    pub pushed: u64,
    /// Payloads waiting (the one being sent included).
    pub queued: u64,
    /// Payloads dropped, oldest first, because the queue was full (or the service stopped
    /// before they could be sent).
    pub dropped: u64,
    /// Payloads the endpoint refused for good (a 4xx answer other than 429).
    pub rejected: u64,
    /// Sends that failed and were retried.
    pub failed_attempts: u64,
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Payload>,
    /// Set by [`Pusher::finish`]: send what is left until this instant, then drop it.
    stop_at: Option<Instant>,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    capacity: usize,
    pushed: AtomicU64,
    dropped: AtomicU64,
    rejected: AtomicU64,
    failed_attempts: AtomicU64,
    /// Whether the sender is inside a request (its payload is out of `items` then).
    sending: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A queue and the thread that empties it into one endpoint.
pub struct Pusher {
    name: &'static str,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pusher {
    /// Starts sending to `endpoint` with `headers` on every request (name: for the log).
    pub fn start(
        name: &'static str,
        endpoint: &Endpoint,
        headers: Vec<(String, String)>,
        capacity: usize,
    ) -> std::io::Result<Pusher> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            capacity: capacity.max(1),
            pushed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            failed_attempts: AtomicU64::new(0),
            sending: AtomicU64::new(0),
            last_error: Mutex::new(None),
        });
        let base = endpoint.base.clone();
        let thread = std::thread::Builder::new()
            .name(format!("export-{name}"))
            .spawn({
                let shared = shared.clone();
                move || send_loop(name, &base, &headers, &shared)
            })?;
        Ok(Pusher {
            name,
            shared,
            thread: Some(thread),
        })
    }

    /// Queues `payload`; drops the oldest waiting one when the queue is full. Never waits for
    /// the endpoint.
    pub fn push(&self, payload: Payload) {
        let mut q = lock(&self.shared.queue);
        let waiting = q.items.len() + self.shared.sending.load(Ordering::Relaxed) as usize;
        if waiting >= self.shared.capacity {
            if q.items.pop_front().is_some() {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                // Only the payload in flight: the new one waits behind it, one over capacity
                // for the time of that request.
            }
        }
        q.items.push_back(payload);
        drop(q);
        self.shared.wake.notify_one();
    }

    /// The counts so far.
    pub fn counts(&self) -> PushCounts {
        let q = lock(&self.shared.queue);
        PushCounts {
            pushed: self.shared.pushed.load(Ordering::Relaxed),
            queued: q.items.len() as u64 + self.shared.sending.load(Ordering::Relaxed),
            dropped: self.shared.dropped.load(Ordering::Relaxed),
            rejected: self.shared.rejected.load(Ordering::Relaxed),
            failed_attempts: self.shared.failed_attempts.load(Ordering::Relaxed),
        }
    }

    /// The last failure, if the last send failed.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared.last_error).clone()
    }

    /// The endpoint's name in the log (`pyroscope`, `otlp`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Sends what is queued for at most `within`, then drops what is left (counted); returns
    /// the final counts.
    pub fn finish(mut self, within: Duration) -> PushCounts {
        lock(&self.shared.queue).stop_at = Some(Instant::now() + within);
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.counts()
    }
}

impl Drop for Pusher {
    fn drop(&mut self) {
        if self.thread.is_some() {
            lock(&self.shared.queue).stop_at = Some(Instant::now());
            self.shared.wake.notify_one();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a queue half-changed: take it anyway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a send ended.
enum Sent {
    Ok,
    /// Worth sending again later.
    Retry(String),
    /// The endpoint refuses this payload.
    Refused(String),
}

fn send(agent: &ureq::Agent, base: &str, headers: &[(String, String)], p: &Payload) -> Sent {
    let mut request = agent
        .post(format!("{base}{}", p.path))
        .header("Content-Type", p.content_type);
    for (k, v) in headers {
        request = request.header(k, v);
    }
    match request.send(&p.body[..]) {
        Ok(response) if response.status().is_success() => Sent::Ok,
        Ok(response) => {
            let status = response.status();
            let mut body = response.into_body();
            let text = body
                .with_config()
                .limit(512)
                .read_to_string()
                .unwrap_or_default();
            let why = format!("HTTP {status}: {}", text.trim().replace(['\n', '\r'], " "));
            if status.is_client_error() && status.as_u16() != 429 {
                Sent::Refused(why)
            } else {
                Sent::Retry(why)
            }
        }
        Err(e) => Sent::Retry(e.to_string()),
    }
}

fn send_loop(name: &'static str, base: &str, headers: &[(String, String)], shared: &Shared) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(REQUEST_TIMEOUT))
        // Statuses are answers to judge here, not errors.
        .http_status_as_error(false)
        .build()
        .into();
    let mut backoff = FIRST_BACKOFF;
    let mut failing_since: Option<u64> = None;
    loop {
        // The next payload, or the end.
        let payload = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(stop_at) = q.stop_at {
                    if Instant::now() >= stop_at {
                        let left = q.items.len() as u64;
                        q.items.clear();
                        shared.dropped.fetch_add(left, Ordering::Relaxed);
                        return;
                    }
                    if q.items.is_empty() {
                        return;
                    }
                }
                if let Some(p) = q.items.pop_front() {
                    shared.sending.store(1, Ordering::Relaxed);
                    break p;
                }
                q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
        };
        let outcome = send(&agent, base, headers, &payload);
        let mut q = lock(&shared.queue);
        shared.sending.store(0, Ordering::Relaxed);
        match outcome {
            Sent::Ok => {
                shared.pushed.fetch_add(1, Ordering::Relaxed);
                *lock(&shared.last_error) = None;
                if let Some(failed) = failing_since.take() {
                    tracing::info!(
                        "export to {name}: {base} takes profiles again ({failed} failed attempts before)"
                    );
                }
                backoff = FIRST_BACKOFF;
            }
            Sent::Refused(why) => {
                shared.rejected.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("export to {name}: {base} refused {}: {why}", payload.what);
                *lock(&shared.last_error) = Some(why);
            }
            Sent::Retry(why) => {
                shared.failed_attempts.fetch_add(1, Ordering::Relaxed);
                if failing_since.is_none() {
                    tracing::warn!(
                        "export to {name}: {base}: {why}; sending again with backoff, up to {} profiles held (oldest dropped first)",
                        shared.capacity
                    );
                }
                *failing_since.get_or_insert(0) += 1;
                *lock(&shared.last_error) = Some(why);
                // Back at the head, unless newer ones filled the queue meanwhile.
                if q.items.len() < shared.capacity {
                    q.items.push_front(payload);
                } else {
                    shared.dropped.fetch_add(1, Ordering::Relaxed);
                }
                // Wait before the next try; a stop cuts the wait short.
                let until = Instant::now() + backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                loop {
                    let now = Instant::now();
                    let stop_at = q.stop_at;
                    if now >= until || stop_at.is_some_and(|s| now >= s) {
                        break;
                    }
                    let wait = stop_at.map_or(until, |s| s.min(until)) - now;
                    q = shared
                        .wake
                        .wait_timeout(q, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if q.stop_at.is_some() && stop_at.is_none() {
                        // Stopping: one more try now rather than after the backoff.
                        break;
                    }
                }
            }
        }
    }
}
