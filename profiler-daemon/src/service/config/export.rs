//! The `[export]` section: where the service pushes the calls of each interval as profiles.
//!
//! ```toml
//! [export]
//! pyroscope = "http://pyroscope:4040"          # Grafana Pyroscope (push API), or
//! otlp = "http://otel-collector:4318"          # an OpenTelemetry Collector (OTLP profiles, development)
//! interval = "15s"                             # one profile per target process per interval
//! tenant = "team-a"                            # X-Scope-OrgID (multi-tenant Pyroscope)
//! basic_auth_file = "/etc/fdr-profiled/push.auth"   # one line: user:password
//! queue = 64                                   # profiles held while the endpoint is away
//! ```
//!
//! Validated at start (a bad URL, an unreadable credentials file: refused with file:line), so a
//! service never runs with an export it cannot do.
use super::values::{parse_duration, Located};
use std::time::Duration;
use toml::Spanned;

/// Default push interval.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
/// Shortest and longest intervals accepted.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Default and largest number of profiles held for an endpoint that does not answer.
const DEFAULT_QUEUE: i64 = 64;
const MAX_QUEUE: i64 = 100_000;
/// Largest credentials file read.
const MAX_AUTH_BYTES: u64 = 4096;

/// `[export]` as serde reads it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExport {
    pyroscope: Option<Spanned<String>>,
    otlp: Option<Spanned<String>>,
    interval: Option<Spanned<String>>,
    tenant: Option<Spanned<String>>,
    basic_auth_file: Option<Spanned<String>>,
    queue: Option<Spanned<i64>>,
}

/// An HTTP endpoint, checked: `http` or `https`, a host, no credentials in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL without a trailing `/`; paths are appended to it.
    pub base: String,
}

/// `[export]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportConfig {
    /// Grafana Pyroscope's base URL.
    pub pyroscope: Option<Endpoint>,
    /// An OTLP/HTTP receiver's base URL (profiles go to `/v1development/profiles`).
    pub otlp: Option<Endpoint>,
    /// Calls are aggregated per interval, aligned to multiples of it since the Unix epoch.
    pub interval: Duration,
    /// `X-Scope-OrgID`.
    pub tenant: Option<String>,
    /// `Authorization: Basic`, from `basic_auth_file`: (user, password).
    pub basic_auth: Option<(String, String)>,
    /// Profiles held per endpoint while it does not take them; the oldest are dropped first.
    pub queue: usize,
}

/// Validates `[export]`.
pub(super) fn export(raw: &RawExport) -> Located<ExportConfig> {
    let pyroscope = raw.pyroscope.as_ref().map(endpoint).transpose()?;
    let otlp = raw.otlp.as_ref().map(endpoint).transpose()?;
    if pyroscope.is_none() && otlp.is_none() {
        return Err((
            0..0,
            "[export] names no endpoint: set pyroscope = \"http://host:4040\" or otlp = \"http://host:4318\"".into(),
        ));
    }
    let interval = match &raw.interval {
        None => DEFAULT_INTERVAL,
        Some(v) => {
            let d = parse_duration(v.get_ref()).map_err(|m| (v.span(), m))?;
            if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&d) || d.subsec_nanos() != 0 {
                return Err((
                    v.span(),
                    format!(
                        "interval {:?}: give whole seconds from 1s to 1h",
                        v.get_ref()
                    ),
                ));
            }
            d
        }
    };
    let tenant = match &raw.tenant {
        None => None,
        Some(t) => {
            let value = t.get_ref();
            if value.is_empty()
                || value.len() > 150
                || !value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!-_.*'()".contains(&b))
            {
                return Err((
                    t.span(),
                    format!("tenant {value:?}: use 1 to 150 letters, digits or !-_.*'()"),
                ));
            }
            Some(value.clone())
        }
    };
    let basic_auth = raw
        .basic_auth_file
        .as_ref()
        .map(|f| read_basic_auth(f.get_ref()).map_err(|m| (f.span(), m)))
        .transpose()?;
    let queue = match &raw.queue {
        None => DEFAULT_QUEUE,
        Some(q) if (1..=MAX_QUEUE).contains(q.get_ref()) => *q.get_ref(),
        Some(q) => {
            return Err((
                q.span(),
                format!(
                    "queue must be between 1 and {MAX_QUEUE}, not {}",
                    q.get_ref()
                ),
            ))
        }
    } as usize;
    Ok(ExportConfig {
        pyroscope,
        otlp,
        interval,
        tenant,
        basic_auth,
        queue,
    })
}

/// Checks an endpoint URL with the HTTP crate's parser.
fn endpoint(v: &Spanned<String>) -> Located<Endpoint> {
    let text = v.get_ref().trim_end_matches('/');
    let bad = |why: &str| (v.span(), format!("endpoint {:?}: {why}", v.get_ref()));
    let uri: ureq::http::Uri = text
        .parse()
        .map_err(|e: ureq::http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(bad("give an http:// or https:// URL")),
    }
    let Some(authority) = uri.authority() else {
        return Err(bad("no host"));
    };
    if authority.host().is_empty() {
        return Err(bad("no host"));
    }
    if authority.as_str().contains('@') {
        return Err(bad(
            "credentials in the URL would be logged: use basic_auth_file",
        ));
    }
    if uri.query().is_some() {
        return Err(bad("no query string: give the server's base URL"));
    }
    Ok(Endpoint {
        base: text.to_owned(),
    })
}

/// `user:password` on the first line of `path`, a regular file of at most 4 KiB.
fn read_basic_auth(path: &str) -> Result<(String, String), String> {
    let fail = |why: String| format!("basic_auth_file {path:?}: {why}");
    if !path.starts_with('/') {
        return Err(fail("give an absolute path".into()));
    }
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(fail("not a regular file".into()));
    }
    if meta.len() > MAX_AUTH_BYTES {
        return Err(fail(format!(
            "{} bytes: a credentials file is one line",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
    match line.split_once(':') {
        Some((user, password)) if !user.is_empty() => Ok((user.to_owned(), password.to_owned())),
        _ => Err(fail("its first line must be user:password".into())),
    }
}
