//! CUDA presence probe. `cudarc::driver::CudaContext::new` panics when libcuda is missing, so
//! the library is looked for first.

/// `Ok(device name)` when a CUDA device can be used, `Err(reason)` otherwise.
pub fn probe() -> Result<String, String> {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made when it is absent.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        return Err("libcuda not found (no NVIDIA driver on this machine)".to_string());
    }
    let ctx = std::panic::catch_unwind(|| cudarc::driver::CudaContext::new(0))
        .map_err(|_| "creating a CUDA context panicked".to_string())?
        .map_err(|e| format!("no usable CUDA device: {e}"))?;
    ctx.name()
        .map_err(|e| format!("querying the CUDA device: {e}"))
}
