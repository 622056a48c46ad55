//! Data patterns and comparisons shared by the copy tests (`copies`, `capture`): a pattern that
//! differs between the two ends of every copy, so a copy that did not happen, happened twice, or
//! wrote freed memory that was reused shows as wrong data.

pub const SIZES: [usize; 6] = [0, 1, 3, 4097, (1 << 20) + 1, (64 << 20) + 3];

/// A pattern that depends on the position and the seed (so two buffers never agree by chance).
pub fn pattern_u32(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed.wrapping_mul(0x9E37_79B9)) ^ seed).collect()
}

pub fn pattern_f32(n: usize, seed: u32) -> Vec<f32> {
    pattern_u32(n, seed).into_iter().map(|x| (x >> 8) as f32).collect()
}

pub fn pattern_u8(n: usize, seed: u32) -> Vec<u8> {
    pattern_u32(n, seed).into_iter().map(|x| (x >> 24) as u8).collect()
}

/// Compares without printing 64 Mi elements on a failure.
pub fn same<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!("{what}: first difference at element {i} of {}: {:?} != {:?}", got.len(), got[i], want[i]);
    }
}
