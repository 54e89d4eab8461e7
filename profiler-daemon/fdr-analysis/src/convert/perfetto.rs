//! Perfetto's own trace format: a `Trace` of `TracePacket`s (protobuf), as the Perfetto UI and
//! trace processor read it, for traces of any size (the UI opens JSON traces of a few hundred
//! MB at most; this format is its native one).
//!
//! Each process is a track and each thread a track under it (`TrackDescriptor`s with their
//! process and thread descriptors); each call is a `TYPE_SLICE_BEGIN`/`TYPE_SLICE_END` pair of
//! `TrackEvent`s on its thread's track; custom and typed events are instants whose debug
//! annotations hold the payload. Each thread is a packet sequence of its own whose function
//! names are interned (`EventName`, sent once per sequence in the packet that first uses it),
//! so a call costs a few bytes. Times are nanoseconds from the session's first record. The
//! packets are written as the trace is read: memory holds one thread's interned names, not its
//! calls.
//!
//! Calls deeper than [`MAX_SHOWN_DEPTH`] fold as in the other formats (see [`super`]).
use super::depth::{Folding, FOLDED_FRAME, MAX_SHOWN_DEPTH};
use super::json::payload_text;
use crate::replay::{self, Call, FunctionKey, Namer, ObjectTable, Session, TraceEvent, Visitor};
use prost::Message as _;
use proto::track_event::Type;
use proto::{
    DebugAnnotation, EventName, InternedData, ProcessDescriptor, ThreadDescriptor, TracePacket,
    TrackDescriptor, TrackEvent,
};
use std::collections::HashMap;
use std::io::{self, Write};

/// The messages, generated from `proto/perfetto_trace.proto` (see `build.rs`).
#[allow(clippy::all, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

/// `TracePacket.sequence_flags`: the first packet of a sequence clears the interned state;
/// every later one uses it.
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;

/// The name of the interned name that stands for calls folded at [`MAX_SHOWN_DEPTH`].
const FOLDED_IID: u64 = 1;

/// Writes `session` as a Perfetto trace to `out`; returns problems found (one line each).
pub fn write(session: &Session, out: &mut impl Write) -> io::Result<Vec<String>> {
    let start = session.start_ns();
    let mut namer = session.namer();
    let mut warnings = Vec::new();
    let mut folding = Folding::default();
    let mut described = std::collections::HashSet::new();
    let mut buf = Vec::new();
    for (index, t) in session.threads().into_iter().enumerate() {
        let pid = t.process.pid;
        let tid = t.thread.tid;
        let process_track = process_uuid(pid);
        if described.insert(pid) {
            let packet = TracePacket {
                data: Some(proto::trace_packet::Data::TrackDescriptor(
                    TrackDescriptor {
                        uuid: Some(process_track),
                        process: Some(ProcessDescriptor {
                            pid: Some(pid as i32),
                            process_name: Some(t.process.name.clone()),
                        }),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            };
            put(out, &mut buf, &packet)?;
        }
        let track = thread_uuid(pid, tid);
        let sequence = index as u32 + 1;
        let packet = TracePacket {
            data: Some(proto::trace_packet::Data::TrackDescriptor(
                TrackDescriptor {
                    uuid: Some(track),
                    parent_uuid: Some(process_track),
                    thread: Some(ThreadDescriptor {
                        pid: Some(pid as i32),
                        tid: Some(i64::from(tid)),
                        thread_name: Some(if tid == pid { "main thread" } else { "thread" }.into()),
                    }),
                    ..Default::default()
                },
            )),
            optional_trusted_packet_sequence_id: Some(
                proto::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                    sequence,
                ),
            ),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            interned_data: Some(InternedData {
                event_names: vec![EventName {
                    iid: Some(FOLDED_IID),
                    name: Some(FOLDED_FRAME.into()),
                }],
            }),
            ..Default::default()
        };
        put(out, &mut buf, &packet)?;
        let mut v = ThreadWriter {
            out: &mut *out,
            buf: &mut buf,
            namer: &mut namer,
            interned: HashMap::new(),
            objects: t.objects,
            track,
            sequence,
            start,
            folding: &mut folding,
            error: None,
        };
        replay::replay_thread(&t, &mut v, &mut warnings);
        if let Some(e) = v.error {
            return Err(e);
        }
    }
    warnings.extend(folding.warning());
    out.flush()?;
    Ok(warnings)
}

/// A process's track: its pid, above every thread's uuid.
fn process_uuid(pid: u32) -> u64 {
    (1 << 63) | u64::from(pid)
}

/// A thread's track.
fn thread_uuid(pid: u32, tid: u32) -> u64 {
    (u64::from(pid) << 32) | u64::from(tid)
}

/// Writes `packet` as one `Trace.packet` (field 1, length-delimited).
fn put(out: &mut impl Write, buf: &mut Vec<u8>, packet: &TracePacket) -> io::Result<()> {
    buf.clear();
    buf.push(0x0a);
    prost::encoding::encode_varint(packet.encoded_len() as u64, buf);
    packet
        .encode(buf)
        .map_err(|e| io::Error::other(format!("encoding a trace packet: {e}")))?;
    out.write_all(buf)
}

struct ThreadWriter<'a, W: Write> {
    out: &'a mut W,
    buf: &'a mut Vec<u8>,
    namer: &'a mut Namer,
    /// This sequence's interned names.
    interned: HashMap<FunctionKey, u64>,
    objects: ObjectTable,
    track: u64,
    sequence: u32,
    start: u64,
    folding: &'a mut Folding,
    error: Option<io::Error>,
}

impl<W: Write> ThreadWriter<'_, W> {
    /// Writes a track event at `ts`, with the names it interns.
    fn emit(&mut self, ts: u64, event: TrackEvent, names: Vec<EventName>) {
        if self.error.is_some() {
            return;
        }
        let packet = TracePacket {
            timestamp: Some(ts.saturating_sub(self.start)),
            data: Some(proto::trace_packet::Data::TrackEvent(TrackEvent {
                track_uuid: Some(self.track),
                ..event
            })),
            optional_trusted_packet_sequence_id: Some(
                proto::trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(
                    self.sequence,
                ),
            ),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            interned_data: (!names.is_empty()).then_some(InternedData { event_names: names }),
        };
        if let Err(e) = put(self.out, self.buf, &packet) {
            self.error = Some(e);
        }
    }

    /// The interned id of function `id`'s name, and the name to intern with it if this is
    /// its first use on this sequence.
    fn name_iid(&mut self, id: u32) -> (u64, Option<EventName>) {
        let key = self.objects.function(id);
        if let Some(&iid) = self.interned.get(&key) {
            return (iid, None);
        }
        let iid = FOLDED_IID + 1 + self.interned.len() as u64;
        self.interned.insert(key, iid);
        let name = self.namer.function(key).name.clone();
        (
            iid,
            Some(EventName {
                iid: Some(iid),
                name: Some(name),
            }),
        )
    }
}

impl<W: Write> Visitor for ThreadWriter<'_, W> {
    fn enter(&mut self, id: u32, ts: u64, args: &[u64], depth: usize) {
        if self.folding.fold(depth) && depth > MAX_SHOWN_DEPTH {
            return;
        }
        let (iid, new) = if depth == MAX_SHOWN_DEPTH {
            (FOLDED_IID, None)
        } else {
            self.name_iid(id)
        };
        let debug_annotations = if depth < MAX_SHOWN_DEPTH {
            args.iter()
                .enumerate()
                .map(|(i, &a)| DebugAnnotation {
                    name_field: Some(proto::debug_annotation::NameField::Name(format!("arg{i}"))),
                    value: Some(proto::debug_annotation::Value::UintValue(a)),
                })
                .collect()
        } else {
            Vec::new()
        };
        let event = TrackEvent {
            name_field: Some(proto::track_event::NameField::NameIid(iid)),
            r#type: Some(Type::SliceBegin as i32),
            debug_annotations,
            ..Default::default()
        };
        self.emit(ts, event, new.into_iter().collect());
    }

    fn exit(&mut self, call: &Call) {
        if call.depth > MAX_SHOWN_DEPTH {
            return;
        }
        let event = TrackEvent {
            r#type: Some(Type::SliceEnd as i32),
            ..Default::default()
        };
        self.emit(call.end, event, Vec::new());
    }

    fn event(&mut self, e: &TraceEvent<'_>) {
        let name = match e.event_type {
            None => "custom event".to_owned(),
            Some(t) => format!("typed event {t}"),
        };
        let mut debug_annotations = vec![DebugAnnotation {
            name_field: Some(proto::debug_annotation::NameField::Name("payload".into())),
            value: Some(proto::debug_annotation::Value::StringValue(payload_text(
                e.data,
            ))),
        }];
        if let Some(id) = e.function {
            let key = self.objects.function(id);
            debug_annotations.push(DebugAnnotation {
                name_field: Some(proto::debug_annotation::NameField::Name("function".into())),
                value: Some(proto::debug_annotation::Value::StringValue(
                    self.namer.function(key).name.clone(),
                )),
            });
        }
        let event = TrackEvent {
            name_field: Some(proto::track_event::NameField::Name(name)),
            r#type: Some(Type::Instant as i32),
            categories: vec!["event".into()],
            debug_annotations,
            ..Default::default()
        };
        self.emit(e.ts, event, Vec::new());
    }
}
