//! How deep the conversions draw calls: down to [`MAX_SHOWN_DEPTH`] levels, deeper calls folded
//! into one marked frame and counted (see the [module](super) comment for why).

/// The deepest call shown as itself (depth 0 is a thread's outermost call): a call at this depth
/// is drawn as one [`FOLDED_FRAME`] with all it called.
pub const MAX_SHOWN_DEPTH: usize = 256;

/// The name of the frame that stands for the calls at [`MAX_SHOWN_DEPTH`] and deeper.
pub const FOLDED_FRAME: &str = "[deeper calls folded]";

/// The calls a conversion folded into [`FOLDED_FRAME`]s, for its warning.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Folding {
    /// Calls at [`MAX_SHOWN_DEPTH`] or deeper.
    calls: u64,
    /// The deepest call's depth.
    deepest: usize,
}

impl Folding {
    /// Notes a call at `depth` (once per call); true when it is folded.
    pub(crate) fn fold(&mut self, depth: usize) -> bool {
        if depth < MAX_SHOWN_DEPTH {
            return false;
        }
        self.calls += 1;
        self.deepest = self.deepest.max(depth);
        true
    }

    /// One warning line, if anything was folded.
    pub(crate) fn warning(&self) -> Option<String> {
        (self.calls > 0).then(|| {
            format!(
                "{} calls nested deeper than {MAX_SHOWN_DEPTH} levels (down to level {}) are folded into \"{FOLDED_FRAME}\" frames; a trace of XRay's own runtime keeps the frames an exception or longjmp left open until a caller's exit (README, \"Reports\"); `report` counts every call",
                self.calls,
                self.deepest + 1
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_from_the_cap_down_and_counts() {
        let mut f = Folding::default();
        assert!(f.warning().is_none());
        assert!(!f.fold(0));
        assert!(!f.fold(MAX_SHOWN_DEPTH - 1));
        assert!(f.warning().is_none());
        assert!(f.fold(MAX_SHOWN_DEPTH));
        assert!(f.fold(MAX_SHOWN_DEPTH + 9));
        let w = f.warning().expect("a warning");
        assert!(
            w.starts_with("2 calls nested deeper than 256 levels (down to level 266) are folded"),
            "{w}"
        );
        assert!(!w.contains('\n'));
    }
}
