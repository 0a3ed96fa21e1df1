//! `cargo x nvrtc`: compile every kernel in `kernels/` with NVRTC, as the chapters do at
//! run time (after `kernels/block_reduce.cuh`, which they put in front of every kernel
//! from chapter 4 on), and fail on any error or warning. Needs no GPU: only libnvrtc and the CUDA
//! headers (from a CUDA toolkit, or from the PyPI packages `cargo x test` installs).

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use cudarc::nvrtc::result as nvrtc;

use crate::paths;

/// The virtual architecture CI compiles for (Hopper, the H200); chapters ask the device.
const ARCH: &str = "compute_90";

/// Folder of the pip-installed CUDA 13 libraries and headers (see `cargo x test`).
pub fn pip_cuda_dir() -> Result<PathBuf> {
    Ok(paths::cache()?.join("cuda/nvidia/cu13"))
}

pub fn run() -> Result<()> {
    // SAFETY: only tries to load libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return rerun_with_pip_libnvrtc();
    }
    let include_dir = cuda_include_dir()?;
    let mut kernels: Vec<PathBuf> = std::fs::read_dir(paths::root()?.join("kernels"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "cu"))
        .collect();
    kernels.sort();
    for kernel in &kernels {
        compile(kernel, &include_dir)?;
        println!("nvrtc: {} compiles cleanly for {ARCH}", kernel.file_name().unwrap().to_string_lossy());
    }
    println!("nvrtc: {} kernel file(s), no errors or warnings (headers from {})", kernels.len(), include_dir.display());
    Ok(())
}

/// The dynamic loader reads `LD_LIBRARY_PATH` only when a process starts, so to use the
/// pip-installed libnvrtc we start ourselves again with it set.
fn rerun_with_pip_libnvrtc() -> Result<()> {
    let lib = pip_cuda_dir()?.join("lib");
    if std::env::var_os("XTASK_NVRTC_RERUN").is_some() || !lib.join("libnvrtc.so.13").exists() {
        bail!(
            "libnvrtc cannot be loaded: install a CUDA toolkit, or run `cargo x test` once to put \
             the PyPI package nvidia-cuda-nvrtc in {}",
            lib.display()
        );
    }
    let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("nvrtc")
        .env("LD_LIBRARY_PATH", format!("{}:{old}", lib.display()))
        .env("XTASK_NVRTC_RERUN", "1")
        .status()?;
    ensure!(status.success(), "nvrtc check failed");
    Ok(())
}

/// The first folder holding `cuda_bf16.h`: `$CUDA_HOME/include`, `$CUDA_PATH/include`,
/// `/usr/local/cuda/include`, then the pip-installed headers.
pub fn cuda_include_dir() -> Result<PathBuf> {
    let candidates = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(|v| Path::new(&v).join("include")))
        .chain([PathBuf::from("/usr/local/cuda/include"), pip_cuda_dir()?.join("include")]);
    for dir in candidates {
        if dir.join("cuda_bf16.h").exists() {
            return Ok(dir);
        }
    }
    bail!("no CUDA headers (cuda_bf16.h) found: set CUDA_HOME, or run `cargo x test` to install them")
}

fn compile(kernel: &Path, include_dir: &Path) -> Result<()> {
    let read = |path: &Path| std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()));
    let prelude = read(&kernel.with_file_name("block_reduce.cuh"))?;
    let source = format!("{prelude}\n{}", read(kernel)?);
    let name = kernel.file_name().unwrap().to_string_lossy().into_owned();
    let source = CString::new(source).context("kernel source contains a NUL byte")?;
    let program = nvrtc::create_program(&source, Some(&CString::new(name.clone())?))?;
    let options = vec![
        format!("--gpu-architecture={ARCH}"),
        format!("--include-path={}", include_dir.display()),
        "--std=c++17".to_string(),
    ];
    // SAFETY: `program` is a live NVRTC program; we destroy it once below.
    let compiled = unsafe { nvrtc::compile_program(program, &options) };
    let log = unsafe { nvrtc::get_program_log(program) }?;
    unsafe { nvrtc::destroy_program(program) }?;
    let log = unsafe { CStr::from_ptr(log.as_ptr()) }.to_string_lossy().trim().to_string();
    if compiled.is_err() {
        bail!("{name} does not compile:\n{log}");
    }
    if log.contains("warning") {
        bail!("{name} compiles with warnings:\n{log}");
    }
    Ok(())
}
