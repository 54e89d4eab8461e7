//! Which objects a session probes: planned from the command line at the start (a binary; a
//! running process's mapped objects; a command and the instrumented libraries it links), then,
//! for a single traced process, the objects it maps later (`dlopen`), found by rescanning its
//! mappings while recording.
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::discovery::{Discovery, Found};
use crate::plan::exits::ExitPolicy;
use crate::plan::select::FunctionFilter;
use crate::plan::AttachPlan;
use crate::session::{Executable, Session};
use crate::traced::mappings;
use crate::traced::process::TracedProcess;
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};

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
    let mut libraries = 0;
    for (i, path) in image.iter().enumerate() {
        if !mappings::has_instrumentation_map(path) {
            continue;
        }
        let object_id = if i == 0 { 0 } else { libraries + 1 };
        if object_id > crate::plan::MAX_OBJECT_ID {
            break;
        }
        let plan = AttachPlan::for_object(path, object_id)?;
        // A library's plan names it by its file already (it is planned by its path).
        if i > 0 {
            libraries += 1;
        } else {
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

/// The return probes of an object, kept so that its exits can be observed by its exit sleds
/// instead (see `record::exit_sleds_instead`).
pub struct ReturnProbes {
    pub plan: AttachPlan,
    pub links: Attachment,
}

/// Decides how `plan`'s functions' exits are observed, places its probes, says so, and adds
/// the object to the session. With `keep`, the object's return probes are kept there.
pub fn attach(
    tracer: &mut Tracer,
    session: &mut Session,
    mut plan: AttachPlan,
    policy: ExitPolicy,
    scope: Scope,
    keep: Option<&mut Vec<ReturnProbes>>,
) -> Result<usize> {
    crate::plan::exits::decide(&mut plan, policy);
    let placed = match keep {
        Some(kept) => {
            let (placed, links) = tracer.attach_keeping_returns(&plan, scope)?;
            kept.push(ReturnProbes {
                plan: plan.clone(),
                links,
            });
            placed
        }
        None => tracer.attach(&plan, scope)?,
    };
    let attached_ns = crate::session::monotonic_ns();
    let object = if plan.object_id == 0 {
        String::new()
    } else {
        format!(" (object {})", plan.object_id)
    };
    errln!(
        "fdr-profiled: attached {placed} probes to {} functions in {}{object}",
        plan.functions,
        plan.display_path
    );
    session.add_object(plan, placed, attached_ns);
    Ok(placed)
}

/// Looks for objects the process mapped since the last look and probes the instrumented
/// ones. A process that is gone has nothing more to map: errors reading it are not reported
/// (its exit ends the session).
pub fn rescan(
    discovery: &mut Discovery,
    filter: &FunctionFilter,
    policy: ExitPolicy,
    tracer: &mut Tracer,
    session: &mut Session,
    scope: Scope,
    mut keep: Option<&mut Vec<ReturnProbes>>,
) {
    let Ok(found) = discovery.scan() else {
        return;
    };
    warn_all(&found);
    for &(object_id, load_address) in &found.located {
        session.locate_object(object_id, load_address);
    }
    for mut plan in found.plans {
        if filter.retain(&mut plan) == 0 {
            continue;
        }
        let path = plan.display_path.clone();
        if let Err(err) = attach(tracer, session, plan, policy, scope, keep.as_deref_mut()) {
            errln!("fdr-profiled: warning: {path}: not traced: {err:#}");
        }
    }
}

fn warn_all(found: &Found) {
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
