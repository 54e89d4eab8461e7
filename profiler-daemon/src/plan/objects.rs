//! Which objects a session probes first, planned from the command line: a binary (`--attach`,
//! `list`), a running process's mapped objects (`--pid`, `list PID`), a command and the
//! instrumented libraries it links (a launched command). What a process maps later is found
//! by [`Discovery`] while recording (`record::objects`).
use crate::plan::discovery::{Discovery, Found};
use crate::plan::object_ids::{self, ObjectIds};
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::traced::mappings;
use crate::traced::process::TracedProcess;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};

/// The traced executable, as the session's directory names and manifest show it.
#[derive(Clone, Debug)]
pub struct Executable {
    /// File name, for the per-process directories (`<name>-<pid>`).
    pub name: String,
    /// Its path as users know it.
    pub path: String,
    /// The file was deleted or replaced on disk after the process started.
    pub deleted: bool,
}

/// The objects to probe first, and how to find more.
pub struct Planned {
    /// The traced executable, for directory names and the manifest.
    pub executable: Executable,
    /// One plan per object, the executable's first when it is instrumented.
    pub plans: Vec<AttachPlan>,
    /// Every file of the process image, instrumented or not: where `--exits auto` looks for
    /// an unwinding personality routine (see [`crate::plan::exits::choose`]).
    pub image: Vec<PathBuf>,
    /// For a single process: its objects as seen so far (rescanned while recording). For a
    /// launched command it is completed with the child's pid by [`Planned::watch_child`].
    pub discovery: Option<Discovery>,
}

/// Every instrumented object `process` maps. Errors when there is none.
pub fn for_process(process: &TracedProcess) -> Result<Planned> {
    let pid = process.pid;
    let mut discovery = Discovery::new(pid, mappings::executable_id(pid));
    let found = discovery
        .scan()
        .with_context(|| format!("pid {pid} ({})", process.exe_path))?;
    warn_all(&found);
    if found.plans.is_empty() {
        bail!(
            "pid {pid} ({}) maps no instrumented object: none of its {} mapped files has an xray_instr_map (build with -fxray-instrument)",
            process.exe_path,
            found.new_files
        );
    }
    Ok(Planned {
        executable: Executable {
            name: process.exe_name(),
            path: process.exe_path_on_disk().to_owned(),
            deleted: process.exe_deleted(),
        },
        plans: found.plans,
        image: crate::plan::exits::mapped_image(pid),
        discovery: Some(discovery),
    })
}

/// `binary` alone (for `--attach`: every process running it, whatever else they map).
pub fn for_binary(binary: &Path) -> Result<Planned> {
    let plan = AttachPlan::for_binary(binary)?;
    Ok(Planned {
        executable: executable_of(&plan),
        image: crate::plan::exits::static_image(&plan.binary),
        plans: vec![plan],
        discovery: None,
    })
}

/// A command to launch: its executable and the instrumented libraries it links (found as the
/// dynamic loader would, through DT_NEEDED and DT_RUNPATH), probed before it starts so that
/// their first calls are traced. What the loader finds elsewhere, or the program loads later,
/// is found by rescanning once it runs.
pub fn for_command(program: &Path) -> Result<Planned> {
    let image = crate::plan::exits::static_image(program);
    let mut plans = Vec::new();
    let mut executable = None;
    let mut ids = ObjectIds::default();
    for (i, path) in image.iter().enumerate() {
        if !mappings::has_instrumentation_map(path) {
            continue;
        }
        let object_id = if i == 0 {
            object_ids::EXECUTABLE
        } else {
            match ids.next_shared() {
                Some(id) => id,
                // The rest is found (and refused, with the reason) by rescanning the process.
                None => break,
            }
        };
        let plan = AttachPlan::for_object(path, object_id)?;
        ids.used(object_id);
        // A library's plan names it by its file already (it is planned by its path).
        if i == 0 {
            executable = Some(executable_of(&plan));
        }
        plans.push(plan);
    }
    if plans.is_empty() {
        // The executable's own error says best what is wrong with it.
        AttachPlan::for_binary(program)?;
        bail!("{}: no instrumented object", program.display());
    }
    let executable = executable.unwrap_or_else(|| {
        let path = std::path::absolute(program).unwrap_or_else(|_| program.to_path_buf());
        Executable {
            name: crate::traced::file_name(&path.display().to_string()).to_owned(),
            path: path.display().to_string(),
            deleted: false,
        }
    });
    Ok(Planned {
        executable,
        plans,
        image,
        discovery: None,
    })
}

impl Planned {
    /// For a launched command: rescan the child `pid` once it runs, knowing which files were
    /// already probed (by path, before it started).
    pub fn watch_child(&mut self, pid: u32, program: &Path) {
        let mut discovery = Discovery::new(pid, mappings::file_id(program));
        for plan in &self.plans {
            if let Some(id) = mappings::file_id(&plan.binary) {
                discovery.already_probed(id, plan.object_id);
            }
        }
        self.discovery = Some(discovery);
    }

    /// Keeps only the functions `filter` selects; errors when it selects none at all.
    pub fn select(&mut self, filter: &FunctionFilter) -> Result<()> {
        let mut selected = 0;
        for plan in &mut self.plans {
            selected += filter.retain(plan);
        }
        self.plans.retain(|p| !p.probes.is_empty());
        if selected == 0 || self.plans.is_empty() {
            bail!(
                "nothing to trace: {} has no function sleds{}",
                self.executable.path,
                if filter.is_empty() {
                    ""
                } else {
                    " that --functions/--exclude select (see `fdr-profiled list`)"
                }
            );
        }
        Ok(())
    }
}

/// Prints what a scan found and did not trace, one warning each.
pub fn warn_all(found: &Found) {
    for w in &found.warnings {
        errln!("fdr-profiled: warning: {w}");
    }
}

fn executable_of(plan: &AttachPlan) -> Executable {
    Executable {
        name: plan.exe_name.clone(),
        path: plan.display_path.clone(),
        deleted: plan.deleted,
    }
}
