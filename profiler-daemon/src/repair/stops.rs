//! Where the unwinder stops a thread for its repair: the throw and catch points of the objects
//! a process maps (`plan::catches`), probed with the `unwind_stop` program, and what the
//! keeper needs to hold those probes and place the same ones in the processes it follows.
use crate::kernel::bpf::{Attachment, Scope, Tracer};
use crate::plan::catches::CatchPoint;
use crate::traced::mappings::FileId;
use anyhow::{bail, Context as _, Result};
use profiler_common::event_kind;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// The throw and catch stops of one process: the probes placed (to remove them again), and
/// what the [`Keeper`] needs to hold them and to place the same stops in the processes the
/// traced one forks.
pub struct UnwindStops {
    /// The links' descriptors: the keeper keeps them open for as long as it traces.
    pub(super) links: Vec<RawFd>,
    /// The `unwind_stop` program as `uprobe_multi` links run it, and the `repair_release`
    /// task iterator program.
    pub(super) program: RawFd,
    pub(super) release_program: RawFd,
    /// Each object's points, with the object open: the keeper places a child's stops through
    /// `/proc/self/fd/N`, on the very files probed here, whatever happens to their paths.
    pub(super) objects: Vec<StopPoints>,
}

/// The throw and catch points (`event_kind::THROW`, `CATCH`) of the objects looked at so far,
/// by file (device and inode): finding them reads an ELF symbol table each, 100 ms and more for
/// a C++ runtime, which a process that starts must not wait for each time.
#[derive(Default)]
pub struct PointCache(HashMap<FileId, std::rc::Rc<Vec<(CatchPoint, u8)>>>);

impl PointCache {
    /// The throw and catch points of `object` (none if it cannot be read).
    pub fn points(&mut self, object: &std::path::Path) -> std::rc::Rc<Vec<(CatchPoint, u8)>> {
        let read = || {
            std::rc::Rc::new(
                crate::plan::catches::throw_points(object)
                    .into_iter()
                    .map(|p| (p, event_kind::THROW))
                    .chain(
                        crate::plan::catches::catch_points(object)
                            .into_iter()
                            .map(|p| (p, event_kind::CATCH)),
                    )
                    .collect(),
            )
        };
        match crate::traced::mappings::file_id(object) {
            Some(id) => self.0.entry(id).or_insert_with(read).clone(),
            None => read(),
        }
    }
}

/// The throw and catch points of one object.
pub(super) struct StopPoints {
    pub(super) file: File,
    pub(super) offsets: Vec<u64>,
    pub(super) cookies: Vec<u64>,
}

/// Probes the unwinder's throw functions and the catch functions of `image` (the traced
/// process's objects) for `scope`; returns them (to remove them again) and what the
/// [`Keeper`] needs of them.
/// Errors when the image has no unwinder (then nothing can throw and `--exits return` does
/// the same at no cost), or when the probes are not `uprobe_multi` links; nothing placed here
/// stays in place then.
pub fn attach(
    tracer: &mut Tracer,
    image: &[PathBuf],
    scope: Scope,
    cache: &mut PointCache,
) -> Result<(Attachment, UnwindStops)> {
    let can_throw = image.iter().any(|o| {
        cache
            .points(o)
            .iter()
            .any(|(_, kind)| *kind == event_kind::THROW)
    });
    if !can_throw {
        bail!("--exits repair: no unwinder (_Unwind_RaiseException) in the image: nothing can throw, use --exits return");
    }
    // Only what is placed here goes to the keeper.
    drop(tracer.take_attachment());
    let placed = place_unwind_stops(tracer, image, scope, cache);
    let attachment = tracer.take_attachment();
    let stops = placed.and_then(|objects| {
        let links = tracer.link_fds(&attachment).context(
            "--exits repair needs uprobe_multi links (Linux 6.6 or later): a perf-event probe cannot be handed to the repair keeper",
        )?;
        Ok(UnwindStops {
            links,
            program: tracer.unwind_stop_program_fd()?,
            release_program: tracer.release_program_fd()?,
            objects,
        })
    });
    match stops {
        Ok(stops) => Ok((attachment, stops)),
        Err(err) => {
            tracer.detach(attachment);
            Err(err)
        }
    }
}

/// Places the `unwind_stop` probes; returns each object's points.
pub(super) fn place_unwind_stops(
    tracer: &mut Tracer,
    image: &[PathBuf],
    scope: Scope,
    cache: &mut PointCache,
) -> Result<Vec<StopPoints>> {
    let mut objects = Vec::new();
    for object in image {
        let points = cache.points(object);
        if points.is_empty() {
            continue;
        }
        let file = File::open(object).with_context(|| format!("opening {}", object.display()))?;
        let mut stops = StopPoints {
            file,
            offsets: Vec::new(),
            cookies: Vec::new(),
        };
        for (point, kind) in points.iter() {
            let cookie = tracer
                .attach_unwind_stop(object, point.file_offset, *kind, scope)
                .with_context(|| format!("probing {} in {}", point.name, object.display()))?;
            stops.offsets.push(point.file_offset);
            stops.cookies.push(cookie);
        }
        objects.push(stops);
    }
    Ok(objects)
}
