//! Which FDR layout the writer produces.
#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

/// The FDR file layouts the writer can produce.
///
/// Version 1 is the layout of the 2017 specification and the default. Version 5 is what today's
/// compiler-rt writes: BufferExtents framing, a Pid record, no EndOfBuffer, custom events with a
/// 32-bit tick delta, and typed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FdrVersion {
    /// Version 1 (default).
    #[default]
    V1,
    /// Version 5.
    V5,
}

impl FdrVersion {
    /// The number written in the file header.
    pub fn number(self) -> u16 {
        match self {
            FdrVersion::V1 => 1,
            FdrVersion::V5 => 5,
        }
    }

    /// Whether the version has a record for typed events (version 1 does not).
    pub fn has_typed_events(self) -> bool {
        self == FdrVersion::V5
    }
}

impl fmt::Display for FdrVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// A version name that is not `1` or `5`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported FDR version {0:?}: the writer produces versions 1 and 5")]
pub struct UnknownVersion(pub String);

impl FromStr for FdrVersion {
    type Err = UnknownVersion;

    /// Accepts `1`, `5`, `v1`, `v5` (so `--fdr-version 5` reads naturally).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().trim_start_matches(['v', 'V']) {
            "1" => Ok(FdrVersion::V1),
            "5" => Ok(FdrVersion::V5),
            _ => Err(UnknownVersion(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        assert_eq!("1".parse(), Ok(FdrVersion::V1));
        assert_eq!("v5".parse(), Ok(FdrVersion::V5));
        assert_eq!(" 5 ".parse(), Ok(FdrVersion::V5));
        assert!("3".parse::<FdrVersion>().is_err());
        assert!("".parse::<FdrVersion>().is_err());
        assert_eq!(FdrVersion::V5.to_string(), "5");
        assert_eq!(FdrVersion::default(), FdrVersion::V1);
        assert!(!FdrVersion::V1.has_typed_events());
    }
}
