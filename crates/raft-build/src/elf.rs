//! [`gnu_build_id`]: the GNU build-id an ELF file carries (its `NT_GNU_BUILD_ID` note), the
//! identity of one build of a library. Two builds of the same release (another package, a
//! rebuild) carry different ones: `raft-sys` compiles it into the shim for the `librmm.so` it
//! links, and the shim compares it at load with the `librmm.so` the process mapped (helper 101:
//! a same-release `librmm.so` of another build ran under the shim's inline RMM code unnoticed).

/// The most hex digits of a build-id the shims report and the builds record (35 bytes; the
/// usual ids are 8, 16 or 20 bytes).
pub const BUILD_ID_HEX_MAX: usize = 70;

/// `PT_NOTE`: a program header of notes.
const PT_NOTE: u32 = 4;
/// `NT_GNU_BUILD_ID`: the note of the build-id (owner "GNU").
const NT_GNU_BUILD_ID: u32 = 3;

/// The GNU build-id of a 64-bit little-endian ELF file's image (lower-case hex), from its
/// `PT_NOTE` program headers as the loader maps them; `None` for anything else or a file
/// without one. Callers compare at most [`BUILD_ID_HEX_MAX`] digits (what the shims report).
pub fn gnu_build_id(elf: &[u8]) -> Option<String> {
    // Every offset checked: a crafted file gives `None`, never a panic in a build script.
    let u16_at = |at: usize| elf.get(at..at.checked_add(2)?).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |at: usize| elf.get(at..at.checked_add(4)?).map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])));
    let u64_at = |at: usize| elf.get(at..at.checked_add(8)?).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    // "\x7fELF", 64-bit (class 2), little-endian (data 1).
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    for i in 0..phnum {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        if u32_at(ph)? != PT_NOTE {
            continue;
        }
        let offset = usize::try_from(u64_at(ph.checked_add(8)?)?).ok()?;
        let size = usize::try_from(u64_at(ph.checked_add(32)?)?).ok()?;
        // Notes in a segment aligned to 8 are padded to 8 (gABI); otherwise to 4.
        let align = if u64_at(ph.checked_add(48)?)? == 8 { 8 } else { 4 };
        let notes = elf.get(offset..offset.checked_add(size)?)?;
        if let Some(id) = build_id_note(notes, align) {
            return Some(id);
        }
    }
    None
}

/// The build-id in one segment's notes, padded to `align`.
fn build_id_note(notes: &[u8], align: usize) -> Option<String> {
    let pad = |n: usize| n.checked_add(align - 1).map(|n| n & !(align - 1));
    let mut at = 0usize;
    while at.checked_add(12)? <= notes.len() {
        let word = |k: usize| u32::from_le_bytes(notes[at + 4 * k..at + 4 * k + 4].try_into().unwrap_or([0; 4])) as usize;
        let (namesz, descsz, kind) = (word(0), word(1), word(2) as u32);
        // The descriptor and the next note start at the alignment, counted from this note's
        // start (glibc's ELF_NOTE_DESC_OFFSET and ELF_NOTE_NEXT_OFFSET).
        let name = at + 12;
        let desc = at.checked_add(pad(12usize.checked_add(namesz)?)?)?;
        let next = at.checked_add(pad((desc - at).checked_add(descsz)?)?)?;
        // The last note's tail padding may be missing (the loader's reader, the shim's, does not
        // need it either): only the name and the descriptor must lie inside.
        if name.checked_add(namesz)? > notes.len() || desc.checked_add(descsz)? > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && namesz == 4 && &notes[name..name + 4] == b"GNU\0" && descsz > 0 {
            return Some(notes[desc..desc + descsz].iter().map(|b| format!("{b:02x}")).collect());
        }
        at = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF image: the header, one `PT_NOTE` program header, then `notes`.
    fn image(notes: &[u8], align: u64) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        let ph = 64;
        elf[ph..ph + 4].copy_from_slice(&PT_NOTE.to_le_bytes());
        elf[ph + 8..ph + 16].copy_from_slice(&120u64.to_le_bytes()); // p_offset
        elf[ph + 32..ph + 40].copy_from_slice(&(notes.len() as u64).to_le_bytes()); // p_filesz
        elf[ph + 48..ph + 56].copy_from_slice(&align.to_le_bytes()); // p_align
        elf.extend_from_slice(notes);
        elf
    }

    fn note(name: &[u8], kind: u32, desc: &[u8], align: usize) -> Vec<u8> {
        let mut n = Vec::new();
        n.extend_from_slice(&(name.len() as u32).to_le_bytes());
        n.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        n.extend_from_slice(&kind.to_le_bytes());
        n.extend_from_slice(name);
        n.resize(n.len().next_multiple_of(align), 0);
        n.extend_from_slice(desc);
        n.resize(n.len().next_multiple_of(align), 0);
        n
    }

    #[test]
    fn the_build_id_note_is_found_after_other_notes_at_either_alignment() {
        for align in [4usize, 8] {
            let mut notes = note(b"GNU\0", 5, &[1, 2, 3, 4, 5, 6, 7, 8], align); // a property note first
            notes.extend(note(b"GNU\0", NT_GNU_BUILD_ID, &[0xde, 0xad, 0xbe, 0xef, 0x01], align));
            assert_eq!(gnu_build_id(&image(&notes, align as u64)).as_deref(), Some("deadbeef01"), "align {align}");
        }
        // Another owner's note of type 3 is not the build-id; none, or a cut image, is None.
        assert_eq!(gnu_build_id(&image(&note(b"Go\0\0", NT_GNU_BUILD_ID, &[1, 2], 4), 4)), None);
        let whole = image(&note(b"GNU\0", NT_GNU_BUILD_ID, &[9; 20], 4), 4);
        assert_eq!(gnu_build_id(&whole[..whole.len() - 4]), None);
        // A last note without its tail padding is still read (a 5-byte id leaves 3 bytes of it).
        let unpadded = note(b"GNU\0", NT_GNU_BUILD_ID, &[1, 2, 3, 4, 5], 4);
        let cut = &unpadded[..unpadded.len() - 3];
        assert_eq!(gnu_build_id(&image(cut, 4)).as_deref(), Some("0102030405"));
        assert_eq!(gnu_build_id(b"\x7fELF\x01\x01"), None);
    }

    /// Mutated images (seeded, 20 000 cases: bytes flipped, cut, inserted, repeated, and the
    /// header's and notes' offsets, counts and sizes overwritten by edge values such as 0,
    /// `u32::MAX` and `u64::MAX`): never a panic (a build script would die of it), and a
    /// build-id found is lower-case hex of whole bytes, no longer than the image.
    #[test]
    #[cfg_attr(miri, ignore = "tens of thousands of cases: Miri adds nothing to the bounds checks")]
    fn mutated_images_never_panic() {
        let mut notes = note(b"GNU\0", 5, &[1, 2, 3, 4, 5, 6, 7, 8], 8);
        notes.extend(note(b"GNU\0", NT_GNU_BUILD_ID, &[0xab; 20], 8));
        let whole = image(&notes, 8);
        assert_eq!(gnu_build_id(&whole).as_deref(), Some("ab".repeat(20).as_str()));
        // Where the reader takes offsets, counts and sizes from.
        let fields = [0x20, 0x36, 0x38, 64, 64 + 8, 64 + 32, 64 + 48, 120, 124, 128, 136, 140, 144];
        let edges: [u64; 8] = [0, 1, 3, 8, 0xffff, u32::MAX as u64, i64::MAX as u64, u64::MAX];
        let mut next = crate::seeded(0x5eed_0111_0000_0006u64);
        let mut found = 0;
        for case in 0..20_000 {
            let mut b = whole.clone();
            for _ in 0..1 + next() % 3 {
                let at = next() % (b.len() + 1);
                match next() % 6 {
                    0 if at < b.len() => b[at] ^= (next() as u8).max(1),
                    1 => b.truncate(at),
                    2 => b.insert(at, next() as u8),
                    3 => {
                        let copy = b[at..(at + 1 + next() % 24).min(b.len())].to_vec();
                        b.splice(at..at, copy);
                    }
                    _ => {
                        let (field, value) = (fields[next() % fields.len()], edges[next() % edges.len()]);
                        let width = [2, 4, 8][next() % 3];
                        for (k, byte) in value.to_le_bytes().into_iter().take(width).enumerate() {
                            if let Some(x) = b.get_mut(field + k) {
                                *x = byte;
                            }
                        }
                    }
                }
            }
            if let Some(id) = gnu_build_id(&b) {
                found += 1;
                let hex = id.len() % 2 == 0 && id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
                assert!(hex && !id.is_empty() && id.len() <= 2 * b.len(), "case {case}: {id:?}");
            }
        }
        assert!(found > 1000, "{found} images still carried a build-id");
    }

    /// This test's own executable against binutils' `readelf -n`, where both say something.
    #[test]
    #[cfg_attr(miri, ignore)] // spawns readelf
    fn the_build_id_of_this_executable_is_readelfs() {
        let exe = std::env::current_exe().unwrap();
        let ours = gnu_build_id(&std::fs::read(&exe).unwrap());
        let Ok(out) = std::process::Command::new("readelf").arg("-n").arg(&exe).output() else {
            eprintln!("SKIP: no readelf to compare with (ours: {ours:?})");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let theirs = text.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).map(str::to_string);
        assert_eq!(ours, theirs, "{text}");
    }
}
