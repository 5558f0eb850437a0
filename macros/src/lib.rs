//! `resource_stack!`, the list syntax for mrstack resource stacks. Use it through `mrstack`.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{braced, AngleBracketedGenericArguments, Expr, Ident, LitInt, LitStr, Token};

/// Builds a resource stack: the first item is the leaf, each following item wraps the one above.
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
                    let fields = Punctuated::<Field, Token![,]>::parse_terminated(&content)?;
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
}

impl Parse for Field {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let value = if input.peek(LitInt) && input.peek2(Ident) {
            let n: LitInt = input.parse()?;
            let unit: Ident = input.parse()?;
            let span = n.span().join(unit.span()).unwrap_or_else(|| n.span());
            if !n.suffix().is_empty() {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "a size is a number and a unit, as `{} {unit}`: drop the `{}` suffix",
                        n.base10_digits(),
                        n.suffix()
                    ),
                ));
            }
            size_tokens(n.base10_digits(), &unit.to_string(), span)?
        } else if input.peek(LitInt) && {
            // A lone literal (`4096`, `512MiB`); one followed by an operator (`1 << 40`) is an
            // expression.
            let fork = input.fork();
            fork.parse::<LitInt>().is_ok() && (fork.is_empty() || fork.peek(Token![,]))
        } {
            let n: LitInt = input.parse()?;
            match n.suffix() {
                // An integer type suffix is the user's choice of type: keep it.
                "" | "usize" | "isize" | "u8" | "u16" | "u32" | "u64" | "u128" | "i8" | "i16"
                | "i32" | "i64" | "i128" => n.into_token_stream(),
                unit => size_tokens(n.base10_digits(), unit, n.span())?,
            }
        } else if input.peek(LitStr) {
            let s: LitStr = input.parse()?;
            let text = s.value();
            if text.trim_start().starts_with(|c: char| c.is_ascii_digit()) {
                let (digits, unit) = split_size(&text);
                size_tokens(digits, unit, s.span())?
            } else {
                s.into_token_stream()
            }
        } else {
            input.parse::<Expr>()?.into_token_stream()
        };
        Ok(Field { name, value })
    }
}

fn split_size(text: &str) -> (&str, &str) {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    (&text[..end], text[end..].trim())
}

/// The number of bytes in `digits unit`, as a `usize` literal, or an error at `span`.
fn size_tokens(digits: &str, unit: &str, span: Span) -> syn::Result<TokenStream2> {
    let bytes = parse_size(digits, unit).map_err(|msg| syn::Error::new(span, msg))?;
    let lit = LitInt::new(&format!("{bytes}usize"), span);
    Ok(lit.into_token_stream())
}

/// The bytes in `digits unit`, or the message for the user: the rules are mrstack-units', shared
/// with text configs.
fn parse_size(digits: &str, unit: &str) -> Result<u64, String> {
    mrstack_units::size_of(digits, unit).map_err(|e| format!("bad size `{digits} {unit}`: {e}"))
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
        assert_eq!(parse_size("1", "GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("4_096", ""), Ok(4096));
        assert!(parse_size("1", "GiBs")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_size("99999999999", "TiB")
            .unwrap_err()
            .contains("64 bits"));
    }
}
