//! Loading the objects of a session's processes: each distinct (file, recorded build-id) once,
//! through the [`Symbolizer`], which refuses a file whose build-id is not the recorded one.
//! A missing, unreadable or replaced file is a warning naming the process, the object and its
//! file; the object's functions are then named by id. A file that is there but is no
//! instrumented ELF object (not a regular file, not ELF, malformed, without an instrumentation
//! map) is an error: no recorder names such a file, so the session was tampered with, and
//! going on would only hide it.
use super::layout::{ObjectEntry, ProcessEntry};
use super::objects::{SessionObject, NO_OBJECT};
use crate::symbolize::{ObjectSymbols, Symbolizer};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What makes two recorded objects the same session object: the file, the build-id it must
/// have, and whether it is refused outright (replaced during the recording, nothing to check).
type ObjectKey = (Option<PathBuf>, Option<String>, bool);

/// Builds the session's object list, process by process.
pub(super) struct Loader<'a> {
    /// `--binary`: replaces every process's executable (XRay object 0).
    binary: Option<&'a Path>,
    symbolizer: &'a Symbolizer,
    objects: Vec<SessionObject>,
    index: HashMap<ObjectKey, u32>,
}

impl<'a> Loader<'a> {
    pub(super) fn new(binary: Option<&'a Path>, symbolizer: &'a Symbolizer) -> Loader<'a> {
        Loader {
            binary,
            symbolizer,
            objects: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// The session objects loaded.
    pub(super) fn into_objects(self) -> Vec<SessionObject> {
        self.objects
    }

    /// Loads (or finds already loaded) the objects of `p`; returns its table from XRay object
    /// id to session object index, or the error refusing one of its files.
    pub(super) fn process(
        &mut self,
        p: &ProcessEntry,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<[u32; 16]> {
        let mut table = [NO_OBJECT; 16];
        let mut entries = p.objects.clone();
        if let Some(binary) = self.binary {
            match entries.iter_mut().find(|o| o.id == 0) {
                Some(o) => o.path = Some(binary.to_path_buf()),
                None => entries.insert(
                    0,
                    ObjectEntry {
                        id: 0,
                        path: Some(binary.to_path_buf()),
                        build_id: None,
                        deleted: false,
                    },
                ),
            }
        }
        for o in &entries {
            let Some(slot) = table.get_mut(usize::from(o.id)) else {
                continue; // The layout keeps ids in range; this only guards the index.
            };
            let given = o.id == 0 && self.binary.is_some();
            let refused = o.deleted && o.build_id.is_none() && !given;
            let key = (o.path.clone(), o.build_id.clone(), refused);
            *slot = match self.index.get(&key) {
                Some(&index) => index,
                None => {
                    let symbols = self.load(p, o, given, warnings)?;
                    self.objects.push(SessionObject {
                        path: o.path.clone(),
                        symbols,
                    });
                    let index = (self.objects.len() - 1) as u32;
                    self.index.insert(key, index);
                    index
                }
            };
        }
        Ok(table)
    }

    fn load(
        &self,
        p: &ProcessEntry,
        o: &ObjectEntry,
        given: bool,
        warnings: &mut Vec<String>,
    ) -> anyhow::Result<Option<Arc<ObjectSymbols>>> {
        let exe = o.id == 0;
        let who = if exe {
            format!("{} (pid {})", p.name, p.pid)
        } else {
            format!("{} (pid {}) object {}", p.name, p.pid, o.id)
        };
        let Some(path) = o.path.as_deref() else {
            warnings.push(if exe {
                format!(
                    "{who}: no binary is recorded; its functions are shown by id (give --binary)"
                )
            } else {
                format!("{who}: no file is recorded; its functions are shown by id")
            });
            return Ok(None);
        };
        if o.deleted && o.build_id.is_none() && !given {
            let hint = if exe {
                " (give --binary with the original)"
            } else {
                ""
            };
            warnings.push(format!(
                "{who}: {} was replaced on disk during the recording and no build-id was recorded to check it; its functions are shown by id{hint}",
                path.display()
            ));
            return Ok(None);
        }
        match self.symbolizer.object(path, o.build_id.as_deref()) {
            Ok(obj) => {
                if o.build_id.is_none() {
                    let what = if exe {
                        "the binary that ran"
                    } else {
                        "the object that was loaded"
                    };
                    warnings.push(format!(
                        "{who}: no build-id was recorded, so nothing shows that {} is {what}; names assume it is",
                        path.display()
                    ));
                }
                for refused in &obj.refused_debug_files {
                    warnings.push(format!("debug file refused: {refused}"));
                }
                Ok(Some(obj))
            }
            Err(e) if refused(&e) => Err(anyhow::anyhow!("{who}: {e:#}; refused")),
            Err(e) => {
                warnings.push(format!("{who}: {e:#}; its functions are shown by id"));
                Ok(None)
            }
        }
    }
}

/// Whether `e` refuses the file itself (it is there, but is no instrumented ELF object), as
/// opposed to the file being missing or unreadable, or another build than the recorded one.
fn refused(e: &anyhow::Error) -> bool {
    use xray_object::elf::ElfError;
    use xray_object::instrmap::InstrMapError;
    let elf = |e: &ElfError| !matches!(e, ElfError::Io { .. });
    if let Some(e) = e.downcast_ref::<ElfError>() {
        return elf(e);
    }
    match e.downcast_ref::<InstrMapError>() {
        Some(InstrMapError::Elf(e)) => elf(e),
        Some(_) => true,
        None => false,
    }
}
