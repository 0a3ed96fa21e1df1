//! Peak GPU memory: how much of the device's free memory a run took, sampled after each
//! phase. Our chapters allocate everything up front and free nothing until they end, so the
//! last sample is the peak; the samples show where it grew.

use std::sync::Arc;

use anyhow::Result;
use cudarc::driver::CudaContext;

use crate::record::Measurement;

pub struct MemoryWatch {
    ctx: Arc<CudaContext>,
    /// Free bytes before the run allocated anything (the context itself excluded).
    baseline_free: usize,
    lowest_free: usize,
}

impl MemoryWatch {
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let (free, _) = ctx.mem_get_info()?;
        Ok(MemoryWatch { ctx: ctx.clone(), baseline_free: free, lowest_free: free })
    }

    pub fn sample(&mut self) -> Result<()> {
        let (free, _) = self.ctx.mem_get_info()?;
        self.lowest_free = self.lowest_free.min(free);
        Ok(())
    }

    /// The peak of the samples so far as the figure `peak_memory_gib`; `detail` says what it includes.
    pub fn peak_figure(&self, detail: &str) -> Measurement {
        let bytes = self.baseline_free - self.lowest_free;
        Measurement::derived("peak_memory_gib", "GiB", bytes as f64 / (1u64 << 30) as f64, detail)
    }
}
