//! The workspace README's Rust examples are copies of the crate READMEs'
//! examples, which each crate compiles and runs as doctests (a crate's
//! package holds its own README only), or of a marked part of an example
//! kernel's source, which its build compiles for the bare-metal target (an
//! example that uses hardware-only types such as `Arm64Mmu`). This
//! module's test keeps the copies identical, so every example in the
//! workspace README is built.

/// The crate READMEs whose examples are doctests.
const CRATE_READMES: [&str; 4] = [
    "pgtable-core/README.md",
    "pgtable-arm64/README.md",
    "pgtable-x86/README.md",
    "pgtable-riscv/README.md",
];

/// Kernel sources holding README examples between a `// README begin` and
/// a `// README end` line (built by `cargo xtask qemu-test` and `ci`).
const KERNEL_EXAMPLES: [&str; 1] = ["examples/arm64-kernel/src/quickstart.rs"];

/// The parts of a source text between `// README begin` and `// README
/// end` lines, without the marker lines.
fn marked_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim() == "// README begin" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim() == "// README end" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// The fenced ```` ```rust ```` blocks of a Markdown text, without fences.
fn rust_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match current.as_mut() {
            None if line.trim_start().starts_with("```rust") => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

mod tests {
    use super::{marked_blocks, rust_blocks, CRATE_READMES, KERNEL_EXAMPLES};
    use crate::qemu::root;

    fn read(path: &str) -> String {
        std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn workspace_readme_examples_are_doctested_crate_readme_examples() {
        let tested: Vec<String> = CRATE_READMES
            .iter()
            .flat_map(|p| rust_blocks(&read(p)))
            .chain(KERNEL_EXAMPLES.iter().flat_map(|p| marked_blocks(&read(p))))
            .collect();
        let examples = rust_blocks(&read("README.md"));
        assert!(
            examples.len() >= 5,
            "README.md has {} examples",
            examples.len()
        );
        for example in &examples {
            assert!(
                tested.contains(example),
                "this README.md example is in no crate README (so no doctest runs it) \
                 nor in a kernel's marked source; copy it there or copy that version \
                 here:\n{example}"
            );
        }
    }

    #[test]
    fn marked_blocks_are_the_lines_between_the_markers() {
        let text = "a\n// README begin\nfn f() {}\n    // README end\nb\n";
        assert_eq!(marked_blocks(text), ["fn f() {}\n"]);
        assert_eq!(
            marked_blocks("// README begin\nunfinished\n"),
            Vec::<String>::new()
        );
        for p in KERNEL_EXAMPLES {
            assert!(!marked_blocks(&read(p)).is_empty(), "{p} marks no example");
        }
    }

    #[test]
    fn rust_blocks_skips_other_languages() {
        let text = "a\n```rust\nlet x = 1;\n```\n```sh\nls\n```\n  ```rust\nfoo();\n  ```\n";
        assert_eq!(rust_blocks(text), ["let x = 1;\n", "foo();\n"]);
    }
}
