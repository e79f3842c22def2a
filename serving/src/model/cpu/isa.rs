//! Which vector extensions the kernels use, decided once per process.
//!
//! The CPU's features are detected once ([`Features::get`]) and `BROWNOUT_ISA` is read once
//! ([`cap`]); the f32 kernels' [`Isa`] and the integer kernels' [`QuantPath`] are both derived
//! from those two, so they can never disagree about what the machine has or what was asked for.

use std::sync::OnceLock;

/// The x86 features the kernels care about, detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    pub avx512f: bool,
    pub avx512bw: bool,
    /// AVX2 and FMA (every AVX2 kernel needs both).
    pub avx2_fma: bool,
    /// F16C (`vcvtph2ps`: the repacked kernel's f16 scales).
    pub f16c: bool,
    /// AVX-512 VNNI with VL (`vpdpbusd` on 256-bit registers).
    pub avx512_vnni: bool,
}

impl Features {
    /// This CPU's features (detected on first use).
    pub fn get() -> Features {
        static F: OnceLock<Features> = OnceLock::new();
        *F.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                Features {
                    avx512f: has!("avx512f"),
                    avx512bw: has!("avx512bw"),
                    avx2_fma: has!("avx2") && has!("fma"),
                    f16c: has!("f16c"),
                    avx512_vnni: has!("avx512vnni") && has!("avx512vl"),
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                Features {
                    avx512f: false,
                    avx512bw: false,
                    avx2_fma: false,
                    f16c: false,
                    avx512_vnni: false,
                }
            }
        })
    }
}

/// What `BROWNOUT_ISA` asks for (read once): a cap on the extensions the kernels use, to
/// measure the other paths and test them on a machine that has more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    /// Unset or another value: the best the CPU has.
    None,
    /// `avx2`: no AVX-512 (and so no VNNI).
    Avx2,
    /// `scalar`: no vector kernels.
    Scalar,
}

/// `BROWNOUT_ISA`, read on first use.
pub fn cap() -> Cap {
    static C: OnceLock<Cap> = OnceLock::new();
    *C.get_or_init(|| match std::env::var("BROWNOUT_ISA").as_deref() {
        Ok("scalar") => Cap::Scalar,
        Ok("avx2") => Cap::Avx2,
        _ => Cap::None,
    })
}

/// AVX2 and FMA are present (whatever the cap).
pub(super) fn has_avx2_fma() -> bool {
    Features::get().avx2_fma
}

/// The instruction set the packed kernel runs on ([`Isa::detect`]: once per process).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

impl Isa {
    /// The best this CPU has; `BROWNOUT_ISA=avx2|scalar` caps it (to measure, and to test the
    /// other paths on an AVX-512 machine).
    pub fn detect() -> Isa {
        static I: OnceLock<Isa> = OnceLock::new();
        *I.get_or_init(|| {
            let best = Isa::best();
            match cap() {
                Cap::Scalar => Isa::Scalar,
                Cap::Avx2 if best != Isa::Scalar => Isa::Avx2,
                _ => best,
            }
        })
    }

    /// Every instruction set this CPU can run the kernel on, best first.
    pub fn available() -> Vec<Isa> {
        match Isa::best() {
            Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2, Isa::Scalar],
            Isa::Avx2 => vec![Isa::Avx2, Isa::Scalar],
            Isa::Scalar => vec![Isa::Scalar],
        }
    }

    fn best() -> Isa {
        let f = Features::get();
        if f.avx512f {
            Isa::Avx512
        } else if f.avx2_fma {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }
}

/// How the quantised (integer) kernels run. All paths give the same bits.
///
/// Repacked weights (the default, `cpu/repacked.rs`): `TilesVnni` 16 rows × up to 8 tokens
/// with AVX-512 VNNI `vpdpbusd` (needs AVX-512 F, BW, VNNI); `Tiles` 16 rows × up to 6 tokens (Q8_0: 4)
/// with AVX2 `maddubs`+`madd` (AVX2, FMA, F16C); `RowWise` the scalar loop.
/// Prepared GGUF blocks (`BROWNOUT_QUANT=tiles`, `cpu/quant.rs`): `TilesVnni` / `Tiles` 4 × 4
/// tiles with `vpdpbusd` (256-bit) or `maddubs`; `RowWise` row by row (AVX2 `dot_row`, or
/// scalar without AVX2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QuantPath {
    RowWise,
    Tiles,
    TilesVnni,
}

impl QuantPath {
    /// The fastest this CPU has; `BROWNOUT_ISA=avx2` leaves out VNNI, `scalar` the tiles.
    pub fn detect() -> QuantPath {
        static Q: OnceLock<QuantPath> = OnceLock::new();
        *Q.get_or_init(|| {
            let best = QuantPath::available()[0];
            match cap() {
                Cap::Scalar => QuantPath::RowWise,
                Cap::Avx2 if best == QuantPath::TilesVnni => QuantPath::Tiles,
                _ => best,
            }
        })
    }

    /// Every path this CPU can run, fastest first.
    pub fn available() -> Vec<QuantPath> {
        let f = Features::get();
        let vnni = f.avx512_vnni && f.avx512f && f.avx512bw;
        match (f.avx2_fma && f.f16c, vnni) {
            (true, true) => vec![QuantPath::TilesVnni, QuantPath::Tiles, QuantPath::RowWise],
            (true, false) => vec![QuantPath::Tiles, QuantPath::RowWise],
            _ => vec![QuantPath::RowWise],
        }
    }
}
