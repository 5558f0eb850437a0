//! The grammar of text configurations: `leaf(field=value, …) > adaptor > …`, parsed by recursive descent.

use super::{ConfigError, ConfigErrorKind, FieldSpec, ItemSpec, StackSpec};
use crate::stack::ends_raw_value;
use std::collections::HashSet;

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
        // The names seen so far, so that a repeated one is found in constant time: a linear
        // search per field would make parsing quadratic in the number of fields.
        let mut seen = HashSet::new();
        loop {
            self.skip_space();
            if self.peek() == Some(')') {
                self.pos += 1;
                return Ok(item);
            }
            let field = self.field(&item.name)?;
            if !seen.insert(field.name.clone()) {
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
