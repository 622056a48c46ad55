//! The distances cuVS measures (`cuvsDistanceType`).
use crate::sys::cuvsDistanceType;

/// How cuVS measures the distance between two rows (cuVS's `cuvsDistanceType`). Brute force
/// takes every one; CAGRA takes `L2Expanded` and `InnerProduct` (its `CosineExpanded` is refused: see
/// [`CagraIndexParams::metric`](crate::CagraIndexParams::metric)).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Metric {
    /// Squared Euclidean distance, computed as `|x|² + |y|² - 2 x·y` (cuVS's default).
    #[default]
    L2Expanded,
    /// Euclidean distance (the square root of `L2Expanded`).
    L2SqrtExpanded,
    /// Squared Euclidean distance, computed as `Σ (x - y)²`.
    L2Unexpanded,
    /// Inner product: larger is nearer.
    InnerProduct,
    /// Cosine distance, `1 - x·y / (|x| |y|)`.
    CosineExpanded,
    /// Manhattan distance.
    L1,
    /// Chebyshev distance.
    Linf,
}

impl Metric {
    pub(crate) fn raw(self) -> cuvsDistanceType {
        match self {
            Metric::L2Expanded => cuvsDistanceType::L2Expanded,
            Metric::L2SqrtExpanded => cuvsDistanceType::L2SqrtExpanded,
            Metric::L2Unexpanded => cuvsDistanceType::L2Unexpanded,
            Metric::InnerProduct => cuvsDistanceType::InnerProduct,
            Metric::CosineExpanded => cuvsDistanceType::CosineExpanded,
            Metric::L1 => cuvsDistanceType::L1,
            Metric::Linf => cuvsDistanceType::Linf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_cuvs_values() {
        // cuvs/distance/distance.h of 26.08.
        let values: Vec<u32> = [
            Metric::L2Expanded,
            Metric::L2SqrtExpanded,
            Metric::L2Unexpanded,
            Metric::InnerProduct,
            Metric::CosineExpanded,
            Metric::L1,
            Metric::Linf,
        ]
        .iter()
        .map(|m| m.raw().0)
        .collect();
        assert_eq!(values, [0, 1, 4, 6, 2, 3, 7]);
    }
}
