//! The CUDA backend: kernels written in CUDA C (`kernels.cu`, launched from `kernels.rs`, which
//! also generates the `#define`s of the constants they share), compiled with NVRTC when the
//! backend starts, and a runner (`runner.rs`) that keeps the primary route's weights and an
//! engine's K/V blocks in device memory.
//!
//! Everything is loaded at run time (cudarc's `dynamic-loading`): a build without CUDA works and
//! a machine without libcuda or libnvrtc gets an error, never a panic. The order matters:
//! `cudarc::driver::CudaContext::new` panics when libcuda is missing, so the library is looked
//! for first; NVRTC likewise.

mod kernels;
mod runner;

use std::sync::{Arc, OnceLock};

pub use kernels::{KERNEL_NAMES, Kernels};
pub use runner::{CudaRunner, KernelHarness};

/// Whether libcuda (the driver library) can be loaded.
pub fn libcuda_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made when it is absent.
    std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false)
}

/// The kernels on device 0, compiled and loaded once per process (the outcome, error included,
/// is kept).
///
/// # Errors
/// Why CUDA cannot be used: no libcuda, no device, no libnvrtc, a compile or load error.
pub fn kernels() -> Result<Arc<Kernels>, String> {
    static KERNELS: OnceLock<Result<Arc<Kernels>, String>> = OnceLock::new();
    KERNELS
        .get_or_init(|| {
            if !libcuda_present() {
                return Err("libcuda not found (no NVIDIA driver on this machine)".to_string());
            }
            let t0 = std::time::Instant::now();
            let k = Kernels::load()?;
            tracing::info!(
                device = k.name,
                compile_ms = t0.elapsed().as_millis() as u64,
                "CUDA kernels compiled with NVRTC and loaded"
            );
            Ok(Arc::new(k))
        })
        .clone()
}

/// Compiles the kernel source with NVRTC only (no driver, no device needed) and returns the PTX.
///
/// # Errors
/// libnvrtc missing, or the compiler's log.
pub fn compile_ptx() -> Result<String, String> {
    kernels::compile().map(|p| p.to_src())
}
