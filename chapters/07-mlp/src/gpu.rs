//! The GPU side of the engine: a stream to queue work on, and our CUDA kernels,
//! compiled from source when the program starts.
//!
//! Kernels live in `kernels/*.cu` and travel inside the binary (`include_str!`). At
//! start-up NVRTC, NVIDIA's run-time compiler, turns them into PTX for this GPU's
//! architecture, and the driver loads the PTX as a module whose functions we launch.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

// ANCHOR: kernels
/// Every kernel the engine launches.
pub struct Kernels {
    pub embedding_gather: CudaFunction,
    pub rms_norm: CudaFunction,
    pub rope: CudaFunction,
    pub attention_prefill: CudaFunction,
    pub silu_mul: CudaFunction,
    pub argmax_rows: CudaFunction,
}
// ANCHOR_END: kernels

/// The GPU: the stream all work is queued on, the compiled kernels, and cuBLAS.
pub struct Gpu {
    pub stream: Arc<CudaStream>,
    pub kernels: Kernels,
    /// NVIDIA's matrix library, for the matrix products (on the same stream).
    pub blas: CudaBlas,
    /// The virtual architecture the kernels were compiled for, e.g. `compute_90`.
    pub arch: String,
}

impl Gpu {
    // ANCHOR: gpu_new
    /// Compiles every kernel for this GPU and loads it.
    pub fn new(ctx: &Arc<CudaContext>, stream: Arc<CudaStream>) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        if major < 8 {
            bail!(
                "{} has compute capability {major}.{minor}; cuBLAS's bf16 matrix products need 8.0 (Ampere) or newer",
                ctx.name()?
            );
        }
        let arch = format!("compute_{major}{minor}");
        let include_dir = cuda_include_dir()?;
        let compile = |name: &str, source: &str| compile_kernel(ctx, name, source, &arch, &include_dir);

        let embedding = compile("embedding.cu", include_str!("../../../kernels/embedding.cu"))?;
        let rmsnorm = compile("rmsnorm.cu", include_str!("../../../kernels/rmsnorm.cu"))?;
        let rope = compile("rope.cu", include_str!("../../../kernels/rope.cu"))?;
        let attention = compile("attention_prefill.cu", include_str!("../../../kernels/attention_prefill.cu"))?;
        let swiglu = compile("swiglu.cu", include_str!("../../../kernels/swiglu.cu"))?;
        let argmax = compile("argmax.cu", include_str!("../../../kernels/argmax.cu"))?;
        let kernels = Kernels {
            embedding_gather: embedding.load_function("embedding_gather")?,
            rms_norm: rmsnorm.load_function("rms_norm")?,
            rope: rope.load_function("rope")?,
            attention_prefill: attention.load_function("attention_prefill")?,
            silu_mul: swiglu.load_function("silu_mul")?,
            argmax_rows: argmax.load_function("argmax_rows")?,
        };
        let blas = CudaBlas::new(stream.clone()).context("cannot start cuBLAS")?;
        Ok(Gpu { stream, kernels, blas, arch })
    }
    // ANCHOR_END: gpu_new

    // ANCHOR: alloc_nan
    /// A new buffer with every bit set: NaN for floats, `u32::MAX` (no valid token id) for
    /// ids. Kernels write their outputs into such buffers, so an element a kernel forgets
    /// to write cannot pass a check.
    pub fn alloc_nan<T: DeviceRepr>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every byte is set right below, before anything reads the buffer.
        let mut buffer = unsafe { self.stream.alloc::<T>(len) }?;
        let bytes = len * std::mem::size_of::<T>();
        {
            let (pointer, _record) = buffer.device_ptr_mut(&self.stream);
            // SAFETY: `pointer` addresses `bytes` bytes owned by `buffer`, on this stream.
            unsafe { cudarc::driver::result::memset_d8_async(pointer, 0xFF, bytes, self.stream.cu_stream()) }?;
        }
        Ok(buffer)
    }
    // ANCHOR_END: alloc_nan
}

// ANCHOR: compile_kernel
/// NVRTC: CUDA C++ source → PTX for `arch`; then the driver loads the PTX.
fn compile_kernel(
    ctx: &Arc<CudaContext>,
    name: &str,
    source: &str,
    arch: &str,
    include_dir: &Path,
) -> Result<Arc<CudaModule>> {
    // SAFETY: only tries to load libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        bail!("libnvrtc (NVIDIA's run-time compiler) cannot be loaded: install the CUDA toolkit");
    }
    let options = CompileOptions {
        include_paths: vec![include_dir.display().to_string()],
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_string()],
        name: Some(name.to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(source, options).map_err(|error| match error {
        CompileError::CompileError { log, .. } => anyhow!("{name} does not compile:\n{}", log.to_string_lossy()),
        other => anyhow!("NVRTC failed on {name}: {other:?}"),
    })?;
    ctx.load_module(ptx).with_context(|| format!("the driver cannot load {name}"))
}
// ANCHOR_END: compile_kernel

/// The CUDA headers (`cuda_bf16.h` and friends) that kernels include:
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, or `/usr/local/cuda/include`.
fn cuda_include_dir() -> Result<PathBuf> {
    let candidates: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(|dir| Path::new(&dir).join("include")))
        .chain([PathBuf::from("/usr/local/cuda/include")])
        .collect();
    candidates.iter().find(|dir| dir.join("cuda_bf16.h").exists()).cloned().with_context(|| {
        format!(
            "no CUDA headers found (looked for cuda_bf16.h in {}); install the CUDA toolkit or set CUDA_HOME",
            candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
        )
    })
}
