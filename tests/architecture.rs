//! The shape of the code: modules that import each other in a circle
//! cannot be read one at a time, so their number is held down.

use crate::util::{python_file, root};

/// The circles there are: the snapshot model with its event columns (a
/// model owns its columns, which are built of its types) and the two
/// halves of a pickle read on two threads (each runs the other's machine).
const CIRCLES_AT_MOST: usize = 2;

#[test]
fn modules_import_each_other_in_at_most_two_circles() {
    let out = python_file(
        &root().join("tests/support/module_circles.py"),
        &[] as &[&str],
    );
    let count: usize = out
        .lines()
        .last()
        .and_then(|l| l.strip_suffix(" circles"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {out}"));
    assert!(count <= CIRCLES_AT_MOST, "{out}");
}
