//! The objects of a session and how a trace's packed function ids name their functions.
use crate::symbolize::ObjectSymbols;
use std::path::PathBuf;
use std::sync::Arc;

/// A function across the session: the object it belongs to and its id as in the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionKey {
    /// Index into [`Session::objects`](super::Session::objects); [`NO_OBJECT`] when the trace names an object the
    /// session does not know.
    pub object: u32,
    /// The function id as the trace holds it: `(XRay object id << 24) | function id`. Kept
    /// packed, not split, so that a function is always shown by the id found in the trace.
    pub id: u32,
}

/// [`FunctionKey::object`] of functions whose object the session does not list.
pub const NO_OBJECT: u32 = u32::MAX;

/// Bits of a packed function id that are the function's id within its object.
pub const FUNCTION_ID_MASK: u32 = 0xFF_FFFF;

impl FunctionKey {
    /// The XRay function id within the object: what its instrumentation map numbers it.
    pub fn function_id(&self) -> u32 {
        self.id & FUNCTION_ID_MASK
    }

    /// The XRay object id: 0 for the executable, 1 to 15 for shared objects.
    pub fn xray_object(&self) -> u32 {
        self.id >> 24
    }
}

/// One process's objects: session object index by XRay object id.
#[derive(Clone, Copy, Debug)]
pub struct ObjectTable(pub(super) [u32; 16]);

impl ObjectTable {
    /// The function a trace record's (packed) function id names.
    pub fn function(&self, id: u32) -> FunctionKey {
        let object = self
            .0
            .get((id >> 24) as usize)
            .copied()
            .unwrap_or(NO_OBJECT);
        FunctionKey { object, id }
    }
}

/// An object functions of the session belong to.
pub struct SessionObject {
    /// The file as recorded (or as given with `--binary`); `None` when nothing names it.
    pub path: Option<PathBuf>,
    /// Its symbols; `None` when it could not be used (missing, replaced, unreadable) and its
    /// functions are named by id.
    pub symbols: Option<Arc<ObjectSymbols>>,
}

impl SessionObject {
    /// File name for people: `libfoo.so`.
    pub fn file_name(&self) -> Option<String> {
        let path = self.path.as_deref()?;
        Some(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
        )
    }
}
