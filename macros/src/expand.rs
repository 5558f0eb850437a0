//! The code a parsed stack becomes: the leaf, then one `Layer::layer` call per line.

use crate::parse::{Item, Stack};
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;

/// The path of the mrstack crate as the calling crate names it: `::mrstack`, or `::mrs` for a
/// user who renamed the dependency (`mrs = { package = "mrstack", … }`). Inside mrstack itself
/// (its tests and examples included) `::mrstack` works: the library declares
/// `extern crate self as mrstack`.
///
/// The path carries `span`, the line's, so that an error in a line points at that line.
fn crate_path(name: &str, span: Span) -> TokenStream2 {
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
    pub(crate) fn expand(self) -> TokenStream2 {
        let krate_name = crate_name();
        let mut acc = leaf(self.leaf, &krate_name);
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
                    let path = quote_spanned!(span=> #krate::__private::layer::#name #generics);
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
            acc = quote_spanned!(span=> #krate::resource::Layer::layer(#config, #acc));
        }
        acc
    }
}

/// The leaf, through `mrstack::__private` (whose docs say how): a leaf that is not a resource, a
/// `Result` without its `?` above all, is one error that says so, where the layers would each
/// report it again.
///
/// The error points at the method's name, which carries the span of the leaf's last token: the
/// call's parentheses in `Cuda::new(&ctx)`, where the `?` goes.
fn leaf(leaf: syn::Expr, krate_name: &str) -> TokenStream2 {
    // `&Simulated::new(…)`: the borrow stays outside, so that `let mr = resource_stack![&…];`
    // still extends the temporary's life as `let mr = &…;` does; the value inside is checked
    // (`&R` is a resource exactly when `R` is). A place (`&sim`) is borrowed as it is: checking
    // it by value would move it.
    if let syn::Expr::Reference(reference) = &leaf {
        let value = matches!(
            *reference.expr,
            syn::Expr::Call(_) | syn::Expr::MethodCall(_) | syn::Expr::Struct(_)
        );
        if value && reference.mutability.is_none() {
            let and = reference.and_token;
            let checked = checked(&reference.expr, krate_name);
            return quote!(#and #checked);
        }
    }
    checked(&leaf, krate_name)
}

fn checked(leaf: &syn::Expr, krate_name: &str) -> TokenStream2 {
    let first = leaf.span();
    let last = leaf
        .to_token_stream()
        .into_iter()
        .last()
        .map_or(first, |t| t.span());
    let krate = crate_path(krate_name, first);
    let call = quote_spanned!(last=> .into_leaf());
    quote_spanned!(first=> {
        #[allow(unused_imports)]
        use #krate::__private::{IsNeither as _, IsResource as _, IsResult as _};
        #krate::__private::Wrap(#leaf)#call
    })
}
