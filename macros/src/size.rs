//! The values of a configuration's fields: which fields are sizes or counts, how a size is read,
//! and the errors for the ways it is miswritten.

use proc_macro2::{Span, TokenStream as TokenStream2, TokenTree};
use quote::{quote, ToTokens};
use syn::parse::ParseStream;
use syn::{Expr, Ident, Lit, LitFloat, LitInt, LitStr, Token};

/// The fields that hold bytes, by configuration: a number there needs a unit.
const SIZES: [(&str, &str); 13] = [
    ("Pool", "initial"),
    ("Pool", "max"),
    ("Tlsf", "initial"),
    ("Tlsf", "max"),
    ("Binning", "min"),
    ("Binning", "max"),
    ("Arena", "size"),
    ("Arena", "superblock"),
    ("FixedSize", "block_size"),
    ("Limiting", "limit"),
    ("ThreadCache", "bytes"),
    ("ThreadCache", "max_block"),
    ("ThreadHeaps", "max"),
];

/// The `usize` fields that count something other than bytes: a unit there is a mistake.
const COUNTS: [(&str, &str); 2] = [
    ("FixedSize", "blocks_to_preallocate"),
    ("Prefetch", "device"),
];

/// What the macro knows of a field's meaning. A field it does not know (a misspelt one, say) is
/// passed on as written, sizes converted, for the compiler to judge.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Size,
    Count,
    Unknown,
}

/// The field whose value is being read: its configuration, its name and what it holds.
struct Field<'a> {
    config: &'a Ident,
    name: &'a Ident,
    kind: Kind,
}

impl<'a> Field<'a> {
    fn new(config: &'a Ident, name: &'a Ident) -> Self {
        let is = |table: &[(&str, &str)]| table.iter().any(|&(c, f)| config == c && name == f);
        let kind = if is(&SIZES) {
            Kind::Size
        } else if is(&COUNTS) {
            Kind::Count
        } else {
            Kind::Unknown
        };
        Field { config, name, kind }
    }

    /// The value of `number unit` (`written` so), or the error for it.
    fn sized(&self, number: &str, unit: &str, written: TokenStream2) -> syn::Result<Value> {
        let bytes = mrstack_units::size_of(number, unit).map_err(|e| {
            syn::Error::new_spanned(&written, format!("bad size `{number} {unit}`: {e}"))
        })?;
        if self.kind == Kind::Count {
            return Err(self.count_with_unit(written));
        }
        Ok(Value::literal(bytes, written))
    }

    /// The error for a number literal without a unit in a size field, the number as written
    /// (`1_024`) less its type suffix.
    fn needs_unit(&self, lit: &Lit, suffix: &str) -> syn::Error {
        let Field { config, name, .. } = self;
        let text = lit.to_token_stream().to_string();
        let number = text.strip_suffix(suffix).unwrap_or(&text);
        syn::Error::new(
            lit.span(),
            format!(
                "`{config}`'s `{name}` is a size, and `{number}` has no unit: write `{number} B` for bytes, or another unit (`{number} MiB`); an expression (`1 << 20`, a variable) is taken as bytes"
            ),
        )
    }

    fn count_with_unit(&self, written: TokenStream2) -> syn::Error {
        let Field { config, name, .. } = self;
        syn::Error::new_spanned(
            written,
            format!("`{config}`'s `{name}` is a count, not a size: drop the unit"),
        )
    }
}

/// A field's value as the expansion writes it, with its bytes when it is a literal size.
pub(crate) struct Value {
    pub(crate) tokens: TokenStream2,
    /// The bytes and the size as written, for an error about them.
    bytes: Option<(u64, TokenStream2)>,
}

impl Value {
    fn literal(bytes: u64, written: TokenStream2) -> Self {
        let span = written
            .clone()
            .into_iter()
            .next()
            .map_or_else(Span::call_site, |t| t.span());
        Value {
            tokens: usize_tokens(bytes, span),
            bytes: Some((bytes, written)),
        }
    }

    fn expression(tokens: TokenStream2) -> Self {
        Value {
            tokens,
            bytes: None,
        }
    }
}

/// True for an identifier that names a unit (`B`, `KiB`, `MB`, …).
fn is_unit(ident: &Ident) -> bool {
    let unit = ident.to_string();
    mrstack_units::UNITS.iter().any(|&(name, _)| name == unit)
}

/// Reads the value of field `name` of configuration `config`, up to (not including) the `,` or
/// the end of the braces that follow it.
pub(crate) fn parse_value(input: ParseStream, config: &Ident, name: &Ident) -> syn::Result<Value> {
    let field = Field::new(config, name);
    let number_next = input.peek(LitInt) || input.peek(LitFloat);
    // `512 MiB`; but `64 max: …` is a number with its comma missing, left for the caller to say.
    if number_next && input.peek2(Ident) && !input.peek3(Token![:]) {
        let lit: Lit = input.parse()?;
        let unit: Ident = input.parse()?;
        let (number, suffix) = number(&lit);
        let written = quote!(#lit #unit);
        if !suffix.is_empty() {
            return Err(syn::Error::new_spanned(
                written,
                format!("a size is a number and a unit, as `{number} {unit}`: drop the `{suffix}` suffix"),
            ));
        }
        return field.sized(&number, &unit.to_string(), written);
    }
    let lone = || {
        let fork = input.fork();
        fork.parse::<Lit>().is_ok() && (fork.is_empty() || fork.peek(Token![,]))
    };
    if number_next && lone() {
        let lit: Lit = input.parse()?;
        let (number, suffix) = number(&lit);
        let integer = matches!(lit, Lit::Int(_));
        return match suffix.as_str() {
            // An integer type suffix is the user's choice of type: keep it.
            "" | "usize" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128" | "i8" | "i16"
            | "i32" | "i64" | "i128"
                if integer =>
            {
                let value: Option<u64> = number.parse().ok();
                // Zero bytes is zero in any unit: `initial: 0` needs none.
                if field.kind == Kind::Size && value != Some(0) {
                    return Err(field.needs_unit(&lit, &suffix));
                }
                let written = lit.to_token_stream();
                Ok(Value {
                    tokens: written.clone(),
                    bytes: value.map(|n| (n, written)),
                })
            }
            // `1.5` or `1.5f64`: a float, not a size; the field's type decides.
            "" | "f32" | "f64" => {
                if field.kind == Kind::Size {
                    return Err(field.needs_unit(&lit, &suffix));
                }
                Ok(Value::expression(lit.into_token_stream()))
            }
            unit => field.sized(&number, unit, lit.to_token_stream()),
        };
    }
    if input.peek(LitStr) {
        let s: LitStr = input.parse()?;
        let text = s.value();
        let trimmed = text.trim();
        if !trimmed.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return Ok(Value::expression(s.into_token_stream()));
        }
        let bytes = mrstack_units::parse_size(&text)
            .map_err(|e| syn::Error::new(s.span(), format!("bad size `{text}`: {e}")))?;
        let has_unit = trimmed.ends_with(|c: char| c.is_ascii_alphabetic());
        if field.kind == Kind::Size && !has_unit && bytes != 0 {
            return Err(syn::Error::new(
                s.span(),
                format!(
                    "`{config}`'s `{name}` is a size, and `\"{trimmed}\"` has no unit: write \"{trimmed} B\" for bytes, or another unit (\"{trimmed} MiB\")"
                ),
            ));
        }
        if field.kind == Kind::Count && has_unit {
            return Err(field.count_with_unit(s.to_token_stream()));
        }
        return Ok(Value::literal(bytes, s.into_token_stream()));
    }
    let expr: Expr = input.parse()?;
    if input.peek(Ident) && !input.peek2(Token![:]) {
        let fork = input.fork();
        let unit: Ident = fork.parse()?;
        if is_unit(&unit) {
            return Err(unit_after_expression(&expr, &unit));
        }
    }
    Ok(Value::expression(expr.into_token_stream()))
}

/// The error for a unit after something other than a number literal: `n GiB`, `64 * 1024 MiB`.
fn unit_after_expression(expr: &Expr, unit: &Ident) -> syn::Error {
    let written = quote!(#expr #unit);
    if let Expr::Unary(syn::ExprUnary {
        op: syn::UnOp::Neg(_),
        ..
    }) = expr
    {
        return syn::Error::new_spanned(written, "a size is a number of bytes: never negative");
    }
    let shift = mrstack_units::unit_scale(&unit.to_string()).map_or(0, u64::trailing_zeros);
    let text = expr.to_token_stream().to_string();
    // Calls, paths and literals bind tighter than `<<`; anything else needs its parentheses.
    let operand = match expr {
        Expr::Path(_)
        | Expr::Lit(_)
        | Expr::Call(_)
        | Expr::MethodCall(_)
        | Expr::Field(_)
        | Expr::Index(_)
        | Expr::Paren(_) => text.clone(),
        _ => format!("({text})"),
    };
    let bytes = if shift == 0 {
        text
    } else {
        format!("{operand} << {shift}")
    };
    let one_number = match constant(expr) {
        Some(n) => format!("one number, `{n} {unit}`, or "),
        None => String::new(),
    };
    syn::Error::new_spanned(
        written,
        format!(
            "a unit follows a number literal, not an expression: write {one_number}the bytes as a `usize` expression, `{bytes}`"
        ),
    )
}

/// The value of an expression of integer literals, `+` and `*` (`64 * 1024`), if it fits.
fn constant(expr: &Expr) -> Option<u64> {
    match expr {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(n), ..
        }) if n.suffix().is_empty() => n.base10_parse().ok(),
        Expr::Paren(p) => constant(&p.expr),
        Expr::Binary(b) => {
            let (l, r) = (constant(&b.left)?, constant(&b.right)?);
            match b.op {
                syn::BinOp::Add(_) => l.checked_add(r),
                syn::BinOp::Mul(_) => l.checked_mul(r),
                _ => None,
            }
        }
        _ => None,
    }
}

/// A number literal's digits (base 10, `_` kept out) and its suffix.
fn number(lit: &Lit) -> (String, String) {
    match lit {
        Lit::Int(n) => (n.base10_digits().to_owned(), n.suffix().to_owned()),
        Lit::Float(n) => (n.base10_digits().to_owned(), n.suffix().to_owned()),
        _ => (String::new(), String::new()),
    }
}

/// `bytes` as a `usize` literal placed at `span`, the size as written, but marked as made by the
/// macro: lints about literals (`0.5 GiB` becoming `524288usize` looks zero-prefixed) skip it.
fn usize_tokens(bytes: u64, span: Span) -> TokenStream2 {
    let span = Span::call_site().located_at(span);
    LitInt::new(&format!("{bytes}usize"), span).into_token_stream()
}

/// The first `number unit` pair in `tokens`, groups included: a size written where the macro does
/// not read sizes (in an expression), which Rust's grammar cannot parse.
pub(crate) fn unit_in(tokens: TokenStream2) -> Option<syn::Error> {
    let mut previous: Option<TokenTree> = None;
    for tree in tokens {
        match (&previous, &tree) {
            (Some(TokenTree::Literal(lit)), TokenTree::Ident(unit))
                if is_unit(unit) && lit.to_string().starts_with(|c: char| c.is_ascii_digit()) =>
            {
                let shift =
                    mrstack_units::unit_scale(&unit.to_string()).map_or(0, u64::trailing_zeros);
                let bytes = if shift == 0 {
                    lit.to_string()
                } else {
                    format!("{lit} << {shift}")
                };
                return Some(syn::Error::new_spanned(
                    quote!(#lit #unit),
                    format!(
                        "`resource_stack!` reads a size with a unit only as the value of a layer's field (`Pool {{ initial: {lit} {unit} }}`): in an expression write the bytes, `{bytes}`"
                    ),
                ));
            }
            (_, TokenTree::Group(group)) => {
                if let Some(e) = unit_in(group.stream()) {
                    return Some(e);
                }
            }
            _ => {}
        }
        previous = Some(tree);
    }
    None
}

/// Fields of a configuration whose first may not exceed its second: `(configuration, low, high)`.
const ORDERED: [(&str, &str, &str); 4] = [
    ("Pool", "initial", "max"),
    ("ThreadCache", "max_block", "bytes"),
    ("Tlsf", "initial", "max"),
    ("Binning", "min", "max"),
];

/// `Err` at the later of the two fields when both of a pair in [`ORDERED`] are literal sizes and
/// contradict each other, as `Pool { initial: 2 GiB, max: 1 GiB }`.
pub(crate) fn check_order(name: &Ident, fields: &[(Ident, Value)]) -> syn::Result<()> {
    let literal = |wanted: &str| {
        let i = fields.iter().position(|(f, _)| f == wanted)?;
        let (bytes, written) = fields[i].1.bytes.as_ref()?;
        Some((i, *bytes, written))
    };
    for (config, low, high) in ORDERED {
        if name != config {
            continue;
        }
        if let (Some((i, lo, lo_written)), Some((j, hi, hi_written))) =
            (literal(low), literal(high))
        {
            if lo > hi {
                let later = if i > j { lo_written } else { hi_written };
                return Err(syn::Error::new_spanned(
                    later,
                    format!(
                        "`{config}`'s `{low}` ({}) is above its `{high}` ({})",
                        mrstack_units::Bytes(lo),
                        mrstack_units::Bytes(hi)
                    ),
                ));
            }
        }
    }
    Ok(())
}
