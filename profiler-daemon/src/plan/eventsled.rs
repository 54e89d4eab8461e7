//! Where a custom or typed event sled keeps its arguments.
//!
//! An unpatched event sled is `jmp +15` (custom) or `jmp +20` (typed) over the code the XRay
//! runtime would run once patched: for each argument slot either `push dst` or a 4-byte nop,
//! then for each pushed slot a `mov src, dst` into the System V argument register (`rdi`,
//! `rsi`, `rdx`), then `call __xray_CustomEvent`/`__xray_TypedEvent`. A slot whose value is
//! already in its argument register gets the nop. A uprobe on the sled fires before any of that
//! runs, so each argument is in the register its mov reads from (or in the argument register
//! itself). This module decodes those instructions; see xray-binaries.md.

/// x86-64 register numbers as the instruction encoding uses them (rax 0 ... rdi 7, r8 8 ...).
const RDI: u8 = 7;
const RSI: u8 = 6;
const RDX: u8 = 2;

/// Registers (x86-64 numbers) holding an event sled's arguments at the sled address:
/// `[pointer, size, 0]` for a custom event, `[type, pointer, size]` for a typed event. `None`
/// when the bytes are not an event sled this decoder understands (the sled is then not probed).
pub fn decode(bytes: &[u8], typed: bool) -> Option<[u8; 3]> {
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

#[cfg(test)]
mod tests {
    use super::*;

    // Sleds as clang 19 emits them (objdump of a test program).
    #[test]
    fn custom_event_with_arguments_in_place() {
        let b = [
            0xeb, 0x0f, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0xe8, 0x25, 0xc4, 0xff,
            0xff, 0x90, 0x90,
        ];
        assert_eq!(decode(&b, false), Some([RDI, RSI, 0]));
    }

    #[test]
    fn custom_event_with_moved_arguments() {
        // push rdi; push rsi; mov rdi, rbx; mov rsi, rax; call
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x48, 0x89, 0xdf, 0x48, 0x89, 0xc6, 0xe8, 0xcd, 0xc3, 0xff,
            0xff, 0x5e, 0x5f,
        ];
        assert_eq!(decode(&b, false), Some([3, 0, 0]));
    }

    #[test]
    fn typed_event_and_extended_registers() {
        // push rdi; nop4; nop4; mov rdi, rax; call
        let b = [
            0xeb, 0x14, 0x57, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0x48, 0x89, 0xc7,
            0xe8, 0xcf, 0xc4, 0xff, 0xff, 0x90, 0x90, 0x5f,
        ];
        assert_eq!(decode(&b, true), Some([0, RSI, RDX]));
        // push rdi; push rsi; mov rdi, r8 (4c 89 c7); mov rsi, r15 (4c 89 fe); call
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x4c, 0x89, 0xc7, 0x4c, 0x89, 0xfe, 0xe8, 0, 0, 0, 0, 0x5e,
            0x5f,
        ];
        assert_eq!(decode(&b, false), Some([8, 15, 0]));
    }

    #[test]
    fn movs_apply_in_order() {
        // mov rdi, rsi; mov rsi, rdi: rsi ends up with rsi's original value.
        let b = [
            0xeb, 0x0f, 0x57, 0x56, 0x48, 0x89, 0xf7, 0x48, 0x89, 0xfe, 0xe8, 0, 0, 0, 0, 0x5e,
            0x5f,
        ];
        assert_eq!(decode(&b, false), Some([RSI, RSI, 0]));
    }

    #[test]
    fn rejects_what_is_not_an_event_sled() {
        assert_eq!(decode(&[0xeb, 0x09, 0x90], false), None);
        assert_eq!(decode(&[0xeb, 0x0f], false), None);
        let mut b = [0x90u8; 17];
        b[0] = 0xeb;
        b[1] = 0x0f;
        assert_eq!(decode(&b, false), None);
        // No call within the jump.
        let b = [
            0xeb, 0x0f, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08, 0x0f, 0x1f, 0x40, 0x08,
            0x0f, 0x1f, 0x40,
        ];
        assert_eq!(decode(&b, false), None);
    }
}
