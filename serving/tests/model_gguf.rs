//! GGUF reader: round trip through the writer, a table of malformed files with the error each
//! must give, and property tests that random, truncated or mutated bytes never panic.

use brownout_serving::model::gguf::{GgmlType, Gguf, GgufError, GgufWriter, MetaValue};
use brownout_serving::model::{LoadedModel, tiny};
use proptest::prelude::*;

fn small_file() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::Str("llama".into()))
        .meta("a.u8", MetaValue::U8(7))
        .meta("a.i8", MetaValue::I8(-7))
        .meta("a.u16", MetaValue::U16(700))
        .meta("a.i16", MetaValue::I16(-700))
        .meta("a.u32", MetaValue::U32(70000))
        .meta("a.i32", MetaValue::I32(-70000))
        .meta("a.f32", MetaValue::F32(1.5))
        .meta("a.bool", MetaValue::Bool(true))
        .meta("a.u64", MetaValue::U64(1 << 40))
        .meta("a.i64", MetaValue::I64(-(1 << 40)))
        .meta("a.f64", MetaValue::F64(-2.25))
        .meta(
            "a.arr",
            MetaValue::Array(vec![
                MetaValue::Str("x".into()),
                MetaValue::Str("yz".into()),
            ]),
        )
        .tensor("t.f32", &[4], GgmlType::F32, vec![0u8; 16])
        .tensor("t.q8", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]);
    w
}

#[test]
fn writer_output_parses_back_to_the_same_metadata_and_tensors() {
    let bytes = small_file().to_bytes();
    let g = Gguf::parse(&bytes).expect("parse");
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.get("a.i16"), Some(&MetaValue::I16(-700)));
    assert_eq!(g.get("a.f64"), Some(&MetaValue::F64(-2.25)));
    assert_eq!(g.get("a.u64").and_then(MetaValue::as_u64), Some(1 << 40));
    assert_eq!(
        g.get("a.arr")
            .and_then(MetaValue::as_array)
            .map(<[MetaValue]>::len),
        Some(2)
    );
    let t = g.tensor("t.q8").expect("tensor");
    assert_eq!(
        (t.dims.clone(), t.ty, t.size_bytes),
        (vec![32, 2], GgmlType::Q8_0, 68)
    );
    assert_eq!(t.offset % 32, 0);
    assert!(g.tensor_data(t).iter().all(|&b| b == 1));
}

/// Header bytes: magic, version, tensor count, kv count.
fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&tensors.to_le_bytes());
    b.extend_from_slice(&kvs.to_le_bytes());
    b
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

/// One tensor info + padding + `data_len` bytes of data.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header(3, 1, 0);
    string(&mut b, "w");
    b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        b.extend_from_slice(&d.to_le_bytes());
    }
    b.extend_from_slice(&ty.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + data_len, 0);
    b
}

#[test]
fn malformed_files_give_the_matching_error() {
    let mut bad_type = header(3, 0, 1);
    string(&mut bad_type, "k");
    bad_type.extend_from_slice(&99u32.to_le_bytes());
    let mut bad_align = header(3, 0, 1);
    string(&mut bad_align, "general.alignment");
    bad_align.extend_from_slice(&4u32.to_le_bytes());
    bad_align.extend_from_slice(&3u32.to_le_bytes());
    let mut huge_array = header(3, 0, 1);
    string(&mut huge_array, "k");
    huge_array.extend_from_slice(&9u32.to_le_bytes());
    huge_array.extend_from_slice(&4u32.to_le_bytes());
    huge_array.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut bad_utf8 = header(3, 0, 1);
    bad_utf8.extend_from_slice(&2u64.to_le_bytes());
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    let mut dup = small_file();
    dup.tensor("t.f32", &[4], GgmlType::F32, vec![0u8; 16]);
    type Check = fn(&GgufError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Check)> = vec![
        ("empty", vec![], |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("bad magic", b"GGML\x03\0\0\0".to_vec(), |e| {
            matches!(e, GgufError::BadMagic(_))
        }),
        ("version 1", header(1, 0, 0), |e| {
            matches!(e, GgufError::UnsupportedVersion(1))
        }),
        ("header cut", header(3, 0, 0)[..15].to_vec(), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("unknown value type", bad_type, |e| {
            matches!(e, GgufError::BadValueType { ty: 99, .. })
        }),
        ("alignment 3", bad_align, |e| {
            matches!(e, GgufError::BadAlignment(3))
        }),
        ("array longer than the file", huge_array, |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("key not UTF-8", bad_utf8, |e| {
            matches!(e, GgufError::BadUtf8 { .. })
        }),
        ("tensor count lies", header(3, u64::MAX, 0), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("Q6_K tensor", one_tensor(&[256], 14, 0, 210), |e| {
            matches!(
                e,
                GgufError::UnsupportedType {
                    ty: 14,
                    type_name: "Q6_K",
                    ..
                }
            )
        }),
        ("misaligned offset", one_tensor(&[4], 0, 4, 64), |e| {
            matches!(e, GgufError::BadTensor { .. })
        }),
        ("data past the end", one_tensor(&[64], 0, 0, 100), |e| {
            matches!(e, GgufError::Truncated { .. })
        }),
        ("zero dimension", one_tensor(&[0], 0, 0, 0), |e| {
            matches!(e, GgufError::BadTensor { .. })
        }),
        (
            "five dimensions",
            one_tensor(&[1, 1, 1, 1, 1], 0, 0, 4),
            |e| matches!(e, GgufError::BadTensor { .. }),
        ),
        ("row not whole blocks", one_tensor(&[33], 8, 0, 64), |e| {
            matches!(e, GgufError::BadTensor { .. })
        }),
        (
            "dimensions overflow",
            one_tensor(&[1 << 32, 1 << 32], 0, 0, 0),
            |e| matches!(e, GgufError::BadTensor { .. }),
        ),
        ("duplicate tensor", dup.to_bytes(), |e| {
            matches!(e, GgufError::Duplicate { .. })
        }),
    ];
    for (what, bytes, check) in cases {
        match Gguf::parse(&bytes) {
            Ok(_) => panic!("{what}: parsed"),
            Err(e) => assert!(check(&e), "{what}: wrong error {e:?}"),
        }
    }
}

#[test]
fn every_truncation_of_the_tiny_model_is_an_error() {
    let bytes = tiny::gguf_bytes(tiny::SEED);
    assert!(Gguf::parse(&bytes).is_ok());
    // Every prefix of the header region, then a sample of the data region.
    let header_end = Gguf::parse(&bytes).expect("ok").tensors[0].offset;
    let cuts = (0..header_end).chain((header_end..bytes.len()).step_by(997));
    for cut in cuts {
        // The last tensor may end before trailing padding; cutting only padding is fine.
        let last = Gguf::parse(&bytes)
            .expect("ok")
            .tensors
            .iter()
            .map(|t| t.offset + t.size_bytes)
            .max();
        if Some(cut) >= last {
            continue;
        }
        assert!(
            Gguf::parse(&bytes[..cut]).is_err(),
            "prefix of {cut} bytes parsed"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Gguf::parse(&bytes);
        let mut with_magic = b"GGUF\x03\0\0\0".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = Gguf::parse(&with_magic);
    }

    #[test]
    fn mutated_tiny_model_never_panics_the_loader(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        in_header in any::<bool>(),
    ) {
        let mut bytes = tiny::gguf_bytes(tiny::SEED);
        let header_end = Gguf::parse(&bytes).expect("ok").tensors[0].offset;
        for (idx, val) in flips {
            let len = if in_header { header_end } else { bytes.len() };
            let i = idx.index(len);
            bytes[i] = val;
        }
        let _ = LoadedModel::from_gguf_bytes(&bytes, "mutated");
    }
}
