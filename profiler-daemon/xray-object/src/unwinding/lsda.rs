//! A function's exception table (its LSDA in `.gcc_except_table`), read for one question: when
//! an exception comes out of the call at a given address, can it leave the function?
//!
//! The table lists call-site ranges. For the C++ and Rust personality routines
//! (`__gxx_personality_v0`, `rust_eh_personality`):
//! - a call outside every range terminates the program (`noexcept` code, as GCC writes it);
//! - a range whose action chain holds a catch-all (`catch (...)`, a type entry of 0: what
//!   clang's `noexcept` landing pads and Rust's `catch_unwind` use) or an empty exception
//!   specification (`throw()`: `std::unexpected`, then terminate) keeps every exception in;
//! - anything else (no landing pad, cleanups only, typed catches) may let it out.
//!
//! Layout (Itanium C++ ABI exception tables, as libsupc++'s `parse_lsda_header` reads them):
//! `@LPStart` encoding and value, `@TType` encoding and base offset, call-site encoding and
//! table length, the call-site records `(start, length, landing pad, action)`, then the action
//! records `(filter, next)`, both signed LEB128, `next` relative to its own position.
use gimli::{EndianSlice, LittleEndian, Reader as _};

const DW_EH_PE_OMIT: u8 = 0xff;

/// What happens to an exception coming out of one call of the function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call is in no call-site range: the personality routine terminates the program in
    /// this frame.
    Terminates,
    /// A catch-all or an empty exception specification covers the call.
    Stopped,
    /// The exception may leave the function (possibly after cleanups or a typed catch that
    /// does not match).
    MayLeave,
}

/// One call-site range of the table, as absolute addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Site {
    start: u64,
    end: u64,
    stops: bool,
}

/// The call-site table of one function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExceptionTable {
    sites: Vec<Site>,
}

impl ExceptionTable {
    /// The fate of an exception coming out of the call whose return address is `return_to`:
    /// the personality routine looks up `return_to - 1`, inside the call instruction.
    pub fn outcome(&self, return_to: u64) -> Outcome {
        let ip = return_to.wrapping_sub(1);
        match self.sites.iter().find(|s| s.start <= ip && ip < s.end) {
            None => Outcome::Terminates,
            Some(site) if site.stops => Outcome::Stopped,
            Some(_) => Outcome::MayLeave,
        }
    }
}

/// Upper bound on the call sites read from one table (hostile input).
const MAX_SITES: usize = 1 << 20;

/// Parses the LSDA in `data` (the bytes from the LSDA to the end of its section) of the
/// function starting at `function_start`. `None` when the table uses an encoding this reader
/// does not know or is cut short: the caller then assumes every exception may leave.
pub fn parse(data: &[u8], function_start: u64) -> Option<ExceptionTable> {
    let mut r = EndianSlice::new(data, LittleEndian);
    let lp_start_encoding = r.read_u8().ok()?;
    if lp_start_encoding != DW_EH_PE_OMIT {
        // Landing pads are not needed, only whether there is one; the value must still be
        // skipped, and only plain (non-relative) encodings can be.
        if lp_start_encoding & 0x70 != 0 {
            return None;
        }
        read_encoded(&mut r, lp_start_encoding)?;
    }
    let ttype_encoding = r.read_u8().ok()?;
    let ttype_base = if ttype_encoding != DW_EH_PE_OMIT {
        let offset = r.read_uleb128().ok()?;
        let here = data.len() - r.len();
        Some(here.checked_add(usize::try_from(offset).ok()?)?)
    } else {
        None
    };
    let call_site_encoding = r.read_u8().ok()?;
    let table_len = usize::try_from(r.read_uleb128().ok()?).ok()?;
    let table_at = data.len() - r.len();
    let actions_at = table_at.checked_add(table_len)?;
    if actions_at > data.len() {
        return None;
    }
    let mut table = EndianSlice::new(&data[table_at..actions_at], LittleEndian);
    let mut sites = Vec::new();
    while !table.is_empty() {
        if sites.len() >= MAX_SITES {
            return None;
        }
        let start = read_encoded(&mut table, call_site_encoding)?;
        let len = read_encoded(&mut table, call_site_encoding)?;
        let landing_pad = read_encoded(&mut table, call_site_encoding)?;
        let action = table.read_uleb128().ok()?;
        let start = function_start.checked_add(start)?;
        let stops = landing_pad != 0
            && action != 0
            && action_chain_stops(data, actions_at, action - 1, ttype_encoding, ttype_base)?;
        sites.push(Site {
            start,
            end: start.checked_add(len)?,
            stops,
        });
    }
    Some(ExceptionTable { sites })
}

/// Whether the action chain starting `first` bytes into the action table catches everything.
fn action_chain_stops(
    data: &[u8],
    actions_at: usize,
    first: u64,
    ttype_encoding: u8,
    ttype_base: Option<usize>,
) -> Option<bool> {
    let mut at = actions_at.checked_add(usize::try_from(first).ok()?)?;
    // A chain visits each record once; a longer walk is a loop in a hostile table.
    for _ in 0..4096 {
        let mut r = EndianSlice::new(data.get(at..)?, LittleEndian);
        let filter = r.read_sleb128().ok()?;
        let next_at = at + (data.len() - at - r.len());
        let next = r.read_sleb128().ok()?;
        match filter {
            0 => {}
            f if f > 0 => {
                if type_entry(data, ttype_encoding, ttype_base?, f as u64)? == 0 {
                    return Some(true);
                }
            }
            f => {
                // An exception specification: a ULEB128 list of type indices ending in 0, at
                // ttype_base + (-f - 1). An empty list lets no exception through.
                let spec = ttype_base?.checked_add(usize::try_from(-(f + 1)).ok()?)?;
                let mut s = EndianSlice::new(data.get(spec..)?, LittleEndian);
                if s.read_uleb128().ok()? == 0 {
                    return Some(true);
                }
            }
        }
        if next == 0 {
            return Some(false);
        }
        at = usize::try_from(i64::try_from(next_at).ok()?.checked_add(next)?).ok()?;
    }
    None
}

/// The raw value of type entry `index` (1-based, counted backwards from the type table's base).
/// Zero is the null type information of a catch-all, whatever the encoding.
fn type_entry(data: &[u8], encoding: u8, base: usize, index: u64) -> Option<u64> {
    let size = match encoding & 0x0f {
        0x00 | 0x04 | 0x0c => 8,
        0x02 | 0x0a => 2,
        0x03 | 0x0b => 4,
        _ => return None,
    };
    let at = base.checked_sub(usize::try_from(index).ok()?.checked_mul(size)?)?;
    let mut r = EndianSlice::new(data.get(at..)?, LittleEndian);
    read_encoded(&mut r, encoding & 0x0f)
}

/// A value in DWARF exception-header encoding `encoding` (its format bits; the application
/// bits are the caller's business), as raw bits.
fn read_encoded(r: &mut EndianSlice<'_, LittleEndian>, encoding: u8) -> Option<u64> {
    Some(match encoding & 0x0f {
        0x00 | 0x04 => r.read_u64().ok()?,
        0x01 => r.read_uleb128().ok()?,
        0x02 => u64::from(r.read_u16().ok()?),
        0x03 => u64::from(r.read_u32().ok()?),
        0x09 => r.read_sleb128().ok()? as u64,
        0x0a => r.read_i16().ok()? as i64 as u64,
        0x0b => r.read_i32().ok()? as i64 as u64,
        0x0c => r.read_i64().ok()? as u64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An LSDA as clang writes it: no LPStart, a udata4 type table, ULEB128 call sites.
    fn lsda(sites: &[(u8, u8, u8, u8)], actions: &[i8], types: &[u32]) -> Vec<u8> {
        let mut table = Vec::new();
        for &(start, len, lp, action) in sites {
            table.extend_from_slice(&[start, len, lp, action]);
        }
        let mut body = vec![0x01, table.len() as u8];
        body.extend_from_slice(&table);
        body.extend(actions.iter().map(|&a| a as u8));
        let mut types_bytes = Vec::new();
        for t in types.iter().rev() {
            types_bytes.extend_from_slice(&t.to_le_bytes());
        }
        body.extend_from_slice(&types_bytes);
        // @TType base offset: from just after this ULEB128 to the end of the type table.
        let mut out = vec![DW_EH_PE_OMIT, 0x03, body.len() as u8];
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn calls_outside_every_range_terminate() {
        let t = parse(&lsda(&[(0x10, 0x08, 0x40, 0)], &[], &[]), 0x1000).unwrap();
        assert_eq!(t.outcome(0x1005), Outcome::Terminates);
        assert_eq!(
            t.outcome(0x1015),
            Outcome::MayLeave,
            "a cleanup lets it out"
        );
        assert_eq!(t.outcome(0x1019), Outcome::Terminates, "one past the range");
    }

    #[test]
    fn a_catch_all_stops_and_a_typed_catch_does_not() {
        // Action 1 (offset 0): filter 1, end. Action 2 (offset 2): filter 2, end.
        // Type 1 is a real type, type 2 the null of catch (...).
        let t = parse(
            &lsda(
                &[(0, 8, 0x40, 1), (8, 8, 0x40, 3)],
                &[1, 0, 2, 0],
                &[0x1234, 0],
            ),
            0x2000,
        )
        .unwrap();
        assert_eq!(t.outcome(0x2004), Outcome::MayLeave);
        assert_eq!(t.outcome(0x200c), Outcome::Stopped);
    }

    #[test]
    fn a_typed_catch_chained_to_a_catch_all_stops() {
        // Action 1: filter 1, next +1 (to the record at offset 2); that record: filter 2, end.
        let t = parse(&lsda(&[(0, 8, 0x40, 1)], &[1, 1, 2, 0], &[0x1234, 0]), 0).unwrap();
        assert_eq!(t.outcome(4), Outcome::Stopped);
    }

    #[test]
    fn no_landing_pad_lets_it_out() {
        let t = parse(&lsda(&[(0, 8, 0, 1)], &[2, 0], &[0x1234, 0]), 0).unwrap();
        assert_eq!(t.outcome(4), Outcome::MayLeave);
    }

    #[test]
    fn truncated_or_unknown_tables_are_refused() {
        let full = lsda(&[(0, 8, 0x40, 1)], &[1, 0], &[0]);
        for cut in 0..full.len() - 1 {
            // Any prefix either parses to something or is refused; none panics.
            let _ = parse(&full[..cut], 0);
        }
        assert_eq!(parse(&[0x10, 0x00], 0), None, "pc-relative LPStart");
        assert_eq!(parse(&[], 0), None);
    }
}
