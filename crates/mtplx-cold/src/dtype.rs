//! [`KvDtype`]: the element type of stored K/V rows. The cold tier stores rows in the type
//! the server keeps them in and never converts them: a row is its elements' bytes (a float
//! value's little-endian bytes, or a quantized group of 32 values: ggml's `q8_0` and `q4_1`
//! blocks), and the type is recorded in every entry and block so rows are never handed to
//! a server that keeps another type.

use std::fmt;

/// The element type of K/V rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
    Bf16,
    /// Groups of 32 values: an `f16` scale and 32 `i8` (34 bytes).
    Q8,
    /// Groups of 32 values: `f16` scale and offset and 32 nibbles (20 bytes).
    Q4,
}

impl KvDtype {
    pub const ALL: [KvDtype; 5] = [
        KvDtype::F32,
        KvDtype::F16,
        KvDtype::Bf16,
        KvDtype::Q8,
        KvDtype::Q4,
    ];

    /// Values one stored element holds: 1, or a quantized group's 32. A row's values are a
    /// whole number of elements (heads of whole groups, [`crate::KvGeometry`]).
    pub fn group(self) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => 1,
            KvDtype::Q8 | KvDtype::Q4 => 32,
        }
    }

    /// Bytes of one stored element.
    pub fn element_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Q8 => 34,
            KvDtype::Q4 => 20,
        }
    }

    /// Bytes of `values` values, a whole number of elements.
    pub fn bytes(self, values: usize) -> usize {
        debug_assert!(values.is_multiple_of(self.group()));
        values / self.group() * self.element_bytes()
    }

    /// The name the server's `--kv-dtype` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8 => "q8",
            KvDtype::Q4 => "q4",
        }
    }

    /// The code stored on disk (entry records, block headers) and hashed into
    /// [`crate::Identity::digest`].
    pub fn code(self) -> u8 {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
            KvDtype::Q8 => 3,
            KvDtype::Q4 => 4,
        }
    }

    /// The type of an on-disk code; `None` for a code this build does not know.
    pub fn from_code(code: u8) -> Option<KvDtype> {
        KvDtype::ALL.into_iter().find(|d| d.code() == code)
    }

    /// Appends `value` in this float type, little-endian (f16 and bf16 round to nearest
    /// even).
    ///
    /// # Panics
    /// For a quantized type: the cold tier never quantizes (its callers hand it the rows'
    /// bytes).
    pub fn encode(self, value: f32, out: &mut Vec<u8>) {
        match self {
            KvDtype::F32 => out.extend_from_slice(&value.to_le_bytes()),
            KvDtype::F16 => out.extend_from_slice(&half::f16::from_f32(value).to_le_bytes()),
            KvDtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(value).to_le_bytes()),
            KvDtype::Q8 | KvDtype::Q4 => panic!("the cold tier does not quantize {self} rows"),
        }
    }

    /// The value whose little-endian bytes in this float type are `bytes`
    /// ([`KvDtype::element_bytes`] of them): exact, the value the rows hold.
    ///
    /// # Panics
    /// For a quantized type (see [`KvDtype::encode`]).
    pub fn decode(self, bytes: &[u8]) -> f32 {
        match self {
            KvDtype::F32 => f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
            KvDtype::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            KvDtype::Bf16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32(),
            KvDtype::Q8 | KvDtype::Q4 => panic!("the cold tier does not dequantize {self} rows"),
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_sizes_and_names_are_pinned() {
        // Pinned: the codes are on disk and in every identity digest; changing one needs a
        // format bump.
        let got: Vec<(u8, usize, usize, &str)> = KvDtype::ALL
            .iter()
            .map(|d| (d.code(), d.group(), d.element_bytes(), d.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (0, 1, 4, "f32"),
                (1, 1, 2, "f16"),
                (2, 1, 2, "bf16"),
                (3, 32, 34, "q8"),
                (4, 32, 20, "q4")
            ]
        );
        assert_eq!(KvDtype::Q8.bytes(64), 68);
        for d in KvDtype::ALL {
            assert_eq!(KvDtype::from_code(d.code()), Some(d));
            assert_eq!(d.to_string(), d.as_str());
        }
        assert_eq!(KvDtype::from_code(5), None);
        assert_eq!(KvDtype::from_code(255), None);
    }

    #[test]
    fn values_encode_little_endian_rounding_to_nearest_even() {
        let enc = |d: KvDtype, x: f32| {
            let mut out = Vec::new();
            d.encode(x, &mut out);
            out
        };
        assert_eq!(enc(KvDtype::F32, 1.5), 1.5f32.to_le_bytes());
        // 1.0 is 0x3c00 in f16, 0x3f80 in bf16.
        assert_eq!(enc(KvDtype::F16, 1.0), [0x00, 0x3c]);
        assert_eq!(enc(KvDtype::Bf16, 1.0), [0x80, 0x3f]);
        // Halfway between 1.0 and the next f16 (1 + 2^-10): ties to even, down to 1.0;
        // 3/4 of the way rounds up.
        assert_eq!(enc(KvDtype::F16, 1.0 + 2f32.powi(-11)), [0x00, 0x3c]);
        assert_eq!(enc(KvDtype::F16, 1.0 + 3.0 * 2f32.powi(-12)), [0x01, 0x3c]);
        // bf16 keeps f32's exponent: 1 + 2^-8 is halfway to 1 + 2^-7, ties to even.
        assert_eq!(enc(KvDtype::Bf16, 1.0 + 2f32.powi(-8)), [0x80, 0x3f]);
        for d in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
            assert_eq!(d.decode(&enc(d, -2.5)), -2.5);
        }
    }
}
