//! A position in the source, as the DWARF gives it.
use serde::Serialize;

/// A source position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceLocation {
    /// The file, as the DWARF names it (usually absolute).
    pub file: String,
    /// Line, 1-based; 0 when the DWARF gives none.
    pub line: u32,
    /// Column, 1-based; 0 when the DWARF gives none.
    pub column: u32,
}

impl SourceLocation {
    /// `file:line` with the file's last path component, as `llvm-xray account` shows it.
    pub fn short(&self) -> String {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{name}:{}", self.line)
    }
}
