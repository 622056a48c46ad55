//! Compiles the benchmark's C++ baseline (bench/baseline.cpp, and issue 30's floors of create +
//! release in bench/lifecycle_floor.cpp) and the tests' C++ "other library" (native/foreign_mr.cpp:
//! resources installed past this binding) with the shim's toolchain against the same headers,
//! and links them to the RAPIDS/CUDA libraries the shim was linked with.
//!
//! raft-sys links nothing into Rust binaries (it loads its shim at run time), so this test crate
//! links the baseline's libraries itself and gives its binaries an rpath to them: only this
//! workspace-internal crate does that; users' binaries need neither.
use raft_build::{Stack, LIBRARIES};

/// The documents whose Rust code blocks `tests/tests/docs.rs` compiles.
const DOCUMENTS: &[&str] = &["README.md", "docs/COMMS.md", "docs/CUVS.md", "docs/MEMORY.md"];

/// Every ```` ```rust ```` block of the documents (`rust,ignore` too: rustdoc never sees these
/// files), each as the body of a function returning `Result`, so `?` works as in the text;
/// rustdoc's hidden lines (`# …`) are kept without their mark. Written to
/// `$OUT_DIR/doc_examples.rs` with the count of blocks per document, for `docs.rs` to include
/// and check: a block that no longer compiles fails the tests' build.
fn doc_examples() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = String::new();
    let mut counts = Vec::new();
    for doc in DOCUMENTS {
        println!("cargo:rerun-if-changed=../{doc}");
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let mut block: Option<(usize, Vec<String>)> = None;
        let mut n = 0;
        for (i, line) in text.lines().enumerate() {
            match &mut block {
                None if line.trim_start().starts_with("```rust") => block = Some((i + 1, Vec::new())),
                None => {}
                Some(_) if line.trim_start() == "```" => {
                    let (at, body) = block.take().expect("open block");
                    n += 1;
                    let name: String = doc.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
                    out.push_str(&format!(
                        "/// {doc}, the block at line {at}.\n#[allow(unused, unused_must_use, clippy::all)]\npub fn {name}_{n}() -> Result<(), Box<dyn std::error::Error>> {{\n{}\n    ;\n    Ok(())\n}}\n\n",
                        body.join("\n")
                    ));
                }
                Some((_, body)) => {
                    let trimmed = line.trim_start();
                    let line = if trimmed == "#" {
                        ""
                    } else {
                        trimmed.strip_prefix("# ").map_or(line, |_| &line[line.len() - trimmed.len() + 2..])
                    };
                    body.push(format!("    {line}"));
                }
            }
        }
        assert!(block.is_none(), "{doc}: a rust block is never closed");
        counts.push(format!("({doc:?}, {n})"));
    }
    out.push_str(&format!("/// The blocks compiled, per document.\npub const COUNTS: &[(&str, usize)] = &[{}];\n", counts.join(", ")));
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("doc_examples.rs");
    std::fs::write(dest, out).expect("write doc_examples.rs");
}

fn main() {
    doc_examples();
    println!("cargo:rerun-if-changed=bench/baseline.cpp");
    println!("cargo:rerun-if-changed=bench/lifecycle_floor.cpp");
    println!("cargo:rerun-if-changed=native/foreign_mr.cpp");
    // raft-sys's build metadata (DEP_RAFTRS_*); absent in documentation builds, which need no
    // baseline.
    let Some(found) = Stack::from_dep_metadata() else { return };
    let mut build = cc::Build::new();
    // The C++ never instrumented: under -Zsanitizer=address cc adds -fsanitize=address for
    // CARGO_CFG_SANITIZE, and `--no-undefined` links cannot take ASan's runtime.
    build.flag("-fno-sanitize=address");
    build
        .cpp(true)
        .std("c++20")
        .file("bench/baseline.cpp")
        .file("bench/lifecycle_floor.cpp")
        .file("native/foreign_mr.cpp")
        .opt_level(2)
        .debug(false);
    // The shim's fence (crates/raft-sys/src/fence.hpp), which the floor rows put on their
    // pool-like resources as the shim does.
    build.include(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/raft-sys/src"));
    println!("cargo:rerun-if-changed=../crates/raft-sys/src/fence.hpp");
    for dir in &found.includes {
        build.flag(format!("-isystem{}", dir.display()));
    }
    // The static baseline first, then the libraries it calls.
    build.compile("raft_bench_baseline");

    for dir in &found.lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    // DT_RPATH rather than RUNPATH: it also serves the libraries' own dependencies (cuBLAS's
    // cuBLASLt), as LD_LIBRARY_PATH would.
    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    for name in LIBRARIES {
        match found.library(name) {
            // The CUDA wheels ship only versioned files (`libcudart.so.13`): link those by name.
            Some((_, file)) if file != format!("lib{name}.so") => println!("cargo:rustc-link-lib=dylib:+verbatim={file}"),
            Some(_) => println!("cargo:rustc-link-lib=dylib={name}"),
            None => panic!("lib{name}.so is not in raft-sys's library directories {:?}", found.lib_dirs),
        }
    }
}
