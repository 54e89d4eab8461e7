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

/// `text` as one line: every control character (a newline, a carriage return, a terminal's
/// escape) and every Unicode line break written as an escape (`\n`, `\x1b`, `\u{2028}`),
/// backslashes doubled so that an escape cannot be faked. Names that others chose (file names,
/// a binary's function names) can then never make one log line look like two.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    let plain = |c: char| !(c.is_control() || c == '\\' || c == '\u{2028}' || c == '\u{2029}');
    if text.chars().all(plain) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if plain(c) => out.push(c),
            c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    std::borrow::Cow::Owned(out)
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

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_escapes_what_could_start_a_line() {
        use super::one_line;
        assert_eq!(one_line("plain /usr/bin/x"), "plain /usr/bin/x");
        assert_eq!(
            one_line("nl\nfdr-profiled: service: FAKE"),
            "nl\\nfdr-profiled: service: FAKE"
        );
        assert_eq!(one_line("a\r\x1b[2Kb\\n"), "a\\r\\x1b[2Kb\\\\n");
        assert_eq!(one_line("x\u{2028}y\u{85}"), "x\\u{2028}y\\x85");
        assert!(!one_line("\u{7f}\u{9b}").chars().any(char::is_control));
    }
}
