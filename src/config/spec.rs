//! A parsed configuration: a stack of items, each a name with fields; what builders read them with.

use super::{ConfigError, ConfigErrorKind};
use crate::erased::{AnyResource, Properties, PropertySet};
use crate::resource::{AllocError, Layer, MemoryResource};
use crate::stack::write_value;
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
        let bytes = crate::units::parse_size(&f.value)
            .map_err(|e| e.to_string())
            .and_then(|n| {
                usize::try_from(n).map_err(|_| "the size does not fit in usize".to_string())
            });
        bytes.map(Some).map_err(|reason| {
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

    /// The field `name` as a size in bytes, or `default` if it is not given.
    pub fn size_or(&self, name: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.size(name)?.unwrap_or(default))
    }

    /// The field `name` as a size in bytes; `Err` if it is missing.
    pub fn required_size(&self, name: &str) -> Result<usize, ConfigError> {
        self.size(name)?.ok_or_else(|| self.missing(name))
    }

    /// `Err` if `low_value` (field `low`, given or defaulted) is above `high_value` (field `high`),
    /// at the later-written of the two fields: the column where the item stops making sense.
    pub fn check_order(
        &self,
        (low, low_value): (&str, usize),
        (high, high_value): (&str, usize),
    ) -> Result<(), ConfigError> {
        if low_value <= high_value {
            return Ok(());
        }
        let position = [self.field(low), self.field(high)]
            .into_iter()
            .flatten()
            .map(|f| f.position)
            .max()
            .unwrap_or(self.position);
        Err(ConfigError::new(
            ConfigErrorKind::Contradiction {
                item: self.name.clone(),
                low: low.to_string(),
                low_value,
                high: high.to_string(),
                high_value,
            },
            position,
        ))
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

    /// The field `name` as `true` or `false`, or `default` if it is not given.
    pub fn flag_or(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.field(name) {
            None => Ok(default),
            Some(f) => match f.value.as_str() {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(self.bad_value(f, "true or false")),
            },
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
    pub(super) fn check_gives<P: PropertySet, R: MemoryResource>(&self) -> Result<(), ConfigError> {
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
    /// registered with [`StackBuilder::with_adaptor`](super::StackBuilder::with_adaptor) usually ends with.
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

    /// The error for an item whose resource could not be built (its constructor's `Err`).
    pub fn resource_error(&self, error: AllocError) -> ConfigError {
        self.error(ConfigErrorKind::Resource {
            item: self.name.clone(),
            error,
        })
    }
}

impl fmt::Display for FieldSpec {
    /// `name=value`, quoting the value when it would not read back unquoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.name)?;
        write_value(f, &self.value)
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
