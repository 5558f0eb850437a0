//! The leaf resources text can name: `cuda`, `cuda_async`, `cuda_async_view` (the device's
//! default pool), `cuda_async_managed`, `managed`, `pinned`, `sam_headroom`, `system`,
//! `simulated`, `vmm`, `paged`.

use super::{ConfigError, ItemSpec};
use crate::cuda_context;
use crate::erased::AnyResource;
use crate::leaf::{
    Cuda, CudaAsync, CudaAsyncManaged, CudaAsyncOptions, CudaAsyncView, DevicePages, Managed,
    PagedHeaps, PagedHeapsConfig, Pinned, SamHeadroom, Simulated, System, VirtualMemory,
    VirtualMemoryConfig,
};
use crate::property::PropertySet;
use crate::resource::{AllocError, MemoryResource};
use std::sync::Arc;

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
    "paged",
];

/// A leaf whose one field is `device`, built by `on_device` on that device (or the default).
fn device_leaf<P, R>(
    item: &ItemSpec,
    default_device: usize,
    on_device: fn(usize) -> Result<R, AllocError>,
) -> Result<AnyResource<P>, ConfigError>
where
    P: PropertySet,
    R: MemoryResource + Send + Sync + 'static,
{
    item.check_fields(&["device"])?;
    item.check_gives::<P, R>()?;
    let device = item.number("device")?.unwrap_or(default_device);
    item.erase(on_device(device).map_err(|e| item.resource_error(e))?)
}

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
        "cuda" => device_leaf(item, default_device, Cuda::on_device),
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
            device_leaf(item, default_device, CudaAsyncView::on_device)
        }
        "cuda_async_managed" => device_leaf(item, default_device, CudaAsyncManaged::on_device),
        "managed" => device_leaf(item, default_device, Managed::on_device),
        "pinned" => device_leaf(item, default_device, Pinned::on_device),
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
            item.check_fields(&[
                "device",
                "simulated",
                "page",
                "max",
                "cache",
                "reservation",
                "peak_slack",
            ])?;
            let default = VirtualMemoryConfig::default();
            let config = VirtualMemoryConfig {
                reservation: item.size_or("reservation", default.reservation)?,
                max: item.size_or("max", default.max)?,
                cache: item.size_or("cache", default.cache)?,
                peak_slack: item.size_or("peak_slack", default.peak_slack)?,
            };
            // The properties are checked before a device is opened: a mismatch is an error on
            // any machine.
            if item.size("simulated")?.is_some() {
                item.check_gives::<P, VirtualMemory<Simulated>>()?;
            } else {
                item.check_gives::<P, VirtualMemory<DevicePages>>()?;
            }
            match page_source(item, device)? {
                Source::Simulated(sim) => item.erase(VirtualMemory::new(sim, config).map_err(err)?),
                Source::Device(pages) => {
                    item.erase(VirtualMemory::new(pages, config).map_err(err)?)
                }
            }
        }
        "paged" => {
            item.check_fields(&["device", "simulated", "page", "cache", "peak_slack"])?;
            let default = PagedHeapsConfig::default();
            let config = PagedHeapsConfig {
                cache: item.size_or("cache", default.cache)?,
                peak_slack: item.size_or("peak_slack", default.peak_slack)?,
            };
            if item.size("simulated")?.is_some() {
                item.check_gives::<P, PagedHeaps<Arc<Simulated>>>()?;
            } else {
                item.check_gives::<P, PagedHeaps<DevicePages>>()?;
            }
            match page_source(item, device)? {
                Source::Simulated(sim) => item.erase(PagedHeaps::new(Arc::new(sim), config)),
                Source::Device(pages) => item.erase(PagedHeaps::new(pages, config)),
            }
        }
        _ => return Ok(None),
    };
    any.map(Some)
}

/// The pages a `vmm` or `paged` item maps from.
enum Source {
    Simulated(Simulated),
    Device(DevicePages),
}

/// `simulated=SIZE` (with `page`, 2 MiB by default), or the pages of the item's device (at its
/// granularity, or `page`).
fn page_source(
    item: &ItemSpec,
    device: impl Fn() -> Result<usize, ConfigError>,
) -> Result<Source, ConfigError> {
    let err = |e| item.resource_error(e);
    let page = item.size("page")?;
    match item.size("simulated")? {
        Some(capacity) => {
            if let Some(f) = item.field("device") {
                return Err(item.bad_value(
                    f,
                    "no `device` beside `simulated` (simulated pages belong to no device)",
                ));
            }
            Ok(Source::Simulated(Simulated::with_page_size(
                capacity,
                page.unwrap_or(2 << 20),
            )))
        }
        None => {
            let ctx = cuda_context(device()?).map_err(err)?;
            let pages = DevicePages::with_page_size(&ctx, page.unwrap_or(0)).map_err(err)?;
            Ok(Source::Device(pages))
        }
    }
}
