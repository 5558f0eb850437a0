//! The leaf resources text can name: `cuda`, `cuda_async`, `cuda_async_view` (the device's
//! default pool), `cuda_async_managed`, `managed`, `pinned`, `sam_headroom`, `system`,
//! `simulated`, `vmm`.

use super::{ConfigError, ItemSpec};
use crate::cuda_context;
use crate::erased::AnyResource;
use crate::leaf::{
    Cuda, CudaAsync, CudaAsyncManaged, CudaAsyncOptions, CudaAsyncView, DevicePages, Managed,
    Pinned, SamHeadroom, Simulated, System, VirtualMemory, VirtualMemoryConfig,
};
use crate::property::PropertySet;

/// The leaf resources, by name.
pub(super) const LEAVES: &[&str] = &[
    "cuda",
    "cuda_async",
    "cuda_async_view",
    "cuda_async_managed",
    "managed",
    "pinned",
    "sam_headroom",
    "system",
    "simulated",
    "vmm",
];

/// Builds the leaf `item` names (on `default_device` unless it names one); `Ok(None)` when it
/// names no leaf.
pub(super) fn leaf<P: PropertySet>(
    item: &ItemSpec,
    default_device: usize,
) -> Result<Option<AnyResource<P>>, ConfigError> {
    let device =
        || -> Result<usize, ConfigError> { Ok(item.number("device")?.unwrap_or(default_device)) };
    let err = |e| item.resource_error(e);
    let any = match item.name.as_str() {
        "cuda" => {
            item.check_fields(&["device"])?;
            item.check_gives::<P, Cuda>()?;
            item.erase(Cuda::on_device(device()?).map_err(err)?)
        }
        "cuda_async" => {
            item.check_fields(&["device", "initial", "release_threshold", "exportable"])?;
            item.check_gives::<P, CudaAsync>()?;
            let options = CudaAsyncOptions {
                initial_pool_size: item.size("initial")?,
                release_threshold: item.size("release_threshold")?,
                exportable: item.flag_or("exportable", false)?,
            };
            let ctx = cuda_context(device()?).map_err(err)?;
            item.erase(CudaAsync::with_options(&ctx, options).map_err(err)?)
        }
        "cuda_async_view" => {
            // Only the device's default pool: a foreign pool's handle is `unsafe` to take.
            item.check_fields(&["device"])?;
            item.check_gives::<P, CudaAsyncView>()?;
            item.erase(CudaAsyncView::on_device(device()?).map_err(err)?)
        }
        "cuda_async_managed" => {
            item.check_fields(&["device"])?;
            item.check_gives::<P, CudaAsyncManaged>()?;
            item.erase(CudaAsyncManaged::on_device(device()?).map_err(err)?)
        }
        "managed" => {
            item.check_fields(&["device"])?;
            item.check_gives::<P, Managed>()?;
            item.erase(Managed::on_device(device()?).map_err(err)?)
        }
        "pinned" => {
            item.check_fields(&["device"])?;
            item.check_gives::<P, Pinned>()?;
            item.erase(Pinned::on_device(device()?).map_err(err)?)
        }
        "sam_headroom" => {
            item.check_fields(&["device", "headroom"])?;
            item.check_gives::<P, SamHeadroom>()?;
            let headroom = item.required_size("headroom")?;
            item.erase(SamHeadroom::on_device(device()?, headroom).map_err(err)?)
        }
        "system" => {
            item.check_fields(&[])?;
            item.erase(System::new())
        }
        "simulated" => {
            item.check_fields(&["capacity"])?;
            item.erase(Simulated::new(item.required_size("capacity")?))
        }
        "vmm" => {
            item.check_fields(&["device", "simulated", "page", "max", "cache", "reservation"])?;
            let default = VirtualMemoryConfig::default();
            let config = VirtualMemoryConfig {
                reservation: item.size_or("reservation", default.reservation)?,
                max: item.size_or("max", default.max)?,
                cache: item.size_or("cache", default.cache)?,
            };
            let page = item.size("page")?;
            match item.size("simulated")? {
                Some(capacity) => {
                    if let Some(f) = item.field("device") {
                        return Err(item.bad_value(
                            f,
                            "no `device` beside `simulated` (simulated pages belong to no device)",
                        ));
                    }
                    item.check_gives::<P, VirtualMemory<Simulated>>()?;
                    let sim = Simulated::with_page_size(capacity, page.unwrap_or(2 << 20));
                    item.erase(VirtualMemory::new(sim, config).map_err(err)?)
                }
                None => {
                    item.check_gives::<P, VirtualMemory<DevicePages>>()?;
                    let ctx = cuda_context(device()?).map_err(err)?;
                    let pages =
                        DevicePages::with_page_size(&ctx, page.unwrap_or(0)).map_err(err)?;
                    item.erase(VirtualMemory::new(pages, config).map_err(err)?)
                }
            }
        }
        _ => return Ok(None),
    };
    any.map(Some)
}
