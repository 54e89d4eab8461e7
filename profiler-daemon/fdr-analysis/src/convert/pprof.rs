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
use crate::replay::{FunctionKey, Session, NO_OBJECT};
use flate2::write::GzEncoder;
use prost::Message as _;
use std::collections::HashMap;
use std::io::{self, Write};

/// The generated `perftools.profiles` messages (build.rs, from `proto/profile.proto`).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perftools.profiles.rs"));
}

use proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

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

/// Builds the pprof profile of `session`; returns it and the problems found while reading.
pub fn profile(session: &Session) -> (Profile, Vec<String>) {
    let (trie, mut warnings) = StackTrie::from_session(session);
    let mut strings = Strings::new();
    let sample_type = vec![
        ValueType {
            r#type: strings.id("calls"),
            unit: strings.id("count"),
        },
        ValueType {
            r#type: strings.id("wall"),
            unit: strings.id("nanoseconds"),
        },
        ValueType {
            r#type: strings.id("self"),
            unit: strings.id("nanoseconds"),
        },
    ];
    let default_sample_type = strings.id("self");

    // One mapping per object of the session (ids 1..), one for functions of unknown objects.
    let mut mappings: Vec<Mapping> = Vec::new();
    let mut mapping_of_object: HashMap<u32, u64> = HashMap::new();
    let mut mapping_id = |object: u32, strings: &mut Strings, mappings: &mut Vec<Mapping>| {
        *mapping_of_object.entry(object).or_insert_with(|| {
            let id = mappings.len() as u64 + 1;
            let found = session.objects.get(object as usize);
            let symbols = found.and_then(|o| o.symbols.as_ref());
            let path = found
                .and_then(|o| o.path.as_ref())
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "[unknown object]".to_owned());
            let has_lines = symbols.is_some_and(|s| s.debug_file.is_some());
            mappings.push(Mapping {
                id,
                memory_start: 0,
                memory_limit: u64::MAX,
                file_offset: 0,
                filename: strings.id(&path),
                build_id: strings.id(symbols.and_then(|s| s.build_id.as_deref()).unwrap_or("")),
                has_functions: true,
                has_filenames: has_lines,
                has_line_numbers: has_lines,
                has_inline_frames: false,
            });
            id
        })
    };

    // One location and one function per distinct frame.
    let mut namer = session.namer();
    let mut locations: Vec<Location> = Vec::new();
    let mut functions: Vec<Function> = Vec::new();
    let mut location_of_frame: HashMap<Frame, u64> = HashMap::new();
    let mut location_id = |frame: Frame,
                           strings: &mut Strings,
                           mappings: &mut Vec<Mapping>,
                           locations: &mut Vec<Location>,
                           functions: &mut Vec<Function>| {
        if let Some(&id) = location_of_frame.get(&frame) {
            return id;
        }
        let id = locations.len() as u64 + 1;
        let (name, file, line, address, object) = match frame {
            Frame::Folded => (FOLDED_FRAME.to_owned(), String::new(), 0, 0, NO_OBJECT),
            Frame::Function(FunctionKey { object, id: fid }) => {
                let info = namer.function(FunctionKey { object, id: fid });
                let (file, line) = info
                    .location
                    .as_ref()
                    .map(|l| (l.file.clone(), i64::from(l.line)))
                    .unwrap_or_default();
                (info.name.clone(), file, line, info.address, object)
            }
        };
        functions.push(Function {
            id,
            name: strings.id(&name),
            system_name: strings.id(&name),
            filename: strings.id(&file),
            start_line: line,
        });
        locations.push(Location {
            id,
            mapping_id: mapping_id(object, strings, mappings),
            address,
            line: vec![Line {
                function_id: id,
                line,
            }],
            is_folded: false,
        });
        location_of_frame.insert(frame, id);
        id
    };

    // One sample per stack at which calls returned, its locations leaf first.
    let mut samples = Vec::new();
    let mut stack = Vec::new();
    for (node, r) in trie.returned.iter().enumerate() {
        if r.calls == 0 {
            continue;
        }
        stack.clear();
        let mut at = node as u32;
        while at != ROOT {
            let (parent, frame) = trie.nodes[at as usize];
            stack.push(location_id(
                frame,
                &mut strings,
                &mut mappings,
                &mut locations,
                &mut functions,
            ));
            at = parent;
        }
        samples.push(Sample {
            location_id: stack.clone(),
            value: vec![clamp(r.calls), clamp(r.total_ns), clamp(r.self_ns)],
            label: Vec::new(),
        });
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
    let left_out = trie.not_returned;
    let mut comment = vec![strings.id(&format!(
        "fdr-profiled session {}",
        session.layout.dir.display()
    ))];
    if left_out > 0 {
        comment.push(strings.id(&format!(
            "{left_out} calls that did not return (unwound by an exception, or unfinished) are left out"
        )));
    }
    let profile = Profile {
        sample_type,
        sample: samples,
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos,
        duration_nanos: clamp(last.saturating_sub(first)),
        period_type: None,
        period: 0,
        comment,
        default_sample_type,
    };
    (profile, warnings)
}

fn clamp(v: u64) -> i64 {
    v.min(i64::MAX as u64) as i64
}

/// Writes the gzipped pprof profile of `session`; returns problems found.
pub fn write(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let (profile, warnings) = profile(session);
    let mut gz = GzEncoder::new(&mut *out, flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?;
    out.flush()?;
    Ok(warnings)
}
