//! The CUDA backend against the CPU reference: each kernel on its own, then whole forward passes
//! and greedy generation on tiny-random (and SmolLM2 when fetched).
//!
//! The tests that need a GPU (or libnvrtc) are `#[ignore]`d, so `cargo test` on a machine without
//! one reports them as ignored instead of as passed; `scripts/gpu-check.sh` runs them with
//! `--include-ignored` and `BROWNOUT_REQUIRE_CUDA=1`, under which a test that finds no usable
//! device fails instead of printing `SKIPPED`, so a GPU run cannot pass by skipping. The one test
//! that always runs checks the CPU side: `--device cuda` is a clear error without a GPU and
//! `--device auto` falls back to the CPU. The NVRTC test needs libnvrtc only (no driver, no device).

use std::sync::Arc;

use brownout_serving::model::cpu::{Matrix, matmul};
use brownout_serving::model::llama::{HyperParams, RopeTable, rmsnorm};
use brownout_serving::model::{
    ChatMessage, Device, LoadedModel, ModelError, ModelRunner, Route, SeqChunk, argmax,
};

fn require_cuda() -> bool {
    std::env::var_os("BROWNOUT_REQUIRE_CUDA").is_some_and(|v| v != "0")
}

fn skip(reason: &str) {
    assert!(
        !require_cuda(),
        "BROWNOUT_REQUIRE_CUDA is set but: {reason}"
    );
    eprintln!("SKIPPED: {reason}");
}

/// The kernel harness, or `None` (after printing why) without a usable CUDA device.
macro_rules! gpu_or_skip {
    () => {
        match ModelRunner::cuda_kernels() {
            Ok(h) => h,
            Err(reason) => {
                skip(&reason);
                return;
            }
        }
    };
}

/// Deterministic pseudo-random numbers in [-1, 1).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next_f32()).collect()
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// `|a − b| ≤ tol · (1 + |b|)` everywhere.
fn assert_close(gpu: &[f32], cpu: &[f32], tol: f32, what: &str) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let mut worst = (0usize, 0f32);
    for (i, (&a, &b)) in gpu.iter().zip(cpu).enumerate() {
        assert!(a.is_finite(), "{what}: GPU value {i} is {a}");
        let d = (a - b).abs() / (1.0 + b.abs());
        if d > worst.1 {
            worst = (i, d);
        }
    }
    assert!(
        worst.1 <= tol,
        "{what}: element {} GPU {} vs CPU {} (relative diff {} > {tol})",
        worst.0,
        gpu[worst.0],
        cpu[worst.0],
        worst.1
    );
    eprintln!("{what}: max relative diff {:.3e}", worst.1);
}

fn tiny_hp() -> HyperParams {
    LoadedModel::load("tiny-random", Device::Cpu)
        .expect("tiny-random loads")
        .hparams()
        .clone()
}

/// The parameter types of PTX entry `name`, space-separated.
fn ptx_params(ptx: &str, name: &str) -> String {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry {name}"));
    let body = &ptx[start..];
    let end = body.find(')').expect("closing parenthesis");
    body[..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".param ."))
        .map(|l| l.split_whitespace().next().unwrap_or("?").to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
#[ignore = "needs libnvrtc: scripts/gpu-check.sh runs it"]
fn nvrtc_compiles_the_kernel_source() {
    match ModelRunner::cuda_compile_ptx() {
        Ok(ptx) => {
            for name in ModelRunner::cuda_kernel_names() {
                assert!(
                    ptx.contains(&format!(".entry {name}(")),
                    "kernel {name} missing from the PTX"
                );
            }
            // The parameter lists the launchers in cuda/kernels.rs push, in order (pointers
            // are u64, i32 → u32, i64 → u64, f32 → f32): a kernel edited without its launcher
            // fails here, without a GPU.
            let want: [(&str, &str); 12] = [
                ("embed_gather", "u64 u64 u64 u32"),
                ("rmsnorm", "u64 u64 u64 u32 f32"),
                ("rmsnorm_gather", "u64 u64 u64 u64 u32 f32"),
                ("matmul_xwt", "u64 u64 u64 u32 u32 u32"),
                ("rope", "u64 u64 u64 u32 u32 u32 u32"),
                ("kv_write", "u64 u64 u64 u64 u64 u32 u32 u32"),
                (
                    "paged_attention",
                    "u64 u64 u64 u64 u64 u64 u64 u64 u32 u32 u32 u32 u32 f32",
                ),
                ("silu_mul", "u64 u64 u64 u32"),
                ("add_inplace", "u64 u64 u64"),
                ("kv_gather_blocks", "u64 u64 u64 u32 u32 u64 u32"),
                ("kv_scatter_blocks", "u64 u64 u64 u32 u32 u64 u32"),
                ("kv_copy_block", "u64 u32 u32 u32 u64 u32"),
            ];
            for (name, params) in want {
                assert_eq!(ptx_params(&ptx, name), params, "parameters of {name}");
            }
            eprintln!(
                "NVRTC compiled {} kernels to {} bytes of PTX",
                ModelRunner::cuda_kernel_names().len(),
                ptx.len()
            );
        }
        Err(e) if e.starts_with("libnvrtc not found") => skip(&e),
        Err(e) => panic!("the kernel source does not compile:\n{e}"),
    }
}

#[test]
fn cuda_device_is_a_clear_error_without_a_gpu_and_auto_falls_back_to_the_cpu() {
    if ModelRunner::cuda_driver_present() {
        // With a driver the CUDA path is exercised by the tests below; here only check that
        // Device::Cuda either works or says why.
        match LoadedModel::load("tiny-random", Device::Cuda) {
            Ok(m) => assert!(m.device_name().starts_with("cuda"), "{}", m.device_name()),
            Err(e) => {
                assert!(matches!(e, ModelError::DeviceUnavailable(_)), "{e}");
                skip(&e.to_string());
            }
        }
        return;
    }
    let err = LoadedModel::load("tiny-random", Device::Cuda).expect_err("no CUDA here");
    assert!(
        matches!(&err, ModelError::DeviceUnavailable(m) if m.contains("libcuda not found")),
        "{err}"
    );
    let auto = Arc::new(LoadedModel::load("tiny-random", Device::Auto).expect("auto loads"));
    assert!(
        auto.device_name().starts_with("cpu"),
        "{}",
        auto.device_name()
    );
    let err = ModelRunner::with_device(auto.clone(), 8, 16, Device::Cuda).expect_err("no CUDA");
    assert!(matches!(err, ModelError::DeviceUnavailable(_)), "{err}");
    assert!(ModelRunner::cuda_kernels().is_err());
    // Auto and Cpu runners run on the CPU, with the CPU's results.
    let mut runner = ModelRunner::with_device(auto.clone(), 8, 16, Device::Auto).expect("auto");
    assert!(!runner.is_cuda());
    assert!(runner.device_name().starts_with("cpu"));
    let prompt = [1u32, 2, 3, 4, 5];
    let table: Vec<u32> = (0..8).collect();
    let chunk = [SeqChunk {
        tokens: &prompt,
        start_pos: 0,
        block_table: &table,
    }];
    let a = runner.forward(Route::Primary, &chunk).expect("forward");
    let mut kv = auto.new_kv(8, 16);
    let b = auto
        .forward(Route::Primary, &chunk, &mut kv)
        .expect("forward");
    assert_eq!(a, b);
    assert!(runner.cpu_kv().is_some());
    eprintln!("SKIPPED (GPU part): libcuda not found; checked the CPU fallback only");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn rmsnorm_kernel_matches_cpu() {
    let g = gpu_or_skip!();
    let mut rng = Rng(11);
    for (n, h) in [(1, 64), (5, 576), (3, 1000)] {
        let x = rng.vec(n * h);
        let w = rng.vec(h);
        let gpu = g.rmsnorm(&x, &w, 1e-5).expect("gpu rmsnorm");
        let mut cpu = vec![0f32; n * h];
        for i in 0..n {
            rmsnorm(
                &x[i * h..(i + 1) * h],
                &w,
                1e-5,
                &mut cpu[i * h..(i + 1) * h],
            );
        }
        assert_close(&gpu, &cpu, 1e-5, &format!("rmsnorm {n}x{h}"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn rope_kernel_matches_cpu_bit_for_bit() {
    let g = gpu_or_skip!();
    let mut hps = vec![tiny_hp()];
    let mut partial = tiny_hp();
    partial.rope_dim = partial.head_dim / 2; // rotate only part of each head
    partial.rope_base = 500.0;
    hps.push(partial);
    let mut rng = Rng(12);
    for hp in &hps {
        let rope = RopeTable::new(hp);
        let qkv_w = hp.q_dim() + 2 * hp.kv_dim();
        let positions: Vec<usize> = (0..9).map(|_| rng.below(rope.max_pos())).collect();
        let qkv = rng.vec(positions.len() * qkv_w);
        let gpu = g.rope(hp, &qkv, &positions).expect("gpu rope");
        let mut cpu = qkv.clone();
        for (i, &p) in positions.iter().enumerate() {
            let row = &mut cpu[i * qkv_w..(i + 1) * qkv_w];
            for hh in 0..hp.num_heads + hp.num_kv_heads {
                rope.apply(&mut row[hh * hp.head_dim..(hh + 1) * hp.head_dim], p);
            }
        }
        assert_eq!(gpu, cpu, "rope (rope_dim {})", hp.rope_dim);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn silu_mul_kernel_matches_cpu() {
    let g = gpu_or_skip!();
    let mut rng = Rng(13);
    let (n, f) = (7, 1536);
    let gu: Vec<f32> = rng.vec(n * 2 * f).iter().map(|v| v * 8.0).collect();
    let gpu = g.silu_mul(&gu, f).expect("gpu silu_mul");
    let mut cpu = vec![0f32; n * f];
    for i in 0..n {
        let (gate, up) = gu[i * 2 * f..(i + 1) * 2 * f].split_at(f);
        for c in 0..f {
            let gv = gate[c];
            cpu[i * f + c] = gv / (1.0 + (-gv).exp()) * up[c];
        }
    }
    assert_close(&gpu, &cpu, 1e-6, "silu_mul");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn embedding_gather_residual_add_and_kv_write_are_exact() {
    let g = gpu_or_skip!();
    let mut rng = Rng(14);
    let (vocab, h) = (300, 64);
    let embed = rng.vec(vocab * h);
    let tokens = [0usize, 299, 17, 17, 42];
    let x = g.embed(&embed, h, &tokens).expect("embed");
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(&x[i * h..(i + 1) * h], &embed[t * h..(t + 1) * h]);
    }
    let o = rng.vec(x.len());
    let sum = g.add(&x, &o).expect("add");
    let want: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    assert_eq!(sum, want);

    let hp = tiny_hp();
    let (qd, kvd) = (hp.q_dim(), hp.kv_dim());
    let qkv_w = qd + 2 * kvd;
    let slots = [3usize, 0, 17, 9];
    let cache_slots = 20;
    let qkv = rng.vec(slots.len() * qkv_w);
    let (k, v) = g
        .kv_write(&hp, &qkv, &slots, cache_slots * kvd)
        .expect("kv_write");
    let mut wk = vec![0f32; cache_slots * kvd];
    let mut wv = vec![0f32; cache_slots * kvd];
    for (i, &s) in slots.iter().enumerate() {
        let row = &qkv[i * qkv_w..(i + 1) * qkv_w];
        wk[s * kvd..(s + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
        wv[s * kvd..(s + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
    }
    assert_eq!(k, wk);
    assert_eq!(v, wv);
}

/// `y = x·wᵀ` on the GPU: `(x, n, w, rows, cols)`.
type GpuMatmul<'a> = dyn Fn(&[f32], usize, &[f32], usize, usize) -> Vec<f32> + 'a;

fn check_matmul(mm: &GpuMatmul<'_>, rows: usize, cols: usize, batches: &[usize]) {
    let mut rng = Rng(15 + rows as u64);
    let w = rng.vec(rows * cols);
    let m = Matrix::f32(rows, cols, w.clone());
    let max_n = *batches.iter().max().expect("batches");
    let x_all = rng.vec(max_n * cols);
    let alone = mm(&x_all[..cols], 1, &w, rows, cols);
    for &n in batches {
        let x = &x_all[..n * cols];
        let gpu = mm(x, n, &w, rows, cols);
        let mut cpu = vec![0f32; n * rows];
        matmul(x, n, &m, &mut cpu);
        // Error bound: relative to Σ|x·w| of each output.
        for t in 0..n {
            for r in 0..rows {
                let mag: f32 = (0..cols)
                    .map(|c| (x[t * cols + c] * w[r * cols + c]).abs())
                    .sum();
                let (a, b) = (gpu[t * rows + r], cpu[t * rows + r]);
                assert!(
                    (a - b).abs() <= 2e-5 * mag + 1e-6,
                    "matmul {rows}x{cols} batch {n}: ({t}, {r}) GPU {a} CPU {b}"
                );
            }
        }
        // Batching never changes a result bit on the GPU either.
        assert_eq!(
            &gpu[..rows],
            &alone[..],
            "matmul {rows}x{cols}: token 0 alone vs in a batch of {n}"
        );
    }
    eprintln!("matmul {rows}x{cols} batches {batches:?}: ok");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn matmul_kernel_matches_cpu_at_batch_1_8_32() {
    let g = gpu_or_skip!();
    let h = |x: &[f32], n: usize, w: &[f32], rows: usize, cols: usize| {
        g.matmul(x, n, w, rows, cols).expect("gpu matmul")
    };
    // SmolLM2's QKV shape, an odd shape (rows and cols not multiples of the tiles), and a
    // wide one.
    check_matmul(&h, 960, 576, &[1, 8, 32]);
    check_matmul(&h, 203, 100, &[1, 8, 32, 33]);
    check_matmul(&h, 64, 1536, &[1, 8, 32]);
}

/// The CPU forward's attention, written out for one token: positions `0..=pos` read through
/// `table` from `[block][slot][kv_head][dim]` caches.
#[allow(clippy::too_many_arguments)]
fn cpu_attention(
    hp: &HyperParams,
    q_all: &[f32],
    pos: usize,
    table: &[u32],
    kc: &[f32],
    vc: &[f32],
    bs: usize,
    out: &mut [f32],
) {
    let (hd, kvd) = (hp.head_dim, hp.kv_dim());
    let group = hp.num_heads / hp.num_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut scores = vec![0f32; pos + 1];
    for head in 0..hp.num_heads {
        let kvh = head / group;
        let q = &q_all[head * hd..(head + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (j, s) in scores.iter_mut().enumerate() {
            let base = (table[j / bs] as usize * bs + j % bs) * kvd + kvh * hd;
            *s = q
                .iter()
                .zip(&kc[base..base + hd])
                .map(|(a, b)| a * b)
                .sum::<f32>()
                * scale;
            max = max.max(*s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[head * hd..(head + 1) * hd];
        oh.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let base = (table[j / bs] as usize * bs + j % bs) * kvd + kvh * hd;
            for (o, &v) in oh.iter_mut().zip(&vc[base..base + hd]) {
                *o += p / sum * v;
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn paged_attention_kernel_matches_cpu_attention() {
    let g = gpu_or_skip!();
    let mut rng = Rng(16);
    let mut wide = tiny_hp();
    wide.num_heads = 9; // SmolLM2's heads: 9 query / 3 KV, head size 64
    wide.num_kv_heads = 3;
    wide.head_dim = 64;
    wide.hidden_size = 576;
    // (model, block size, blocks, positions): short sequences, and ones longer than the kernel's
    // 1024-position pass (online softmax across passes).
    let cases: [(HyperParams, usize, usize, Vec<usize>); 3] = [
        (tiny_hp(), 4, 16, vec![0, 1, 5, 17, 63]),
        (tiny_hp(), 16, 200, vec![1023, 1024, 2500, 3199]),
        (wide, 16, 80, vec![0, 15, 16, 700, 1279]),
    ];
    for (hp, bs, nblocks, positions) in &cases {
        let (qd, kvd) = (hp.q_dim(), hp.kv_dim());
        let qkv_w = qd + 2 * kvd;
        let kc: Vec<f32> = rng.vec(nblocks * bs * kvd);
        let vc: Vec<f32> = rng.vec(nblocks * bs * kvd);
        // Each token gets its own shuffled block table.
        let tables: Vec<Vec<u32>> = positions
            .iter()
            .map(|_| {
                let mut t: Vec<u32> = (0..*nblocks as u32).collect();
                for i in (1..t.len()).rev() {
                    t.swap(i, rng.below(i + 1));
                }
                t
            })
            .collect();
        let qkv: Vec<f32> = rng
            .vec(positions.len() * qkv_w)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let table_refs: Vec<&[u32]> = tables.iter().map(Vec::as_slice).collect();
        let gpu = g
            .paged_attention(hp, &qkv, positions, &table_refs, &kc, &vc, *bs)
            .expect("gpu attention");
        let mut cpu = vec![0f32; positions.len() * qd];
        for (i, &p) in positions.iter().enumerate() {
            cpu_attention(
                hp,
                &qkv[i * qkv_w..i * qkv_w + qd],
                p,
                &tables[i],
                &kc,
                &vc,
                *bs,
                &mut cpu[i * qd..(i + 1) * qd],
            );
        }
        assert_close(
            &gpu,
            &cpu,
            2e-5,
            &format!("paged attention bs {bs}, positions {positions:?}"),
        );
    }
}

/// tiny-random loaded for CUDA and a CUDA runner, or `None` after printing why.
fn cuda_tiny(num_blocks: usize, bs: usize) -> Option<(Arc<LoadedModel>, ModelRunner)> {
    let model = match LoadedModel::load("tiny-random", Device::Cuda) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            skip(&e.to_string());
            return None;
        }
    };
    let runner =
        ModelRunner::with_device(model.clone(), num_blocks, bs, Device::Cuda).expect("CUDA runner");
    assert!(runner.is_cuda());
    Some((model, runner))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn the_start_up_health_check_runs_on_the_gpu_and_matches_the_cpu() {
    let Some((model, mut gpu)) = cuda_tiny(64, 16) else {
        return;
    };
    let on_gpu = gpu.health_check().expect("healthy on the GPU");
    let on_cpu = ModelRunner::cpu(model, 64, 16)
        .health_check()
        .expect("healthy on the CPU");
    for (g, c) in on_gpu.iter().zip(&on_cpu) {
        eprintln!("{:?}: gpu {:?} cpu {:?}", g.route, g.generated, c.generated);
        assert_eq!((g.route, &g.tokens), (c.route, &c.tokens));
    }
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn greedy_generation_on_cuda_matches_the_cpu_tokens() {
    let Some((model, mut gpu)) = cuda_tiny(64, 16) else {
        return;
    };
    eprintln!("device: {}", gpu.device_name());
    let prompt = model.encode_chat(&[ChatMessage::new("user", "Hello world, tell me more")]);
    let max_new = 24;
    let want = model
        .generate_greedy(Route::Primary, &prompt, max_new)
        .expect("cpu greedy");
    // Blocks in reverse order, so the block table matters.
    let table: Vec<u32> = (0..64).rev().collect();
    let mut cpu = ModelRunner::cpu(model.clone(), 64, 16);
    let mut got = Vec::new();
    let mut tokens = prompt.clone();
    let mut start = 0;
    let mut worst = 0f32;
    for _ in 0..max_new {
        let chunk = [SeqChunk {
            tokens: &tokens[start..],
            start_pos: start,
            block_table: &table,
        }];
        let lg = gpu.forward(Route::Primary, &chunk).expect("gpu forward");
        let lc = cpu.forward(Route::Primary, &chunk).expect("cpu forward");
        worst = worst.max(max_abs_diff(&lg[0], &lc[0]));
        let next = argmax(&lg[0]);
        got.push(next);
        start = tokens.len();
        tokens.push(next);
        if model.config().eos_token_ids.contains(&next) {
            break;
        }
    }
    eprintln!("greedy: {} tokens, max |logit diff| {worst:.3e}", got.len());
    assert!(worst < 1e-3, "logits differ by {worst}");
    assert_eq!(got, want, "CUDA greedy tokens vs CPU generate_greedy");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn batched_chunked_and_fallback_steps_on_cuda_match_the_cpu() {
    let Some((model, mut gpu)) = cuda_tiny(100, 4) else {
        return;
    };
    let mut cpu = ModelRunner::cpu(model.clone(), 100, 4);
    let vocab = model.config().vocab_size;
    let mut rng = Rng(17);
    // 8 sequences, 12 blocks each, interleaved block ids (0..96); 96..100 stay free.
    let tables: Vec<Vec<u32>> = (0..8u32)
        .map(|s| (0..12u32).map(|i| i * 8 + s).collect())
        .collect();
    let mut seqs: Vec<Vec<u32>> = (0..8)
        .map(|s| {
            (0..3 + 2 * s)
                .map(|_| rng.below(vocab) as u32)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut done = vec![0usize; 8];
    let step = |route: Route,
                which: &[usize],
                seqs: &mut [Vec<u32>],
                done: &mut [usize],
                gpu: &mut ModelRunner,
                cpu: &mut ModelRunner| {
        let chunks: Vec<SeqChunk<'_>> = which
            .iter()
            .map(|&s| SeqChunk {
                tokens: &seqs[s][done[s]..],
                start_pos: done[s],
                block_table: &tables[s],
            })
            .collect();
        let lg = gpu.forward(route, &chunks).expect("gpu");
        let lc = cpu.forward(route, &chunks).expect("cpu");
        let d = lg
            .iter()
            .zip(&lc)
            .map(|(a, b)| max_abs_diff(a, b))
            .fold(0.0, f32::max);
        assert!(
            d < 1e-3,
            "{route:?} step over {which:?}: logits differ by {d}"
        );
        for (i, &s) in which.iter().enumerate() {
            done[s] = seqs[s].len();
            seqs[s].push(argmax(&lc[i]));
        }
    };
    let all: Vec<usize> = (0..8).collect();
    // Batched prefill of 8 prompts of different lengths, then batched decode.
    step(
        Route::Primary,
        &all,
        &mut seqs,
        &mut done,
        &mut gpu,
        &mut cpu,
    );
    for _ in 0..5 {
        step(
            Route::Primary,
            &all,
            &mut seqs,
            &mut done,
            &mut gpu,
            &mut cpu,
        );
    }
    // Fallback steps (CPU over the mirror) for half the sequences, then primary again for all:
    // blocks move down and up between the two.
    for _ in 0..3 {
        step(
            Route::Fallback,
            &[1, 3, 5, 7],
            &mut seqs,
            &mut done,
            &mut gpu,
            &mut cpu,
        );
    }
    for _ in 0..3 {
        step(
            Route::Primary,
            &all,
            &mut seqs,
            &mut done,
            &mut gpu,
            &mut cpu,
        );
    }
    // A chunked prefill: 5 new tokens at once for sequence 0.
    for _ in 0..5 {
        let t = rng.below(vocab) as u32;
        seqs[0].push(t);
    }
    step(
        Route::Primary,
        &[0],
        &mut seqs,
        &mut done,
        &mut gpu,
        &mut cpu,
    );
    // Copy-on-write: sequence 2's last (partly filled) block copied to a fresh block id that a
    // forked table uses, then both decode.
    let pos2 = done[2];
    let last_block = tables[2][pos2 / 4];
    let fresh = 99u32;
    gpu.copy_block(last_block, fresh).expect("gpu copy_block");
    cpu.copy_block(last_block, fresh).expect("cpu copy_block");
    let mut forked = tables[2].clone();
    forked[pos2 / 4] = fresh;
    let seq = &seqs[2];
    let chunk = [SeqChunk {
        tokens: &seq[pos2..],
        start_pos: pos2,
        block_table: &forked,
    }];
    let lg = gpu.forward(Route::Primary, &chunk).expect("gpu fork");
    let lc = cpu.forward(Route::Primary, &chunk).expect("cpu fork");
    assert!(
        max_abs_diff(&lg[0], &lc[0]) < 1e-3,
        "forked sequence differs"
    );
    // Invalid input is an error and writes nothing, as on the CPU.
    let bad = [SeqChunk {
        tokens: &[vocab as u32],
        start_pos: 0,
        block_table: &tables[0],
    }];
    let e = gpu
        .forward(Route::Primary, &bad)
        .expect_err("token out of range");
    assert!(matches!(e, ModelError::InvalidInput(_)), "{e}");
}

#[test]
#[ignore = "needs a CUDA GPU: scripts/gpu-check.sh runs it"]
fn smollm2_greedy_on_cuda_matches_the_cpu_when_fetched() {
    if ModelRunner::cuda_kernels().is_err() {
        skip("no usable CUDA device (SmolLM2 CUDA check)");
        return;
    }
    let model = match LoadedModel::load("smollm2", Device::Cuda) {
        Ok(m) => Arc::new(m),
        Err(e @ ModelError::NotFetched { .. }) => {
            eprintln!("SKIPPED (SmolLM2 part, not a CUDA problem): {e}");
            return;
        }
        Err(e) => panic!("loading smollm2: {e}"),
    };
    let prompt = model.encode_chat(&[ChatMessage::new("user", "What is the capital of France?")]);
    let want = model
        .generate_greedy(Route::Primary, &prompt, 12)
        .expect("cpu greedy");
    let mut gpu =
        ModelRunner::with_device(model.clone(), 64, 16, Device::Cuda).expect("CUDA runner");
    let table: Vec<u32> = (0..64).collect();
    let mut tokens = prompt.clone();
    let mut start = 0;
    let mut got = Vec::new();
    let t0 = std::time::Instant::now();
    for _ in 0..want.len() {
        let lg = gpu
            .forward(
                Route::Primary,
                &[SeqChunk {
                    tokens: &tokens[start..],
                    start_pos: start,
                    block_table: &table,
                }],
            )
            .expect("gpu forward");
        let next = argmax(&lg[0]);
        got.push(next);
        start = tokens.len();
        tokens.push(next);
    }
    eprintln!(
        "SmolLM2 on {}: {} tokens in {:.1?}: {:?}",
        gpu.device_name(),
        got.len(),
        t0.elapsed(),
        model.tokenizer().decode(&got)
    );
    assert_eq!(got, want);
}
