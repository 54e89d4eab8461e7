//! Which functions an exception or a panic can unwind out of, decided from the machine code.
//!
//! A return probe replaces a frame's return address with the kernel's trampoline, and an
//! unwinder that meets the trampoline finds no unwind information for it: the C++ runtime then
//! calls `std::terminate`. A return probe is therefore safe on a function exactly when no
//! exception can ever leave its frame. This module proves that for as many functions as it
//! soundly can, and says why for every function.
//!
//! An exception starts at a call to a thrower (`__cxa_throw`, `_Unwind_RaiseException`, ...)
//! and travels up call edges. So the analysis:
//! 1. lists the object's functions (the unwinder's own list, `.eh_frame`, completed by the
//!    symbol table) and decodes each one's calls and jumps out of it ([`code`]);
//! 2. marks as *sources* the functions with a transfer to code it cannot see or trust: a
//!    thrower, an indirect call or jump, an import not known to be harmless ([`imports`]), an
//!    address that is no function start, bytes that do not decode;
//! 3. propagates "may unwind" from every source to its callers (and to the functions that
//!    tail-jump to it), stopping at calls the caller's exception table keeps in ([`lsda`]):
//!    calls outside every call-site range (they terminate), or covered by a catch-all or an
//!    empty exception specification. A tail jump is never stopped: the jumping frame is gone.
//!
//! Everything no source reaches cannot unwind: leaves, functions calling only such functions
//! (recursion included), and functions whose exception table stops everything. That is the
//! largest sound answer under these assumptions, stated in the README: exceptions are raised
//! only by calls (not from signal handlers, nor by faulting instructions under
//! `-fnon-call-exceptions`); no thread is cancelled; a call through the PLT to a function this
//! object defines reaches that definition (no interposition); the functions of
//! [`imports::NEVER_THROW`] and imported destructors do not throw.
pub mod code;
pub mod frames;
pub mod imports;
pub mod lsda;

use std::collections::{HashMap, VecDeque};
use std::fmt;

use object::{Object as _, ObjectSymbol as _, SymbolKind};

use crate::elf::{ElfImage, LoadSegment};
use crate::symbols::SymbolTable;
use code::Target;
use imports::{Bound, Slots};
use lsda::{ExceptionTable, Outcome};

/// Largest function decoded (bytes); a bigger extent is hostile or broken and is judged
/// "may unwind".
const MAX_FUNCTION_BYTES: u64 = 16 << 20;

/// The personality routines whose exception tables [`lsda`] reads correctly: for both, a
/// call outside every range terminates and a catch-all catches everything.
const CXX_PERSONALITIES: &[&str] = &["__gxx_personality_v0", "rust_eh_personality"];

/// Why no exception can leave a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Contained {
    /// It calls nothing and jumps to no other function.
    Leaf,
    /// Everything it calls or jumps to cannot unwind.
    CallsOnlyContained,
    /// Its exception table keeps in what its callees could throw (`noexcept`, `catch (...)`).
    ExceptionTable,
}

/// Why an exception may leave a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MayUnwind {
    /// It calls a function that starts unwinding.
    Throws(String),
    /// It calls through a pointer (a function pointer, a virtual call) at this address.
    IndirectCall(u64),
    /// It jumps through a pointer (a switch table or a tail call through a pointer).
    IndirectJump(u64),
    /// It calls an imported function not known to be harmless.
    Import(String),
    /// It calls or jumps to an address that starts no known function.
    UnknownTarget(u64),
    /// It calls (or tail-jumps to) a function that may unwind.
    Calls(String),
    /// Its code does not decode from this address on.
    Undecodable(u64),
    /// The object does not describe the function's code (no symbol size, no unwind entry), or
    /// could not be analysed.
    NoCode,
}

/// The decision for one function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No exception can leave the function: a return probe is safe.
    Contained(Contained),
    /// One may: only exit sleds observe its exits safely.
    MayUnwind(MayUnwind),
}

impl Verdict {
    /// Whether a return probe is safe on the function.
    pub fn is_contained(&self) -> bool {
        matches!(self, Verdict::Contained(_))
    }

    /// The rule that decided, as a short key (statistics: how much each rule proves).
    pub fn rule(&self) -> &'static str {
        match self {
            Verdict::Contained(Contained::Leaf) => "leaf",
            Verdict::Contained(Contained::CallsOnlyContained) => "calls_only_contained",
            Verdict::Contained(Contained::ExceptionTable) => "exception_table",
            Verdict::MayUnwind(MayUnwind::Throws(_)) => "throws",
            Verdict::MayUnwind(MayUnwind::IndirectCall(_)) => "indirect_call",
            Verdict::MayUnwind(MayUnwind::IndirectJump(_)) => "indirect_jump",
            Verdict::MayUnwind(MayUnwind::Import(_)) => "import",
            Verdict::MayUnwind(MayUnwind::UnknownTarget(_)) => "unknown_target",
            Verdict::MayUnwind(MayUnwind::Calls(_)) => "calls_may_unwind",
            Verdict::MayUnwind(MayUnwind::Undecodable(_)) => "undecodable",
            Verdict::MayUnwind(MayUnwind::NoCode) => "no_code",
        }
    }
}

/// Every [`Verdict::rule`] key, contained ones first.
pub const RULES: &[&str] = &[
    "leaf",
    "calls_only_contained",
    "exception_table",
    "throws",
    "calls_may_unwind",
    "indirect_call",
    "indirect_jump",
    "import",
    "unknown_target",
    "undecodable",
    "no_code",
];

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Contained(Contained::Leaf) => write!(f, "leaf"),
            Verdict::Contained(Contained::CallsOnlyContained) => {
                write!(f, "calls only functions that cannot throw")
            }
            Verdict::Contained(Contained::ExceptionTable) => {
                write!(f, "its exception table keeps every exception in")
            }
            Verdict::MayUnwind(MayUnwind::Throws(name)) => {
                write!(f, "throws ({})", crate::symbols::demangle(name))
            }
            Verdict::MayUnwind(MayUnwind::IndirectCall(at)) => {
                write!(f, "indirect call at {at:#x}")
            }
            Verdict::MayUnwind(MayUnwind::IndirectJump(at)) => {
                write!(f, "indirect jump at {at:#x}")
            }
            Verdict::MayUnwind(MayUnwind::Import(name)) => {
                write!(
                    f,
                    "calls {} (imported, may throw)",
                    crate::symbols::demangle(name)
                )
            }
            Verdict::MayUnwind(MayUnwind::UnknownTarget(at)) => {
                write!(f, "calls unknown code at {at:#x}")
            }
            Verdict::MayUnwind(MayUnwind::Calls(name)) => {
                write!(f, "calls {name}, which may throw")
            }
            Verdict::MayUnwind(MayUnwind::Undecodable(at)) => {
                write!(f, "undecodable code at {at:#x}")
            }
            Verdict::MayUnwind(MayUnwind::NoCode) => write!(f, "code not found"),
        }
    }
}

/// A decision for every function of one object.
#[derive(Debug, Default)]
pub struct UnwindAnalysis {
    verdicts: HashMap<u64, Verdict>,
}

impl UnwindAnalysis {
    /// The decision for the function starting at `address`: [`MayUnwind::NoCode`] for an
    /// address that starts no function the object describes.
    pub fn verdict(&self, address: u64) -> Verdict {
        self.verdicts
            .get(&address)
            .cloned()
            .unwrap_or(Verdict::MayUnwind(MayUnwind::NoCode))
    }

    /// Analyses every function of `image`. Never fails: what cannot be read may unwind.
    pub fn of(image: &ElfImage, symbols: &SymbolTable) -> UnwindAnalysis {
        let Ok(file) = image.parse() else {
            return UnwindAnalysis::default();
        };
        let Ok(segments) = image.load_segments() else {
            return UnwindAnalysis::default();
        };
        let memory = Memory {
            data: &image.data,
            segments,
        };
        let slots = Slots::of(&file);
        let plt = imports::plt_ranges(&file);
        let functions = functions(&file, &memory, &slots);
        // Throwers this object defines itself (a static C++ runtime): sources whatever their
        // code looks like.
        let local_throwers: HashMap<u64, String> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.is_definition() && functions.contains_key(&s.address()))
            .filter_map(|s| {
                let name = s.name().ok()?;
                imports::THROWERS
                    .contains(&name)
                    .then(|| (s.address(), name.to_owned()))
            })
            .collect();
        let name = |address: u64| {
            symbols
                .name_at(address)
                .map_or_else(|| format!("{address:#x}"), str::to_owned)
        };

        let starts: std::collections::BTreeSet<u64> = functions.keys().copied().collect();
        // Each function's edges to other functions, and its own reason to unwind, if any.
        let mut sources: HashMap<u64, MayUnwind> = HashMap::new();
        let mut callers: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut contained: HashMap<u64, Contained> = HashMap::new();
        for (&start, function) in &functions {
            if let Some(name) = local_throwers.get(&start) {
                sources.insert(start, MayUnwind::Throws(name.clone()));
                continue;
            }
            let Some(bytes) = memory.code(start, function.end) else {
                sources.insert(start, MayUnwind::NoCode);
                continue;
            };
            let code = code::decode(bytes, start);
            let mut own = code.invalid_at.map(MayUnwind::Undecodable);
            let mut kept_in = false;
            for transfer in &code.transfers {
                let reached = match transfer.target {
                    Target::Address(to) if plt.iter().any(|r| r.contains(&to)) => {
                        resolve_slot(stub_slot(&memory, to), &slots, &memory, &functions)
                    }
                    Target::Address(to) => match containing(&starts, &functions, to) {
                        // Into the middle of a function, too: a compiler's cold part of a
                        // function is reached by a jump into it, and code entered part-way
                        // through can do no more than the whole function does.
                        Some(at) => Reached::Function(at),
                        None => Reached::Unknown(MayUnwind::UnknownTarget(to)),
                    },
                    Target::Slot(slot) => resolve_slot(Some(slot), &slots, &memory, &functions),
                    Target::Unknown if transfer.call => {
                        Reached::Unknown(MayUnwind::IndirectCall(transfer.at))
                    }
                    Target::Unknown => Reached::Unknown(MayUnwind::IndirectJump(transfer.at)),
                };
                if matches!(reached, Reached::Harmless) {
                    continue;
                }
                if transfer.call
                    && function
                        .table
                        .as_ref()
                        .is_some_and(|t| t.outcome(transfer.next) != Outcome::MayLeave)
                {
                    kept_in = true;
                    continue;
                }
                match reached {
                    Reached::Function(to) => callers.entry(to).or_default().push(start),
                    Reached::Unknown(why) => {
                        own.get_or_insert(why);
                    }
                    Reached::Harmless => {}
                }
            }
            match own {
                Some(why) => {
                    sources.insert(start, why);
                }
                None if kept_in => {
                    contained.insert(start, Contained::ExceptionTable);
                }
                None if code.transfers.is_empty() => {
                    contained.insert(start, Contained::Leaf);
                }
                None => {
                    contained.insert(start, Contained::CallsOnlyContained);
                }
            }
        }

        // From every source up its callers, breadth first: each caller names the callee
        // through which it was first reached.
        let mut verdicts: HashMap<u64, Verdict> = HashMap::new();
        let mut queue: VecDeque<u64> = VecDeque::new();
        let mut ordered: Vec<(u64, MayUnwind)> = sources.into_iter().collect();
        ordered.sort_by_key(|(start, _)| *start);
        for (start, why) in ordered {
            verdicts.insert(start, Verdict::MayUnwind(why));
            queue.push_back(start);
        }
        while let Some(callee) = queue.pop_front() {
            let Some(list) = callers.get(&callee) else {
                continue;
            };
            for &caller in list {
                if verdicts.contains_key(&caller) {
                    continue;
                }
                let why = match verdicts.get(&callee) {
                    Some(Verdict::MayUnwind(MayUnwind::Throws(thrower)))
                        if functions.get(&callee).is_some_and(|f| f.end - callee < 64) =>
                    {
                        // A tiny wrapper of a thrower (`std::__throw_*` style) is named by
                        // what it throws with.
                        MayUnwind::Throws(format!("{} via {}", thrower, name(callee)))
                    }
                    _ => MayUnwind::Calls(name(callee)),
                };
                verdicts.insert(caller, Verdict::MayUnwind(why));
                queue.push_back(caller);
            }
        }
        for (start, why) in contained {
            verdicts.entry(start).or_insert(Verdict::Contained(why));
        }
        UnwindAnalysis { verdicts }
    }

    /// How many of the object's functions (every function, not only instrumented ones) were
    /// judged.
    pub fn len(&self) -> usize {
        self.verdicts.len()
    }

    /// Every function judged (start address) and its verdict, in no particular order.
    pub fn verdicts(&self) -> impl Iterator<Item = (u64, &Verdict)> {
        self.verdicts.iter().map(|(&a, v)| (a, v))
    }

    /// Whether no function was analysed.
    pub fn is_empty(&self) -> bool {
        self.verdicts.is_empty()
    }
}

/// One function of the object: where its code ends, and its exception table when its
/// personality routine is one [`lsda`] reads.
struct Function {
    end: u64,
    table: Option<ExceptionTable>,
}

/// What a call reaches.
enum Reached {
    /// A function of this object.
    Function(u64),
    /// Something that cannot unwind.
    Harmless,
    /// Something that may, and why.
    Unknown(MayUnwind),
}

/// The object's bytes as the loader maps them.
struct Memory<'a> {
    data: &'a [u8],
    segments: Vec<LoadSegment>,
}

impl Memory<'_> {
    /// The file bytes from `address` to the end of its segment's file-backed part.
    fn from(&self, address: u64) -> Option<&[u8]> {
        let segment = self
            .segments
            .iter()
            .find(|s| s.file_offset(address).is_some())?;
        let at = usize::try_from(segment.file_offset(address)?).ok()?;
        let end = usize::try_from(segment.offset.checked_add(segment.filesz)?).ok()?;
        self.data.get(at..end)
    }

    /// The code of `[start, end)`, when it lies in one executable segment.
    fn code(&self, start: u64, end: u64) -> Option<&[u8]> {
        let len = end
            .checked_sub(start)
            .filter(|&l| l > 0 && l <= MAX_FUNCTION_BYTES)?;
        let segment = self
            .segments
            .iter()
            .find(|s| s.is_executable() && s.file_offset(start).is_some())?;
        let bytes = self.from(start)?;
        let _ = segment;
        bytes.get(..usize::try_from(len).ok()?)
    }

    /// The pointer stored at `address` in the file (a slot no dynamic relocation fills).
    fn pointer(&self, address: u64) -> Option<u64> {
        let bytes = self.from(address)?.get(..8)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }
}

/// Every function of the object, by start address: the unwinder's FDEs, with their exception
/// tables, and the sized function symbols no FDE starts at.
fn functions(
    file: &object::read::elf::ElfFile64<'_, object::LittleEndian>,
    memory: &Memory<'_>,
    slots: &Slots,
) -> HashMap<u64, Function> {
    let mut out = HashMap::new();
    // By (indirect, address): a handful of distinct personality pointers per object.
    let mut personalities: HashMap<(bool, u64), bool> = HashMap::new();
    for frame in frames::frames(file) {
        let readable = frame.personality.is_some_and(|p| {
            let key = match p {
                gimli::Pointer::Direct(a) => (false, a),
                gimli::Pointer::Indirect(a) => (true, a),
            };
            *personalities.entry(key).or_insert_with(|| {
                personality_name(p, file, slots, memory)
                    .is_some_and(|n| CXX_PERSONALITIES.contains(&n.as_str()))
            })
        });
        let table = match (frame.lsda, readable) {
            (Some(lsda), true) => memory
                .from(lsda)
                .and_then(|data| lsda::parse(data, frame.start)),
            _ => None,
        };
        out.insert(
            frame.start,
            Function {
                end: frame.end,
                table,
            },
        );
    }
    for symbol in file.symbols().chain(file.dynamic_symbols()) {
        if symbol.kind() != SymbolKind::Text || !symbol.is_definition() || symbol.size() == 0 {
            continue;
        }
        let start = symbol.address();
        out.entry(start).or_insert(Function {
            end: start.saturating_add(symbol.size()),
            table: None,
        });
    }
    out
}

/// The function whose code contains `address`: the closest start at or below it, when its
/// extent reaches that far.
fn containing(
    starts: &std::collections::BTreeSet<u64>,
    functions: &HashMap<u64, Function>,
    address: u64,
) -> Option<u64> {
    let start = *starts.range(..=address).next_back()?;
    (address < functions.get(&start)?.end).then_some(start)
}

/// The name of the personality routine `pointer` designates.
fn personality_name(
    pointer: gimli::Pointer,
    file: &object::read::elf::ElfFile64<'_, object::LittleEndian>,
    slots: &Slots,
    memory: &Memory<'_>,
) -> Option<String> {
    let address = match pointer {
        gimli::Pointer::Direct(address) => address,
        gimli::Pointer::Indirect(slot) => match slots.get(slot) {
            Some(Bound::Symbol { name, .. }) => return Some(name.clone()),
            Some(Bound::Local(address)) => *address,
            None => memory.pointer(slot)?,
        },
    };
    file.symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.address() == address && s.is_definition() && s.kind() == SymbolKind::Text)
        .and_then(|s| s.name().ok().map(str::to_owned))
}

/// The GOT slot a PLT stub at `stub` jumps through (`[endbr64;] [bnd] jmp [rip+disp]`).
fn stub_slot(memory: &Memory<'_>, stub: u64) -> Option<u64> {
    let bytes = memory.from(stub)?;
    let bytes = &bytes[..bytes.len().min(16)];
    code::decode(bytes, stub)
        .transfers
        .first()
        .and_then(|t| match t.target {
            Target::Slot(slot) => Some(slot),
            _ => None,
        })
}

/// What a call through GOT slot `slot` reaches.
fn resolve_slot(
    slot: Option<u64>,
    slots: &Slots,
    memory: &Memory<'_>,
    functions: &HashMap<u64, Function>,
) -> Reached {
    let Some(slot) = slot else {
        return Reached::Unknown(MayUnwind::NoCode);
    };
    let local = |address: u64| match functions.contains_key(&address) {
        true => Reached::Function(address),
        false => Reached::Unknown(MayUnwind::UnknownTarget(address)),
    };
    match slots.get(slot) {
        Some(Bound::Symbol { name, defined_at }) => {
            if imports::THROWERS.contains(&name.as_str()) {
                Reached::Unknown(MayUnwind::Throws(name.clone()))
            } else if imports::never_throws(name) || name.starts_with("__xray_") {
                Reached::Harmless
            } else if let Some(address) = defined_at.filter(|a| functions.contains_key(a)) {
                Reached::Function(address)
            } else {
                Reached::Unknown(MayUnwind::Import(name.clone()))
            }
        }
        Some(Bound::Local(address)) => local(*address),
        None => match memory.pointer(slot) {
            Some(address) => local(address),
            None => Reached::Unknown(MayUnwind::UnknownTarget(slot)),
        },
    }
}
