//! Helpers of the process-group tests: each test with two ranks as threads
//! runs in a process of its own with libtorch's flight recorder off (see
//! `tests/dist.rs`).

use std::process::Command;

/// Set in the child process [`in_own_process`] starts.
const CHILD: &str = "ESPER_DIST_TEST_CHILD";

/// Runs `body` in a child process of this test binary that runs only the
/// test `name`, with libtorch's flight recorder off (see the module docs);
/// in that child, runs `body` itself.
pub(crate) fn in_own_process(name: &str, body: impl FnOnce()) {
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .env("TORCH_FR_BUFFER_SIZE", "0")
        .output()
        .expect("the test's own process");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{name} in its own process: {}\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("1 passed"), "{name} did not run: {stdout}");
    print!("{stdout}");
}
