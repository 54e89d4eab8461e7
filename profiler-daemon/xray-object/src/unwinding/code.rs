//! A function's machine code, decoded with iced-x86 for what leaves it: calls, jumps to
//! other functions (tail calls, conditional ones included) and indirect transfers.
use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};

/// Where a transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A fixed address (`call rel32`, `jmp rel32`).
    Address(u64),
    /// Through the pointer stored at this address (`call [rip+disp]`: a GOT slot).
    Slot(u64),
    /// Through a register or computed memory: a function pointer, a virtual call, a switch
    /// table.
    Unknown,
}

/// One control transfer out of the function's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transfer {
    /// Address of the instruction.
    pub at: u64,
    /// Address of the next instruction: a call's return address.
    pub next: u64,
    /// A call (the function's frame stays below the callee) or a jump (the function's frame
    /// is gone: the target runs in its place).
    pub call: bool,
    pub target: Target,
}

/// What decoding found in one function's bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Code {
    /// Calls and jumps that leave `[start, end)`, in address order.
    pub transfers: Vec<Transfer>,
    /// Address of the first byte that is not a valid instruction, if any.
    pub invalid_at: Option<u64>,
}

/// Decodes `bytes`, the code of the function at `[start, start + bytes.len())`, linearly:
/// compilers put no data inside x86-64 functions, so every byte is an instruction.
pub fn decode(bytes: &[u8], start: u64) -> Code {
    let end = start.saturating_add(bytes.len() as u64);
    let mut decoder = Decoder::with_ip(64, bytes, start, DecoderOptions::NONE);
    let mut code = Code::default();
    let mut instruction = iced_x86::Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            code.invalid_at = Some(instruction.ip());
            break;
        }
        let call = match instruction.flow_control() {
            FlowControl::Call | FlowControl::IndirectCall => true,
            FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::IndirectBranch => false,
            _ => continue,
        };
        let target = match instruction.op0_kind() {
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
                let to = instruction.near_branch_target();
                if !call && (start..end).contains(&to) {
                    continue;
                }
                Target::Address(to)
            }
            OpKind::Memory if instruction.is_ip_rel_memory_operand() => {
                Target::Slot(instruction.ip_rel_memory_address())
            }
            // far branches, jumps through registers or computed memory
            _ => Target::Unknown,
        };
        code.transfers.push(Transfer {
            at: instruction.ip(),
            next: instruction.next_ip(),
            call,
            target,
        });
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_calls_tail_jumps_and_indirect_transfers() {
        let bytes = [
            0xe8, 0x0b, 0x00, 0x00, 0x00, // 0x100: call 0x110
            0xff, 0x15, 0x00, 0x10, 0x00, 0x00, // 0x105: call [rip+0x1000] -> slot 0x110b
            0x74, 0x02, // 0x10b: je 0x10f (inside)
            0xff, 0xd0, // 0x10d: call rax
            0xe9, 0xec, 0x0e, 0x00, 0x00, // 0x10f: jmp 0x1000 (a tail call)
            0xc3, // 0x114: ret
        ];
        let code = decode(&bytes, 0x100);
        assert_eq!(code.invalid_at, None);
        let got: Vec<(u64, bool, Target)> = code
            .transfers
            .iter()
            .map(|t| (t.at, t.call, t.target))
            .collect();
        assert_eq!(
            got,
            vec![
                (0x100, true, Target::Address(0x110)),
                (0x105, true, Target::Slot(0x110b)),
                (0x10d, true, Target::Unknown),
                (0x10f, false, Target::Address(0x1000)),
            ]
        );
        assert_eq!(code.transfers[0].next, 0x105);
    }

    #[test]
    fn reports_undecodable_bytes() {
        let code = decode(&[0x90, 0x0f, 0x0b, 0x06], 0x40);
        assert_eq!(
            code.invalid_at,
            Some(0x43),
            "0x06 (push es) is invalid in 64-bit mode"
        );
    }
}
