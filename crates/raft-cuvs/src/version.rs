//! The version of the loaded cuVS, as a value: what `cuvsVersionGet` reports.

/// A cuVS release (`cuvsVersionGet`), e.g. 26.08.1: ordered by release, shown as
/// `26.08.01` (RAPIDS's own spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The year's last two digits (26).
    pub major: u16,
    /// The month (8).
    pub minor: u16,
    /// The patch (1).
    pub patch: u16,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}.{:02}", self.major, self.minor, self.patch)
    }
}

#[cfg(test)]
mod tests {
    use super::Version;

    #[test]
    fn versions_order_by_release_and_print_as_rapids_does() {
        let v = Version { major: 26, minor: 8, patch: 1 };
        assert_eq!(v.to_string(), "26.08.01");
        assert!(v < Version { major: 26, minor: 10, patch: 0 });
        assert!(v > Version { major: 25, minor: 12, patch: 9 });
    }
}
