//! Where a custom or typed event sled keeps its arguments.
//!
//! An unpatched event sled is `jmp +15` (custom) or `jmp +20` (typed) over the code the XRay
//! runtime would run once patched: for each argument slot either `push dst` or a 4-byte nop,
//! then for each pushed slot a `mov src, dst` into the System V argument register (`rdi`,
//! `rsi`, `rdx`), then `call __xray_CustomEvent`/`__xray_TypedEvent`. A slot whose value is
//! already in its argument register gets the nop. A uprobe on the sled fires before any of that
//! runs, so each argument is in the register its mov reads from (or in the argument register
//! itself). This module decodes those instructions; see xray-binaries.md.
//!
//! On AArch64 the sled is `b` over the same shape (`AArch64AsmPrinter::LowerPATCHABLE_EVENT_CALL`):
//! `stp x0, x1, [sp, #-16]!` (typed: `#-32`, then `str x2, [sp, #16]`), a `mov` into each of
//! x0, x1 (and x2) from where the value is, `bl __xray_CustomEvent`/`__xray_TypedEvent`, the
//! restores: [`decode_aarch64`].

use xray_object::elf::Machine;

/// Registers holding an event sled's arguments at the sled address (see [`decode_x86_64`] and
/// [`decode_aarch64`]), for the architecture of the object the sled is in.
pub fn decode(machine: Machine, bytes: &[u8], typed: bool) -> Option<[u8; 3]> {
    match machine {
        Machine::X86_64 => decode_x86_64(bytes, typed),
        Machine::Aarch64 => decode_aarch64(bytes, typed),
    }
}

/// x86-64 register numbers as the instruction encoding uses them (rax 0 ... rdi 7, r8 8 ...).
const RDI: u8 = 7;
const RSI: u8 = 6;
const RDX: u8 = 2;

/// Registers (x86-64 numbers) holding an event sled's arguments at the sled address:
/// `[pointer, size, 0]` for a custom event, `[type, pointer, size]` for a typed event. `None`
/// when the bytes are not an event sled this decoder understands (the sled is then not probed).
pub fn decode_x86_64(bytes: &[u8], typed: bool) -> Option<[u8; 3]> {
    let (jump, slots): (u8, &[u8]) = if typed {
        (0x14, &[RDI, RSI, RDX])
    } else {
        (0x0f, &[RDI, RSI])
    };
    if bytes.len() < 2 + jump as usize || bytes[0] != 0xeb || bytes[1] != jump {
        return None;
    }
    // holds[r] = the register whose value at the sled address r holds after the movs so far.
    let mut holds: [u8; 16] = core::array::from_fn(|r| r as u8);
    let body = &bytes[2..2 + jump as usize];
    let mut i = 0;
    while i < body.len() {
        match body[i..] {
            // call rel32: the end of the argument set-up.
            [0xe8, ..] => break,
            // push r64 / push r8..r15
            [0x50..=0x57, ..] => i += 1,
            [0x41, 0x50..=0x57, ..] => i += 2,
            // 4-byte nop standing in for a slot whose value is already in place.
            [0x0f, 0x1f, 0x40, _, ..] => i += 4,
            // mov r/m64, r64 (89) or mov r64, r/m64 (8b), register to register.
            [rex @ 0x48..=0x4f, op @ (0x89 | 0x8b), modrm, ..] if modrm >> 6 == 3 => {
                let reg = ((modrm >> 3) & 7) | if rex & 4 != 0 { 8 } else { 0 };
                let rm = (modrm & 7) | if rex & 1 != 0 { 8 } else { 0 };
                let (dst, src) = if op == 0x89 { (rm, reg) } else { (reg, rm) };
                holds[dst as usize] = holds[src as usize];
                i += 3;
            }
            _ => return None,
        }
    }
    if i >= body.len() {
        return None;
    }
    let mut regs = [0u8; 3];
    for (out, &slot) in regs.iter_mut().zip(slots) {
        *out = holds[slot as usize];
    }
    Some(regs)
}

/// Registers (x`n`) holding an AArch64 event sled's arguments at the sled address, in the
/// order of [`decode_x86_64`]'s; `None` when the words are not an event sled of that shape.
pub fn decode_aarch64(bytes: &[u8], typed: bool) -> Option<[u8; 3]> {
    let word = |i: usize| {
        bytes
            .get(4 * i..4 * i + 4)
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let first = word(0)?;
    // `b` forward, over the call sequence (in words).
    if first & 0xfc00_0000 != 0x1400_0000 {
        return None;
    }
    let words = (first & 0x03ff_ffff) as usize;
    if !(2..=12).contains(&words) {
        return None;
    }
    // holds[r] = the register whose value at the sled address x`r` holds after the movs so far.
    let mut holds: [u8; 32] = core::array::from_fn(|r| r as u8);
    for i in 1..words {
        let w = word(i)?;
        let base_is_sp = (w >> 5) & 31 == 31;
        match w {
            // bl: the end of the argument set-up.
            _ if w & 0xfc00_0000 == 0x9400_0000 => {
                let slots: &[usize] = if typed { &[0, 1, 2] } else { &[0, 1] };
                let mut regs = [0u8; 3];
                for (out, &slot) in regs.iter_mut().zip(slots) {
                    *out = holds[slot];
                }
                return Some(regs);
            }
            // mov xd, xm (orr xd, xzr, xm): a copy between general registers.
            _ if w & 0xffe0_ffe0 == 0xaa00_03e0 => {
                let (m, d) = (((w >> 16) & 31) as usize, (w & 31) as usize);
                if m == 31 || d == 31 {
                    return None;
                }
                holds[d] = holds[m];
            }
            // stp x_, x_, [sp, #imm]! and str x_, [sp, #imm]: the argument registers saved.
            _ if w & 0xffc0_0000 == 0xa980_0000 && base_is_sp => {}
            _ if w & 0xffc0_0000 == 0xf900_0000 && base_is_sp => {}
            _ => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    // AArch64 sleds as clang 19 emits them (llvm-objdump of tests/fixtures/events.cpp).
    #[test]
    fn aarch64_custom_events() {
        // b +24; stp x0, x1, [sp, #-16]!; mov x0, x20; mov x1, x8; bl; ldp
        let b = words(&[
            0x1400_0006,
            0xa9bf_07e0,
            0xaa14_03e0,
            0xaa08_03e1,
            0x97ff_f048,
            0xa8c1_07e0,
        ]);
        assert_eq!(decode(Machine::Aarch64, &b, false), Some([20, 8, 0]));
        // mov x0, x0; mov x1, x1: in place.
        let b = words(&[
            0x1400_0006,
            0xa9bf_07e0,
            0xaa00_03e0,
            0xaa01_03e1,
            0x97ff_f099,
            0xa8c1_07e0,
        ]);
        assert_eq!(decode_aarch64(&b, false), Some([0, 1, 0]));
        // mov x0, x1; mov x1, x0: x1 gets what x0 now holds, x1's original value.
        let b = words(&[
            0x1400_0006,
            0xa9bf_07e0,
            0xaa01_03e0,
            0xaa00_03e1,
            0x9400_0000,
        ]);
        assert_eq!(decode_aarch64(&b, false), Some([1, 1, 0]));
    }

    #[test]
    fn aarch64_typed_event() {
        // b +36; stp x0, x1, [sp, #-32]!; str x2, [sp, #16]; mov x0, x9; mov x1, x10;
        // mov x2, x11; bl
        let b = words(&[
            0x1400_0009,
            0xa9be_07e0,
            0xf900_0be2,
            0xaa09_03e0,
            0xaa0a_03e1,
            0xaa0b_03e2,
            0x9400_0000,
        ]);
        assert_eq!(decode_aarch64(&b, true), Some([9, 10, 11]));
    }

    #[test]
    fn aarch64_rejects_what_is_not_an_event_sled() {
        // The function sled: b #32 over NOPs, no bl.
        let mut w = vec![0x1400_0008];
        w.extend([0xd503_201f; 7]);
        assert_eq!(decode_aarch64(&words(&w), false), None);
        // A load into x0 instead of a mov.
        let b = words(&[0x1400_0006, 0xa9bf_07e0, 0xf940_0000, 0x9400_0000]);
        assert_eq!(decode_aarch64(&b, false), None);
        // Short.
        assert_eq!(
            decode_aarch64(&words(&[0x1400_0006, 0xa9bf_07e0]), false),
            None
        );
    }

    // Sleds as clang 19 emits them (objdump of a test program).
    #[test]
    fn custom_event_with_arguments_in_place() {
        let b = [
            0xeb, 0x0f, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0xe8, 0x25, 0xc4, 0xff,
            0xff, 0x90, 0x90,
        ];
        assert_eq!(decode_x86_64(&b, false), Some([RDI, RSI, 0]));
    }

    #[test]
    fn custom_event_with_moved_arguments() {
        // push rdi; push rsi; mov rdi, rbx; mov rsi, rax; call
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x48, 0x89, 0xdf, 0x48, 0x89, 0xc6, 0xe8, 0xcd, 0xc3, 0xff,
            0xff, 0x5e, 0x5f,
        ];
        assert_eq!(decode_x86_64(&b, false), Some([3, 0, 0]));
    }

    #[test]
    fn typed_event_and_extended_registers() {
        // push rdi; nop4; nop4; mov rdi, rax; call
        let b = [
            0xeb, 0x14, 0x57, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0x48, 0x89, 0xc7,
            0xe8, 0xcf, 0xc4, 0xff, 0xff, 0x90, 0x90, 0x5f,
        ];
        assert_eq!(decode_x86_64(&b, true), Some([0, RSI, RDX]));
        // push rdi; push rsi; mov rdi, r8 (4c 89 c7); mov rsi, r15 (4c 89 fe); call
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x4c, 0x89, 0xc7, 0x4c, 0x89, 0xfe, 0xe8, 0, 0, 0, 0, 0x5e,
            0x5f,
        ];
        assert_eq!(decode_x86_64(&b, false), Some([8, 15, 0]));
    }

    #[test]
    fn movs_apply_in_order() {
        // mov rdi, rsi; mov rsi, rdi: rsi ends up with rsi's original value.
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x48, 0x89, 0xf7, 0x48, 0x89, 0xfe, 0xe8, 0, 0, 0, 0, 0x5e,
            0x5f,
        ];
        assert_eq!(decode_x86_64(&b, false), Some([RSI, RSI, 0]));
    }

    #[test]
    fn rejects_what_is_not_an_event_sled() {
        assert_eq!(decode_x86_64(&[0xeb, 0x09, 0x90], false), None);
        assert_eq!(decode_x86_64(&[0xeb, 0x0f], false), None);
        let mut b = [0x90u8; 17];
        b[0] = 0xeb;
        b[1] = 0x0f;
        assert_eq!(decode_x86_64(&b, false), None);
        // No call within the jump.
        let b = [
            0xeb, 0x0f, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08,
            0x0f, 0x1f, 0x40,
        ];
        assert_eq!(decode_x86_64(&b, false), None);
    }
}
