//! GGUF reading (and, for the tiny test model, writing).
//!
//! ```text
//!  "GGUF" u32 version | u64 tensor_count | u64 kv_count
//!  kv_count × (string key, u32 value_type, value)
//!  tensor_count × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml_type, u64 offset)
//!  padding to `general.alignment` (default 32)
//!  tensor data; each tensor at data_start + offset (offset a multiple of the alignment)
//! ```
//!
//! Strings are `u64 len` + UTF-8 bytes; everything little-endian. `ne[0]` is the fastest-moving
//! dimension, so a weight matrix `[ne0 = in, ne1 = out]` is `out` rows of `in` values.
//!
//! The reader works on a byte slice (a memory map or a `Vec`), checks every length against the
//! bytes that remain before allocating, and returns [`GgufError`] — never panics — on malformed,
//! truncated or unsupported input.

use std::collections::BTreeMap;

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GgufError {
    #[error("not a GGUF file (magic {0:02x?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("truncated: needed {needed} bytes at offset {offset} for {what}, file has {len}")]
    Truncated {
        what: String,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("metadata key {key:?}: unknown value type {ty}")]
    BadValueType { key: String, ty: u32 },
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    BadUtf8 { what: String, offset: usize },
    #[error("metadata arrays nested deeper than {0}")]
    TooDeep(usize),
    #[error("tensor {name:?}: {reason}")]
    BadTensor { name: String, reason: String },
    #[error("tensor {name:?}: unsupported ggml type {ty} ({type_name})")]
    UnsupportedType {
        name: String,
        ty: u32,
        type_name: &'static str,
    },
    #[error("bad alignment {0} (must be a non-zero power of two)")]
    BadAlignment(u64),
    #[error("duplicate {what} {name:?}")]
    Duplicate { what: &'static str, name: String },
}

/// ggml tensor element types this crate can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl GgmlType {
    pub fn from_u32(ty: u32) -> Result<GgmlType, &'static str> {
        Ok(match ty {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            6 => return Err("Q5_0"),
            7 => return Err("Q5_1"),
            9 => return Err("Q8_1"),
            10 => return Err("Q2_K"),
            11 => return Err("Q3_K"),
            12 => return Err("Q4_K"),
            13 => return Err("Q5_K"),
            14 => return Err("Q6_K"),
            15 => return Err("Q8_K"),
            30 => return Err("BF16"),
            _ => return Err("unknown"),
        })
    }

    pub fn as_u32(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
        }
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q4_1 => 20,
            GgmlType::Q8_0 => 34,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    fn type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => 0,
            MetaValue::I8(_) => 1,
            MetaValue::U16(_) => 2,
            MetaValue::I16(_) => 3,
            MetaValue::U32(_) => 4,
            MetaValue::I32(_) => 5,
            MetaValue::F32(_) => 6,
            MetaValue::Bool(_) => 7,
            MetaValue::Str(_) => 8,
            MetaValue::Array(_) => 9,
            MetaValue::U64(_) => 10,
            MetaValue::I64(_) => 11,
            MetaValue::F64(_) => 12,
        }
    }

    /// Any integer type as u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// `ne[0]` first (fastest-moving).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute offset of the data in the file.
    pub offset: usize,
    pub size_bytes: usize,
}

impl TensorInfo {
    pub fn num_elems(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// A parsed GGUF file borrowing its bytes.
#[derive(Debug)]
pub struct Gguf<'a> {
    pub version: u32,
    pub alignment: usize,
    pub metadata: BTreeMap<String, MetaValue>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    bytes: &'a [u8],
}

const MAX_DEPTH: usize = 4;
const MAX_DIMS: u32 = 4;

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                len: self.bytes.len(),
            }),
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn arr<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let at = self.pos;
        let s = self.take(len, what)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::BadUtf8 {
            what: what(),
            offset: at,
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue, GgufError> {
        let what = || format!("metadata value {key:?}");
        Ok(match ty {
            0 => MetaValue::U8(self.arr::<1>(&what)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.arr(&what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.arr(&what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.arr(&what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.arr(&what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.arr(&what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.arr(&what)?)),
            7 => MetaValue::Bool(self.arr::<1>(&what)?[0] != 0),
            8 => MetaValue::Str(self.string(&what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(GgufError::TooDeep(MAX_DEPTH));
                }
                let elem_ty = self.u32(&what)?;
                let count = self.u64(&what)?;
                // Every element takes at least one byte: a count above what remains is a lie.
                if count > self.remaining() as u64 {
                    return Err(GgufError::Truncated {
                        what: format!("array {key:?} of {count} elements"),
                        offset: self.pos,
                        needed: usize::try_from(count).unwrap_or(usize::MAX),
                        len: self.bytes.len(),
                    });
                }
                let mut v = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    v.push(self.value(elem_ty, key, depth + 1)?);
                }
                MetaValue::Array(v)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.arr(&what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.arr(&what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.arr(&what)?)),
            _ => {
                return Err(GgufError::BadValueType {
                    key: key.to_string(),
                    ty,
                });
            }
        })
    }
}

impl<'a> Gguf<'a> {
    /// Parses the header, metadata and tensor infos; checks every tensor lies inside `bytes`.
    ///
    /// # Errors
    /// [`GgufError`] for anything malformed, truncated or unsupported.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        let mut c = Cursor { bytes, pos: 0 };
        let magic: [u8; 4] = c.arr(&|| "magic".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let tensor_count = c.u64(&|| "tensor count".into())?;
        let kv_count = c.u64(&|| "metadata count".into())?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let ty = c.u32(&|| format!("metadata type of {key:?}"))?;
            let v = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                return Err(GgufError::Duplicate {
                    what: "metadata key",
                    name: key,
                });
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => {
                let a = v.as_u64().unwrap_or(0);
                if a == 0 || !a.is_power_of_two() || a > 1 << 20 {
                    return Err(GgufError::BadAlignment(a));
                }
                a as usize
            }
        };
        // Each tensor info takes at least 24 bytes.
        if tensor_count > (c.remaining() / 24) as u64 {
            return Err(GgufError::Truncated {
                what: format!("{tensor_count} tensor infos"),
                offset: c.pos,
                needed: usize::try_from(tensor_count.saturating_mul(24)).unwrap_or(usize::MAX),
                len: bytes.len(),
            });
        }
        let mut raw = Vec::with_capacity(tensor_count as usize);
        let mut names = std::collections::HashSet::new();
        for i in 0..tensor_count {
            let name = c.string(&|| format!("tensor name #{i}"))?;
            let what = || format!("tensor info {name:?}");
            let n_dims = c.u32(&what)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadTensor {
                    name,
                    reason: format!("{n_dims} dimensions (supported 1..={MAX_DIMS})"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&what)?);
            }
            let ty_raw = c.u32(&what)?;
            let offset = c.u64(&what)?;
            if !names.insert(name.clone()) {
                return Err(GgufError::Duplicate {
                    what: "tensor",
                    name,
                });
            }
            raw.push((name, dims, ty_raw, offset));
        }
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, ty_raw, offset) in raw {
            let ty =
                GgmlType::from_u32(ty_raw).map_err(|type_name| GgufError::UnsupportedType {
                    name: name.clone(),
                    ty: ty_raw,
                    type_name,
                })?;
            let bad = |reason: String| GgufError::BadTensor {
                name: name.clone(),
                reason,
            };
            let mut n: u64 = 1;
            for &d in &dims {
                if d == 0 {
                    return Err(bad(format!("zero dimension in {dims:?}")));
                }
                n = n
                    .checked_mul(d)
                    .filter(|&n| n < 1 << 40)
                    .ok_or_else(|| bad(format!("dimensions {dims:?} too large")))?;
            }
            let be = ty.block_elems() as u64;
            if dims[0] % be != 0 {
                return Err(bad(format!(
                    "row length {} is not a multiple of the {} block size {be}",
                    dims[0],
                    ty.name()
                )));
            }
            let size = n / be * ty.block_bytes() as u64;
            if offset % alignment as u64 != 0 {
                return Err(bad(format!("offset {offset} not aligned to {alignment}")));
            }
            let start = (data_start as u64).checked_add(offset);
            let end = start.and_then(|s| s.checked_add(size));
            match (start, end) {
                (Some(s), Some(e)) if e <= bytes.len() as u64 => tensors.push(TensorInfo {
                    name,
                    dims,
                    ty,
                    offset: s as usize,
                    size_bytes: size as usize,
                }),
                _ => {
                    return Err(GgufError::Truncated {
                        what: format!("data of tensor {name:?}"),
                        offset: start.map_or(usize::MAX, |s| s as usize),
                        needed: size as usize,
                        len: bytes.len(),
                    });
                }
            }
        }
        Ok(Gguf {
            version,
            alignment,
            metadata,
            tensors,
            bytes,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (already bounds-checked by [`Gguf::parse`]).
    pub fn tensor_data(&self, t: &TensorInfo) -> &'a [u8] {
        &self.bytes[t.offset..t.offset + t.size_bytes]
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }
}

/// Builds a GGUF file in memory (used for the tiny random model and tests).
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    pub fn meta(&mut self, key: &str, v: MetaValue) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    /// `dims` with `ne[0]` first; `data` already encoded in `ty`.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, data));
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        const ALIGN: usize = 32;
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        fn put_str(out: &mut Vec<u8>, s: &str) {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        fn put_val(out: &mut Vec<u8>, v: &MetaValue) {
            match v {
                MetaValue::U8(x) => out.push(*x),
                MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::Bool(x) => out.push(u8::from(*x)),
                MetaValue::Str(s) => put_str(out, s),
                MetaValue::Array(a) => {
                    let elem_ty = a.first().map_or(4, MetaValue::type_id);
                    out.extend_from_slice(&elem_ty.to_le_bytes());
                    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                    for e in a {
                        put_val(out, e);
                    }
                }
                MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
                MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
            }
        }
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            put_val(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.as_u32().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(ALIGN) * ALIGN;
        }
        let data_start = out.len().div_ceil(ALIGN) * ALIGN;
        out.resize(data_start, 0);
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(data);
        }
        let end = out.len().div_ceil(ALIGN) * ALIGN;
        out.resize(end, 0);
        out
    }
}
