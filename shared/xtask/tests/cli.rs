//! `cargo x` as a user meets it: where it works, and where it refuses to.

use std::process::Command;

fn xtask() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
}

#[test]
fn outside_a_checkout_it_refuses_instead_of_using_the_one_it_was_built_in() {
    let elsewhere = tempfile::tempdir().unwrap();
    let output = xtask().current_dir(elsewhere.path()).arg("check").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let cwd = elsewhere.path().canonicalize().unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {} is not inside a checkout of Inference from Scratch (no folder at or above it holds \
             chapters/ and models/); run cargo x from the repository",
            cwd.display()
        )
    );
}

#[test]
fn version_works_anywhere() {
    let elsewhere = tempfile::tempdir().unwrap();
    let output = xtask().current_dir(elsewhere.path()).arg("--version").output().unwrap();
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("cargo x "));
}

#[test]
fn synth_writes_a_relative_out_under_the_current_folder_and_says_where() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("chapters/07-mlp")).unwrap();
    std::fs::create_dir(root.path().join("models")).unwrap();
    let chapter = root.path().join("chapters/07-mlp");
    let output =
        xtask().current_dir(&chapter).args(["synth", "--config", "tiny", "--out", "models/x"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let written = chapter.canonicalize().unwrap().join("models/x");
    assert!(written.join("model.safetensors").is_file());
    assert!(stdout.starts_with(&format!("wrote {} (", written.display())), "{stdout}");
}
