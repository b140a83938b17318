//! Whether the library's modules import only downwards, in no circle (see the crate
//! docs, "Layout"), with the workspace's checker (`sluice_testkit::layers`).

use sluice_testkit::layers::{Layers, ROOT, assert_library_keeps};

/// The layers, from the bottom; a module may import from its own layer and those below.
const LAYERS: Layers = Layers::new(&[
    ("time as scenarios write it", &["duration"]),
    ("inputs", &["scenario", "access_log"]),
    ("the simulated service", &["service"]),
    ("arrivals", &["traffic"]),
    ("what is recorded", &["record", "overshoot"]),
    ("the fleet", &["run"]),
    ("the report", &["report"]),
    ("crate root", &[ROOT]),
]);

#[test]
fn the_library_imports_only_downwards_and_in_no_circle() {
    assert_library_keeps(&LAYERS, env!("CARGO_MANIFEST_DIR"), 15);
}
