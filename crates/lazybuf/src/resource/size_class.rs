//! Size classes: which block size serves a request, and how much a block can waste.
//!
//! A request of `n` bytes is served by a block of `class_size(n)` bytes:
//! - up to 256 bytes, the next multiple of 64 (a cache line);
//! - above, four classes per power of two: for `2^k < n <= 2^(k+1)` the next multiple of
//!   `2^(k-2)`, i.e. `1.25`, `1.5`, `1.75` or `2` times `2^k`, with the step capped at
//!   2 MiB (a huge page): large requests round to a multiple of 2 MiB, as PyTorch's caching
//!   allocator rounds them, rather than to a quarter of their size.
//!
//! **Worst-case waste.** A block exceeds its request by less than one step, so by at most
//! 63 bytes for requests up to 256 bytes, and by less than a quarter of the request and less
//! than 2 MiB above (the step `2^(k-2)` is under `n / 4` because `n > 2^k`). Every class is a
//! multiple of 64, so every block is cache-line sized. The tests below check the bound for
//! every request up to 4 MiB and for sampled sizes up to 2^62.
//!
//! What does not live here: the free lists ([`super::CachingResource`]).

/// Requests up to this many bytes round to a multiple of [`GRANULE`].
const SMALL: usize = 256;
/// The smallest step between classes: a cache line.
const GRANULE: usize = 64;
/// The largest step between classes: a huge page.
const MAX_STEP: usize = 2 << 20;

/// The block size that serves a request of `bytes`: 0 for 0, else the class described in the
/// module docs; `None` when the class would not fit in `usize`.
pub(crate) fn class_size(bytes: usize) -> Option<usize> {
    if bytes == 0 {
        return Some(0);
    }
    let step = if bytes <= SMALL {
        GRANULE
    } else {
        // 2^k < bytes <= 2^(k+1), with k >= 8 here.
        let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
        (1usize << (k - 2)).min(MAX_STEP)
    };
    bytes.checked_next_multiple_of(step)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented bound: under 64 bytes up to 256, under a quarter of the request (and
    /// under 2 MiB) above.
    fn waste_bound(n: usize) -> usize {
        if n <= SMALL { GRANULE } else { n.div_ceil(4).min(MAX_STEP) }
    }

    fn check(n: usize) {
        let class = class_size(n).unwrap();
        assert!(class >= n, "class {class} is smaller than the request {n}");
        assert!(class - n < waste_bound(n), "request {n}: class {class} wastes too much");
        assert_eq!(class % GRANULE, 0, "class {class} is not a multiple of {GRANULE}");
        assert_eq!(class_size(class), Some(class), "class {class} does not map to itself");
    }

    #[test]
    fn waste_is_bounded_for_every_size_up_to_4_mib() {
        for n in 1..=(4 << 20) {
            check(n);
        }
    }

    #[test]
    fn waste_is_bounded_for_large_sizes() {
        for k in 22..62 {
            let base = 1usize << k;
            for n in [base - 1, base, base + 1, base + base / 4, base + base / 4 + 1, 2 * base - 1] {
                check(n);
            }
        }
    }

    #[test]
    fn classes_are_the_documented_ladder() {
        assert_eq!(class_size(0), Some(0));
        assert_eq!(class_size(1), Some(64));
        assert_eq!(class_size(65), Some(128));
        assert_eq!(class_size(256), Some(256));
        assert_eq!(class_size(257), Some(320));
        assert_eq!(class_size(4000), Some(4096));
        assert_eq!(class_size(4097), Some(5120));
        assert_eq!(class_size(1 << 20), Some(1 << 20));
        assert_eq!(class_size((1 << 20) + 1), Some(5 << 18));
        // Just above a power of two: one step of a quarter of it, up to 2 MiB.
        assert_eq!(class_size((4 << 20) + 1), Some(5 << 20));
        assert_eq!(class_size((64 << 20) + 1), Some(66 << 20));
        assert_eq!(class_size((1 << 30) + 1), Some((1 << 30) + (2 << 20)));
    }

    #[test]
    fn classes_are_monotonic() {
        let mut last = 0;
        for n in 0..=(1 << 16) {
            let class = class_size(n).unwrap();
            assert!(class >= last);
            last = class;
        }
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn sizes_beyond_the_address_space_have_no_class() {
        assert_eq!(class_size(usize::MAX), None);
        assert_eq!(class_size(usize::MAX - MAX_STEP + 2), None);
        assert_eq!(class_size(1 << 63), Some(1 << 63));
    }
}
