//! Writing to the terminal without dying of it. `println!` and `eprintln!` panic when their
//! stream is gone (`fdr-profiled verify DIR | head -1`, a closed terminal, a log pipe whose
//! reader died): a recording session must not lose its trace to that, and no subcommand may
//! panic. Messages to standard error are dropped when it cannot take them; output to standard
//! output whose reader went away ends the process quietly with status 0, as `dump`, `report`
//! and `convert` already did: nobody reads the rest.
//!
//! The macros are `#[macro_use]`d at the crate root: `outln!`/`out!` for standard output,
//! `errln!`/`err!` for standard error, with `println!`'s arguments.
use std::io::Write as _;

/// Status of a subcommand whose output reader went away.
pub const BROKEN_PIPE_STATUS: u8 = 0;

/// Writes to standard output; a reader that went away ends the process (see the module).
pub fn out(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(err) = stdout.write_fmt(args).and_then(|()| stdout.flush()) {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(i32::from(BROKEN_PIPE_STATUS));
        }
    }
}

/// Writes to standard error; nothing happens when it cannot take it.
pub fn err(args: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

/// `println!` that never panics (see the module).
#[macro_export]
macro_rules! outln {
    () => { $crate::console::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::console::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that never panics (see the module).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::console::out(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics (see the module).
#[macro_export]
macro_rules! errln {
    () => { $crate::console::err(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::console::err(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that never panics (see the module).
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => { $crate::console::err(format_args!($($arg)*)) };
}
