//! Forward-pass correctness: the paged, batched forward against a plain reference written here
//! (no paging, no batching, weights read straight from the GGUF), on the tiny random model and —
//! when the file has been fetched — on SmolLM2-135M.

use brownout_serving::model::gguf::Gguf;
use brownout_serving::model::{
    Device, KvTensors, LoadedModel, ModelError, ModelRunner, Route, SeqChunk, quant, tiny,
};

/// A deliberately plain Llama: one token at a time, contiguous K/V, naive loops.
struct Reference {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ffn: usize,
    eps: f32,
    rope_base: f32,
    embed: Vec<f32>,
    layers: Vec<RefLayer>,
    out_norm: Vec<f32>,
    vocab: usize,
}

struct RefLayer {
    attn_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

fn read(g: &Gguf<'_>, name: &str) -> Vec<f32> {
    let t = g.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
    let mut v = vec![0f32; t.num_elems()];
    quant::dequantize(t.ty, g.tensor_data(t), &mut v);
    v
}

impl Reference {
    fn new(bytes: &[u8]) -> Reference {
        let g = Gguf::parse(bytes).expect("parse");
        let u = |k: &str| g.get(k).and_then(|v| v.as_u64()).expect(k) as usize;
        let f = |k: &str| g.get(k).and_then(|v| v.as_f64()).expect(k) as f32;
        let hidden = u("llama.embedding_length");
        let heads = u("llama.attention.head_count");
        let layers = (0..u("llama.block_count"))
            .map(|i| {
                let r = |s: &str| read(&g, &format!("blk.{i}.{s}.weight"));
                RefLayer {
                    attn_norm: r("attn_norm"),
                    q: r("attn_q"),
                    k: r("attn_k"),
                    v: r("attn_v"),
                    o: r("attn_output"),
                    ffn_norm: r("ffn_norm"),
                    gate: r("ffn_gate"),
                    up: r("ffn_up"),
                    down: r("ffn_down"),
                }
            })
            .collect();
        let embed = read(&g, "token_embd.weight");
        Reference {
            hidden,
            heads,
            kv_heads: u("llama.attention.head_count_kv"),
            head_dim: hidden / heads,
            ffn: u("llama.feed_forward_length"),
            eps: f("llama.attention.layer_norm_rms_epsilon"),
            rope_base: f("llama.rope.freq_base"),
            vocab: embed.len() / hidden,
            embed,
            layers,
            out_norm: read(&g, "output_norm.weight"),
        }
    }

    /// `w` is `[out][in]`.
    fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        x.iter().zip(w).map(|(v, g)| v * r * g).collect()
    }

    fn rope(&self, v: &mut [f32], pos: usize) {
        for head in v.chunks_exact_mut(self.head_dim) {
            for i in 0..self.head_dim / 2 {
                let theta = pos as f32
                    * self
                        .rope_base
                        .powf(-(2.0 * i as f32) / self.head_dim as f32);
                let (s, c) = theta.sin_cos();
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c - b * s;
                head[2 * i + 1] = a * s + b * c;
            }
        }
    }

    /// Logits after each token of `tokens`, fed one at a time.
    fn run(&self, tokens: &[u32]) -> Vec<Vec<f32>> {
        let mut st = RefState::default();
        tokens.iter().map(|&t| self.step(&mut st, t)).collect()
    }

    /// Feeds one token; returns the logits after it.
    fn step(&self, st: &mut RefState, token: u32) -> Vec<f32> {
        let hd = self.head_dim;
        if st.k.is_empty() {
            st.k = vec![Vec::new(); self.layers.len()];
            st.v = vec![Vec::new(); self.layers.len()];
        }
        let pos = st.pos;
        st.pos += 1;
        let t = token as usize;
        let mut x = self.embed[t * self.hidden..(t + 1) * self.hidden].to_vec();
        for (l, w) in self.layers.iter().enumerate() {
            let h = Self::norm(&x, &w.attn_norm, self.eps);
            let mut q = Self::matvec(&w.q, &h);
            let mut k = Self::matvec(&w.k, &h);
            let v = Self::matvec(&w.v, &h);
            self.rope(&mut q, pos);
            self.rope(&mut k, pos);
            st.k[l].push(k);
            st.v[l].push(v);
            let mut att = vec![0f32; self.heads * hd];
            for head in 0..self.heads {
                let kvh = head * self.kv_heads / self.heads;
                let qh = &q[head * hd..(head + 1) * hd];
                let scores: Vec<f32> = st.k[l]
                    .iter()
                    .map(|k| {
                        qh.iter()
                            .zip(&k[kvh * hd..(kvh + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (p, v) in e.iter().zip(&st.v[l]) {
                    for d in 0..hd {
                        att[head * hd + d] += p / z * v[kvh * hd + d];
                    }
                }
            }
            let o = Self::matvec(&w.o, &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let h = Self::norm(&x, &w.ffn_norm, self.eps);
            let g = Self::matvec(&w.gate, &h);
            let u = Self::matvec(&w.up, &h);
            let a: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            assert_eq!(a.len(), self.ffn);
            let d = Self::matvec(&w.down, &a);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        let h = Self::norm(&x, &self.out_norm, self.eps);
        let logits = Self::matvec(&self.embed, &h);
        assert_eq!(logits.len(), self.vocab);
        logits
    }

    fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut st = RefState::default();
        let mut logits = Vec::new();
        for &t in prompt {
            logits = self.step(&mut st, t);
        }
        let mut out = Vec::new();
        for _ in 0..n {
            let next = argmax(&logits);
            out.push(next);
            logits = self.step(&mut st, next);
        }
        out
    }
}

#[derive(Default)]
struct RefState {
    k: Vec<Vec<Vec<f32>>>,
    v: Vec<Vec<Vec<f32>>>,
    pos: usize,
}

fn argmax(v: &[f32]) -> u32 {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b as u32
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn tiny() -> LoadedModel {
    LoadedModel::load("tiny-random", Device::Cpu).expect("tiny-random loads")
}

fn smollm2() -> Option<LoadedModel> {
    match LoadedModel::load("smollm2", Device::Cpu) {
        Ok(m) => Some(m),
        Err(e @ ModelError::NotFetched { .. }) => {
            eprintln!("SKIPPED (SmolLM2 part): {e}");
            None
        }
        Err(e) => panic!("loading smollm2: {e}"),
    }
}

#[test]
fn tiny_random_health_check_passes_on_both_routes() {
    let m = tiny();
    let h = m.health_check().expect("healthy");
    assert_eq!(h.len(), 2);
    assert_eq!(m.routes_resident(), vec![Route::Primary, Route::Fallback]);
    for r in &h {
        assert!(!r.tokens.is_empty(), "{:?} generated nothing", r.route);
    }
    assert_eq!(m.config().num_kv_heads, tiny::KV_HEADS);
}

#[test]
fn the_runner_health_check_runs_both_routes_through_its_own_kv_memory() {
    // What `brownout-serve` runs at start on the device that will serve: the same tokens as
    // the model's own check when the chat-templated prompt fits, "Hello" alone when the pool
    // is smaller than the template, and an error naming the route when not even that fits.
    let m = std::sync::Arc::new(tiny());
    let own = m.health_check().expect("healthy");
    let mut runner = ModelRunner::cpu(m.clone(), 64, 16);
    let via_runner = runner.health_check().expect("healthy through the runner");
    assert_eq!(via_runner.len(), 2);
    for (a, b) in own.iter().zip(&via_runner) {
        assert_eq!((a.route, &a.tokens), (b.route, &b.tokens));
    }
    let templated = m.encode_chat(&[brownout_serving::model::ChatMessage::new("user", "Hello")]);
    let plain = m.tokenizer().encode("Hello");
    assert!(templated.len() > 16 && plain.len() + 4 <= 8);
    let mut small = ModelRunner::cpu(m.clone(), 2, 4);
    let h = small.health_check().expect("plain Hello fits 8 positions");
    assert_eq!(h.len(), 2);
    let mut tiny_pool = ModelRunner::cpu(m, 1, 2);
    match tiny_pool.health_check() {
        Err(ModelError::Unhealthy { route, reason }) => {
            assert_eq!(route, "primary");
            assert!(reason.contains("KV blocks"), "{reason}");
        }
        other => panic!("expected Unhealthy, got {other:?}"),
    }
}

#[test]
fn a_model_that_gives_non_finite_logits_fails_its_health_check() {
    // The tiny model with one NaN in the final norm's weights: every logit is NaN, so both the
    // model's own check and the runner's (what brownout-serve runs at start) must refuse it,
    // naming the route and the logit, and the server would never report ready.
    let mut bytes = tiny::gguf_bytes(tiny::SEED);
    let at = {
        let g = Gguf::parse(&bytes).expect("parses");
        g.tensor("output_norm.weight")
            .expect("has the final norm")
            .offset
    };
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nan.gguf");
    std::fs::write(&path, &bytes).expect("writes");
    let m = LoadedModel::load(path.to_str().unwrap(), Device::Cpu).expect("loads");
    let check = |r: Result<_, ModelError>| match r {
        Err(ModelError::Unhealthy { route, reason }) => {
            assert_eq!(route, "primary");
            assert!(
                reason.starts_with("logit ") && reason.ends_with("is NaN"),
                "{reason}"
            );
        }
        other => panic!("expected Unhealthy, got {other:?}"),
    };
    check(m.health_check());
    let mut runner = ModelRunner::cpu(std::sync::Arc::new(m), 64, 16);
    check(runner.health_check());
}

#[test]
fn primary_logits_match_reference_on_tiny_random() {
    let m = tiny();
    let r = Reference::new(&tiny::gguf_bytes(tiny::SEED));
    let prompt = m.tokenizer().encode("Hello world, the help is here");
    let want = r.run(&prompt);
    let mut kv = m.new_kv(8, 4);
    // Scattered physical blocks: exercises the block table.
    let table = [5u32, 2, 7, 0, 3, 6, 1, 4];
    let got = m
        .forward(
            Route::Primary,
            &[SeqChunk {
                tokens: &prompt,
                start_pos: 0,
                block_table: &table,
            }],
            &mut kv,
        )
        .expect("forward");
    let d = max_abs_diff(&got[0], want.last().expect("logits"));
    assert!(d < 1e-3, "max |Δlogit| = {d}");
}

#[test]
fn greedy_decode_matches_reference_token_for_token_on_tiny_random() {
    let m = tiny();
    let r = Reference::new(&tiny::gguf_bytes(tiny::SEED));
    for text in [
        "Hello",
        "the world is",
        "<|im_start|>user\nhelp<|im_end|>\n",
    ] {
        let prompt = m.tokenizer().encode(text);
        let want = r.greedy(&prompt, 12);
        let mut got = m
            .generate_greedy(Route::Primary, &prompt, 12)
            .expect("generate");
        // generate_greedy stops after EOS; the reference does not.
        assert_eq!(got[..], want[..got.len()], "prompt {text:?}");
        got.truncate(0);
    }
}

#[test]
fn greedy_decode_matches_reference_on_smollm2_when_fetched() {
    let Some(m) = smollm2() else { return };
    let path = brownout_serving::model::model_dir().join(brownout_serving::model::MODEL_FILE);
    let bytes = std::fs::read(path).expect("read model");
    let r = Reference::new(&bytes);
    let prompt = m.tokenizer().encode("The capital of France is");
    let want = r.greedy(&prompt, 8);
    let got = m
        .generate_greedy(Route::Primary, &prompt, 8)
        .expect("generate");
    assert_eq!(got[..], want[..got.len()]);
    eprintln!("smollm2 greedy: {:?}", m.tokenizer().decode(&got));
}

/// Decodes `prompts` together (one chunk each per step, blocks interleaved between sequences).
fn decode_batched(
    m: &LoadedModel,
    route: Route,
    prompts: &[Vec<u32>],
    steps: usize,
) -> Vec<Vec<u32>> {
    let bs = 4;
    let per = 16;
    let n = prompts.len();
    let mut kv = m.new_kv(per * n, bs);
    // Sequence s owns blocks s, s+n, s+2n, ... (interleaved, never contiguous).
    let tables: Vec<Vec<u32>> = (0..n)
        .map(|s| (0..per).map(|j| (s + j * n) as u32).collect())
        .collect();
    let mut outs = vec![Vec::new(); n];
    let mut logits = m
        .forward(
            route,
            &prompts
                .iter()
                .zip(&tables)
                .map(|(p, t)| SeqChunk {
                    tokens: p,
                    start_pos: 0,
                    block_table: t,
                })
                .collect::<Vec<_>>(),
            &mut kv,
        )
        .expect("prefill");
    for step in 0..steps {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        for (o, &t) in outs.iter_mut().zip(&next) {
            o.push(t);
        }
        if step + 1 == steps {
            break;
        }
        let chunks: Vec<SeqChunk<'_>> = (0..n)
            .map(|s| SeqChunk {
                tokens: std::slice::from_ref(&next[s]),
                start_pos: prompts[s].len() + step,
                block_table: &tables[s],
            })
            .collect();
        logits = m.forward(route, &chunks, &mut kv).expect("decode");
    }
    outs
}

fn eight_prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    [
        "Hello",
        "the world is big",
        "help",
        "1234 + 5678 =",
        "fn main() { println!(\"hi\"); }",
        "你好，世界",
        "is it here?",
        "   spaces   and\n\nnewlines",
    ]
    .iter()
    .map(|t| m.tokenizer().encode(t))
    .collect()
}

#[test]
fn batched_decode_of_8_prompts_equals_each_alone() {
    let m = tiny();
    let prompts = eight_prompts(&m);
    for route in [Route::Primary, Route::Fallback] {
        let together = decode_batched(&m, route, &prompts, 10);
        for (i, p) in prompts.iter().enumerate() {
            let alone = decode_batched(&m, route, std::slice::from_ref(p), 10);
            assert_eq!(together[i], alone[0], "{route:?} prompt {i}");
        }
    }
}

#[test]
fn batched_decode_equals_alone_on_smollm2_when_fetched() {
    let Some(m) = smollm2() else { return };
    let prompts = eight_prompts(&m);
    let together = decode_batched(&m, Route::Primary, &prompts, 4);
    for i in [0, 5] {
        let alone = decode_batched(&m, Route::Primary, std::slice::from_ref(&prompts[i]), 4);
        assert_eq!(together[i], alone[0], "prompt {i}");
    }
}

#[test]
fn chunked_prefill_gives_the_same_logits_as_one_chunk() {
    let m = tiny();
    let prompt = m
        .tokenizer()
        .encode("Hello world, the help is here and there");
    let table: Vec<u32> = (0..8).rev().collect();
    let mut kv1 = m.new_kv(8, 4);
    let whole = m
        .forward(
            Route::Primary,
            &[SeqChunk {
                tokens: &prompt,
                start_pos: 0,
                block_table: &table,
            }],
            &mut kv1,
        )
        .expect("whole");
    let mut kv2 = m.new_kv(8, 4);
    let mut last = Vec::new();
    for (i, piece) in prompt.chunks(5).enumerate() {
        last = m
            .forward(
                Route::Primary,
                &[SeqChunk {
                    tokens: piece,
                    start_pos: i * 5,
                    block_table: &table,
                }],
                &mut kv2,
            )
            .expect("chunk");
    }
    // With BROWNOUT_MATMUL=gemm the f32 matmul picks its blocking by problem size, so a 5-token
    // chunk and the whole prompt may round differently in the last bits: same next token,
    // logits within 1e-5 of the largest. The default (packed) and tiled kernels: bit-identical.
    assert_eq!(argmax(&whole[0]), argmax(&last[0]));
    let scale = whole[0].iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = whole[0]
        .iter()
        .zip(&last[0])
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-5 * scale, "max |diff| {worst} vs scale {scale}");
    if brownout_serving::model::cpu::Kernel::from_env()
        != brownout_serving::model::cpu::Kernel::Gemm
    {
        assert_eq!(whole[0], last[0]);
    }
}

#[test]
fn fallback_route_stays_close_to_primary_on_tiny_random() {
    let m = tiny();
    let prompt = m.tokenizer().encode("Hello world");
    let mut kv = m.new_kv(4, 16);
    let table = [0u32, 1, 2, 3];
    let c = [SeqChunk {
        tokens: &prompt,
        start_pos: 0,
        block_table: &table,
    }];
    let p = m.forward(Route::Primary, &c, &mut kv).expect("primary");
    let f = m.forward(Route::Fallback, &c, &mut kv).expect("fallback");
    let d = max_abs_diff(&p[0], &f[0]);
    let range = p[0].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
        - p[0].iter().fold(f32::INFINITY, |a, &b| a.min(b));
    // The fallback quantises activations to 8 bits: a few percent of the logit range at most.
    assert!(
        d < 0.05 * range,
        "max |Δlogit| primary vs fallback = {d} (range {range})"
    );
    assert_ne!(
        d, 0.0,
        "the fallback route should really compute differently"
    );
}

#[test]
fn invalid_chunks_are_errors_not_panics() {
    let m = tiny();
    let mut kv = m.new_kv(4, 4);
    let ok_table = [0u32, 1];
    let big = [0u32; 9];
    let cases: Vec<(&str, SeqChunk<'_>)> = vec![
        (
            "empty",
            SeqChunk {
                tokens: &[],
                start_pos: 0,
                block_table: &ok_table,
            },
        ),
        (
            "token id out of range",
            SeqChunk {
                tokens: &[1_000_000],
                start_pos: 0,
                block_table: &ok_table,
            },
        ),
        (
            "block table too short",
            SeqChunk {
                tokens: &big,
                start_pos: 0,
                block_table: &ok_table,
            },
        ),
        (
            "block id out of range",
            SeqChunk {
                tokens: &[5],
                start_pos: 0,
                block_table: &[99],
            },
        ),
        (
            "past the model length",
            SeqChunk {
                tokens: &[5],
                start_pos: tiny::CONTEXT,
                block_table: &ok_table,
            },
        ),
    ];
    for (what, c) in cases {
        match m.forward(Route::Primary, &[c], &mut kv) {
            Err(ModelError::InvalidInput(msg)) => assert!(msg.contains("chunk 0"), "{what}: {msg}"),
            other => panic!("{what}: expected InvalidInput, got {other:?}"),
        }
    }
    let wrong = KvTensors::new(1, 4, 4, 1, 8);
    let mut wrong = wrong;
    assert!(matches!(
        m.forward(
            Route::Primary,
            &[SeqChunk {
                tokens: &[5],
                start_pos: 0,
                block_table: &ok_table
            }],
            &mut wrong
        ),
        Err(ModelError::InvalidInput(_))
    ));
}

#[test]
fn missing_model_files_say_what_is_wrong_and_how_to_fetch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let err = LoadedModel::load(p.to_str().expect("utf8"), Device::Cpu).expect_err("missing");
    assert!(err.to_string().contains("no such file"), "{err}");
    let e = ModelError::NotFetched {
        path: p.clone(),
        dir: dir.path().to_path_buf(),
    };
    let msg = e.to_string();
    assert!(msg.contains("scripts/fetch-model.sh") && msg.contains("brownout-serve fetch-model"));
}

/// Perplexity of `text` on a route, feeding it one token at a time through the paged cache.
fn perplexity(m: &LoadedModel, route: Route, ids: &[u32]) -> f64 {
    let bs = 16;
    let mut kv = m.new_kv(ids.len().div_ceil(bs), bs);
    let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
    let mut nll = 0f64;
    for (pos, w) in ids.windows(2).enumerate() {
        let logits = m
            .forward(
                route,
                &[SeqChunk {
                    tokens: &w[..1],
                    start_pos: pos,
                    block_table: &table,
                }],
                &mut kv,
            )
            .expect("forward");
        let l = &logits[0];
        let max = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let lse = l
            .iter()
            .map(|&v| f64::from(v - max).exp())
            .sum::<f64>()
            .ln()
            + f64::from(max);
        nll += lse - f64::from(l[w[1] as usize]);
    }
    (nll / (ids.len() - 1) as f64).exp()
}

/// The fallback route (Q4_1 weights, 8-bit activations) may lose a little: its perplexity on a
/// fixed English text must stay within 2% of the primary route's (f32 dequantised weights) —
/// the quality gate for quantised kernels.
#[test]
fn fallback_perplexity_within_2_percent_of_primary_on_smollm2_when_fetched() {
    let Some(m) = smollm2() else { return };
    let text = "The city council met on Tuesday evening to discuss the new budget. After a long \
                debate, the members agreed to spend more money on public transport and on repairing \
                the old bridge near the river. The mayor said the decision would help families";
    let ids = m.tokenizer().encode(text);
    let p = perplexity(&m, Route::Primary, &ids);
    let f = perplexity(&m, Route::Fallback, &ids);
    eprintln!(
        "perplexity over {} tokens: primary {p:.3}, fallback {f:.3}",
        ids.len()
    );
    assert!(
        p < 60.0,
        "primary perplexity {p} is implausibly high for English text"
    );
    assert!(
        f <= p * 1.02 && f >= p * 0.98,
        "fallback {f} vs primary {p}"
    );
}
