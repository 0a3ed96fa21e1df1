//! The verdicts of `--check`, in one line format that `cargo x gpu-check` reads:
//!
//! ```text
//! check: WHAT: MEASURED (limit LIMIT): PASS
//! ```
//!
//! WHAT names the comparison, MEASURED says what was found, LIMIT what is allowed; the
//! verdict is PASS or FAIL. Every comparison runs and prints before the program fails, so
//! one run shows every result.

use anyhow::{Result, bail};

// ANCHOR: checks
/// The verdicts of one `--check` run.
#[derive(Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    /// Prints one verdict line and remembers a failure.
    pub fn record(&mut self, what: &str, measured: &str, limit: &str, pass: bool) {
        // The line's fields are separated by ": ", so WHAT must not contain one.
        let what = what.replace(": ", " - ");
        println!("check: {what}: {measured} (limit {limit}): {}", if pass { "PASS" } else { "FAIL" });
        if !pass {
            self.failed.push(what);
        }
    }

    /// Fails if any comparison failed.
    pub fn finish(self) -> Result<()> {
        if !self.failed.is_empty() {
            bail!("{} check(s) failed: {}", self.failed.len(), self.failed.join("; "));
        }
        Ok(())
    }
}
// ANCHOR_END: checks
