//! The service's control socket: `fdr-profiled status`, `fdr-profiled snapshot [TARGET]` and
//! `fdr-profiled top` talk to the running service over a unix socket only root can use.
//!
//! One request line (`status`, `snapshot`, `snapshot NAME`, `top`), one JSON reply line. The socket's
//! directory is made mode 0700 and the socket 0600, and the service also checks that the peer
//! is root (`SO_PEERCRED`), so a permissive umask or a moved socket lets no one else in.
use anyhow::{bail, Context as _, Result};
use fdr_session::output_dir::OutputDir;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the service listens unless told otherwise (`RuntimeDirectory=fdr-profiled`).
pub const DEFAULT_SOCKET: &str = "/run/fdr-profiled/control.sock";

/// Longest request line read.
const MAX_REQUEST: usize = 256;

/// What a client asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// The service's state, as JSON.
    Status,
    /// A snapshot of every target, or of the one named.
    Snapshot(Option<String>),
    /// Each function's calls and their durations so far (`fdr-profiled top`): the service
    /// matches calls while someone asks.
    Top,
}

impl Request {
    /// Parses one request line.
    pub fn parse(line: &str) -> Result<Request, String> {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("status"), None, _) => Ok(Request::Status),
            (Some("top"), None, _) => Ok(Request::Top),
            (Some("snapshot"), None, _) => Ok(Request::Snapshot(None)),
            (Some("snapshot"), Some(name), None) => Ok(Request::Snapshot(Some(name.to_owned()))),
            _ => Err(format!(
                "unknown request {:?} (status, snapshot [TARGET], top)",
                line.chars().take(64).collect::<String>()
            )),
        }
    }

    fn line(&self) -> String {
        match self {
            Request::Status => "status".into(),
            Request::Top => "top".into(),
            Request::Snapshot(None) => "snapshot".into(),
            Request::Snapshot(Some(name)) => format!("snapshot {name}"),
        }
    }
}

/// Binds the control socket at `path`: its directory created 0700 if missing (and refused if
/// other users can write to it, unless sticky), a stale socket (and only a socket) replaced,
/// the socket made 0600, all relative to the directory's descriptor (see
/// [`fdr_session::output_dir`]).
pub fn bind(path: &Path) -> Result<tokio::net::UnixListener> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        bail!("control socket {} has no file name", path.display());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let listener = OutputDir::open_or_create(dir)?.bind_socket(name)?;
    listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::UnixListener::from_std(listener))
        .with_context(|| format!("listening on {}", path.display()))
}

/// Reads a connection's request, if the peer is root and sends one line in time.
pub async fn read_request(stream: &mut tokio::net::UnixStream) -> Result<Request, String> {
    use tokio::io::AsyncReadExt as _;
    let peer = stream
        .peer_cred()
        .map_err(|e| format!("no peer credentials: {e}"))?;
    if peer.uid() != 0 {
        return Err(format!("uid {} is not root", peer.uid()));
    }
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    let read = async {
        while buf.len() < MAX_REQUEST {
            match stream.read(&mut byte).await {
                Ok(0) => break,
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => buf.push(byte[0]),
                Err(e) => return Err(format!("reading the request: {e}")),
            }
        }
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .map_err(|_| "no request within 2 s".to_owned())??;
    Request::parse(&String::from_utf8_lossy(&buf))
}

/// Sends `reply` (one JSON line) on the connection.
pub async fn reply(stream: &mut tokio::net::UnixStream, reply: &serde_json::Value) {
    use tokio::io::AsyncWriteExt as _;
    let mut line = reply.to_string();
    line.push('\n');
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(line.as_bytes())).await;
}

/// Client side: sends `request` to the service at `socket` and returns its reply.
pub fn ask(socket: &Path, request: &Request) -> Result<serde_json::Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot reach the service at {} (is it running? are you root?)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    writeln!(stream, "{}", request.line())?;
    let mut line = String::new();
    BufReader::new(std::io::Read::take(&stream, 16 << 20))
        .read_line(&mut line)
        .with_context(|| format!("reading the service's reply on {}", socket.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&line).context("the service's reply is not JSON")?;
    if let Some(err) = value.get("error").and_then(|e| e.as_str()) {
        bail!("the service says: {err}");
    }
    Ok(value)
}

/// Options of `status` and `snapshot`: where the service listens.
#[derive(Debug, clap::Args)]
pub struct SocketArg {
    /// The service's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// Options of `snapshot`.
#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// The target to snapshot (default: every target).
    pub target: Option<String>,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// `fdr-profiled snapshot [TARGET]`: prints the directory of each snapshot written.
pub fn snapshot(args: &SnapshotArgs) -> Result<u8> {
    let reply = ask(&args.socket.socket, &Request::Snapshot(args.target.clone()))?;
    for dir in reply["snapshots"].as_array().into_iter().flatten() {
        outln!("{}", dir.as_str().unwrap_or_default());
    }
    Ok(0)
}

/// `fdr-profiled status`: the service's state.
pub fn status(args: &SocketArg, json: bool) -> Result<u8> {
    let reply = ask(&args.socket, &Request::Status)?;
    if json {
        outln!("{reply}");
        return Ok(0);
    }
    outln!(
        "fdr-profiled service: {} events, {}/s, {} lost, {} not written, {} snapshots not written; output {}: {} used{}; last snapshot {}",
        reply["events"],
        reply["events_per_second"],
        reply["lost"],
        reply["not_written"],
        reply["snapshots_not_written"],
        reply["output"].as_str().unwrap_or("?"),
        bytes(&reply["disk_used"]),
        match reply["max_disk"].as_u64() {
            Some(_) => format!(" of max_disk {}", bytes(&reply["max_disk"])),
            None => String::new(),
        },
        reply["last_snapshot"].as_str().unwrap_or("none"),
    );
    for t in reply["targets"].as_array().into_iter().flatten() {
        outln!(
            "  {} ({})",
            t["name"].as_str().unwrap_or("?"),
            t["pattern"].as_str().unwrap_or("?")
        );
        for b in t["binaries"].as_array().into_iter().flatten() {
            if b["mode"] == "record" {
                outln!(
                    "    {}: record, {} segments closed, writing {}, {} events not written",
                    b["path"].as_str().unwrap_or("?"),
                    b["segments_closed"],
                    b["segment"].as_str().unwrap_or("nothing"),
                    b["not_written"]
                );
            } else {
                outln!(
                    "    {}: {} threads, {} events held in {}, {} aged out, {} evicted",
                    b["path"].as_str().unwrap_or("?"),
                    b["threads"],
                    b["events"],
                    bytes(&b["bytes"]),
                    b["expired"],
                    b["evicted"]
                );
            }
            let probes = &b["probes"];
            if probes.is_object() && probes["engine"] == "inline" {
                // Calls by function; no trap to estimate the cost of.
                let busiest: Vec<String> = probes["costliest"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| {
                        format!(
                            "{} ({}/s)",
                            f["function"].as_str().unwrap_or("?"),
                            f["calls_per_second"]
                        )
                    })
                    .collect();
                outln!(
                    "      calls: {} calls/s (inline engine: no trap per call){}{}",
                    probes["calls_per_second"],
                    if busiest.is_empty() {
                        ""
                    } else {
                        "; busiest: "
                    },
                    busiest.join(", ")
                );
            } else if probes.is_object() {
                let costliest: Vec<String> = probes["costliest"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| {
                        format!(
                            "{} ({}/s, {:.1}%)",
                            f["function"].as_str().unwrap_or("?"),
                            f["calls_per_second"],
                            f["cpu_percent"].as_f64().unwrap_or(0.0)
                        )
                    })
                    .collect();
                outln!(
                    "      probes: {} calls/s, ~{:.1}% of a CPU (estimated){}{}",
                    probes["calls_per_second"],
                    probes["cpu_percent"].as_f64().unwrap_or(0.0),
                    if costliest.is_empty() {
                        ""
                    } else {
                        "; costliest: "
                    },
                    costliest.join(", ")
                );
            }
            let budget = &b["budget"];
            if budget.is_object() {
                let dropped: Vec<&str> = budget["dropped"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d.as_str())
                    .collect();
                outln!(
                    "      budget: at most {}% overhead, ~{:.1}% now (estimated); {} of {} functions not traced now{}{}",
                    budget["max_overhead_percent"].as_f64().unwrap_or(0.0),
                    budget["overhead_percent"].as_f64().unwrap_or(0.0),
                    dropped.len(),
                    budget["functions"],
                    if dropped.is_empty() { "" } else { ": " },
                    dropped.join(", ")
                );
            }
            let processes = b["processes"].as_array().map_or(&[][..], Vec::as_slice);
            let repair = &b["repair"];
            if repair.is_object() {
                // Each process of a repaired target, traced by a keeper of its own: what
                // became of each, as the JSON says it.
                outln!(
                    "      repair: {} processes traced ({} running now, {} ended; {} from their exec, {} only once past their entry point), {} not traced",
                    repair["processes_traced"],
                    repair["processes_live"],
                    repair["processes_ended"],
                    repair["traced_from_exec"],
                    repair["traced_late"],
                    repair["processes_not_traced"]
                );
                for pid in repair["live"].as_array().into_iter().flatten() {
                    outln!("      process {pid}: traced, stack repaired");
                }
                for p in repair["not_traced"].as_array().into_iter().flatten() {
                    outln!(
                        "      process {}: not traced: {}",
                        p["pid"],
                        p["why"].as_str().unwrap_or("?")
                    );
                }
            } else if b["inline"].is_object() {
                let inline = &b["inline"];
                outln!(
                    "      inline engine: {} processes patched ({} running now, {} ended), {} not traced",
                    inline["processes_patched"],
                    inline["processes_live"],
                    inline["processes_ended"],
                    inline["processes_not_traced"]
                );
                for pid in inline["live"].as_array().into_iter().flatten() {
                    outln!("      process {pid}: patched");
                }
            } else if processes.is_empty() {
                outln!("      no process seen");
            }
            for p in processes {
                outln!(
                    "      process {} ({} libraries probed)",
                    p["pid"],
                    p["libraries"]
                );
            }
        }
    }
    Ok(0)
}

/// A byte count of a reply, in bytes and binary units (`123456 B (120.6 KiB)`).
fn bytes(value: &serde_json::Value) -> String {
    let Some(n) = value.as_u64() else {
        return "?".into();
    };
    match n {
        0..1024 => format!("{n} B"),
        1024..1_048_576 => format!("{n} B ({:.1} KiB)", n as f64 / 1024.0),
        _ => format!("{n} B ({:.1} MiB)", n as f64 / 1_048_576.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_print_back() {
        for r in [
            Request::Status,
            Request::Snapshot(None),
            Request::Snapshot(Some("web".into())),
        ] {
            assert_eq!(Request::parse(&r.line()), Ok(r.clone()));
        }
        assert!(Request::parse("snapshot a b").is_err());
        assert!(Request::parse("rm -rf /").is_err());
        assert!(Request::parse("").is_err());
    }
}
