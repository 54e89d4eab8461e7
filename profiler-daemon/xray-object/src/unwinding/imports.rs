//! What a call through the PLT or the GOT reaches: the symbol the dynamic loader binds the
//! slot to, and whether that function is known never to let an exception out.
use std::collections::HashMap;

use object::read::elf::ElfFile64;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _, ObjectSymbolTable as _};

/// What a GOT slot holds once the dynamic loader has filled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The named symbol (`R_X86_64_JUMP_SLOT`, `GLOB_DAT`, `64`), and its address when this
    /// object defines it.
    Symbol {
        name: String,
        defined_at: Option<u64>,
    },
    /// An address in this object (`R_X86_64_RELATIVE`: a pointer to a local function).
    Local(u64),
}

/// The object's GOT slots, from its dynamic relocations.
#[derive(Debug, Default)]
pub struct Slots(HashMap<u64, Bound>);

impl Slots {
    /// Reads the dynamic relocations (`.rela.dyn`, `.rela.plt`) of `file`.
    pub fn of(file: &ElfFile64<'_, object::LittleEndian>) -> Slots {
        let mut slots = HashMap::new();
        let Some(relocations) = file.dynamic_relocations() else {
            return Slots(slots);
        };
        let symbols = file.dynamic_symbol_table();
        for (offset, relocation) in relocations {
            let bound = match relocation.target() {
                object::RelocationTarget::Symbol(index) => {
                    let Some(symbol) = symbols.as_ref().and_then(|t| t.symbol_by_index(index).ok())
                    else {
                        continue;
                    };
                    let Ok(name) = symbol.name() else { continue };
                    if name.is_empty() {
                        continue;
                    }
                    Bound::Symbol {
                        name: name.to_owned(),
                        defined_at: symbol.is_definition().then(|| symbol.address()),
                    }
                }
                _ if relocation.flags()
                    == (object::RelocationFlags::Elf {
                        r_type: object::elf::R_X86_64_RELATIVE,
                    }) =>
                {
                    Bound::Local(relocation.addend() as u64)
                }
                _ => continue,
            };
            slots.insert(offset, bound);
        }
        Slots(slots)
    }

    /// What the slot at `address` is bound to, if a dynamic relocation says.
    pub fn get(&self, address: u64) -> Option<&Bound> {
        self.0.get(&address)
    }
}

/// The address ranges of the object's PLT sections (`.plt`, `.plt.sec`, `.plt.got`): a call
/// into one reaches a stub that jumps through a GOT slot.
pub fn plt_ranges(file: &ElfFile64<'_, object::LittleEndian>) -> Vec<std::ops::Range<u64>> {
    file.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
        .map(|s| s.address()..s.address().saturating_add(s.size()))
        .collect()
}

/// Functions that never let an exception out, whatever they are called with: C library
/// functions that call no user code (memory, strings, characters, numbers, time, locks,
/// stdio output), the C++ runtime's non-throwing members (`operator delete`, the catch
/// machinery, `std::terminate`), and XRay's own entry points. `operator new` is not here:
/// it throws `std::bad_alloc`.
///
/// This is a list of names, so it assumes nobody interposes a throwing function of the same
/// name. It also assumes no thread is cancelled (`pthread_cancel` unwinds out of any
/// cancellation point, `write` and stdio among them).
pub const NEVER_THROW: &[&str] = &[
    // memory and strings
    "malloc",
    "calloc",
    "realloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "memalign",
    "malloc_usable_size",
    "memcpy",
    "memmove",
    "memset",
    "memcmp",
    "memchr",
    "memrchr",
    "bcmp",
    "bzero",
    "explicit_bzero",
    "mempcpy",
    "__memcpy_chk",
    "__memmove_chk",
    "__memset_chk",
    "strlen",
    "strnlen",
    "strcmp",
    "strncmp",
    "strcasecmp",
    "strncasecmp",
    "strcpy",
    "strncpy",
    "stpcpy",
    "strcat",
    "strncat",
    "strchr",
    "strrchr",
    "strstr",
    "strspn",
    "strcspn",
    "strpbrk",
    "strdup",
    "strndup",
    "strcoll",
    "strerror",
    "__strcpy_chk",
    "__strcat_chk",
    "wcslen",
    "wmemcpy",
    "wmemmove",
    "wmemset",
    "wmemcmp",
    "wmemchr",
    // characters and numbers
    "__ctype_b_loc",
    "__ctype_tolower_loc",
    "__ctype_toupper_loc",
    "isalpha",
    "isdigit",
    "isspace",
    "isalnum",
    "isupper",
    "islower",
    "isxdigit",
    "isprint",
    "toupper",
    "tolower",
    "atoi",
    "atol",
    "atoll",
    "atof",
    "strtol",
    "strtoul",
    "strtoll",
    "strtoull",
    "strtod",
    "strtof",
    "strtold",
    "__isoc23_strtol",
    "__isoc23_strtoul",
    "__isoc23_strtoll",
    "__isoc23_strtoull",
    "abs",
    "labs",
    "llabs",
    "rand",
    "srand",
    "random",
    "srandom",
    "rand_r",
    "sqrt",
    "sqrtf",
    "pow",
    "powf",
    "exp",
    "expf",
    "log",
    "logf",
    "log2",
    "log10",
    "floor",
    "floorf",
    "ceil",
    "ceilf",
    "fabs",
    "fmod",
    "fmodf",
    "round",
    "trunc",
    "ldexp",
    "frexp",
    "modf",
    "sin",
    "cos",
    "tan",
    "atan",
    "atan2",
    "hypot",
    // process, time, errno, thread-local data, locks
    "__errno_location",
    "getpid",
    "gettid",
    "getppid",
    "getuid",
    "geteuid",
    "clock_gettime",
    "gettimeofday",
    "time",
    "clock",
    "sched_getcpu",
    "sched_yield",
    "syscall",
    "__tls_get_addr",
    "pthread_self",
    "pthread_equal",
    "pthread_getspecific",
    "pthread_setspecific",
    "pthread_key_create",
    "pthread_mutex_lock",
    "pthread_mutex_unlock",
    "pthread_mutex_trylock",
    "pthread_mutex_init",
    "pthread_mutex_destroy",
    "pthread_rwlock_rdlock",
    "pthread_rwlock_wrlock",
    "pthread_rwlock_unlock",
    "pthread_spin_lock",
    "pthread_spin_unlock",
    "pthread_cond_signal",
    "pthread_cond_broadcast",
    "getenv",
    "secure_getenv",
    "abort",
    "_exit",
    "__stack_chk_fail",
    "__assert_fail",
    "__cxa_atexit",
    "__cxa_finalize",
    "atexit",
    // stdio output (no user callbacks)
    "printf",
    "fprintf",
    "sprintf",
    "snprintf",
    "vprintf",
    "vfprintf",
    "vsprintf",
    "vsnprintf",
    "__printf_chk",
    "__fprintf_chk",
    "__sprintf_chk",
    "__snprintf_chk",
    "__vsnprintf_chk",
    "__vfprintf_chk",
    "puts",
    "fputs",
    "putchar",
    "fputc",
    "putc",
    "fwrite",
    "fflush",
    "perror",
    "dprintf",
    // the C++ runtime's non-throwing members
    "_ZdlPv",
    "_ZdlPvm",
    "_ZdaPv",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "__cxa_begin_catch",
    "__cxa_end_catch",
    "__cxa_allocate_exception",
    "__cxa_free_exception",
    "__cxa_get_exception_ptr",
    "__cxa_current_exception_type",
    "__cxa_guard_release",
    "__cxa_guard_abort",
    "__cxa_pure_virtual",
    "__cxa_deleted_virtual",
    "_ZSt9terminatev",
    "__dynamic_cast",
    "_ZNSt9exceptionD2Ev",
    "_ZNKSt9exception4whatEv",
    // continuing an exception that entered the function through a call judged on its own
    "_Unwind_Resume",
];

/// Functions that start unwinding: C++ `throw`, `throw;` and `std::rethrow_exception`, the
/// unwinder's entry points, and Rust's panic machinery.
pub const THROWERS: &[&str] = &[
    "__cxa_throw",
    "__cxa_rethrow",
    "_Unwind_RaiseException",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "_ZSt17rethrow_exceptionNSt15__exception_ptr13exception_ptrE",
    "__rust_start_panic",
    "rust_panic",
    "pthread_exit",
];

/// Whether a call to the imported `name` can never let an exception out: it is on
/// [`NEVER_THROW`], or it is a C++ destructor (implicitly `noexcept` since C++11; an escaping
/// exception terminates inside it).
pub fn never_throws(name: &str) -> bool {
    NEVER_THROW.contains(&name) || is_destructor(name)
}

/// An Itanium-mangled destructor: a nested name ending in `D0Ev`, `D1Ev` or `D2Ev`.
fn is_destructor(name: &str) -> bool {
    name.starts_with("_ZN")
        && ["D0Ev", "D1Ev", "D2Ev"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_list_is_what_it_says() {
        assert!(never_throws("free"));
        assert!(never_throws("_ZdlPvm"));
        assert!(never_throws(
            "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEED1Ev"
        ));
        assert!(!never_throws("_Znwm"), "operator new throws std::bad_alloc");
        assert!(!never_throws("__cxa_throw"));
        assert!(!never_throws("qsort"), "calls user code");
        assert!(!never_throws("_ZN4YAML4NodeC1Ev"), "a constructor");
        assert!(THROWERS.iter().all(|t| !never_throws(t)));
    }
}
