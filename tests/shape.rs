//! The floors are crates, and Cargo keeps them: the workspace holds the core, the capture edge,
//! the demo and the binary, and the pure core's dependency tree holds no async runtime, HTTP
//! stack or terminal.

use std::process::Command;

fn cargo(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo's output is UTF-8")
}

#[test]
fn the_workspace_has_the_four_floors() {
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--offline",
    ]))
    .unwrap();
    let names: Vec<&str> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    for crate_name in [
        "prefixscope",
        "prefixscope-core",
        "prefixscope-capture",
        "prefixscope-demo",
    ] {
        assert!(names.contains(&crate_name), "{crate_name} in {names:?}");
    }
}

#[test]
fn the_core_depends_on_no_runtime_network_or_terminal_crate() {
    let tree = cargo(&[
        "tree",
        "-p",
        "prefixscope-core",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ]);
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert!(crates.contains(&"serde_json"), "{tree}");
    for edge in [
        "tokio",
        "hyper",
        "ratatui",
        "crossterm",
        "prefixscope-capture",
    ] {
        assert!(
            !crates.contains(&edge),
            "prefixscope-core depends on {edge}:\n{tree}"
        );
    }
    // The capture edge does not reach up into the demo or the binary.
    let capture = cargo(&[
        "tree",
        "-p",
        "prefixscope-capture",
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ]);
    for upper in ["prefixscope-demo", "ratatui", "crossterm"] {
        assert!(
            !capture.lines().any(|l| l.starts_with(&format!("{upper} "))),
            "prefixscope-capture depends on {upper}"
        );
    }
}
