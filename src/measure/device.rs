//! Timing and memory on whatever device a measurement runs: wall clock on the CPU, CUDA events
//! and the driver's free-memory counter on a GPU (feature `cuda`).

use candle_core::Device;

#[cfg(feature = "cuda")]
use crate::error::Error;
use crate::error::Result;

/// Runs `f` and returns its result and duration in ms. On the CPU: wall clock around `f`. On
/// CUDA: events recorded on the device's stream before and after `f`, the host synchronized on
/// the end event, `cuEventElapsedTime` (0.5 µs resolution) — device time of the work `f`
/// queued, without the launch latency of the host call that follows it. Errors: from `f` or the
/// CUDA driver.
pub fn time_ms<R>(device: &Device, f: impl FnOnce() -> Result<R>) -> Result<(R, f64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
        let stream = dev.cuda_stream();
        let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
        let start = stream
            .record_event(flags)
            .map_err(|e| Error::cuda("event", e))?;
        let r = f()?;
        let end = stream
            .record_event(flags)
            .map_err(|e| Error::cuda("event", e))?;
        end.synchronize().map_err(|e| Error::cuda("event", e))?;
        let ms = start
            .elapsed_ms(&end)
            .map_err(|e| Error::cuda("event", e))?;
        return Ok((r, ms as f64));
    }
    let _ = device;
    let t = std::time::Instant::now();
    let r = f()?;
    Ok((r, t.elapsed().as_secs_f64() * 1e3))
}

/// Device memory `(free, total)` now, in bytes, from `cuMemGetInfo` (every process on the GPU
/// counts, the CUDA context's own ~500 MiB included); `None` on the CPU (see [`crate::util::memory`]
/// for RSS). Errors: CUDA driver errors.
pub fn device_mem_info(device: &Device) -> Result<Option<(u64, u64)>> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        let (free, total) = dev
            .cuda_stream()
            .context()
            .mem_get_info()
            .map_err(|e| Error::cuda("mem_get_info", e))?;
        return Ok(Some((free as u64, total as u64)));
    }
    let _ = device;
    Ok(None)
}

/// Device memory in use now, `total − free` bytes of [`device_mem_info`]: sampled around sweep
/// points for the VRAM high-water mark. `None` on the CPU. Errors: CUDA driver errors.
pub fn device_mem_used(device: &Device) -> Result<Option<u64>> {
    Ok(device_mem_info(device)?.map(|(free, total)| total - free))
}

/// Device memory free now, bytes ([`device_mem_info`]); `None` on the CPU. Errors: CUDA driver
/// errors.
pub fn device_mem_free(device: &Device) -> Result<Option<u64>> {
    Ok(device_mem_info(device)?.map(|(free, _)| free))
}

/// The device in words for table headers and `meta.json`: `"CPU, 2 threads"` or the GPU's
/// name, memory and SM count, e.g. `"NVIDIA H200 (139.8 GiB, 132 SMs)"`.
pub fn describe(device: &Device) -> String {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
        let ctx = dev.cuda_stream().context().clone();
        let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let mem = ctx.mem_get_info().map_or(0, |(_, total)| total);
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(0);
        return format!(
            "{name} ({:.1} GiB, {sms} SMs)",
            mem as f64 / (1u64 << 30) as f64
        );
    }
    let _ = device;
    format!("CPU, {} threads", rayon::current_num_threads())
}

/// Waits until every queued kernel on `device` has finished (no-op on the CPU).
/// Errors: CUDA driver errors (a kernel fault surfaces here).
pub fn synchronize(device: &Device) -> Result<()> {
    Ok(device.synchronize()?)
}
