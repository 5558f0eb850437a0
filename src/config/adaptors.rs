//! The adaptors and suballocators text can name: how each reads its configuration from an item
//! ([`FromItem`]), and the builders of those whose item holds more than a configuration (the
//! alignment of `aligned` is a type, `prefetch` needs managed memory below it, `logging` keeps its
//! path, `binning` builds its bins' stacks).

use super::{ConfigError, ConfigErrorKind, FromItem, ItemSpec, StackBuilder, StackSpec};
use crate::adaptor::{
    AlignedConfig, GraphPoolsConfig, LimitingConfig, LogWriter, Logging, LoggingConfig,
    PrefetchConfig, StatisticsConfig, ThreadCacheConfig, TrackingConfig,
};
use crate::erased::{AnyResource, PropertySet};
use crate::property::{Migratable, Properties};
use crate::resource::Layer;
use crate::suballoc::{
    ArenaConfig, Binning, BinningConfig, FixedSizeConfig, PoolConfig, ThreadHeapsConfig, TlsfConfig,
};
use std::io;

/// `FromItem` for the configurations of an `initial` and a `max` size: `name(initial=…, max=…)`,
/// with `initial` at most `max`.
macro_rules! initial_and_max {
    ($($Config:ident),*) => {$(
        impl FromItem for $Config {
            fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
                item.check_fields(&["initial", "max"])?;
                let default = Self::default();
                let config = $Config {
                    initial: item.size_or("initial", default.initial)?,
                    max: item.size_or("max", default.max)?,
                };
                item.check_order(("initial", config.initial), ("max", config.max))?;
                Ok(config)
            }
        }
    )*};
}
initial_and_max!(PoolConfig, TlsfConfig);

impl FromItem for BinningConfig {
    /// `binning(min=…, max=…)`, with `min` at most `max`; `bins` (bins of resources of their own)
    /// is read by the text builder, which builds each bin's stack.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["min", "max", "bins"])?;
        let default = Self::default();
        let config = BinningConfig {
            min: item.size_or("min", default.min)?,
            max: item.size_or("max", default.max)?,
        };
        item.check_order(("min", config.min), ("max", config.max))?;
        Ok(config)
    }
}

/// Builds `binning(min=…, max=…, bins="64 KiB = cuda_async; 1 MiB = cuda > fixed_size(…)")` over
/// `below`: each entry of `bins` a bin's block size and the text config of the resource that
/// serves it, built like the whole stack (its leaf on device 0 unless it names one). One level
/// deep: a bin's resource has no `bins` of its own (the nesting of quoted text is bounded so).
pub(super) fn binning_from_item<P: PropertySet>(
    item: &ItemSpec,
    below: AnyResource<P>,
) -> Result<AnyResource<P>, ConfigError> {
    let config = BinningConfig::from_item(item)?;
    let mut binning = Binning::try_new(below, config).map_err(|e| item.resource_error(e))?;
    if let Some(field) = item.field("bins") {
        let expected = "`size = stack; …`, a bin's block size and the text config of the resource that serves it, e.g. bins=\"64 KiB = cuda_async\"";
        // A bin given twice is an error, as a repeated field is: the second would silently
        // replace the first.
        let mut seen = Vec::new();
        for entry in field.value.split(';').filter(|e| !e.trim().is_empty()) {
            let (size, stack) = entry
                .split_once('=')
                .ok_or_else(|| item.bad_value(field, expected))?;
            let size = crate::units::parse_size(size.trim())
                .ok()
                .and_then(|s| usize::try_from(s).ok())
                .ok_or_else(|| item.bad_value(field, expected))?;
            if seen.contains(&size) {
                return Err(item.bad_value(
                    field,
                    &format!(
                        "each bin once: the {} bin is given twice",
                        crate::units::ExactBytes::from(size)
                    ),
                ));
            }
            seen.push(size);
            let spec: StackSpec = stack.trim().parse().map_err(|e| {
                item.bad_value(field, &format!("a stack for the {size}-byte bin: {e}"))
            })?;
            if spec.items.iter().any(|i| i.field("bins").is_some()) {
                return Err(item.bad_value(
                    field,
                    "bins whose resources have no `bins` of their own (one level deep)",
                ));
            }
            let resource = StackBuilder::<P>::new().build_spec(&spec).map_err(|e| {
                item.bad_value(field, &format!("a stack for the {size}-byte bin: {e}"))
            })?;
            binning = binning
                .with_bin(size, resource)
                .map_err(|e| item.bad_value(field, &format!("a bin size: {e}")))?;
        }
    }
    item.erase(binning)
}

impl FromItem for FixedSizeConfig {
    /// `fixed_size(block_size=…, blocks_to_preallocate=…)`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["block_size", "blocks_to_preallocate"])?;
        let default = Self::default();
        Ok(FixedSizeConfig {
            block_size: item.size_or("block_size", default.block_size)?,
            blocks_to_preallocate: item
                .number("blocks_to_preallocate")?
                .unwrap_or(default.blocks_to_preallocate),
        })
    }
}

impl FromItem for ArenaConfig {
    /// `arena(size=…, superblock=…)`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["size", "superblock"])?;
        let default = Self::default();
        Ok(ArenaConfig {
            size: item.size_or("size", default.size)?,
            superblock: item.size_or("superblock", default.superblock)?,
        })
    }
}

impl FromItem for ThreadHeapsConfig {
    /// `thread_heaps(max=…)`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["max"])?;
        Ok(ThreadHeapsConfig {
            max: item.size_or("max", ThreadHeapsConfig::default().max)?,
        })
    }
}

/// `FromItem` for the configurations with no fields (`statistics`, `graph_pools`).
macro_rules! no_fields {
    ($($Config:ident),*) => {$(
        impl FromItem for $Config {
            fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
                item.check_fields(&[])?;
                Ok($Config {})
            }
        }
    )*};
}
no_fields!(StatisticsConfig, GraphPoolsConfig);

impl FromItem for TrackingConfig {
    /// `tracking(backtraces=true|false)`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["backtraces"])?;
        Ok(TrackingConfig {
            backtraces: item.flag_or("backtraces", false)?,
        })
    }
}

impl FromItem for LimitingConfig {
    /// `limiting(limit=…)`: the limit is required.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["limit"])?;
        Ok(LimitingConfig {
            limit: item.required_size("limit")?,
        })
    }
}

impl FromItem for ThreadCacheConfig {
    /// `thread_cache(bytes=…, max_block=…)`: both optional (256 MiB, 16 MiB); `max_block` may
    /// not exceed `bytes`.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["bytes", "max_block"])?;
        let default = ThreadCacheConfig::default();
        let bytes = item.size_or("bytes", default.bytes)?;
        let config = ThreadCacheConfig {
            max_block: item.size_or("max_block", default.max_block.min(bytes))?,
            bytes,
        };
        item.check_order(("max_block", config.max_block), ("bytes", config.bytes))?;
        Ok(config)
    }
}

impl FromItem for LoggingConfig {
    /// `logging(path=…)`: a file created (or truncated) at `path`; stderr without it.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["path"])?;
        let to: LogWriter = match item.field("path") {
            None => Box::new(io::stderr()),
            Some(f) => Box::new(
                std::fs::File::create(&f.value)
                    .map_err(|_| item.bad_value(f, "a file path that can be created"))?,
            ),
        };
        Ok(LoggingConfig { to })
    }
}

/// Builds `logging(path=…)` over `below` as [`LoggingConfig`] reads it, keeping the path for the
/// stack's description (a configuration has no room for it: its one field is the writer).
pub(super) fn logging_from_item<P: PropertySet>(
    item: &ItemSpec,
    below: AnyResource<P>,
) -> Result<AnyResource<P>, ConfigError> {
    let LoggingConfig { to } = LoggingConfig::from_item(item)?;
    let logging = match item.text("path") {
        Some(path) => Logging::with_path(below, to, path),
        None => Logging::new(below, to),
    };
    item.erase(logging)
}

/// Builds `aligned(alignment=…)` over `below`: the alignment is a type parameter, so the text
/// picks one of a few instantiations.
pub(super) fn aligned_from_item<P: PropertySet>(
    item: &ItemSpec,
    below: AnyResource<P>,
) -> Result<AnyResource<P>, ConfigError> {
    use typenum::{U1024, U256, U4096, U512};
    item.check_fields(&["alignment"])?;
    let f = item
        .field("alignment")
        .ok_or_else(|| item.missing("alignment"))?;
    match item.required_size("alignment")? {
        256 => item.layer(AlignedConfig::<U256>::default(), below),
        512 => item.layer(AlignedConfig::<U512>::default(), below),
        1024 => item.layer(AlignedConfig::<U1024>::default(), below),
        4096 => item.layer(AlignedConfig::<U4096>::default(), below),
        _ => Err(item.bad_value(f, "256, 512, 1024 or 4096")),
    }
}

/// Builds `prefetch(device=…)` over `below`, which must give managed memory: checked at run time,
/// since text erases the upstream's type.
pub(super) fn prefetch_from_item<P: PropertySet>(
    item: &ItemSpec,
    below: AnyResource<P>,
) -> Result<AnyResource<P>, ConfigError> {
    use crate::property::{DeviceAccessible, HostAccessible};
    type ManagedMemory = (HostAccessible, DeviceAccessible, Migratable);
    item.check_fields(&["device"])?;
    let device = item.number("device")?.unwrap_or(0);
    let gives = below.properties();
    let managed = below.try_cast::<ManagedMemory>().map_err(|_| {
        item.error(ConfigErrorKind::Properties {
            item: item.name.clone(),
            gives,
            wants: Properties::of_set::<ManagedMemory>(),
        })
    })?;
    item.erase(PrefetchConfig { device }.layer(managed))
}
