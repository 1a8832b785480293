//! Element types a buffer can hold: the [`Element`] trait for Rust's typed edge and the
//! [`DType`] enum that the untyped core and the Python binding use.
//!
//! What does not live here: NumPy dtype parsing (the Python binding maps to [`DType`]).

use std::fmt;

/// The element type of a buffer, known at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `u8`
    U8,
    /// `u16`
    U16,
    /// `u32`
    U32,
    /// `u64`
    U64,
    /// `i8`
    I8,
    /// `i16`
    I16,
    /// `i32`
    I32,
    /// `i64`
    I64,
    /// IEEE half precision (`half::f16`)
    F16,
    /// bfloat16 (`half::bf16`)
    BF16,
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// A complex number of two `f32`s, real part first ([`num_complex::Complex32`]; NumPy's
    /// `complex64`)
    C64,
    /// A complex number of two `f64`s, real part first ([`num_complex::Complex64`]; NumPy's
    /// `complex128`)
    C128,
}

impl DType {
    /// Every supported element type.
    pub const ALL: [DType; 14] = [
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
    ];

    /// The size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// The NumPy-style name (`"float32"`, `"bfloat16"`).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::C64 => "complex64",
            DType::C128 => "complex128",
        }
    }

    /// Looks a type up by its NumPy-style name.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A type that can be an element of a [`crate::UnifiedBuffer`]: plain old data whose every bit
/// pattern is a valid value, so bytes copied from a device can be read as `Self`.
///
/// Sealed: the set of element types is the set of [`DType`]s.
pub trait Element: bytemuck::Pod + Send + Sync + fmt::Debug + PartialEq + sealed::Sealed {
    /// The run-time tag of this type.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element! {
    u8 => U8, u16 => U16, u32 => U32, u64 => U64,
    i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64,
    num_complex::Complex32 => C64, num_complex::Complex64 => C128,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(<half::bf16 as Element>::DTYPE.size(), size_of::<half::bf16>());
        assert_eq!(<f64 as Element>::DTYPE.size(), size_of::<f64>());
        assert_eq!(<i16 as Element>::DTYPE.size(), size_of::<i16>());
        assert_eq!(<num_complex::Complex32 as Element>::DTYPE.size(), size_of::<num_complex::Complex32>());
        assert_eq!(<num_complex::Complex64 as Element>::DTYPE.size(), size_of::<num_complex::Complex64>());
    }

    #[test]
    fn complex_numbers_are_real_part_first() {
        // The layout NumPy, C99 `float _Complex`, CUDA's cuComplex and OpenCL's float2 use.
        let z = num_complex::Complex32::new(1.5, -2.0);
        let bytes = bytemuck::bytes_of(&z);
        assert_eq!(&bytes[..4], &1.5f32.to_ne_bytes());
        assert_eq!(&bytes[4..], &(-2.0f32).to_ne_bytes());
        assert_eq!(align_of::<num_complex::Complex64>(), align_of::<f64>());
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("complex64"), Some(DType::C64));
        assert_eq!(DType::from_name("complex128"), Some(DType::C128));
        assert_eq!(DType::from_name("complex256"), None);
        assert_eq!(DType::from_name("bool"), None);
    }
}
