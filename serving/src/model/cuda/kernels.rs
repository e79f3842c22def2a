//! The CUDA kernels (`kernels.cu`, with the constants they share with Rust generated here as a
//! `#define` prelude), compiled with NVRTC when the backend starts, and the
//! launch helpers that pair each kernel with its argument list and launch configuration.
//!
//! Conventions: activations are row-major `[token][feature]` f32; a weight matrix is row-major
//! `[rows][cols]` f32 and a matmul computes `y[n][rows] = x[n][cols] · Wᵀ` (the CPU's contract).
//! The K/V memory of a runner is ONE buffer of `2 · layers` planes of
//! `num_blocks · block_size · num_kv_heads · head_dim` floats (plane `l` = K of layer `l`, plane
//! `layers + l` = V of layer `l`), each plane in vLLM's `[block][slot][kv_head][dim]` layout.
//! Every index that can exceed 2³¹ is computed in `long long`. All block sizes are multiples of
//! 32 (the warp reductions use full-warp shuffles).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DriverError,
    LaunchArgs, LaunchConfig, PushKernelArg,
};

/// Largest head size the attention kernel holds in shared memory (`MAX_HD` in the source).
pub const MAX_HEAD_DIM: usize = 256;

/// Threads per block of the row-wise kernels (`ROW_THREADS` in the source).
const ROW_THREADS: u32 = 256;
/// Matmul tile: tokens × weight rows per block, threads per block.
const MM_BT: u32 = 32;
const MM_BR: u32 = 64;
const MM_THREADS: u32 = 256;
/// Threads per (token, head) of the attention kernel.
const ATT_THREADS: u32 = 128;

/// The constants the launchers share with the kernels, by their name in the CUDA source. They
/// are defined only here: [`prelude`] turns them into `#define`s put before `kernels.cu`, which
/// must not define them itself (tested).
pub const SHARED_CONSTANTS: [(&str, u64); 6] = [
    ("ROW_THREADS", ROW_THREADS as u64),
    ("MM_BT", MM_BT as u64),
    ("MM_BR", MM_BR as u64),
    ("MM_THREADS", MM_THREADS as u64),
    ("ATT_THREADS", ATT_THREADS as u64),
    ("MAX_HD", MAX_HEAD_DIM as u64),
];

/// The kernels' CUDA C, without the shared constants (see [`source`]).
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// `#define NAME value` for each of [`SHARED_CONSTANTS`].
pub fn prelude() -> String {
    let mut s = String::from("// Generated from serving/src/model/cuda/kernels.rs.\n");
    for (name, v) in SHARED_CONSTANTS {
        s.push_str(&format!("#define {name} {v}\n"));
    }
    s
}

/// What NVRTC compiles: [`prelude`] then `kernels.cu`.
pub fn source() -> String {
    format!("{}\n{KERNELS_CU}", prelude())
}

/// Grid-stride kernels: at most this many blocks (plenty for any GPU).
const MAX_STRIDE_BLOCKS: usize = 65_535;

/// Names of every kernel in [`source`] (the NVRTC test checks each is in the PTX).
pub const KERNEL_NAMES: [&str; 12] = [
    "embed_gather",
    "rmsnorm",
    "rmsnorm_gather",
    "matmul_xwt",
    "rope",
    "kv_write",
    "paged_attention",
    "silu_mul",
    "add_inplace",
    "kv_gather_blocks",
    "kv_scatter_blocks",
    "kv_copy_block",
];

/// Compiles [`source`] to PTX with NVRTC.
///
/// # Errors
/// libnvrtc missing, or the compiler's log.
pub fn compile() -> Result<cudarc::nvrtc::Ptx, String> {
    // SAFETY: only tries to dlopen libnvrtc.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        return Err("libnvrtc not found (needs libnvrtc.so.13 on the library path)".to_string());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        name: Some("brownout_kernels.cu".to_string()),
        ..Default::default()
    };
    match std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(source(), opts)) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. })) => Err(format!(
            "NVRTC failed ({nvrtc:?}): {}",
            log.to_string_lossy()
        )),
        Ok(Err(e)) => Err(format!("NVRTC failed: {e}")),
        Err(_) => Err("NVRTC panicked (a symbol missing from libnvrtc?)".to_string()),
    }
}

/// The compiled kernels on device 0, and the stream every launch goes to.
pub struct Kernels {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// E.g. `cuda:0 (NVIDIA H200, sm_90)`.
    pub name: String,
    _module: Arc<CudaModule>,
    embed_gather: CudaFunction,
    rmsnorm: CudaFunction,
    rmsnorm_gather: CudaFunction,
    matmul_xwt: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    paged_attention: CudaFunction,
    silu_mul: CudaFunction,
    add_inplace: CudaFunction,
    kv_gather_blocks: CudaFunction,
    kv_scatter_blocks: CudaFunction,
    kv_copy_block: CudaFunction,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn drv(what: &str) -> impl Fn(DriverError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Launches `b` with `cfg`; a driver error is reported under the kernel's `name`.
///
/// # Safety
/// As [`LaunchArgs::launch`]: `b`'s argument list matches the kernel and every buffer it
/// touches is large enough (each caller states why).
unsafe fn launch(b: &mut LaunchArgs<'_>, cfg: LaunchConfig, name: &str) -> Result<(), String> {
    // SAFETY: the caller's contract.
    unsafe { b.launch(cfg) }.map(drop).map_err(drv(name))
}

/// Grid-stride launch over `total` elements.
fn stride_cfg(total: usize) -> LaunchConfig {
    let blocks = total
        .div_ceil(ROW_THREADS as usize)
        .clamp(1, MAX_STRIDE_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rows_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `i32` for a kernel argument.
///
/// # Errors
/// A value that does not fit.
pub fn int(v: usize, what: &str) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what} = {v} does not fit a 32-bit kernel argument"))
}

impl Kernels {
    /// Creates the context on device 0, compiles and loads every kernel. The caller has checked
    /// that libcuda is present (`CudaContext::new` panics otherwise).
    ///
    /// # Errors
    /// A driver, NVRTC or module error, as text.
    pub fn load() -> Result<Kernels, String> {
        let ptx = compile()?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
            .map_err(|_| "creating a CUDA context panicked".to_string())?
            .map_err(|e| format!("no usable CUDA device: {e}"))?;
        let dev = ctx.name().map_err(drv("querying the CUDA device"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("querying the compute capability"))?;
        let module = ctx
            .load_module(ptx)
            .map_err(drv("loading the PTX module"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| format!("kernel {name}: {e}"))
        };
        let stream = ctx.default_stream();
        Ok(Kernels {
            name: format!("cuda:0 ({dev}, sm_{major}{minor})"),
            embed_gather: f("embed_gather")?,
            rmsnorm: f("rmsnorm")?,
            rmsnorm_gather: f("rmsnorm_gather")?,
            matmul_xwt: f("matmul_xwt")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            paged_attention: f("paged_attention")?,
            silu_mul: f("silu_mul")?,
            add_inplace: f("add_inplace")?,
            kv_gather_blocks: f("kv_gather_blocks")?,
            kv_scatter_blocks: f("kv_scatter_blocks")?,
            kv_copy_block: f("kv_copy_block")?,
            _module: module,
            stream,
            ctx,
        })
    }

    /// `x[i] = embed[tokens[i]]` for `n` tokens of width `h`.
    pub fn embed_gather(
        &self,
        embed: &CudaSlice<f32>,
        tokens: &CudaView<'_, i32>,
        x: &mut CudaSlice<f32>,
        n: usize,
        h: usize,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.embed_gather);
        b.arg(embed).arg(tokens).arg(x).arg(&h);
        // SAFETY: argument list matches the kernel; x holds n·h, tokens n ids < embed rows.
        unsafe { launch(&mut b, rows_cfg(n), "embed_gather") }
    }

    /// `out[i] = rmsnorm(x[i]) · w` for `n` rows of width `h`.
    pub fn rmsnorm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.rmsnorm);
        b.arg(x).arg(w).arg(out).arg(&h).arg(&eps);
        // SAFETY: argument list matches the kernel; x and out hold n·h floats, w h.
        unsafe { launch(&mut b, rows_cfg(n), "rmsnorm") }
    }

    /// `out[i] = rmsnorm(x[rows[i]]) · w` for the `n_out` rows listed.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_gather(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: &CudaView<'_, i32>,
        n_out: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), String> {
        if n_out == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.rmsnorm_gather);
        b.arg(x).arg(w).arg(out).arg(rows).arg(&h).arg(&eps);
        // SAFETY: argument list matches the kernel; rows index rows of x; out holds n_out·h.
        unsafe { launch(&mut b, rows_cfg(n_out), "rmsnorm_gather") }
    }

    /// `y[n][rows] = x[n][cols] · wᵀ`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(), String> {
        if n == 0 || rows == 0 {
            return Ok(());
        }
        let grid_y = n.div_ceil(MM_BT as usize);
        if grid_y > 65_535 {
            return Err(format!("matmul over {n} tokens exceeds the grid"));
        }
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(MM_BR as usize) as u32, grid_y as u32, 1),
            block_dim: (MM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ni, ri, ci) = (int(n, "tokens")?, int(rows, "rows")?, int(cols, "cols")?);
        let mut b = self.stream.launch_builder(&self.matmul_xwt);
        b.arg(x).arg(w).arg(y).arg(&ni).arg(&ri).arg(&ci);
        // SAFETY: argument list matches the kernel; x holds n·cols, w rows·cols, y n·rows.
        unsafe { launch(&mut b, cfg, "matmul_xwt") }
    }

    /// RoPE on the first `heads` heads of each of the `n` qkv rows (row width `qkv_w`),
    /// `table` = `[pos][half][cos, sin]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        qkv: &mut CudaSlice<f32>,
        table: &CudaSlice<f32>,
        pos: &CudaView<'_, i32>,
        n: usize,
        qkv_w: usize,
        heads: usize,
        head_dim: usize,
        half: usize,
    ) -> Result<(), String> {
        if n == 0 || half == 0 {
            return Ok(());
        }
        let (w, hh, hd, hf) = (
            int(qkv_w, "qkv width")?,
            int(heads, "heads")?,
            int(head_dim, "head size")?,
            int(half, "rope pairs")?,
        );
        let mut b = self.stream.launch_builder(&self.rope);
        b.arg(qkv)
            .arg(table)
            .arg(pos)
            .arg(&w)
            .arg(&hh)
            .arg(&hd)
            .arg(&hf);
        // SAFETY: argument list matches the kernel; positions < table rows (validated).
        unsafe { launch(&mut b, rows_cfg(n), "rope") }
    }

    /// K/V of `n` tokens into their slots of the K plane at `k_off` and V plane at `v_off`.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write(
        &self,
        qkv: &CudaSlice<f32>,
        kv: &mut CudaSlice<f32>,
        slots: &CudaView<'_, i32>,
        k_off: usize,
        v_off: usize,
        n: usize,
        qkv_w: usize,
        q_dim: usize,
        kv_dim: usize,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let (ko, vo) = (k_off as i64, v_off as i64);
        let (w, qd, kd) = (
            int(qkv_w, "qkv width")?,
            int(q_dim, "q dim")?,
            int(kv_dim, "kv dim")?,
        );
        let mut b = self.stream.launch_builder(&self.kv_write);
        b.arg(qkv)
            .arg(kv)
            .arg(slots)
            .arg(&ko)
            .arg(&vo)
            .arg(&w)
            .arg(&qd)
            .arg(&kd);
        // SAFETY: argument list matches the kernel; slots < blocks·block_size (validated).
        unsafe { launch(&mut b, rows_cfg(n), "kv_write") }
    }

    /// Paged attention of `n` tokens into `out[n][num_heads·head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        qkv: &CudaSlice<f32>,
        kv: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        pos: &CudaView<'_, i32>,
        bt_off: &CudaView<'_, i32>,
        block_tables: &CudaView<'_, i32>,
        k_off: usize,
        v_off: usize,
        shape: AttnShape,
    ) -> Result<(), String> {
        if shape.n == 0 {
            return Ok(());
        }
        if shape.head_dim > MAX_HEAD_DIM || shape.num_heads > 65_535 {
            return Err(format!(
                "attention with head size {} and {} heads is not supported",
                shape.head_dim, shape.num_heads
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (shape.n as u32, shape.num_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ko, vo) = (k_off as i64, v_off as i64);
        let w = int(shape.qkv_w, "qkv width")?;
        let nh = int(shape.num_heads, "heads")?;
        let nkv = int(shape.num_kv_heads, "kv heads")?;
        let hd = int(shape.head_dim, "head size")?;
        let bs = int(shape.block_size, "block size")?;
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.paged_attention);
        b.arg(qkv)
            .arg(kv)
            .arg(out)
            .arg(pos)
            .arg(bt_off)
            .arg(block_tables)
            .arg(&ko)
            .arg(&vo)
            .arg(&w)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&bs)
            .arg(&scale);
        // SAFETY: argument list matches the kernel; every block id read is < num_blocks and
        // every table long enough (validated before the step).
        unsafe { launch(&mut b, cfg, "paged_attention") }
    }

    /// `act[n][f] = silu(gu[:, :f]) · gu[:, f:]`.
    pub fn silu_mul(
        &self,
        gu: &CudaSlice<f32>,
        act: &mut CudaSlice<f32>,
        n: usize,
        f: usize,
    ) -> Result<(), String> {
        let total = n * f;
        if total == 0 {
            return Ok(());
        }
        let (t, fi) = (total as i64, int(f, "ffn size")?);
        let mut b = self.stream.launch_builder(&self.silu_mul);
        b.arg(gu).arg(act).arg(&t).arg(&fi);
        // SAFETY: argument list matches the kernel; gu holds n·2f, act n·f.
        unsafe { launch(&mut b, stride_cfg(total), "silu_mul") }
    }

    /// `x[..total] += o[..total]`.
    pub fn add(
        &self,
        x: &mut CudaSlice<f32>,
        o: &CudaSlice<f32>,
        total: usize,
    ) -> Result<(), String> {
        if total == 0 {
            return Ok(());
        }
        let t = total as i64;
        let mut b = self.stream.launch_builder(&self.add_inplace);
        b.arg(x).arg(o).arg(&t);
        // SAFETY: argument list matches the kernel; both hold at least `total` floats.
        unsafe { launch(&mut b, stride_cfg(total), "add_inplace") }
    }

    /// Copies the listed blocks of every plane into `staging` (`[plane][block][block_len]`).
    pub fn kv_gather_blocks(
        &self,
        kv: &CudaSlice<f32>,
        staging: &mut CudaSlice<f32>,
        blocks: &CudaSlice<i32>,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let f = &self.kv_gather_blocks;
        self.kv_blocks(f, "kv_gather_blocks", kv, staging, blocks, geo)
    }

    /// The inverse of [`Kernels::kv_gather_blocks`].
    pub fn kv_scatter_blocks(
        &self,
        kv: &mut CudaSlice<f32>,
        staging: &CudaSlice<f32>,
        blocks: &CudaSlice<i32>,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let f = &self.kv_scatter_blocks;
        self.kv_blocks(f, "kv_scatter_blocks", kv, staging, blocks, geo)
    }

    /// The launch shared by the gather and the scatter (kernel `func`, called `name`): both
    /// take `(kv, staging, blocks, nb, planes, plane_len, block_len)` and differ only in which
    /// of `kv` and `staging` they write.
    #[allow(clippy::too_many_arguments)]
    fn kv_blocks<'a, K, S>(
        &'a self,
        func: &'a CudaFunction,
        name: &str,
        kv: K,
        staging: S,
        blocks: &'a CudaSlice<i32>,
        geo: KvGeometry,
    ) -> Result<(), String>
    where
        LaunchArgs<'a>: PushKernelArg<K> + PushKernelArg<S>,
    {
        let total = geo.planes * blocks.len() * geo.block_len;
        if total == 0 {
            return Ok(());
        }
        let (nb, pl, plen, bl) = geo.args(blocks.len())?;
        let mut b: LaunchArgs<'a> = self.stream.launch_builder(func);
        b.arg(kv).arg(staging).arg(blocks);
        // The scalars live only in this call: the builder narrows to their lifetime.
        let mut b: LaunchArgs<'_> = b;
        b.arg(&nb).arg(&pl).arg(&plen).arg(&bl);
        // SAFETY: argument list matches both kernels; staging holds `total`, block ids valid.
        unsafe { launch(&mut b, stride_cfg(total), name) }
    }

    /// Block `src` copied onto block `dst` in every plane.
    pub fn kv_copy_block(
        &self,
        kv: &mut CudaSlice<f32>,
        src: usize,
        dst: usize,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let total = geo.planes * geo.block_len;
        if total == 0 || src == dst {
            return Ok(());
        }
        let (s, d) = (int(src, "block id")?, int(dst, "block id")?);
        let (_, pl, plen, bl) = geo.args(1)?;
        let mut b = self.stream.launch_builder(&self.kv_copy_block);
        b.arg(kv).arg(&s).arg(&d).arg(&pl).arg(&plen).arg(&bl);
        // SAFETY: argument list matches the kernel; src, dst < num_blocks (checked by caller).
        unsafe { launch(&mut b, stride_cfg(total), "kv_copy_block") }
    }

    /// Waits for the stream and reports any error recorded by an asynchronous call.
    ///
    /// # Errors
    /// The driver's error.
    pub fn sync(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(drv("synchronizing the stream"))?;
        self.ctx.check_err().map_err(drv("CUDA error"))
    }
}

/// Shape of one attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n: usize,
    pub qkv_w: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

/// Shape of the K/V buffer: `planes` planes of `plane_len` floats, blocks of `block_len`.
#[derive(Debug, Clone, Copy)]
pub struct KvGeometry {
    pub planes: usize,
    pub plane_len: usize,
    pub block_len: usize,
}

impl KvGeometry {
    fn args(&self, nblk: usize) -> Result<(i32, i32, i64, i32), String> {
        Ok((
            int(nblk, "blocks")?,
            int(self.planes, "planes")?,
            self.plane_len as i64,
            int(self.block_len, "block length")?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(name, value)` of every `#define NAME VALUE` line of `src` (value as written).
    fn defines(src: &str) -> Vec<(String, String)> {
        src.lines()
            .filter_map(|l| {
                let mut w = l.trim_start().strip_prefix('#')?.split_whitespace();
                (w.next()? == "define").then_some(())?;
                let name = w.next()?.to_string();
                Some((name, w.collect::<Vec<_>>().join(" ")))
            })
            .collect()
    }

    #[test]
    fn shared_constants_come_only_from_the_rust_prelude() {
        let shared: Vec<&str> = SHARED_CONSTANTS.iter().map(|(n, _)| *n).collect();
        // kernels.cu must use them but never define (or undefine) them.
        for (name, value) in defines(KERNELS_CU) {
            assert!(
                !shared.contains(&name.as_str()),
                "kernels.cu defines {name} ({value}) itself: it comes from kernels.rs"
            );
        }
        for l in KERNELS_CU.lines() {
            let t = l.trim_start();
            if let Some(rest) = t.strip_prefix("#undef") {
                assert!(
                    !shared.contains(&rest.trim()),
                    "kernels.cu undefines {rest}"
                );
            }
        }
        for name in &shared {
            assert!(KERNELS_CU.contains(name), "kernels.cu never uses {name}");
        }
        // The compiled source defines each exactly once, with the launcher's value, before
        // the kernels.
        let src = source();
        let all = defines(&src);
        for (name, v) in SHARED_CONSTANTS {
            let got: Vec<&String> = all
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v)
                .collect();
            assert_eq!(got, [&v.to_string()], "{name} in the compiled source");
        }
        assert!(src.starts_with(&prelude()) && src.ends_with(KERNELS_CU));
        assert_eq!(MAX_HEAD_DIM as u64, SHARED_CONSTANTS[5].1);
    }

    #[test]
    fn the_define_parser_sees_what_the_check_relies_on() {
        // A check that cannot fail is no check: a .cu defining a shared constant is caught.
        let bad = format!("{KERNELS_CU}\n  #  define MM_BT 16\n");
        assert!(defines(&bad).iter().any(|(n, v)| n == "MM_BT" && v == "16"));
        assert!(defines(&prelude()).len() == SHARED_CONSTANTS.len());
    }

    #[test]
    fn every_launched_kernel_is_in_the_source() {
        for name in KERNEL_NAMES {
            assert!(
                KERNELS_CU.contains(&format!("__global__ void {name}(")),
                "{name} missing from kernels.cu"
            );
        }
    }
}
