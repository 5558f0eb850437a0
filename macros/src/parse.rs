//! The grammar of `resource_stack!` (stated in the crate docs), with an error for each way to
//! miswrite it that says what is wrong, where syn alone would say "expected `,`".

use crate::size::{self, Value};
use proc_macro2::TokenStream as TokenStream2;
use quote::ToTokens;
use syn::parse::{Parse, ParseStream};
use syn::{braced, AngleBracketedGenericArguments, Expr, Ident, Token};

/// mrstack's configurations (`Pool` for `suballoc::PoolConfig`, …): such a name first in the list is a layer where the leaf
/// should be.
const LAYERS: [&str; 15] = [
    "Aligned",
    "Arena",
    "Binning",
    "FixedSize",
    "GraphPools",
    "Limiting",
    "Logging",
    "Pool",
    "Prefetch",
    "Retry",
    "Statistics",
    "ThreadCache",
    "ThreadHeaps",
    "Tlsf",
    "Tracking",
];

pub(crate) struct Stack {
    pub(crate) leaf: Expr,
    pub(crate) layers: Vec<Item>,
}

pub(crate) enum Item {
    /// `Name`, `Name<Args>`, `Name { field: value, … }`: one of mrstack's configurations.
    Config {
        name: Ident,
        generics: Option<AngleBracketedGenericArguments>,
        fields: Option<Vec<(Ident, TokenStream2)>>,
    },
    /// Any other expression: a value implementing `Layer`.
    Expr(Expr),
}

const EXAMPLE: &str = "resource_stack![Cuda::new(&ctx)?, Pool { initial: 1 GiB }, Statistics]";

impl Parse for Stack {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.is_empty() || input.peek(Token![,]) {
            return Err(input.error(format!(
                "resource_stack! starts with its leaf resource, e.g. `{EXAMPLE}`"
            )));
        }
        if let Some(name) = config_name(input) {
            if LAYERS.iter().any(|&layer| name == layer) {
                return Err(syn::Error::new(
                    name.span(),
                    format!(
                        "the leaf must come first: `{name}` is a layer, which wraps the resource before it; start the list with the resource at the bottom of the stack, as in `{EXAMPLE}`"
                    ),
                ));
            }
        }
        let leaf = expression(input)?;
        let mut layers = Vec::new();
        let mut previous = "the leaf".to_owned();
        while !input.is_empty() {
            if !input.peek(Token![,]) {
                return Err(input.error(format!(
                    "missing `,` after {previous}: the items of resource_stack! are separated by commas, as in `{EXAMPLE}`"
                )));
            }
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let item: Item = input.parse()?;
            previous = match &item {
                Item::Config { name, .. } => format!("`{name}`"),
                Item::Expr(Expr::Path(path)) if path.path.get_ident().is_some() => {
                    format!("`{}`", path.path.to_token_stream())
                }
                Item::Expr(_) => "this item".to_owned(),
            };
            layers.push(item);
        }
        Ok(Stack { leaf, layers })
    }
}

/// The name of the configuration that `input` starts with (`Name`, `Name<…>`, `Name::<…>`,
/// `Name { … }`, capitalized, alone before the next `,`), without consuming it; `None` for an
/// expression (`Pool::new(…)`, `my_layer`, `(MyLayer)`).
fn config_name(input: ParseStream) -> Option<Ident> {
    let fork = input.fork();
    let name = fork.parse::<Ident>().ok()?;
    let capitalized = name
        .to_string()
        .starts_with(|c: char| c.is_ascii_uppercase());
    let config_like = capitalized
        && (fork.is_empty()
            || fork.peek(Token![,])
            || fork.peek(syn::token::Brace)
            || fork.peek(Token![<])
            || fork.peek(Token![::]) && fork.peek3(Token![<]));
    config_like.then_some(name)
}

/// An expression up to the next `,`, or the error for a size with a unit written inside one
/// (`Simulated::new(1 GiB)`), which is not Rust.
fn expression(input: ParseStream) -> syn::Result<Expr> {
    let fork = input.fork();
    input.parse::<Expr>().map_err(|e| {
        let tokens = fork
            .step(|cursor| {
                let mut rest = *cursor;
                let mut tokens = TokenStream2::new();
                while let Some((tree, next)) = rest.token_tree() {
                    if matches!(&tree, proc_macro2::TokenTree::Punct(p) if p.as_char() == ',') {
                        break;
                    }
                    tokens.extend([tree]);
                    rest = next;
                }
                Ok((tokens, rest))
            })
            .unwrap_or_default();
        size::unit_in(tokens).unwrap_or(e)
    })
}

impl Parse for Item {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if config_name(input).is_none() {
            return Ok(Item::Expr(expression(input)?));
        }
        let name: Ident = input.parse()?;
        let generics = if input.peek(Token![<]) || input.peek(Token![::]) {
            Some(input.parse::<AngleBracketedGenericArguments>()?)
        } else {
            None
        };
        let fields = if input.peek(syn::token::Brace) {
            let content;
            braced!(content in input);
            let fields = fields(&content, &name)?;
            size::check_order(&name, &fields)?;
            Some(fields.into_iter().map(|(f, v)| (f, v.tokens)).collect())
        } else {
            None
        };
        Ok(Item::Config {
            name,
            generics,
            fields,
        })
    }
}

/// The fields of configuration `config`: `name: value`, separated by `,`.
fn fields(input: ParseStream, config: &Ident) -> syn::Result<Vec<(Ident, Value)>> {
    let mut fields = Vec::new();
    while !input.is_empty() {
        let name: Ident = input.parse().map_err(|_| {
            input.error(format!(
                "expected a field name: the fields of `{config}` are `name: value`, separated by `,`"
            ))
        })?;
        if !input.peek(Token![:]) {
            return Err(input.error(format!(
                "expected `:` after `{name}`: a field is `name: value`, as `{name}: 1 GiB`"
            )));
        }
        input.parse::<Token![:]>()?;
        if input.is_empty() || input.peek(Token![,]) {
            return Err(input.error(format!("expected a value for `{name}` after its `:`")));
        }
        let value = size::parse_value(input, config, &name)?;
        fields.push((name, value));
        if input.is_empty() {
            break;
        }
        if input.peek(Token![,]) {
            input.parse::<Token![,]>()?;
            continue;
        }
        let name = &fields[fields.len() - 1].0;
        if input.peek(Ident) && input.peek2(Token![:]) {
            return Err(input.error(format!(
                "missing `,` before this field: the fields of `{config}` are separated by commas, as in `{config} {{ {name}: …, … }}`"
            )));
        }
        return Err(input.error(format!("expected `,` or `}}` after the value of `{name}`")));
    }
    Ok(fields)
}
