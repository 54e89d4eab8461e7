//! Starting `fdr-profiled service` in a test: [`ServiceStart`] is the one way every test does
//! it (the service's own tests, the hostile user's, output safety's, the privileges' refusal).
//! It builds the command line `fdr-profiled service --config FILE [--socket PATH]`, runs it as
//! asked (under a wrapper such as `setpriv` or a shell, with more environment variables, with a
//! change made to the child before it runs) and waits until the service says it is ready.
//!
//! [`service_status`] asks a running service for its status.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::run::Running;
use crate::tools::fdr_profiled;

/// The line the service prints on stderr once it traces its targets.
pub const READY_PREFIX: &str = "fdr-profiled: service: ready";

/// How long [`ServiceStart::start`] waits for [`READY_PREFIX`].
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The label of the service's output lines in the test's stderr.
const LABEL: &str = "fdr-profiled service";

/// A change made to the service's command before it is spawned.
type Adjust = Box<dyn Fn(&mut Command)>;

/// How to start `fdr-profiled service`: its configuration file, its control socket, and how its
/// process is run. Built with [`ServiceStart::config`] or [`ServiceStart::written`], then
/// [`ServiceStart::start`] (ready), [`ServiceStart::spawn`] (not waited for: a test that expects
/// a refusal or waits for another line) or [`ServiceStart::command`] (a test that runs the
/// process itself).
pub struct ServiceStart {
    config: PathBuf,
    socket: Option<PathBuf>,
    wrapper: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    adjust: Option<Adjust>,
}

impl ServiceStart {
    /// The service on the configuration file `config`, without `--socket` (the service's
    /// default control socket) until [`ServiceStart::socket`] names one.
    pub fn config(config: &Path) -> ServiceStart {
        ServiceStart {
            config: config.to_path_buf(),
            socket: None,
            wrapper: Vec::new(),
            env: Vec::new(),
            adjust: None,
        }
    }

    /// Writes `text` to `dir/fdr-profiled.toml`: the service on it, with its control socket at
    /// `dir/control.sock`.
    pub fn written(dir: &Path, text: &str) -> ServiceStart {
        let config = dir.join("fdr-profiled.toml");
        std::fs::write(&config, text).unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
        ServiceStart::config(&config).socket(&dir.join("control.sock"))
    }

    /// `--socket socket`.
    pub fn socket(mut self, socket: &Path) -> ServiceStart {
        self.socket = Some(socket.to_path_buf());
        self
    }

    /// One more environment variable of the service's process.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> ServiceStart {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Runs the service under `program_and_args` (`setpriv ... --`, `sh -c SCRIPT`, `unshare
    /// ...`), its own command line after them: a shell script sees the daemon's path as `$0`
    /// and its arguments as `"$@"`.
    pub fn wrapped<S: AsRef<OsStr>>(mut self, program_and_args: &[S]) -> ServiceStart {
        self.wrapper = program_and_args
            .iter()
            .map(|a| a.as_ref().to_owned())
            .collect();
        self
    }

    /// `adjust` is applied to the command before it is spawned (`pre_exec`, `uid`).
    pub fn adjusted(mut self, adjust: impl Fn(&mut Command) + 'static) -> ServiceStart {
        self.adjust = Some(Box::new(adjust));
        self
    }

    /// The configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// The control socket given with `--socket`; panics if none was.
    pub fn socket_path(&self) -> &Path {
        self.socket
            .as_deref()
            .expect("a service started with --socket")
    }

    /// The whole command line, wrapper first, with its environment and adjustment.
    pub fn command(&self) -> Command {
        self.command_with("--config")
    }

    /// [`ServiceStart::command`] with `--check-config` in place of `--config`: the
    /// configuration checked as at start, nothing started.
    pub fn check_command(&self) -> Command {
        self.command_with("--check-config")
    }

    fn command_with(&self, config_flag: &str) -> Command {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(fdr_profiled());
                c
            }
            None => Command::new(fdr_profiled()),
        };
        cmd.args(["service", config_flag]).arg(&self.config);
        if let Some(socket) = &self.socket {
            cmd.arg("--socket").arg(socket);
        }
        for (key, value) in &self.env {
            cmd.env(key, value);
        }
        if let Some(adjust) = &self.adjust {
            adjust(&mut cmd);
        }
        cmd
    }

    /// The service started, not waited for.
    pub fn spawn(&self) -> Running {
        Running::spawn(LABEL, &mut self.command())
    }

    /// The service started and ready: returns once it printed [`READY_PREFIX`] (panics after
    /// [`READY_TIMEOUT`]).
    pub fn start(&self) -> Running {
        self.start_within(READY_TIMEOUT)
    }

    /// [`ServiceStart::start`], waiting up to `timeout` for the service to be ready.
    pub fn start_within(&self, timeout: Duration) -> Running {
        let mut service = self.spawn();
        service.wait_for_stderr_line(READY_PREFIX, timeout);
        service
    }
}

/// `fdr-profiled status --json` of the service listening on `socket`; panics unless it answers.
pub fn service_status(socket: &Path) -> serde_json::Value {
    let out = crate::tools::run_output(
        Command::new(fdr_profiled())
            .args(["status", "--json", "--socket"])
            .arg(socket),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}
