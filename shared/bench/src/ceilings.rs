//! The hardware's ceilings, measured in the same session as the chapters: how fast the GPU
//! streams memory it only reads (a decode step's limit: it reads every weight), and how
//! fast cuBLAS multiplies bf16 matrices (a long prefill's limit).

use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use half::bf16;

use crate::record::{Measurement, Part, repeat};

/// Bytes the bandwidth kernel reads per run: far more than the 50 MB L2 cache, so that
/// nearly every byte comes from memory.
const READ_BYTES: usize = 4 << 30;
/// The square GEMM's size: large enough to keep every tensor core busy.
const GEMM_SIZE: usize = 8192;
const RUNS: usize = 10;

pub fn measure(ctx: &Arc<CudaContext>, part: &mut Part) -> Result<()> {
    let stream = ctx.default_stream();
    let bandwidth = read_bandwidth(ctx, &stream)?;
    part.push(Measurement::of_runs(
        "read_bandwidth_tb_per_s",
        "TB/s",
        bandwidth,
        &format!("a read-only kernel streaming {} GiB, 16-byte loads", READ_BYTES >> 30),
    ));
    let tflops = gemm_rate(&stream)?;
    part.push(Measurement::of_runs(
        "gemm_tflops",
        "TFLOP/s",
        tflops,
        &format!("cuBLAS bf16 GEMM {GEMM_SIZE}³, fp32 accumulation"),
    ));
    Ok(())
}

/// TB/s of each run of the read-only kernel, timed with CUDA events.
fn read_bandwidth(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) -> Result<Vec<f64>> {
    let (major, minor) = ctx.compute_capability()?;
    let options = CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("read_bandwidth.cu".into()),
        ..Default::default()
    };
    let source = include_str!("../../../kernels/read_bandwidth.cu");
    let ptx = compile_ptx_with_opts(source, options).map_err(|e| anyhow!("read_bandwidth.cu: {e:?}"))?;
    let kernel = ctx.load_module(ptx)?.load_function("read_bandwidth")?;
    let words = READ_BYTES / 16;
    // Zeros fold to 0, so `never = 1` is never met and the kernel stores nothing.
    let input = stream.alloc_zeros::<u32>(READ_BYTES / 4).context("cannot allocate the bandwidth buffer")?;
    let mut out = stream.alloc_zeros::<u32>(1)?;
    let (words, never) = (words as u64, 1u32);
    let sms = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let launch = LaunchConfig { grid_dim: (sms as u32 * 8, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    repeat(RUNS, || {
        let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        // SAFETY: the arguments match the kernel's signature; `input` holds `words` 16-byte words.
        unsafe { stream.launch_builder(&kernel).arg(&input).arg(&words).arg(&never).arg(&mut out).launch(launch) }?;
        let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        let seconds = start.elapsed_ms(&end)? as f64 / 1e3;
        Ok(READ_BYTES as f64 / seconds / 1e12)
    })
}

/// TFLOP/s of each run of a square bf16 GEMM through cuBLAS.
fn gemm_rate(stream: &Arc<CudaStream>) -> Result<Vec<f64>> {
    let n = GEMM_SIZE;
    // Values that are not all zero: a tensor core multiplying zeros draws less power and
    // would flatter the clock.
    let values: Vec<bf16> = (0..n * n).map(|i| bf16::from_f32(((i % 251) as f32 - 125.0) / 256.0)).collect();
    let a = stream.clone_htod(&values)?;
    let b = stream.clone_htod(&values)?;
    let mut c = stream.alloc_zeros::<bf16>(n * n)?;
    let blas = CudaBlas::new(stream.clone())?;
    let size = n as i32;
    let config = GemmConfig {
        transa: CUBLAS_OP_N,
        transb: CUBLAS_OP_N,
        m: size,
        n: size,
        k: size,
        alpha: bf16::ONE,
        lda: size,
        ldb: size,
        beta: bf16::ZERO,
        ldc: size,
    };
    let flops = 2.0 * (n as f64).powi(3);
    repeat(RUNS, || {
        let start = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        // SAFETY: a, b and c each hold n × n values, as the config says.
        unsafe { blas.gemm(config, &a, &b, &mut c) }?;
        let end = stream.record_event(Some(CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        let seconds = start.elapsed_ms(&end)? as f64 / 1e3;
        Ok(flops / seconds / 1e12)
    })
}
