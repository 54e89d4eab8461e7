//! Names with clang's `Tn` template-parameter declarations, which `cpp_demangle` 0.4 cannot
//! parse (its support is an open pull request, gimli-rs/cpp_demangle#315).
//!
//! Clang 17 and later mangle a template argument as `Tn <type> <argument>` when the template
//! parameter's type must be spelled to tell overloads apart (nlohmann/json's
//! `create<T, enable_if<...>::type = 0>`), and LLVM's demangler prints only the argument:
//! `create<std::nullptr_t, 0>`. The type cannot just be cut out: parsing it adds substitution
//! candidates that later `S<n>_` references count. So each `Tn <type> <literal>` is rewritten
//! as a cast expression, `X cv <type> <marker literal> E`, which parses the same type at the
//! same place (the same candidates, in the same order), the demangled `(type)(marker)` is then
//! replaced by the literal as LLVM prints it. Where the type ends is found by trying each
//! literal after `Tn` in turn, the whole name parsing only with the right one; a name that
//! still does not parse (another declaration form, a non-literal argument) stays mangled.
use super::limited::Limited;
use std::fmt::Write as _;

/// Most rewrites tried for one name (each a full parse at most): hostile names stay cheap.
const MAX_TRIES: usize = 64;
/// Most `Tn` declarations rewritten in one name (the depth of the search).
const MAX_DECLS: usize = 8;

/// A literal argument (`L <builtin type> [n] <digits> E`, or a null pointer), as the
/// demangled text LLVM prints.
struct Literal {
    len: usize,
    text: String,
}

/// The integer literal at the start of `s`, for the builtin types LLVM prints with a suffix
/// (or none); `None` for any other.
fn literal(s: &[u8]) -> Option<Literal> {
    // `nullptr`: `LDnE`, or `LDn0E` as clang writes it.
    for null in [&b"LDnE"[..], b"LDn0E"] {
        if s.starts_with(null) {
            return Some(Literal {
                len: null.len(),
                text: "nullptr".into(),
            });
        }
    }
    if s.first() != Some(&b'L') {
        return None;
    }
    // A pointer's null (`LPv0E`, gtest's `enable_if<...>::type* = nullptr`): `(void*)0`.
    let pointers = s[1..].iter().take_while(|&&b| b == b'P').count();
    let kind = *s.get(1 + pointers)?;
    if pointers > 0 {
        let name = builtin(kind)?;
        let stars = "*".repeat(pointers);
        let rest = &s[2 + pointers..];
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 || rest.get(digits) != Some(&b'E') {
            return None;
        }
        let value = std::str::from_utf8(&rest[..digits]).ok()?;
        return Some(Literal {
            len: 2 + pointers + digits + 1,
            text: format!("({name}{stars}){value}"),
        });
    }
    let negative = s.get(2) == Some(&b'n');
    let digits_at = 2 + usize::from(negative);
    let digits = s[digits_at..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    if digits == 0 || s.get(digits_at + digits) != Some(&b'E') {
        return None;
    }
    let value = std::str::from_utf8(&s[digits_at..digits_at + digits]).ok()?;
    let sign = if negative { "-" } else { "" };
    let text = match kind {
        b'i' => format!("{sign}{value}"),
        b'j' => format!("{sign}{value}u"),
        b'l' => format!("{sign}{value}l"),
        b'm' => format!("{sign}{value}ul"),
        b'x' => format!("{sign}{value}ll"),
        b'y' => format!("{sign}{value}ull"),
        b'b' if !negative && value == "0" => "false".into(),
        b'b' if !negative && value == "1" => "true".into(),
        _ => return None,
    };
    Some(Literal {
        len: digits_at + digits + 1,
        text,
    })
}

/// The name of a builtin type's one-letter code, as a pointer literal's cast prints it.
fn builtin(code: u8) -> Option<&'static str> {
    Some(match code {
        b'v' => "void",
        b'b' => "bool",
        b'c' => "char",
        b'a' => "signed char",
        b'h' => "unsigned char",
        b's' => "short",
        b't' => "unsigned short",
        b'i' => "int",
        b'j' => "unsigned int",
        b'l' => "long",
        b'm' => "unsigned long",
        b'x' => "long long",
        b'y' => "unsigned long long",
        b'f' => "float",
        b'd' => "double",
        _ => return None,
    })
}

/// Demangles `raw`, whose `Tn` declarations `cpp_demangle` cannot parse, as LLVM prints it;
/// `None` if it still does not parse.
pub(super) fn demangle(raw: &str) -> Option<String> {
    if !raw.contains("Tn") {
        return None;
    }
    let mut tries = 0;
    let (text, literals) = rewrite(raw.as_bytes(), 0, Vec::new(), &mut tries)?;
    restore(&text, &literals)
}

/// Rewrites the `Tn`s from `from` on, the literals replaced so far in `literals`; returns the
/// demangled text of the first rewrite that parses whole, with every literal replaced.
fn rewrite(
    name: &[u8],
    from: usize,
    literals: Vec<String>,
    tries: &mut usize,
) -> Option<(String, Vec<String>)> {
    if literals.len() > MAX_DECLS {
        return None;
    }
    // Where literals start: the candidates for a type's end (found once: a hostile name of
    // `Tn`s costs a scan, not a scan per `Tn`).
    let starts: Vec<(usize, Literal)> = (from..name.len())
        .filter(|&i| name[i] == b'L')
        .filter_map(|i| Some((i, literal(&name[i..])?)))
        .collect();
    let mut search = from;
    while let Some(at) = find(name, b"Tn", search) {
        let after = starts.partition_point(|&(i, _)| i < at + 2);
        for (end, lit) in &starts[after..] {
            let (end, lit) = (*end, lit);
            *tries += 1;
            if *tries > MAX_TRIES {
                return None;
            }
            let marker = marker(literals.len());
            let mut next = Vec::with_capacity(name.len() + 16);
            next.extend_from_slice(&name[..at]);
            next.extend_from_slice(b"Xcv");
            next.extend_from_slice(&name[at + 2..end]);
            next.extend_from_slice(format!("Li{marker}EE").as_bytes());
            let resume = next.len();
            next.extend_from_slice(&name[end + lit.len..]);
            let mut more = literals.clone();
            more.push(lit.text.clone());
            if let Some(done) = rewrite(&next, resume, more, tries) {
                return Some(done);
            }
        }
        // A `Tn` inside a source name (`4aTnb`), say: left as it is.
        search = at + 2;
    }
    // Every `Tn` rewritten: does the name parse now?
    *tries += 1;
    if *tries > MAX_TRIES {
        return None;
    }
    parse(name).map(|text| (text, literals))
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    (from..haystack.len().saturating_sub(needle.len() - 1))
        .find(|&i| haystack[i..].starts_with(needle))
}

/// The value standing for the `n`th literal: digits no name is likely to hold.
fn marker(n: usize) -> u64 {
    9_070_000_000_017 + n as u64 * 1_000
}

fn parse(name: &[u8]) -> Option<String> {
    let symbol = cpp_demangle::Symbol::new(name).ok()?;
    let mut out = Limited::default();
    symbol
        .structured_demangle(&mut out, &cpp_demangle::DemangleOptions::default())
        .ok()?;
    Some(out.text)
}

/// Replaces each `(type)(marker)` of `text` with its literal.
fn restore(text: &str, literals: &[String]) -> Option<String> {
    let mut text = text.to_owned();
    for (n, literal) in literals.iter().enumerate() {
        // cpp_demangle prints the cast `(type)(marker)`.
        let marker = format!(")({})", marker(n));
        let close = text.find(&marker)?;
        // Back to the cast's opening parenthesis, over the type's own.
        let mut depth = 0usize;
        let mut open = None;
        for (i, c) in text[..=close].char_indices().rev() {
            match c {
                ')' => depth += 1,
                '(' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        open = Some(i);
                        break;
                    }
                }
                _ => {}
            }
        }
        let mut restored = String::with_capacity(text.len());
        restored.push_str(&text[..open?]);
        let _ = write!(restored, "{literal}");
        restored.push_str(&text[close + marker.len()..]);
        text = restored;
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_print_as_llvm_prints_them() {
        let text = |s: &str| literal(s.as_bytes()).map(|l| (l.len, l.text));
        assert_eq!(text("Li0EE"), Some((4, "0".into())));
        assert_eq!(text("Ljn12E"), Some((6, "-12u".into())));
        assert_eq!(text("Lb1E"), Some((4, "true".into())));
        assert_eq!(text("LDn0EE"), Some((5, "nullptr".into())));
        assert_eq!(text("LPv0EE"), Some((5, "(void*)0".into())));
        assert_eq!(text("LPPc0E"), Some((6, "(char**)0".into())));
        assert_eq!(text("Lf1E"), None);
        assert_eq!(text("Li E"), None);
    }
}
