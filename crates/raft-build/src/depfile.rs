//! The headers a shim was compiled with, from the compiler's dependency files (`-MD`), and one
//! digest of them: two builds whose RAFT, RMM, CCCL or CUDA headers differ in any byte (a
//! hand-edited prefix, headers mixed from two packages of one release) get different digests,
//! where their version macros and RMM's library build-id may all agree (the twenty-first audit's
//! open item).

use std::path::{Path, PathBuf};

/// The prerequisites a make-style dependency file names (GCC's and Clang's `-MD` output): every
/// path after each rule's target, with line continuations joined and `\ ` (a space in a path),
/// `\#` and `$$` unescaped.
pub fn prerequisites(text: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let (mut word, mut escaped, mut in_rule) = (String::new(), false, false);
    let mut chars = text.chars().peekable();
    // A word ends: before the rule's `:` it is a target (dropped), after it a prerequisite.
    fn end_word(word: &mut String, in_rule: &mut bool, out: &mut Vec<PathBuf>) {
        let w = std::mem::take(word);
        if w.is_empty() {
        } else if *in_rule {
            out.push(PathBuf::from(w));
        } else if w.ends_with(':') {
            *in_rule = true;
        }
    }
    while let Some(c) = chars.next() {
        if escaped {
            escaped = false;
            match c {
                '\n' => end_word(&mut word, &mut in_rule, &mut out),
                '\r' if chars.peek() == Some(&'\n') => {
                    chars.next();
                    end_word(&mut word, &mut in_rule, &mut out);
                }
                ' ' | '#' | '\\' => word.push(c),
                other => {
                    word.push('\\');
                    word.push(other);
                }
            }
            continue;
        }
        match c {
            '\\' => escaped = true,
            '$' if chars.peek() == Some(&'$') => {
                chars.next();
                word.push('$');
            }
            '\n' => {
                // An unescaped line end ends the rule.
                end_word(&mut word, &mut in_rule, &mut out);
                in_rule = false;
            }
            c if c.is_whitespace() => end_word(&mut word, &mut in_rule, &mut out),
            c => word.push(c),
        }
    }
    end_word(&mut word, &mut in_rule, &mut out);
    out
}

/// The digest of the headers among `files` that lie under one of `roots` (the stack's include
/// directories; the shim's own sources and the system's headers are left out): FNV-1a (64 bits)
/// over each header's path relative to its root, a NUL, its length and its bytes, in path order,
/// each header once. Returns the digest as 16 hex digits and how many headers it covers.
///
/// A file under no root as written is matched again by its real path against the roots' real
/// paths: GCC writes a system header's real path when that is shorter
/// (`-fcanonical-system-headers`), as for a prefix reached through a long symlink (the review,
/// helper 108: 0 headers were found so).
///
/// # Errors
/// A header that cannot be read.
pub fn headers_digest(files: &[PathBuf], roots: &[PathBuf]) -> std::io::Result<(String, usize)> {
    let real_roots: Vec<PathBuf> = roots.iter().filter_map(|r| r.canonicalize().ok()).collect();
    // The shortest relative path: a root nested in another names the header as the compiler's
    // search found it.
    let under = |f: &Path, roots: &[PathBuf]| -> Option<String> {
        let rel = roots.iter().filter_map(|r| f.strip_prefix(r).ok()).min_by_key(|rel| rel.as_os_str().len())?;
        Some(rel.to_string_lossy().into_owned())
    };
    let mut headers: Vec<(String, &Path)> = files
        .iter()
        .filter_map(|f| {
            let rel = under(f, roots).or_else(|| f.canonicalize().ok().and_then(|real| under(&real, &real_roots)))?;
            Some((rel, f.as_path()))
        })
        .collect();
    headers.sort();
    headers.dedup_by(|a, b| a.0 == b.0);
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash = (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (rel, path) in &headers {
        let bytes = std::fs::read(path)?;
        feed(rel.as_bytes());
        feed(&[0]);
        feed(&(bytes.len() as u64).to_le_bytes());
        feed(&bytes);
    }
    Ok((format!("{hash:016x}"), headers.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prerequisites_are_read_as_gcc_writes_them() {
        let text = "out/a.o: /src/a.cpp /usr/include/stdc-predef.h \\\n /p/inc/rmm/x.hpp \\\n /p/inc/with\\ space.h /p/inc/$$dollar.h\n\nother.o: /p/inc/y.h\n";
        let got = prerequisites(text);
        let want: Vec<PathBuf> =
            ["/src/a.cpp", "/usr/include/stdc-predef.h", "/p/inc/rmm/x.hpp", "/p/inc/with space.h", "/p/inc/$dollar.h", "/p/inc/y.h"]
                .iter()
                .map(PathBuf::from)
                .collect();
        assert_eq!(got, want);
        assert!(prerequisites("").is_empty());
        assert_eq!(prerequisites("a.o : b.h"), vec![PathBuf::from("b.h")]);
    }

    /// Dependency files made of the characters the reader treats specially (seeded, 20 000
    /// cases of up to 60 of them): never a panic, never an empty path, and nothing read as a
    /// prerequisite before a rule's colon.
    #[test]
    #[cfg_attr(miri, ignore = "tens of thousands of cases: Miri adds nothing")]
    fn mutated_dependency_files_never_panic() {
        const PIECES: [&str; 14] = ["a.o", ":", " ", "\\", "\n", "\r\n", "$", "$$", "#", "\t", "/p/x.h", "é", "\\ ", "\\\n"];
        let mut next = crate::seeded(0x5eed_0111_0000_0007u64);
        for case in 0..20_000 {
            let text: String = (0..next() % 60).map(|_| PIECES[next() % PIECES.len()]).collect();
            let got = prerequisites(&text);
            assert!(got.iter().all(|p| !p.as_os_str().is_empty()), "case {case}: {text:?} gave {got:?}");
            if !text.contains(':') {
                assert!(got.is_empty(), "case {case}: {text:?} gave {got:?} with no rule");
            }
        }
    }

    #[test]
    fn the_digest_sees_every_byte_and_path_of_the_stacks_headers_only() {
        let dir = std::env::temp_dir().join(format!("raft-build-depfile-{}", std::process::id()));
        let (inc, other) = (dir.join("prefix/include"), dir.join("elsewhere"));
        std::fs::create_dir_all(inc.join("rmm")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        let write = |p: &Path, text: &str| std::fs::write(p, text).unwrap();
        write(&inc.join("rmm/a.hpp"), "struct a { int x; int y; };");
        write(&inc.join("rmm/b.hpp"), "#include <rmm/a.hpp>");
        write(&other.join("c.h"), "int c;");
        let files = vec![inc.join("rmm/b.hpp"), other.join("c.h"), inc.join("rmm/a.hpp"), inc.join("rmm/a.hpp")];
        let roots = vec![inc.clone()];
        let (first, n) = headers_digest(&files, &roots).unwrap();
        assert_eq!((first.len(), n), (16, 2), "the header outside the roots and the repeat left out");
        // Order of the dependency files does not matter; a file outside the roots does not count.
        write(&other.join("c.h"), "int c, d;");
        let reordered = vec![inc.join("rmm/a.hpp"), inc.join("rmm/b.hpp"), other.join("c.h")];
        assert_eq!(headers_digest(&reordered, &roots).unwrap().0, first);
        // One byte of one header moves it (two fields swapped, as helper 101's layout change).
        write(&inc.join("rmm/a.hpp"), "struct a { int y; int x; };");
        let edited = headers_digest(&files, &roots).unwrap().0;
        assert_ne!(edited, first);
        // So does the same content under another name.
        write(&inc.join("rmm/a.hpp"), "struct a { int x; int y; };");
        assert_eq!(headers_digest(&files, &roots).unwrap().0, first);
        std::fs::rename(inc.join("rmm/b.hpp"), inc.join("rmm/b2.hpp")).unwrap();
        let renamed = vec![inc.join("rmm/b2.hpp"), inc.join("rmm/a.hpp")];
        assert_ne!(headers_digest(&renamed, &roots).unwrap().0, first);
        // A root reached through a symlink, the compiler writing the header's real path: the
        // same header, the same digest.
        let link = dir.join("link-to-include");
        std::os::unix::fs::symlink(&inc, &link).unwrap();
        let through_link = vec![inc.join("rmm/a.hpp"), inc.join("rmm/b2.hpp")];
        assert_eq!(headers_digest(&through_link, std::slice::from_ref(&link)).unwrap(), headers_digest(&renamed, &roots).unwrap());
        // A header that cannot be read is an error, not a digest of less.
        assert!(headers_digest(&[inc.join("rmm/gone.hpp")], &roots).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
