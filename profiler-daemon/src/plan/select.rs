//! Function selection (`--functions` / `--exclude`): which instrumented functions get probes.
//!
//! Patterns match the demangled names the summary shows (`fx::work(int, int)`, `rx_work`,
//! `<r::W<u32>>::get`), or `#ID` for a function without a symbol. A pattern is a glob matched
//! against the whole name (`*` any run of characters, `?` one, `[abc]` a class, `{a,b}`
//! alternatives; `\` escapes), or, after a `re:` prefix, a regular expression that may match
//! anywhere in the name (anchor it with `^...$`). A function is traced when some `--functions`
//! pattern matches it (or none was given) and no `--exclude` pattern does.
use crate::plan::AttachPlan;
use anyhow::{Context as _, Result};
use std::collections::HashSet;

/// Prefix of a regular-expression pattern.
const REGEX_PREFIX: &str = "re:";

/// One `--functions` or `--exclude` pattern.
#[derive(Debug)]
enum Pattern {
    Glob(globset::GlobMatcher),
    Regex(regex::Regex),
}

impl Pattern {
    fn parse(text: &str) -> Result<Pattern> {
        Ok(match text.strip_prefix(REGEX_PREFIX) {
            Some(re) => Pattern::Regex(
                regex::Regex::new(re).with_context(|| format!("bad regex in pattern {text:?}"))?,
            ),
            None => Pattern::Glob(
                globset::GlobBuilder::new(text)
                    .backslash_escape(true)
                    .build()
                    .with_context(|| format!("bad glob pattern {text:?}"))?
                    .compile_matcher(),
            ),
        })
    }

    fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Glob(glob) => glob.is_match(name),
            Pattern::Regex(re) => re.is_match(name),
        }
    }
}

/// The functions chosen on the command line.
#[derive(Debug, Default)]
pub struct FunctionFilter {
    include: Vec<Pattern>,
    exclude: Vec<Pattern>,
}

impl FunctionFilter {
    /// Parses the `--functions` (`include`) and `--exclude` patterns. An error names the bad one.
    pub fn new(include: &[String], exclude: &[String]) -> Result<FunctionFilter> {
        let parse = |patterns: &[String]| -> Result<Vec<Pattern>> {
            patterns.iter().map(|p| Pattern::parse(p)).collect()
        };
        Ok(FunctionFilter {
            include: parse(include)?,
            exclude: parse(exclude)?,
        })
    }

    /// Whether no pattern was given (every function is traced).
    pub fn is_empty(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }

    /// Whether the function named `name` is traced.
    pub fn selects(&self, name: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|p| p.matches(name)))
            && !self.exclude.iter().any(|p| p.matches(name))
    }

    /// Keeps only the probes (of every kind) of selected functions in `plan`, sets
    /// `plan.functions` to the number of functions selected and returns it (possibly 0: in a
    /// session of several objects one may have none selected; the caller decides).
    pub fn retain(&self, plan: &mut AttachPlan) -> usize {
        if self.is_empty() {
            return plan.functions;
        }
        let ids: HashSet<u32> = plan.probes.iter().map(|p| p.cookie.function_id).collect();
        let selected: HashSet<u32> = ids
            .into_iter()
            .filter(|&id| self.selects(&plan.names.name(id)))
            .collect();
        plan.probes
            .retain(|p| selected.contains(&p.cookie.function_id));
        plan.functions = selected.len();
        selected.len()
    }
}

#[cfg(test)]
mod tests;
