//! The GPU itself: finding the driver, opening the device, and saying what it is.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use cudarc::driver::CudaContext;

// ANCHOR: open_gpu
/// Opens GPU 0. cudarc loads the driver library at run time, so we check it is there
/// first: a machine without one gets an error message rather than a panic.
pub fn open_gpu() -> Result<Arc<CudaContext>> {
    // SAFETY: only tries to load libcuda; nothing is called through it.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver_present {
        bail!("no NVIDIA driver found (libcuda.so cannot be loaded); use --no-gpu to validate the files only");
    }
    CudaContext::new(0).context("cannot open GPU 0")
}
// ANCHOR_END: open_gpu

/// The GPU's name and memory, for the run's header.
pub fn describe(ctx: &CudaContext) -> Result<String> {
    let (free, total) = ctx.mem_get_info()?;
    Ok(format!("{} ({:.1} GiB free of {:.1} GiB)", ctx.name()?, gib(free), gib(total)))
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0 * 1024.0)
}
