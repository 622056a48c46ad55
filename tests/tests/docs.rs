//! The Rust code blocks of README.md, docs/COMMS.md, docs/CUVS.md and docs/MEMORY.md, compiled
//! (never run: most need a GPU, some several processes): `build.rs` writes each as a function,
//! so a block that no longer compiles fails this crate's build. The test checks that every block
//! the documents hold was taken, counted here on their text independently of `build.rs`.
mod examples {
    include!(concat!(env!("OUT_DIR"), "/doc_examples.rs"));
}

#[test]
fn every_rust_block_of_the_documents_is_compiled() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (doc, compiled) in examples::COUNTS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let fences = text.lines().filter(|l| l.trim_start().starts_with("```rust")).count();
        assert_eq!(*compiled, fences, "{doc}: {fences} rust blocks, {compiled} compiled");
    }
    assert!(examples::COUNTS.iter().map(|(_, n)| n).sum::<usize>() >= 6, "{:?}", examples::COUNTS);
    // The functions exist (their bodies are what is checked); not called.
    let _ = [examples::readme_md_1 as fn() -> Result<(), Box<dyn std::error::Error>>, examples::docs_memory_md_1];
}
