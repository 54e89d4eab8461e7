//! pprof profiles (`profile.proto`, gzipped): what `go tool pprof`, Grafana Pyroscope and Parca
//! read.
//!
//! One sample per distinct call stack, over every thread and process, with three values:
//! `calls/count`, `wall/nanoseconds` (the inclusive time of the calls that ended at that
//! stack) and `self/nanoseconds` (their exclusive time, the default). So in `go tool pprof`, a
//! function's *flat* is the report's calls, total and self time for the calls, wall and self
//! sample types; and with self time (the default), its *cum* is the time spent in it and
//! below, the report's total for a function that does not recurse (pprof counts a function
//! once per stack, the report each call).
//!
//! Like the report's columns, only calls that returned are counted: calls an exception unwound
//! and calls still open at the end have no exact duration (their number is in the profile's
//! comments). Stacks are cut at [`MAX_SHOWN_DEPTH`](super::MAX_SHOWN_DEPTH) as in the other
//! formats.
//!
//! Each function is one location (its entry address) in the mapping of its object, which
//! carries the object's path and build-id; functions have their name and, when the DWARF
//! says, their file and first line. The locations are marked symbolized (`has_functions`), so
//! pprof does not look for the binaries again.

use super::depth::FOLDED_FRAME;
use super::folded::{Frame, StackTrie, ROOT};
use crate::replay::{Session, NO_OBJECT};
use crate::symbolize::{FunctionInfo, ObjectSymbols};
use flate2::write::GzEncoder;
use prost::Message as _;
use std::collections::HashMap;
use std::io::{self, Write};

/// The generated `perftools.profiles` messages (build.rs, from `proto/profile.proto`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

use proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// The profile's strings, each stored once; index 0 is "" as pprof requires.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        Strings {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

/// The object a function belongs to, as its mapping shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ObjectInfo {
    /// Its path.
    pub path: String,
    /// Its build-id in hex, empty when unknown.
    pub build_id: String,
    /// Whether its functions have source files and lines (DWARF found).
    pub has_lines: bool,
}

/// One frame of a stack as the profile shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameInfo {
    /// The function's name.
    pub name: String,
    /// Its source file, empty when unknown.
    pub file: String,
    /// Its first line, 0 when unknown.
    pub line: i64,
    /// Its link-time address.
    pub address: u64,
    /// Its object.
    pub object: ObjectInfo,
}

impl ObjectInfo {
    /// The object at `path`, with what its symbols say (none when it could not be read).
    pub fn new(path: String, symbols: Option<&ObjectSymbols>) -> ObjectInfo {
        ObjectInfo {
            path,
            build_id: symbols.and_then(|s| s.build_id.clone()).unwrap_or_default(),
            has_lines: symbols.is_some_and(|s| s.debug_file.is_some()),
        }
    }
}

impl FrameInfo {
    /// The frame of a symbolized function of `object`.
    pub fn of_function(f: &FunctionInfo, object: ObjectInfo) -> FrameInfo {
        let (file, line) = f
            .location
            .as_ref()
            .map(|l| (l.file.clone(), i64::from(l.line)))
            .unwrap_or_default();
        FrameInfo {
            name: f.name.clone(),
            file,
            line,
            address: f.address,
            object,
        }
    }
}

/// What one call stack adds up to: [`SAMPLE_TYPES`] in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackValues {
    /// Calls that returned at this stack.
    pub calls: u64,
    /// Their inclusive time, ns.
    pub wall_ns: u64,
    /// Their exclusive time, ns.
    pub self_ns: u64,
}

/// The sample types of every profile written here, as (type, unit); the default is `self`.
pub const SAMPLE_TYPES: [(&str, &str); 3] = [
    ("calls", "count"),
    ("wall", "nanoseconds"),
    ("self", "nanoseconds"),
];

/// Builds a profile sample by sample, each frame (keyed by the caller's `K`) made a function,
/// a location and, per object, a mapping once. Shared by `convert` and the service's export.
pub struct ProfileBuilder<K> {
    strings: Strings,
    mappings: Vec<Mapping>,
    mapping_of_object: HashMap<ObjectInfo, u64>,
    locations: Vec<Location>,
    functions: Vec<Function>,
    location_of_frame: HashMap<K, u64>,
    samples: Vec<Sample>,
}

impl<K: std::hash::Hash + Eq> Default for ProfileBuilder<K> {
    fn default() -> Self {
        ProfileBuilder {
            strings: Strings::new(),
            mappings: Vec::new(),
            mapping_of_object: HashMap::new(),
            locations: Vec::new(),
            functions: Vec::new(),
            location_of_frame: HashMap::new(),
            samples: Vec::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq> ProfileBuilder<K> {
    /// The location of the frame `key`, made from `info()` the first time.
    pub fn location(&mut self, key: K, info: impl FnOnce() -> FrameInfo) -> u64 {
        if let Some(&id) = self.location_of_frame.get(&key) {
            return id;
        }
        let f = info();
        let mapping_id = match self.mapping_of_object.get(&f.object) {
            Some(&id) => id,
            None => {
                let id = self.mappings.len() as u64 + 1;
                self.mappings.push(Mapping {
                    id,
                    memory_start: 0,
                    memory_limit: u64::MAX,
                    file_offset: 0,
                    filename: self.strings.id(&f.object.path),
                    build_id: self.strings.id(&f.object.build_id),
                    has_functions: true,
                    has_filenames: f.object.has_lines,
                    has_line_numbers: f.object.has_lines,
                    has_inline_frames: false,
                });
                self.mapping_of_object.insert(f.object.clone(), id);
                id
            }
        };
        let id = self.locations.len() as u64 + 1;
        let name = self.strings.id(&f.name);
        self.functions.push(Function {
            id,
            name,
            system_name: name,
            filename: self.strings.id(&f.file),
            start_line: f.line,
        });
        self.locations.push(Location {
            id,
            mapping_id,
            address: f.address,
            line: vec![Line {
                function_id: id,
                line: f.line,
            }],
            is_folded: false,
        });
        self.location_of_frame.insert(key, id);
        id
    }

    /// Adds one sample: `locations` leaf first (from [`ProfileBuilder::location`]).
    pub fn sample(&mut self, locations: Vec<u64>, values: StackValues, labels: &[(&str, &str)]) {
        let label = labels
            .iter()
            .map(|(k, v)| Label {
                key: self.strings.id(k),
                str: self.strings.id(v),
                num: 0,
                num_unit: 0,
            })
            .collect();
        self.samples.push(Sample {
            location_id: locations,
            value: vec![
                clamp(values.calls),
                clamp(values.wall_ns),
                clamp(values.self_ns),
            ],
            label,
        });
    }

    /// Samples added so far.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample was added.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The profile: starting at `time_nanos` (since the Unix epoch), lasting `duration_nanos`,
    /// with free-form `comments`.
    pub fn finish(mut self, time_nanos: i64, duration_nanos: i64, comments: &[String]) -> Profile {
        let sample_type = SAMPLE_TYPES
            .iter()
            .map(|(t, u)| ValueType {
                r#type: self.strings.id(t),
                unit: self.strings.id(u),
            })
            .collect();
        let default_sample_type = self.strings.id(SAMPLE_TYPES[2].0);
        let comment = comments.iter().map(|c| self.strings.id(c)).collect();
        Profile {
            sample_type,
            sample: self.samples,
            mapping: self.mappings,
            location: self.locations,
            function: self.functions,
            string_table: self.strings.table,
            drop_frames: 0,
            keep_frames: 0,
            time_nanos,
            duration_nanos,
            period_type: None,
            period: 0,
            comment,
            default_sample_type,
        }
    }
}

/// Builds the pprof profile of `session`; returns it and the problems found while reading.
pub fn profile(session: &Session) -> (Profile, Vec<String>) {
    let (trie, mut warnings) = StackTrie::from_session(session);
    let mut builder: ProfileBuilder<Frame> = ProfileBuilder::default();
    let mut namer = session.namer();
    let object_info = |object: u32| {
        let found = session.objects.get(object as usize);
        ObjectInfo::new(
            found
                .and_then(|o| o.path.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "[unknown object]".to_owned()),
            found.and_then(|o| o.symbols.as_deref()),
        )
    };

    // One sample per stack at which calls returned, its locations leaf first.
    let mut stack = Vec::new();
    for (node, r) in trie.returned.iter().enumerate() {
        if r.calls == 0 {
            continue;
        }
        stack.clear();
        let mut at = node as u32;
        while at != ROOT {
            let (parent, frame) = trie.nodes[at as usize];
            stack.push(builder.location(frame, || match frame {
                Frame::Folded => FrameInfo {
                    name: FOLDED_FRAME.to_owned(),
                    object: object_info(NO_OBJECT),
                    ..FrameInfo::default()
                },
                Frame::Function(key) => {
                    FrameInfo::of_function(&namer.function(key), object_info(key.object))
                }
            }));
            at = parent;
        }
        builder.sample(
            stack.clone(),
            StackValues {
                calls: r.calls,
                wall_ns: r.total_ns,
                self_ns: r.self_ns,
            },
            &[],
        );
    }

    let (first, last) = trie.span;
    let time_nanos = session
        .wall_clock_offset_ns()
        .map(|offset| (i128::from(first) + offset).clamp(0, i128::from(i64::MAX)) as i64)
        .unwrap_or(0);
    if time_nanos == 0 {
        warnings.push(
            "no thread file carries a wall-clock time: the pprof profile's time_nanos is 0".into(),
        );
    }
    let mut comments = vec![format!(
        "fdr-profiled session {}",
        session.layout.dir.display()
    )];
    if trie.not_returned > 0 {
        comments.push(format!(
            "{} calls that did not return (unwound by an exception, or unfinished) are left out",
            trie.not_returned
        ));
    }
    let profile = builder.finish(time_nanos, clamp(last.saturating_sub(first)), &comments);
    (profile, warnings)
}

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// `profile` serialized and gzipped, as a file or a push carries it.
pub fn gzipped(profile: &Profile) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())
        .and_then(|()| gz.finish())
        .expect("writing to memory cannot fail")
}

/// Writes the gzipped pprof profile of `session`; returns problems found.
pub fn write(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let (profile, warnings) = profile(session);
    out.write_all(&gzipped(&profile))?;
    out.flush()?;
    Ok(warnings)
}
