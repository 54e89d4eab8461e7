use super::*;

const NAMES: &[&str] = &[
    "main",
    "domain",
    "fx::work(int, int)",
    "fx::outer(int)",
    "fx::leaf(int)",
    "fx_recurse",
    "fx_tail_caller",
    "<r::inner::W<u32>>::get",
    "#17",
];

fn selected(include: &[&str], exclude: &[&str]) -> Vec<&'static str> {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let filter = FunctionFilter::new(&own(include), &own(exclude)).unwrap();
    NAMES
        .iter()
        .copied()
        .filter(|n| filter.selects(n))
        .collect()
}

#[test]
fn no_pattern_selects_everything() {
    assert!(FunctionFilter::new(&[], &[]).unwrap().is_empty());
    assert_eq!(selected(&[], &[]), NAMES);
}

#[test]
fn globs_match_whole_names() {
    assert_eq!(selected(&["main"], &[]), ["main"]);
    assert_eq!(
        selected(&["fx::*"], &[]),
        ["fx::work(int, int)", "fx::outer(int)", "fx::leaf(int)"]
    );
    assert_eq!(selected(&["fx_*"], &[]), ["fx_recurse", "fx_tail_caller"]);
    assert_eq!(
        selected(&["fx::work(int, int)"], &[]),
        ["fx::work(int, int)"]
    );
    assert_eq!(
        selected(&["fx::{outer,leaf}(*)"], &[]),
        ["fx::outer(int)", "fx::leaf(int)"]
    );
    assert_eq!(selected(&["*main"], &[]), ["main", "domain"]);
    assert_eq!(selected(&["#17"], &[]), ["#17"]);
    assert_eq!(
        selected(&[r"<r::inner::W<u32>>::get"], &[]),
        ["<r::inner::W<u32>>::get"]
    );
}

#[test]
fn backslash_escapes_glob_syntax() {
    let filter = FunctionFilter::new(&[r"a\*b".to_string()], &[]).unwrap();
    assert!(filter.selects("a*b"));
    assert!(!filter.selects("axb"));
}

#[test]
fn regexes_match_anywhere_unless_anchored() {
    assert_eq!(selected(&["re:leaf"], &[]), ["fx::leaf(int)"]);
    assert_eq!(selected(&["re:main"], &[]), ["main", "domain"]);
    assert_eq!(selected(&["re:^main$"], &[]), ["main"]);
    assert_eq!(
        selected(&["re:^fx::(outer|leaf)\\("], &[]),
        ["fx::outer(int)", "fx::leaf(int)"]
    );
}

#[test]
fn several_includes_add_up_and_excludes_win() {
    assert_eq!(
        selected(&["main", "fx_recurse"], &[]),
        ["main", "fx_recurse"]
    );
    assert_eq!(selected(&["fx*"], &["fx::*", "re:caller"]), ["fx_recurse"]);
    assert_eq!(selected(&[], &["re:."]), Vec::<&str>::new());
    assert_eq!(selected(&[], &["fx*", "#*", "<*"]), ["main", "domain"]);
}

#[test]
fn bad_patterns_are_errors_naming_them() {
    for (include, exclude, needle) in [
        (vec!["fx[".to_string()], vec![], "fx["),
        (vec![], vec!["re:(".to_string()], "re:("),
    ] {
        let err = FunctionFilter::new(&include, &exclude).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains(needle), "{text}");
    }
}
