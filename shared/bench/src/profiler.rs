//! The CUDA profiler's switch: with `ncu --profile-from-start off`, only the kernels
//! launched between [`start`] and [`stop`] are profiled.

use anyhow::Result;
use cudarc::driver::sys;

pub fn start() -> Result<()> {
    // SAFETY: takes no arguments; the context is current on this thread.
    unsafe { sys::cuProfilerStart() }.result()?;
    Ok(())
}

pub fn stop() -> Result<()> {
    // SAFETY: as above.
    unsafe { sys::cuProfilerStop() }.result()?;
    Ok(())
}
