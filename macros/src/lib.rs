//! `resource_stack!`, the list syntax for mrstack resource stacks. Use it through `mrstack`.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    braced, AngleBracketedGenericArguments, Expr, Ident, Lit, LitFloat, LitInt, LitStr, Token,
};

/// Builds a resource stack: the first item is the leaf, each following item wraps the one above.
///
/// A field's value may be a size: `512 MiB`, `1.5 GiB`, `64KB`, `"512MB"`, `"1.5GB"`, read at
/// compile time by the convention of the `mrstack-units` crate docs (`KB` = `KiB` = 1024 bytes,
/// decimals truncated to whole bytes). `Pool`'s `initial` above its `max`, or `Binning`'s `min`
/// above its `max`, is a compile error when both are literal sizes.
///
/// ```ignore
/// let mr = resource_stack![
///     Cuda::new(&ctx)?,                     // the leaf: any expression
///     Pool { initial: 1 GiB, max: 8 GiB },  // mrstack::layer::Pool, other fields defaulted
///     Statistics,                           // mrstack::layer::Statistics::default()
/// ];
/// ```
#[proc_macro]
pub fn resource_stack(input: TokenStream) -> TokenStream {
    match syn::parse::<Stack>(input) {
        Ok(stack) => stack.expand().into(),
        Err(e) => e.to_compile_error().into(),
    }
}

struct Stack {
    leaf: Expr,
    layers: Vec<Item>,
}

enum Item {
    /// `Name`, `Name<Args>`, `Name { field: value, … }`: a configuration in `mrstack::layer`.
    Config {
        name: Ident,
        generics: Option<AngleBracketedGenericArguments>,
        fields: Option<Vec<(Ident, TokenStream2)>>,
    },
    /// Any other expression: a value implementing `Layer`.
    Expr(Expr),
}

impl Parse for Stack {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.is_empty() {
            return Err(input.error(
                "resource_stack! needs at least a leaf resource, e.g. resource_stack![Cuda::new(&ctx)?]",
            ));
        }
        let leaf: Expr = input.parse()?;
        let mut layers = Vec::new();
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            layers.push(input.parse()?);
        }
        Ok(Stack { leaf, layers })
    }
}

fn starts_uppercase(ident: &Ident) -> bool {
    ident
        .to_string()
        .starts_with(|c: char| c.is_ascii_uppercase())
}

impl Parse for Item {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let fork = input.fork();
        if let Ok(name) = fork.parse::<Ident>() {
            let config_like = starts_uppercase(&name)
                && (fork.is_empty()
                    || fork.peek(Token![,])
                    || fork.peek(syn::token::Brace)
                    || fork.peek(Token![<])
                    || fork.peek(Token![::]) && fork.peek3(Token![<]));
            if config_like {
                let name: Ident = input.parse()?;
                let generics = if input.peek(Token![<]) || input.peek(Token![::]) {
                    Some(input.parse::<AngleBracketedGenericArguments>()?)
                } else {
                    None
                };
                let fields = if input.peek(syn::token::Brace) {
                    let content;
                    braced!(content in input);
                    let fields: Vec<Field> =
                        Punctuated::<Field, Token![,]>::parse_terminated(&content)?
                            .into_iter()
                            .collect();
                    check_order(&name, &fields)?;
                    Some(fields.into_iter().map(|f| (f.name, f.value)).collect())
                } else {
                    None
                };
                if !(input.is_empty() || input.peek(Token![,])) {
                    return Err(input.error(
                        "expected `,` or the end of the list after a layer: each line is `Name`, `Name { field: value, … }` or an expression",
                    ));
                }
                return Ok(Item::Config {
                    name,
                    generics,
                    fields,
                });
            }
        }
        Ok(Item::Expr(input.parse()?))
    }
}

struct Field {
    name: Ident,
    value: TokenStream2,
    /// The bytes, when the value is a literal size (`2 GiB`, `"512MB"`, `4096`), and where.
    literal: Option<(u64, Span)>,
}

impl Parse for Field {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        // A literal alone before the `,` (`4096`, `512MiB`, `1.5GiB`); one followed by an operator
        // (`1 << 40`) is an expression.
        let lone = || {
            let fork = input.fork();
            fork.parse::<Lit>().is_ok() && (fork.is_empty() || fork.peek(Token![,]))
        };
        let (value, literal) = if (input.peek(LitInt) || input.peek(LitFloat)) && input.peek2(Ident)
        {
            // `512 MiB`, `1.5 GiB`.
            let (number, suffix, span) = number(input.parse()?)?;
            let unit: Ident = input.parse()?;
            let span = span.join(unit.span()).unwrap_or(span);
            if !suffix.is_empty() {
                return Err(syn::Error::new(
                    span,
                    format!("a size is a number and a unit, as `{number} {unit}`: drop the `{suffix}` suffix"),
                ));
            }
            size_tokens(&number, &unit.to_string(), span)?
        } else if (input.peek(LitInt) || input.peek(LitFloat)) && lone() {
            let lit: Lit = input.parse()?;
            let (number, suffix, span) = number(lit.clone())?;
            match suffix.as_str() {
                // An integer type suffix is the user's choice of type: keep it.
                "" | "usize" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128" | "i8" | "i16"
                | "i32" | "i64" | "i128"
                    if matches!(lit, Lit::Int(_)) =>
                {
                    let bytes = number.parse().ok().map(|n| (n, span));
                    (lit.into_token_stream(), bytes)
                }
                // `1.5` or `1.5f64`: a float, not a size; the field's type decides.
                "" | "f32" | "f64" => (lit.into_token_stream(), None),
                unit => size_tokens(&number, unit, span)?,
            }
        } else if input.peek(LitStr) {
            let s: LitStr = input.parse()?;
            let text = s.value();
            if text
                .trim_start()
                .starts_with(|c: char| c.is_ascii_digit() || c == '.')
            {
                let bytes = mrstack_units::parse_size(&text)
                    .map_err(|e| syn::Error::new(s.span(), format!("bad size `{text}`: {e}")))?;
                (usize_tokens(bytes, s.span()), Some((bytes, s.span())))
            } else {
                (s.into_token_stream(), None)
            }
        } else {
            (input.parse::<Expr>()?.into_token_stream(), None)
        };
        Ok(Field {
            name,
            value,
            literal,
        })
    }
}

/// A number literal's digits (base 10, `_` kept out), its suffix and its span.
fn number(lit: Lit) -> syn::Result<(String, String, Span)> {
    match lit {
        Lit::Int(n) => Ok((
            n.base10_digits().to_owned(),
            n.suffix().to_owned(),
            n.span(),
        )),
        Lit::Float(n) => Ok((
            n.base10_digits().to_owned(),
            n.suffix().to_owned(),
            n.span(),
        )),
        other => Err(syn::Error::new(other.span(), "expected a number")),
    }
}

/// The number of bytes in `number unit`, as a `usize` literal with the bytes, or an error at `span`.
fn size_tokens(
    number: &str,
    unit: &str,
    span: Span,
) -> syn::Result<(TokenStream2, Option<(u64, Span)>)> {
    let bytes = parse_size(number, unit).map_err(|msg| syn::Error::new(span, msg))?;
    Ok((usize_tokens(bytes, span), Some((bytes, span))))
}

/// `bytes` as a `usize` literal placed at `span`, the size as written, but marked as made by the
/// macro: lints about literals (`0.5 GiB` becoming `524288usize` looks zero-prefixed) skip it.
fn usize_tokens(bytes: u64, span: Span) -> TokenStream2 {
    let span = Span::call_site().located_at(span);
    LitInt::new(&format!("{bytes}usize"), span).into_token_stream()
}

/// The bytes in `number unit`, or the message for the user: the rules are mrstack-units', shared
/// with text configs.
fn parse_size(number: &str, unit: &str) -> Result<u64, String> {
    mrstack_units::size_of(number, unit).map_err(|e| format!("bad size `{number} {unit}`: {e}"))
}

/// Fields of a configuration whose first may not exceed its second: `(configuration, low, high)`.
const ORDERED: [(&str, &str, &str); 2] = [("Pool", "initial", "max"), ("Binning", "min", "max")];

/// `Err` at the later of the two fields when both of a pair in [`ORDERED`] are literal sizes and
/// contradict each other, as `Pool { initial: 2 GiB, max: 1 GiB }`.
fn check_order(name: &Ident, fields: &[Field]) -> syn::Result<()> {
    let literal = |wanted: &str| {
        fields
            .iter()
            .position(|f| f.name == wanted)
            .and_then(|i| fields[i].literal.map(|(bytes, span)| (i, bytes, span)))
    };
    for (config, low, high) in ORDERED {
        if name != config {
            continue;
        }
        if let (Some((i, lo, lo_span)), Some((j, hi, hi_span))) = (literal(low), literal(high)) {
            if lo > hi {
                let span = if i > j { lo_span } else { hi_span };
                return Err(syn::Error::new(
                    span,
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

/// The path of the mrstack crate as the calling crate names it: `::mrstack`, or `::mrs` for a
/// user who renamed the dependency (`mrs = { package = "mrstack", … }`). Inside mrstack itself
/// (its tests and examples included) `::mrstack` works: the library declares
/// `extern crate self as mrstack`.
///
/// The path carries `span`, the line's, so that an error in a line points at that line.
fn crate_path(name: &str, span: proc_macro2::Span) -> TokenStream2 {
    let ident = syn::Ident::new(name, span);
    quote_spanned!(span=> ::#ident)
}

/// The name the calling crate knows mrstack by.
fn crate_name() -> String {
    match proc_macro_crate::crate_name("mrstack") {
        Ok(proc_macro_crate::FoundCrate::Name(name)) => name,
        Ok(proc_macro_crate::FoundCrate::Itself) | Err(_) => "mrstack".to_owned(),
    }
}

impl Stack {
    fn expand(self) -> TokenStream2 {
        let krate_name = crate_name();
        let mut acc = self.leaf.to_token_stream();
        for layer in self.layers {
            let (config, span) = match layer {
                Item::Config {
                    name,
                    generics,
                    fields,
                } => {
                    let span = name.span();
                    let krate = crate_path(&krate_name, span);
                    let generics = generics.map(|g| {
                        let args = g.args;
                        quote!(::<#args>)
                    });
                    let path = quote_spanned!(span=> #krate::layer::#name #generics);
                    let config = match fields {
                        None => {
                            quote_spanned!(span=> <#path as ::core::default::Default>::default())
                        }
                        Some(fields) => {
                            let fields = fields.iter().map(|(f, v)| quote!(#f: #v));
                            // A `let` so that the lint attribute is allowed: naming every field
                            // makes the `..Default::default()` needless, which is fine here.
                            quote_spanned!(span=> {
                                #[allow(clippy::needless_update)]
                                let config = #path { #(#fields,)* ..::core::default::Default::default() };
                                config
                            })
                        }
                    };
                    (config, span)
                }
                Item::Expr(e) => {
                    let span = e.span();
                    (e.into_token_stream(), span)
                }
            };
            let krate = crate_path(&krate_name, span);
            acc = quote_spanned!(span=> #krate::Layer::layer(#config, #acc));
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512", "MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1", "GB"), Ok(1 << 30));
        assert_eq!(parse_size("1.5", "GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4_096", ""), Ok(4096));
        assert!(parse_size("1", "GiBs")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_size("99999999999", "TiB")
            .unwrap_err()
            .contains("64 bits"));
    }
}
