//! Resource stacks from text, for tools and configuration files:
//! `"cuda > pool(initial=1GiB, max=8GiB) > binning(min=256KiB, max=4MiB) > statistics"` builds the
//! stack `resource_stack!` would, erased into an [`AnyResource<P>`].
//!
//! The text is a list of items separated by `>`, read bottom-up like the macro's lines: the first
//! is a leaf resource, each next one an adaptor wrapping the one before. An item is a name,
//! optionally followed by `(field=value, …)`. Values are sizes (`4096`, `64 KiB`, `1GiB`: units B,
//! KB/MB/GB/TB in powers of 1000, KiB/MiB/GiB/TiB in powers of 1024, as the macro takes them),
//! whole numbers, or text; text with `,` `(` `)` `>` `=` or `"` in it goes in double quotes
//! (`logging(path="a,b.csv")`, with `\"` and `\\` as escapes).
//!
//! Leaves: `cuda(device=0)`, `cuda_async(device=0, initial=…, release_threshold=…)`,
//! `managed(device=0)`, `pinned(device=0)`, `system`, `simulated(capacity=…)`. Adaptors: those
//! registered on the [`StackBuilder`] (the crate's own, and any the caller adds with
//! [`StackBuilder::with_adaptor`]).
//!
//! Every malformed input is an `Err` naming the column and the item: an unknown name, a bad size,
//! a missing or unknown field, a leaf whose memory lacks a property of `P`. Cost: parsing is
//! linear in the text; the built stack costs one virtual call per operation at its top (each
//! adaptor layer over an `AnyResource` adds one more).
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::config;
//!
//! let mr = config::build::<()>("simulated(capacity = 1 GiB)").unwrap();
//! let p = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
//! // SAFETY: p came from mr with this size and alignment.
//! unsafe { mr.deallocate(p, 1 << 20, 256, StreamRef::DEFAULT) };
//!
//! let err = config::build::<DeviceAccessible>("system").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "column 1: `system` gives HostAccessible memory, but the stack must give DeviceAccessible"
//! );
//! ```

use crate::erased::{AnyResource, Properties, PropertySet};
use crate::leaf::{cuda_context, CudaAsync, CudaAsyncOptions, Simulated, System};
use crate::resource::{AllocError, Layer, MemoryResource};
use crate::{Cuda, Managed, Pinned};
use std::fmt;

/// A parsed stack: items bottom (leaf) first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSpec {
    /// The items in the order written: the leaf, then each adaptor over it.
    pub items: Vec<ItemSpec>,
}

/// One item of a stack: `name` or `name(field=value, …)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemSpec {
    /// The resource or adaptor name.
    pub name: String,
    /// The column of the name, counted from 0 in characters.
    pub position: usize,
    /// The fields, in the order written (each name once).
    pub fields: Vec<FieldSpec>,
}

/// One `field=value` of an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldSpec {
    /// The field name.
    pub name: String,
    /// The value, unquoted and trimmed.
    pub value: String,
    /// The column of the field name, from 0.
    pub position: usize,
    /// The column of the value, from 0.
    pub value_position: usize,
}

/// What is wrong with a configuration; [`ConfigError`] adds where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// Nothing but white space.
    #[error(
        "empty configuration: expected a resource such as `cuda` or `simulated(capacity=1GiB)`"
    )]
    Empty,
    /// The text does not follow the grammar here.
    #[error("expected {expected}, found {}", found.map_or("the end of the text".to_string(), |c| format!("`{c}`")))]
    Expected {
        /// What would have been right.
        expected: String,
        /// What is there (`None`: the end of the text).
        found: Option<char>,
    },
    /// A `"` that is never closed.
    #[error("a quoted value is not closed with `\"`")]
    UnterminatedString,
    /// A field given twice in one item.
    #[error("`{item}` has the field `{field}` twice")]
    DuplicateField {
        /// The item.
        item: String,
        /// The field.
        field: String,
    },
    /// A name that is neither a leaf nor a registered adaptor.
    #[error("unknown resource or adaptor `{name}`; known: {known}")]
    Unknown {
        /// The name written.
        name: String,
        /// The names this builder knows, comma-separated.
        known: String,
    },
    /// A leaf resource after the first item.
    #[error("`{name}` is a leaf resource: only the first item may be one (items wrap the one before, as in `cuda > statistics`)")]
    LeafNotFirst {
        /// The leaf's name.
        name: String,
    },
    /// An adaptor as the first item.
    #[error("`{name}` is an adaptor: it needs a leaf resource before it, as in `cuda > {name}`")]
    AdaptorFirst {
        /// The adaptor's name.
        name: String,
    },
    /// A field the item does not take.
    #[error("`{item}` has no field `{field}`; it takes {}", if known.is_empty() { "none" } else { known })]
    UnknownField {
        /// The item.
        item: String,
        /// The field written.
        field: String,
        /// The fields it takes, comma-separated.
        known: String,
    },
    /// A field the item needs and does not have.
    #[error("`{item}` needs the field `{field}`")]
    MissingField {
        /// The item.
        item: String,
        /// The field.
        field: String,
    },
    /// A value that is not a size.
    #[error("bad size `{value}` for `{item}.{field}`: {reason}")]
    BadSize {
        /// The item.
        item: String,
        /// The field.
        field: String,
        /// The value written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value that is not what the field takes (a whole number, one of a few choices).
    #[error("bad value `{value}` for `{item}.{field}`: expected {expected}")]
    BadValue {
        /// The item.
        item: String,
        /// The field.
        field: String,
        /// The value written.
        value: String,
        /// What the field takes.
        expected: String,
    },
    /// An item whose memory lacks a property the stack must give.
    #[error("`{item}` gives {gives} memory, but the stack must give {wants}")]
    Properties {
        /// The item.
        item: String,
        /// What it gives.
        gives: Properties,
        /// What the stack's `P` asks for.
        wants: Properties,
    },
    /// Building the item failed (no driver, no such device, out of memory).
    #[error("`{item}` could not be built: {error}")]
    Resource {
        /// The item.
        item: String,
        /// Why.
        error: AllocError,
    },
}

/// A configuration error at a column of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {}: {kind}", .position + 1)]
pub struct ConfigError {
    /// What is wrong.
    pub kind: ConfigErrorKind,
    /// Where, as a column counted from 0 in characters.
    pub position: usize,
}

impl ConfigError {
    /// An error of `kind` at column `position` (from 0).
    pub fn new(kind: ConfigErrorKind, position: usize) -> Self {
        ConfigError { kind, position }
    }
}

/// Parses a size: `4096`, `64 KiB`, `1GiB`, `1_000 MB` (units B, KB/MB/GB/TB, KiB/MiB/GiB/TiB).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    let (digits, unit) = (&text[..end], text[end..].trim_start());
    if !digits.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("a size is a whole number with an optional unit, e.g. `512 MiB`".into());
    }
    let n: u128 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| "the number is too large".to_string())?;
    let scale: u128 = match unit {
        "" | "B" => 1,
        "KB" => 1000,
        "MB" => 1000_u128.pow(2),
        "GB" => 1000_u128.pow(3),
        "TB" => 1000_u128.pow(4),
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other if other.starts_with('.') => {
            return Err("the number must be a whole number of bytes or units".into())
        }
        other => {
            return Err(format!(
                "unknown unit `{other}`: use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            ))
        }
    };
    n.checked_mul(scale)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| "the size does not fit in usize".to_string())
}

impl ItemSpec {
    /// The field `name`, if given.
    pub fn field(&self, name: &str) -> Option<&FieldSpec> {
        self.fields.iter().find(|f| f.name == name)
    }

    /// An error about this item, at its name.
    pub fn error(&self, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(kind, self.position)
    }

    /// `Err` naming the first field not in `known`.
    pub fn check_fields(&self, known: &[&str]) -> Result<(), ConfigError> {
        match self
            .fields
            .iter()
            .find(|f| !known.contains(&f.name.as_str()))
        {
            None => Ok(()),
            Some(f) => Err(ConfigError::new(
                ConfigErrorKind::UnknownField {
                    item: self.name.clone(),
                    field: f.name.clone(),
                    known: known.join(", "),
                },
                f.position,
            )),
        }
    }

    /// The field `name` as a size in bytes, if given.
    pub fn size(&self, name: &str) -> Result<Option<usize>, ConfigError> {
        let Some(f) = self.field(name) else {
            return Ok(None);
        };
        parse_size(&f.value).map(Some).map_err(|reason| {
            ConfigError::new(
                ConfigErrorKind::BadSize {
                    item: self.name.clone(),
                    field: f.name.clone(),
                    value: f.value.clone(),
                    reason,
                },
                f.value_position,
            )
        })
    }

    /// The field `name` as a size in bytes; `Err` if it is missing.
    pub fn required_size(&self, name: &str) -> Result<usize, ConfigError> {
        self.size(name)?.ok_or_else(|| self.missing(name))
    }

    /// The field `name` as a whole number, if given.
    pub fn number(&self, name: &str) -> Result<Option<usize>, ConfigError> {
        let Some(f) = self.field(name) else {
            return Ok(None);
        };
        let digits = f.value.replace('_', "");
        match digits.parse::<usize>() {
            Ok(n) if digits.starts_with(|c: char| c.is_ascii_digit()) => Ok(Some(n)),
            _ => Err(self.bad_value(f, "a whole number")),
        }
    }

    /// The field `name` as text, if given.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.field(name).map(|f| f.value.as_str())
    }

    /// The error for a field whose value is not what it takes (`expected` says what is).
    pub fn bad_value(&self, field: &FieldSpec, expected: &str) -> ConfigError {
        ConfigError::new(
            ConfigErrorKind::BadValue {
                item: self.name.clone(),
                field: field.name.clone(),
                value: field.value.clone(),
                expected: expected.to_string(),
            },
            field.value_position,
        )
    }

    /// The error for a field the item needs.
    pub fn missing(&self, field: &str) -> ConfigError {
        self.error(ConfigErrorKind::MissingField {
            item: self.name.clone(),
            field: field.to_string(),
        })
    }

    /// Erases `resource`, built for this item, into an `AnyResource<P>`; `Err` naming the item if
    /// its memory lacks a property of `P`.
    pub fn erase<P, R>(&self, resource: R) -> Result<AnyResource<P>, ConfigError>
    where
        P: PropertySet,
        R: MemoryResource + Send + Sync + 'static,
    {
        AnyResource::try_new(resource).map_err(|_| self.lacks::<P, R>())
    }

    /// `Err` if resource type `R` lacks a property of `P`: checked before building a leaf, so a
    /// mismatch is reported as such even where the leaf could not be built.
    fn check_gives<P: PropertySet, R: MemoryResource>(&self) -> Result<(), ConfigError> {
        if Properties::of::<R>().includes(&Properties::of_set::<P>()) {
            Ok(())
        } else {
            Err(self.lacks::<P, R>())
        }
    }

    fn lacks<P: PropertySet, R: MemoryResource>(&self) -> ConfigError {
        self.error(ConfigErrorKind::Properties {
            item: self.name.clone(),
            gives: Properties::of::<R>(),
            wants: Properties::of_set::<P>(),
        })
    }

    /// Wraps `below` in the adaptor `config` builds and erases the result: what an adaptor
    /// registered with [`StackBuilder::with_adaptor`] usually ends with.
    pub fn layer<P, C>(
        &self,
        config: C,
        below: AnyResource<P>,
    ) -> Result<AnyResource<P>, ConfigError>
    where
        P: PropertySet,
        C: Layer<AnyResource<P>>,
        C::Resource: Send + Sync + 'static,
    {
        self.erase(config.layer(below))
    }

    fn resource_error(&self, error: AllocError) -> ConfigError {
        self.error(ConfigErrorKind::Resource {
            item: self.name.clone(),
            error,
        })
    }
}

/// The leaf resources, by name.
const LEAVES: &[&str] = &[
    "cuda",
    "cuda_async",
    "managed",
    "pinned",
    "system",
    "simulated",
];

/// Builds the leaf `item` names; `Ok(None)` when it names no leaf.
fn leaf<P: PropertySet>(item: &ItemSpec) -> Result<Option<AnyResource<P>>, ConfigError> {
    let device = || -> Result<usize, ConfigError> { Ok(item.number("device")?.unwrap_or(0)) };
    let err = |e| item.resource_error(e);
    let any = match item.name.as_str() {
        "cuda" => {
            item.check_fields(&["device"])?;
            item.check_gives::<P, Cuda>()?;
            item.erase(Cuda::on_device(device()?).map_err(err)?)
        }
        "cuda_async" => {
            item.check_fields(&["device", "initial", "release_threshold"])?;
            item.check_gives::<P, CudaAsync>()?;
            let options = CudaAsyncOptions {
                initial_pool_size: item.size("initial")?,
                release_threshold: item.size("release_threshold")?,
            };
            let ctx = cuda_context(device()?).map_err(err)?;
            item.erase(CudaAsync::with_options(&ctx, options).map_err(err)?)
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
        "system" => {
            item.check_fields(&[])?;
            item.erase(System::new())
        }
        "simulated" => {
            item.check_fields(&["capacity"])?;
            item.erase(Simulated::new(item.required_size("capacity")?))
        }
        _ => return Ok(None),
    };
    any.map(Some)
}

type AdaptorFn<P> =
    dyn Fn(&ItemSpec, AnyResource<P>) -> Result<AnyResource<P>, ConfigError> + Send + Sync;

/// Builds stacks from text: the leaves above and the adaptors registered by name.
///
/// ```
/// use mrstack::config::StackBuilder;
/// use mrstack::prelude::*;
///
/// // A caller's own adaptor, taking one field.
/// struct Tag(&'static str);
/// let builder = StackBuilder::<()>::new().with_adaptor("tagged", |item, below| {
///     item.check_fields(&["label"])?;
///     item.text("label").ok_or_else(|| item.missing("label"))?;
///     Ok(below) // a real adaptor would wrap `below`, e.g. with `item.layer(config, below)`
/// });
/// assert!(builder.build("simulated(capacity=1MiB) > tagged(label=\"a, b\")").is_ok());
/// let err = builder.build("simulated(capacity=1MiB) > tagged").unwrap_err();
/// assert_eq!(err.to_string(), "column 28: `tagged` needs the field `label`");
/// ```
pub struct StackBuilder<P: PropertySet> {
    adaptors: Vec<(String, Box<AdaptorFn<P>>)>,
}

impl<P: PropertySet> StackBuilder<P> {
    /// A builder that knows the leaves and this crate's adaptors.
    pub fn new() -> Self {
        Self::without_adaptors().with_crate_adaptors()
    }

    /// A builder that knows the leaves only.
    pub fn without_adaptors() -> Self {
        StackBuilder {
            adaptors: Vec::new(),
        }
    }

    /// Registers this crate's adaptors under their text names; `new` calls it. Each is one
    /// `with_adaptor(name, |item, below| …)` that checks the item's fields, builds the adaptor's
    /// `Layer` configuration from them and ends with [`ItemSpec::layer`]; an adaptor that needs a
    /// property of its upstream (`prefetch`: `Migratable`) first takes it with
    /// [`AnyResource::try_cast`]. A name not registered here is an unknown adaptor.
    fn with_crate_adaptors(self) -> Self {
        self.with_adaptor("pool", |item, below| {
            item.check_fields(&["initial", "max"])?;
            let defaults = crate::layer::Pool::default();
            let config = crate::layer::Pool {
                initial: item.size("initial")?.unwrap_or(defaults.initial),
                max: item.size("max")?.unwrap_or(defaults.max),
            };
            item.layer(config, below)
        })
        .with_adaptor("binning", |item, below| {
            item.check_fields(&["min", "max"])?;
            let defaults = crate::layer::Binning::default();
            let config = crate::layer::Binning {
                min: item.size("min")?.unwrap_or(defaults.min),
                max: item.size("max")?.unwrap_or(defaults.max),
            };
            item.layer(config, below)
        })
        .with_adaptor("fixed_size", |item, below| {
            item.check_fields(&["block_size", "blocks_to_preallocate"])?;
            let defaults = crate::layer::FixedSize::default();
            let config = crate::layer::FixedSize {
                block_size: item.size("block_size")?.unwrap_or(defaults.block_size),
                blocks_to_preallocate: item
                    .number("blocks_to_preallocate")?
                    .unwrap_or(defaults.blocks_to_preallocate),
            };
            item.layer(config, below)
        })
        .with_adaptor("arena", |item, below| {
            item.check_fields(&["size", "superblock"])?;
            let defaults = crate::layer::Arena::default();
            let config = crate::layer::Arena {
                size: item.size("size")?.unwrap_or(defaults.size),
                superblock: item.size("superblock")?.unwrap_or(defaults.superblock),
            };
            item.layer(config, below)
        })
        .with_adaptor("statistics", |item, below| {
            item.check_fields(&[])?;
            item.layer(crate::layer::Statistics::default(), below)
        })
        .with_adaptor("tracking", |item, below| {
            item.check_fields(&["backtraces"])?;
            let backtraces = match item.field("backtraces") {
                None => false,
                Some(f) => match f.value.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => return Err(item.bad_value(f, "true or false")),
                },
            };
            item.layer(crate::layer::Tracking { backtraces }, below)
        })
        .with_adaptor("limiting", |item, below| {
            item.check_fields(&["limit"])?;
            let limit = item.required_size("limit")?;
            item.layer(crate::layer::Limiting { limit }, below)
        })
        .with_adaptor("logging", |item, below| {
            item.check_fields(&["path"])?;
            let to: crate::adaptor::LogWriter = match item.field("path") {
                None => Box::new(std::io::stderr()),
                Some(f) => Box::new(
                    std::fs::File::create(&f.value)
                        .map_err(|_| item.bad_value(f, "a file path that can be created"))?,
                ),
            };
            item.layer(crate::layer::Logging { to }, below)
        })
        .with_adaptor("aligned", |item, below| {
            use typenum::{U1024, U256, U4096, U512};
            item.check_fields(&["alignment"])?;
            let f = item
                .field("alignment")
                .ok_or_else(|| item.missing("alignment"))?;
            // The alignment is a type parameter: text picks one of a few instantiations.
            match item.required_size("alignment")? {
                256 => item.layer(crate::layer::Aligned::<U256>::default(), below),
                512 => item.layer(crate::layer::Aligned::<U512>::default(), below),
                1024 => item.layer(crate::layer::Aligned::<U1024>::default(), below),
                4096 => item.layer(crate::layer::Aligned::<U4096>::default(), below),
                _ => Err(item.bad_value(f, "256, 512, 1024 or 4096")),
            }
        })
        .with_adaptor("prefetch", |item, below| {
            use crate::property::{DeviceAccessible, HostAccessible, Migratable};
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
            let prefetch = crate::layer::Prefetch { device }.layer(managed);
            item.erase(prefetch)
        })
    }

    /// Registers an adaptor under `name` (replacing one of that name): `build(item, below)` checks
    /// `item`'s fields and wraps `below`.
    pub fn with_adaptor(
        mut self,
        name: &str,
        build: impl Fn(&ItemSpec, AnyResource<P>) -> Result<AnyResource<P>, ConfigError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.adaptors.retain(|(n, _)| n != name);
        self.adaptors.push((name.to_string(), Box::new(build)));
        self
    }

    /// The names of the leaves and registered adaptors.
    pub fn names(&self) -> Vec<&str> {
        LEAVES
            .iter()
            .copied()
            .chain(self.adaptors.iter().map(|(n, _)| n.as_str()))
            .collect()
    }

    fn adaptor(&self, name: &str) -> Option<&AdaptorFn<P>> {
        self.adaptors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| &**f)
    }

    fn unknown(&self, item: &ItemSpec) -> ConfigError {
        item.error(ConfigErrorKind::Unknown {
            name: item.name.clone(),
            known: self.names().join(", "),
        })
    }

    /// Parses `text` and builds the stack it describes.
    pub fn build(&self, text: &str) -> Result<AnyResource<P>, ConfigError> {
        self.build_spec(&text.parse()?)
    }

    /// Builds the stack `spec` describes.
    pub fn build_spec(&self, spec: &StackSpec) -> Result<AnyResource<P>, ConfigError> {
        let (first, rest) = spec
            .items
            .split_first()
            .ok_or(ConfigError::new(ConfigErrorKind::Empty, 0))?;
        let mut stack = match leaf::<P>(first)? {
            Some(built) => built,
            None if self.adaptor(&first.name).is_some() => {
                return Err(first.error(ConfigErrorKind::AdaptorFirst {
                    name: first.name.clone(),
                }))
            }
            None => return Err(self.unknown(first)),
        };
        for item in rest {
            if LEAVES.contains(&item.name.as_str()) {
                return Err(item.error(ConfigErrorKind::LeafNotFirst {
                    name: item.name.clone(),
                }));
            }
            let build = self.adaptor(&item.name).ok_or_else(|| self.unknown(item))?;
            stack = build(item, stack)?;
        }
        Ok(stack)
    }
}

impl<P: PropertySet> Default for StackBuilder<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: PropertySet> fmt::Debug for StackBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder")
            .field("names", &self.names())
            .finish()
    }
}

/// Builds the stack `text` describes with the leaves and this crate's adaptors.
pub fn build<P: PropertySet>(text: &str) -> Result<AnyResource<P>, ConfigError> {
    StackBuilder::new().build(text)
}

impl std::str::FromStr for StackSpec {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, ConfigError> {
        Parser {
            chars: text.chars().collect(),
            pos: 0,
        }
        .stack()
    }
}

/// A recursive-descent parser over the characters of the text; positions are character indices.
struct Parser {
    chars: Vec<char>,
    pos: usize,
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Characters that end an unquoted value.
fn ends_raw_value(c: char) -> bool {
    matches!(c, ',' | '(' | ')' | '>' | '=' | '"')
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn expected(&self, expected: impl Into<String>) -> ConfigError {
        ConfigError::new(
            ConfigErrorKind::Expected {
                expected: expected.into(),
                found: self.peek(),
            },
            self.pos,
        )
    }

    fn name(&mut self, what: &str) -> Result<(String, usize), ConfigError> {
        self.skip_space();
        let start = self.pos;
        if !self.peek().is_some_and(is_name_start) {
            return Err(self.expected(what));
        }
        while self.peek().is_some_and(is_name_char) {
            self.pos += 1;
        }
        Ok((self.chars[start..self.pos].iter().collect(), start))
    }

    fn stack(mut self) -> Result<StackSpec, ConfigError> {
        self.skip_space();
        if self.peek().is_none() {
            return Err(ConfigError::new(ConfigErrorKind::Empty, self.pos));
        }
        let mut items = vec![self.item()?];
        loop {
            self.skip_space();
            match self.peek() {
                None => return Ok(StackSpec { items }),
                Some('>') => {
                    self.pos += 1;
                    items.push(self.item()?);
                }
                Some(_) => return Err(self.expected("`>` between items, or the end")),
            }
        }
    }

    fn item(&mut self) -> Result<ItemSpec, ConfigError> {
        let (name, position) = self.name("a resource or adaptor name")?;
        let mut item = ItemSpec {
            name,
            position,
            fields: Vec::new(),
        };
        self.skip_space();
        if self.peek() != Some('(') {
            return Ok(item);
        }
        self.pos += 1;
        loop {
            self.skip_space();
            if self.peek() == Some(')') {
                self.pos += 1;
                return Ok(item);
            }
            let field = self.field(&item.name)?;
            if item.field(&field.name).is_some() {
                return Err(ConfigError::new(
                    ConfigErrorKind::DuplicateField {
                        item: item.name.clone(),
                        field: field.name,
                    },
                    field.position,
                ));
            }
            let after = format!("`,` or `)` after the value of `{}`", field.name);
            item.fields.push(field);
            self.skip_space();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(')') => {
                    self.pos += 1;
                    return Ok(item);
                }
                _ => return Err(self.expected(after)),
            }
        }
    }

    fn field(&mut self, item: &str) -> Result<FieldSpec, ConfigError> {
        let (name, position) = self.name(&format!("a field name of `{item}`, or `)`"))?;
        self.skip_space();
        if self.peek() != Some('=') {
            return Err(self.expected(format!("`=` after the field `{name}`")));
        }
        self.pos += 1;
        self.skip_space();
        let value_position = self.pos;
        let value = if self.peek() == Some('"') {
            self.quoted()?
        } else {
            while self.peek().is_some_and(|c| !ends_raw_value(c)) {
                self.pos += 1;
            }
            let raw: String = self.chars[value_position..self.pos].iter().collect();
            let raw = raw.trim_end().to_string();
            if raw.is_empty() {
                self.pos = value_position;
                return Err(self.expected(format!("a value for `{name}`")));
            }
            raw
        };
        Ok(FieldSpec {
            name,
            value,
            position,
            value_position,
        })
    }

    fn quoted(&mut self) -> Result<String, ConfigError> {
        let start = self.pos;
        self.pos += 1;
        let mut value = String::new();
        loop {
            match self.peek() {
                None => return Err(ConfigError::new(ConfigErrorKind::UnterminatedString, start)),
                Some('"') => {
                    self.pos += 1;
                    return Ok(value);
                }
                Some('\\') if matches!(self.chars.get(self.pos + 1), Some('"' | '\\')) => {
                    value.push(self.chars[self.pos + 1]);
                    self.pos += 2;
                }
                Some(c) => {
                    value.push(c);
                    self.pos += 1;
                }
            }
        }
    }
}

impl fmt::Display for FieldSpec {
    /// `name=value`, quoting the value when it would not read back unquoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = &self.value;
        let plain = !v.is_empty()
            && !v.contains(ends_raw_value)
            && !v.starts_with(char::is_whitespace)
            && !v.ends_with(char::is_whitespace);
        if plain {
            write!(f, "{}={v}", self.name)
        } else {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"");
            write!(f, "{}=\"{escaped}\"", self.name)
        }
    }
}

impl fmt::Display for ItemSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        if !self.fields.is_empty() {
            f.write_str("(")?;
            for (i, field) in self.fields.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{field}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Display for StackSpec {
    /// The stack as text that parses back to the same items.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(" > ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 64 KiB "), Ok(64 << 10));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1_000 MB"), Ok(1_000_000_000));
        assert_eq!(parse_size("2TB"), Ok(2_000_000_000_000));
        assert!(parse_size("1.5GiB").unwrap_err().contains("whole number"));
        assert!(parse_size("1 gib")
            .unwrap_err()
            .contains("unknown unit `gib`"));
        assert!(parse_size("GiB").unwrap_err().contains("whole number"));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999 TiB")
            .unwrap_err()
            .contains("does not fit"));
    }
}
